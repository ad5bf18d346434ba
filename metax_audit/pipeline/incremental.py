# The change-focused review's reuse of earlier work: a baseline revision served without a snapshot,
# and the compare stage of the changed files run ahead on the other core while the trace runs.
"""Nothing here decides a result; it only decides what need not be computed again, and every
reuse is keyed by content, so a review served this way equals the same review computed afresh
(tests/test_incremental.py checks it finding by finding).

- **Revision memo.** A revision's snapshot is a function of its commit and of what is exported:
  `(commit, exported paths, --config bytes) -> (tree digest, config, waivers file text)`. With
  it the result-cache key of a revision's review is known without `git archive`, the digest of
  the export or the removal of its temp dir (about 0.4 s on the real port): the baseline of
  `review --staged` (HEAD) is then one pickle load.
- **Compare ahead.** The compare stage needs the discovery as the trace widened it (the port files
  the chains reached), so it runs after the trace. The files the trace reached are remembered per
  repository; the next review of that repository widens its discovery with them at once and runs
  the per-file compare of that prediction in a forked child while the trace runs. The child only
  fills the content-keyed per-file compare cache and returns its result; the compare stage uses
  that result when the trace's own discovery is the predicted one, and otherwise computes as
  before (hitting whatever the child stored)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metax_audit.cache import resultcache
from metax_audit.cache.memo import review_memo
from metax_audit.cache.store import Key, Kind

if TYPE_CHECKING:
    from metax_audit.core.config import AuditConfig
    from metax_audit.core.forked import Forked
    from metax_audit.core.memo import Memo
    from metax_audit.core.models import Comparison, Discovery, Finding, UpstreamInfo
    from metax_audit.stages.compare.per_file import ComparedParts, CompareWork
    from metax_audit.stages.snapshot import Exported

_CompareResult = tuple["Comparison", list["Finding"], "CompareWork"]


# ---------------------------------------------------------------- revision memo


@dataclass(frozen=True)
class RevisionEntry:
    """What a revision's snapshot gives the review before any stage runs."""

    digest: str  # resultcache.tree_digest of the export
    config: AuditConfig  # the config as the snapshot holds it
    waivers_text: str | None  # the waivers file the config names, as that revision holds it


def revision_commit(repo: Path | None, rev: str) -> tuple[Path, str] | None:
    """(repository top, commit) of `rev`, or None when it does not name a commit."""
    from metax_audit.core.errors import SnapshotError
    from metax_audit.stages.snapshot import find_repo, resolve_commit

    try:
        top = find_repo(repo or Path.cwd())
    except SnapshotError:
        return None
    sha = resolve_commit(top, rev)
    return (top, sha) if sha else None


def _memo_key(commit: str, only: tuple[Exported, ...], config_file: Path | None) -> Key:
    return resultcache.key(Kind.REVISION, commit, list(only), resultcache.file_digest(config_file) if config_file else None)


def remember_revision(commit: str, only: tuple[Exported, ...], config_file: Path | None, root: Path, digest: str,
                      config: AuditConfig) -> None:
    """Record what the snapshot of `commit` (exported as `only`) holds, for revision_entry."""
    waivers = None
    if config.waivers:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            waivers = (root / config.waivers).read_text(encoding="utf-8")
    resultcache.store(_memo_key(commit, only, config_file), RevisionEntry(digest, config, waivers))


def revision_entry(commit: str, only: tuple[Exported, ...], config_file: Path | None,
                   explicit_waivers: Path | None) -> RevisionEntry | None:
    """The memo of `commit`, or None: also when the config names a waivers file the revision lacks
    (the review itself says what that means)."""
    hit = resultcache.load(_memo_key(commit, only, config_file))
    if not isinstance(hit, RevisionEntry):
        return None
    if explicit_waivers is None and hit.config.waivers and hit.waivers_text is None:
        return None
    return hit


@contextlib.contextmanager
def waivers_file(entry: RevisionEntry, explicit: Path | None) -> Iterator[Path | None]:
    """The waivers file of a memo-served review: --waivers, else the revision's own file's text in a
    temp file for the time of the review (apply_waivers reads a path), else none."""
    if explicit is not None:
        yield explicit
        return
    if entry.waivers_text is None or not entry.config.waivers:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="metax-audit-waivers-", suffix=Path(entry.config.waivers).suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(entry.waivers_text)
        yield Path(name)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


# ---------------------------------------------------------------- compare ahead


def _reached_key(repo: str, package: str, paths: tuple[str, ...]) -> Key:
    return resultcache.key(Kind.REACHED, repo, package, sorted(paths))


def keep_discovery_of_review(entry: Key, repo: str, package: str, paths: tuple[str, ...]) -> None:
    """Keep the discovery this review ended with (just remembered for `repo` by CompareAhead.take) under
    the review's result-cache entry too: a later review served whole from that entry, in another clone
    or after another change, hands it on to its repository (served_discovery)."""
    remember = _reached_key(repo, package, paths)
    reached, kept = resultcache.load(remember), resultcache.load(remember.beside(Kind.DISCOVERY))
    if isinstance(reached, tuple) and isinstance(kept, tuple):
        resultcache.store(entry.beside(Kind.REVIEW_DISCOVERY), (reached, kept))


def served_discovery(entry: Key, repo: str, package: str, paths: tuple[str, ...]) -> None:
    """A review served whole: the discovery its computed review ended with becomes `repo`'s last one, so
    the next change-focused review of this repository starts its compare (and what runs during the trace)
    on it, as it would after a computed review (start_compare_early, start_compare)."""
    kept = resultcache.load(entry.beside(Kind.REVIEW_DISCOVERY))
    if isinstance(kept, tuple) and len(kept) == 2:
        remember = _reached_key(repo, package, paths)
        resultcache.store(remember, kept[0])
        resultcache.store(remember.beside(Kind.DISCOVERY), kept[1])


class CompareAhead:
    """The compare stage of the predicted widened discovery, computed in a forked child."""

    def __init__(self, predicted: Discovery | None, child: Forked[_CompareResult] | None, remember: Key | None,
                 inputs: tuple[UpstreamInfo | None, UpstreamInfo | None] | None = None) -> None:
        self._predicted = predicted
        self._child = child
        self._remember = remember  # where the trace's reached files are kept for the next review
        self.inputs = inputs  # the upstream and base releases the child compares with
        self.used = False  # whether take() gave the child's result
        self.early = False  # started before discover (start_compare_early)
        self._speculative: SpeculativeCompare | None = None  # no prediction: the discovery as discover left it

    @property
    def running(self) -> bool:
        """Whether a child compares now (the compare stage will wait for it)."""
        speculative = self._speculative.child if self._speculative is not None else None
        return (self._child is not None and self._child.started) or (speculative is not None and speculative.started)

    @property
    def predicted(self) -> Discovery | None:
        """The widened discovery the child compares (what the trace is expected to widen discovery to)."""
        return self._predicted

    def predicts(self, discovery: Discovery, inputs: tuple[UpstreamInfo | None, UpstreamInfo | None]) -> bool:
        """Whether the child compares what the compare stage would with this discovery and these releases."""
        return self._child is not None and self._predicted is not None and self.inputs == inputs \
            and _compare_view(self._predicted) == _compare_view(discovery)

    def take(self, widened: Discovery, upstream: UpstreamInfo | None = None, base: UpstreamInfo | None = None,
             memo: Memo | None = None) -> _CompareResult | None:
        """The child's result when `widened` (the trace's discovery) and the releases are what it
        compared, else None; remembers the files this trace reached (and the discovery) for the next review.
        A speculative child's parts are used for every file the widening cannot change (SpeculativeCompare.take)."""
        if self._remember is not None:
            reached = tuple(sorted(f.path for f in widened.files if f.reason == "reached-by-trace"))
            resultcache.store(self._remember, reached)
            resultcache.store(self._remember.beside(Kind.DISCOVERY), (str(widened.root), widened))
        if self._speculative is not None:
            speculative, self._speculative = self._speculative, None
            return speculative.take(widened, (upstream, base), memo)
        child, self._child = self._child, None
        if child is None:
            return None
        if not child.started or self._predicted is None or _compare_view(widened) != _compare_view(self._predicted) \
                or (self.inputs is not None and self.inputs != (upstream, base)):
            child.close()
            return None
        self.used = True
        return child.result()

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None
        if self._speculative is not None:
            self._speculative.close()
            self._speculative = None


def same_files(a: Discovery, b: Discovery) -> bool:
    """Whether two discoveries hold the same files (root, paths, modules, reasons, parse problems) and
    registrations: what the checks and the dataflow started during the trace read of a discovery."""
    return _compare_view(a) == _compare_view(b)


def _compare_view(discovery: Discovery) -> tuple[object, ...]:
    """What of a discovery the compare stage reads (compare/stage.py and compare/per_file.cached_compare:
    the snapshot root, each file's path, module, reason and parse problem, the registrations), so
    two discoveries equal here compare the same; a file's line count (SourceFile.lines, for the
    report's coverage) is not read there, and a one-file edit changes it."""
    return (discovery.root, tuple((f.path, f.module, f.reason, f.problem) for f in discovery.files),
            discovery.registrations)


def start_compare_early(fork: Callable[[Callable[[], _CompareResult]], Forked[_CompareResult]], root: Path,
                        config: AuditConfig, upstream: UpstreamInfo | None, base: UpstreamInfo | None, *, repo: str,
                        paths: tuple[str, ...], use_cache: bool) -> CompareAhead | None:
    """Start comparing, before discover runs, the discovery the last review of this repository ended
    with (its trace's widened one), moved to this snapshot: a one-file change that adds no file and
    no registration has the same discovery, and its compare then starts discover's time earlier.
    start_compare keeps this child only when the discovery it predicts is exactly that one."""
    if not use_cache or upstream is None:
        return None
    remember = _reached_key(repo, config.port_package, paths)
    kept = resultcache.load(remember.beside(Kind.DISCOVERY))
    if not (isinstance(kept, tuple) and len(kept) == 2 and isinstance(kept[0], str)):
        return None
    predicted = resultcache.rebase(kept[1], kept[0], str(root))

    def work() -> _CompareResult:
        from metax_audit.stages.compare.per_file import cached_compare

        return cached_compare(predicted, config, upstream, base, memo=review_memo(True))

    ahead = CompareAhead(predicted, fork(work), remember, (upstream, base))
    ahead.early = True
    return ahead


def start_compare(fork: Callable[[Callable[[], Any]], Forked[Any]], discovery: Discovery,
                  config: AuditConfig, upstream: UpstreamInfo | None, base: UpstreamInfo | None, *, repo: str,
                  paths: tuple[str, ...], use_cache: bool, early: CompareAhead | None = None) -> CompareAhead:
    """Start comparing the discovery widened by the files the last trace of this repository reached
    (or keep the `early` child when it compares exactly that). Without that prediction (--no-cache, a
    first review) the child compares the discovery as discover left it (SpeculativeCompare). Nothing
    starts without an upstream."""
    if not use_cache or upstream is None:
        if early is not None:
            early.close()
        return _speculative(fork, discovery, config, upstream, base, None, use_cache)
    remember = _reached_key(repo, config.port_package, paths)
    reached = resultcache.load(remember)
    if not isinstance(reached, tuple):
        if early is not None:
            early.close()
        return _speculative(fork, discovery, config, upstream, base, remember, use_cache)
    from metax_audit.cache.memo import review_memo
    from metax_audit.stages.discover import widen

    predicted = widen(discovery, discovery.root, reached, memo=review_memo(True)) if reached else discovery  # as the trace stage widens it
    if early is not None:
        if early.predicts(predicted, (upstream, base)):
            return early
        early.close()

    def work() -> _CompareResult:
        from metax_audit.stages.compare.per_file import cached_compare

        return cached_compare(predicted, config, upstream, base, memo=review_memo(True))

    return CompareAhead(predicted, fork(work), remember, (upstream, base))


def _speculative(fork: Callable[[Callable[[], _Speculated]], Forked[_Speculated]], discovery: Discovery,
                 config: AuditConfig, upstream: UpstreamInfo | None, base: UpstreamInfo | None, remember: Key | None,
                 use_cache: bool) -> CompareAhead:
    ahead = CompareAhead(None, None, remember)
    if upstream is not None:
        ahead._speculative = SpeculativeCompare(fork, discovery, config, upstream, base, review_memo(use_cache))
    return ahead


_Speculated = tuple["ComparedParts", dict[str, list[str]]]


class SpeculativeCompare:
    """The compare of the discovery as discover left it, in a forked child while the trace runs, for a
    review with no prediction of what the trace will reach (--no-cache, a first review).

    The trace then widens the discovery with the port files it reached. A file's compare reads, of
    the rest of the discovery, only the scope (the modules under review: whether an import of the port's
    own copy of an upstream module is "compared as its own file", compare/structure.py) and the
    registrations, which widening leaves alone. So a file's parts from the child are the widened
    discovery's own unless one of its imports could name a module the widening added; those files and
    the added ones are compared in this process (compare/per_file.cached_compare `known`)."""

    def __init__(self, fork: Callable[[Callable[[], _Speculated]], Forked[_Speculated]], discovery: Discovery,
                 config: AuditConfig, upstream: UpstreamInfo, base: UpstreamInfo | None, memo: Memo) -> None:
        self._discovery, self._config, self._inputs = discovery, config, (upstream, base)

        def work() -> _Speculated:
            from metax_audit.stages.compare.per_file import compare_parts, import_candidates

            # kept under this discovery's scope: the review's own keys when the trace reaches no new file
            # (else take() keeps each file's parts again under the widened scope)
            parts = compare_parts(discovery, config, upstream, base, memo=memo)
            return parts, {f.path: import_candidates(discovery.root, f.path, config) for f in discovery.files}

        self._child: Forked[_Speculated] | None = fork(work)

    def take(self, widened: Discovery, inputs: tuple[UpstreamInfo | None, UpstreamInfo | None],
             memo: Memo | None = None) -> _CompareResult | None:
        """The compare of `widened` with the child's parts of every file the widening cannot change; None
        (compute it all) where the child did not run, compared other releases or another discovery."""
        from metax_audit.stages.compare.per_file import CompareWork, assemble, cached_compare
        from metax_audit.stages.compare.stage import module_of

        child, self._child = self._child, None
        if child is None:
            return None
        before = self._discovery
        added = {f.path for f in widened.files} - {f.path for f in before.files}
        if not child.started or inputs != self._inputs or widened.root != before.root \
                or widened.registrations != before.registrations \
                or _compare_view(replace(widened, files=tuple(f for f in widened.files if f.path not in added))) \
                != _compare_view(before):
            child.close()
            return None
        compared, candidates = child.result()
        upstream, base = self._inputs
        if compared.whole is not None:  # a result not tied to one file: whole, or not at all
            return (*compared.whole, compared.work) if not added else None
        new_modules = {module_of(path) for path in added}
        known = {path: part for path, part in compared.parts.items() if not new_modules & set(candidates.get(path, ()))}
        if not added:
            return (*assemble(widened, self._config, upstream, base, known), CompareWork(0, ahead=len(known)))
        comparison, findings, work = cached_compare(widened, self._config, upstream, base, memo=memo or review_memo(False),
                                                    known=known)
        return comparison, findings, work._replace(ahead=len(known))

    @property
    def child(self) -> Forked[_Speculated] | None:
        """The child comparing (None once taken or closed)."""
        return self._child

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

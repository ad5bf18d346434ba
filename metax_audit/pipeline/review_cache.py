# The result cache at the level of a whole review (resultcache.py holds the store): the key of a review
# of identical inputs, the cached report served as this snapshot's, and a baseline revision's review
# served from the revision memo (incremental.py) without exporting a snapshot.
from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.cache.store import Key, Kind
from metax_audit.core.config import AuditConfig
from metax_audit.core.models import AuditReport, SnapshotInfo, StageRecord, UpstreamInfo
from metax_audit.core.progress import Progress
from metax_audit.stages.upstream import Commit

if TYPE_CHECKING:
    from metax_audit.core.options import ReviewOptions
    from metax_audit.stages.snapshot import Exported


def cacheable(options: ReviewOptions) -> bool:
    """Whether the result cache serves this review: not --test, --probe (their results depend on more
    than the sources) or --no-cache."""
    return not (options.test_command or options.run_probes or options.no_cache)


def result_key(digest: str, config: AuditConfig, options: ReviewOptions, progress: Progress,
               commit: Commit) -> Key | None:
    """The result-cache key of the review of a snapshot whose export has this tree digest (resultcache.py),
    None when the stack cannot be identified."""
    from metax_audit.cache import resultcache
    from metax_audit.stages.introspect import stack_identity

    upstream, base = upstream_and_base(config, options, progress, commit)
    stack: str | None
    if options.stack is not None:
        stack = f"manifest:{resultcache.file_digest(options.stack)}"
    else:
        stack = stack_identity(options.python, tuple(options.extra_path))
        if stack is None:
            return None
    # allow-unbound and the index URL decide whether an unbound pin stops the review (the config's are in its files)
    accepted = sorted(options.allow_unbound) if options.allow_unbound is not None else None
    return resultcache.key(Kind.REVIEW, digest, resultcache.upstream_identity(upstream),
                           resultcache.upstream_identity(base),
                           resultcache.options_identity(options.paths, options.config_file, options.static_roots, stack),
                           ["allow-unbound", accepted, options.index_url],
                           *([repr(options.config)] if options.config is not None else []))


def _usable(hit: object, still_kept: Callable[[str, str], bool]) -> tuple[str, AuditReport] | None:
    """The snapshot root and report of a kept review, None when it is not one or no longer holds: a review
    with accepted unbound pins holds while the index's "not there" of each (public base, module) is kept
    (`still_kept`: stack_pins.kept_miss, under the same index configuration, for a day); after that the
    review is computed again and the index asked again."""
    if not (isinstance(hit, tuple) and len(hit) in (2, 3) and isinstance(hit[1], AuditReport)):
        return None
    misses = hit[2] if len(hit) == 3 else ()
    if not (isinstance(misses, tuple) and all(isinstance(m, tuple) and len(m) == 2 and all(isinstance(x, str) for x in m)
                                              for m in misses)):
        return None
    if bool(misses) != bool(hit[1].unbound):
        return None  # a report with unbound pins is kept only with the answers it stands on
    if not all(still_kept(public, module) for public, module in misses):
        return None
    return str(hit[0]), hit[1]


def upstream_and_base(config: AuditConfig, options: ReviewOptions, progress: Progress, commit: Commit,
                      ) -> tuple[UpstreamInfo | None, UpstreamInfo | None]:
    """The upstream and base releases of a review, as its upstream stage finds them (resolved once, a
    first download happens now, then instant)."""
    from metax_audit.stages.upstream import base_release, installed_upstream_available, resolve_upstream

    spec = options.upstream or (config.upstream_package if installed_upstream_available(config.upstream_package) else None)
    if spec is not None:
        progress.stage("upstream", spec)
    upstream = resolve_upstream(spec, package=config.upstream_package, cache_dir=options.cache_dir) if spec else None
    return upstream, base_release(commit, config, options, upstream)[0] if upstream else None


def served_from_cache(entry: Key | None, snap: SnapshotInfo, stages_so_far: Sequence[StageRecord], started: float,
                      still_kept: Callable[[str, str], bool]) -> AuditReport | None:
    """The cached review of identical inputs, as a report of this snapshot (`still_kept`: see _usable)."""
    from metax_audit.cache import resultcache

    usable = _usable(resultcache.load(entry), still_kept) if entry is not None else None
    if usable is None:
        return None
    old_root, report = usable
    if old_root != str(snap.root):
        report = resultcache.rebase(report, old_root, str(snap.root))
    stages = (*stages_so_far, StageRecord("result-cache", True, round(time.perf_counter() - started, 3),
                                       "served whole from the result cache: same sources, upstream, stack and tool"),
              *(replace(s, seconds=0.0, note=f"cached: {s.note}" if s.note else "cached")
                for s in report.stages if s.name != "snapshot"))
    return replace(report, snapshot=snap, stages=stages, wall_seconds=round(time.perf_counter() - started, 2),
                   generated_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))


def served_revision(options: ReviewOptions, progress: Progress, still_kept: Callable[[str, str], bool],
                    ) -> AuditReport | None:
    """The review of revision options.rev served from the revision memo and the result cache without
    exporting a snapshot (incremental.py), waivers applied as the pipeline's _waived does; None on any miss."""
    from metax_audit.cache import resultcache
    from metax_audit.pipeline import incremental
    from metax_audit.pipeline.waivers import apply_waivers
    from metax_audit.stages.snapshot import export_config, static_export

    if not cacheable(options) or options.rev is None:
        return None
    found = incremental.revision_commit(options.repo, options.rev)
    hint = export_config(options.repo, "rev", options.config_file)
    memo = found and incremental.revision_entry(found[1], static_export(hint.port_package, hint), options.config_file,
                                                options.waivers)
    entry = result_key(memo.digest, memo.config, options, progress, Commit(found[0], found[1], options.rev)) \
        if memo and found else None
    if memo and options.config is not None and memo.config != options.config:
        return None  # reviewed under the subject's config, not the one the revision holds: computed afresh
    usable = _usable(resultcache.load(entry), still_kept) if memo and entry else None
    if memo is None or usable is None:
        return None
    with incremental.waivers_file(memo, options.waivers) as path:
        findings, summary = apply_waivers(usable[1].findings, path, options.today)
    return replace(usable[1], findings=tuple(findings), waivers=summary)


def entry_for(snap: SnapshotInfo, config: AuditConfig, options: ReviewOptions, progress: Progress,
              export: tuple[Exported, ...]) -> Key | None:
    """The result-cache key of this review (None when it must run afresh); a revision's review is also
    remembered in the revision memo by what the snapshot exported."""
    if not cacheable(options):
        return None
    from metax_audit.cache import resultcache
    from metax_audit.pipeline import incremental
    from metax_audit.stages.snapshot import known_digest

    digest = known_digest(snap.root) or resultcache.tree_digest(snap.root)
    entry = result_key(digest, config, options, progress, Commit(Path(snap.repo), snap.commit, snap.label))
    if entry is not None and snap.mode == "rev" and snap.commit:
        incremental.remember_revision(snap.commit, export, options.config_file, snap.root, digest, config)
    return entry


def store(entry: Key, snap: SnapshotInfo, report: AuditReport, misses: tuple[tuple[str, str], ...] = ()) -> None:
    """Keep the review; `misses`: the (public base, module) of the accepted unbound pins whose "not on the
    index" it stands on (served only while each is still kept: _usable)."""
    from metax_audit.cache import resultcache

    resultcache.store(entry, (str(snap.root), report, misses) if misses else (str(snap.root), report))

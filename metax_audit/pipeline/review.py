# The only module that knows the stage order: snapshot -> discover -> trace -> introspect ->
# compare -> checks -> (probe) -> inventory -> report. Each stage is timed and recorded.
from __future__ import annotations

import datetime as _dt
import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from metax_audit import __version__
from metax_audit.core.config import AuditConfig, departures, load_config
from metax_audit.core.errors import AuditError
from metax_audit.core.forked import Forked
from metax_audit.core.memo import Memo
from metax_audit.core.models import (
    AuditReport,
    CallSite,
    Comparison,
    ConfigSwitch,
    Discovery,
    Finding,
    ProbeResult,
    SnapshotInfo,
    StackFacts,
    StageRecord,
    TestRun,
    TraceResult,
    UnboundPackage,
    Unresolved,
    UpstreamInfo,
)
from metax_audit.core.options import ReviewOptions
from metax_audit.core.progress import Progress, QuietProgress

if TYPE_CHECKING:
    from metax_audit.core.contracts import Contracts
    from metax_audit.pipeline.incremental import CompareAhead
    from metax_audit.stages import introspect as introspect_mod
    from metax_audit.stages.checks.memo import FileMemo
    from metax_audit.stages.compare.carried import Carried
    from metax_audit.stages.dataflow import LseFlow
    from metax_audit.stages.introspect.stack_pins import StackBinding
    from metax_audit.stages.snapshot import Exported
    from metax_audit.stages.trace.symbols import SymbolTable

T = TypeVar("T")
# The dataflow stage as the forked child returns it: flows, findings, values not followed.
_FlowResult = tuple[list["LseFlow"], list[Finding], list[Unresolved]]


@dataclass
class _Run:
    """Mutable bookkeeping of one review; only pipeline.py sees it."""

    stages: list[StageRecord] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)  # run when the review ends, however
    export: tuple[Exported, ...] = ()  # what the snapshot exported (the revision memo's key, incremental.py)
    during_trace: bool = False  # the imports/attributes checks and the dataflow ran during the trace (_after_trace)
    unbound: list[UnboundPackage] = field(default_factory=list)  # accepted with allow-unbound (_stack_pins_stage)
    # the (public base, module) of each accepted unbound pin whose "not on the index" is kept (stack_pins.kept_miss);
    # None when one's is not (an index that could not be asked): then the review is not kept whole
    kept_misses: list[tuple[str, str]] | None = field(default_factory=list)
    kernel_roots: tuple[Path, ...] | None = None  # kernel-sources of the config, resolved once (_kernel_source_roots)

    @contextmanager
    def stage(self, name: str, progress: Progress, detail: str = "") -> Iterator[list[str]]:
        progress.stage(name, detail)
        notes: list[str] = []
        start = time.perf_counter()
        yield notes
        self.stages.append(StageRecord(name, True, round(time.perf_counter() - start, 3), "; ".join(notes)))
        from metax_audit.core.pysource import collect_if_grown

        collect_if_grown()  # the collector is paused for the review (pysource.paused_gc)

    def skipped(self, name: str, why: str) -> None:
        self.stages.append(StageRecord(name, False, 0.0, why))


@dataclass(frozen=True)
class ReviewResult:
    report: AuditReport
    generated_waivers: str | None = None
    config: AuditConfig | None = None  # the config the review ran under (its baseline runs under it too)


def review(options: ReviewOptions, progress: Progress | None = None, *, generate_waivers: bool = False) -> ReviewResult:
    """Review the snapshot; then, when it has a baseline (baseline.py), review that revision the
    same way and mark each finding new, changed or unchanged (and list the fixed ones)."""
    from metax_audit.stages.snapshot import remembered_git

    with remembered_git():  # the repository's top and HEAD asked of git once for the whole review
        return _review(options, progress, generate_waivers)


def _review(options: ReviewOptions, progress: Progress | None, generate_waivers: bool) -> ReviewResult:
    from metax_audit.cache.store import rejected_since, rejection_counts
    from metax_audit.core.pysource import frozen_heap, paused_gc
    from metax_audit.pipeline import baseline as baseline_mod
    from metax_audit.pipeline import review_cache

    progress = progress or QuietProgress()
    started = time.perf_counter()
    bad_before = rejection_counts()
    try:
        result = _review_one(options, progress, generate_waivers)
        rev = baseline_mod.baseline_rev(options, result.report.snapshot)
        if rev is not None:
            progress.stage("baseline", rev)
            begun = time.perf_counter()
            # The subject's config governs its baseline: an uncommitted .metax-audit.yaml reviews HEAD as it
            # reviews the worktree (a config the baseline revision lacks would otherwise leave it the default).
            base_options = baseline_mod.baseline_options(options, rev, config=result.config)
            with frozen_heap():  # the review's parses are still alive: no collection needs to rescan them
                with paused_gc():
                    served = review_cache.served_revision(base_options, progress, _still_kept(base_options))
                base = served or _review_one(base_options, progress, False).report
                report = baseline_mod.compare_with(result.report, base, rev)
            info = report.baseline_info
            note = (f"{rev} {(base.snapshot.commit or '')[:12]}: {info['new']} new, {info['changed']} changed, "
                    f"{info['unchanged']} unchanged, {info['fixed']} fixed"
                    + ("; its review served from the result cache without a snapshot" if served else ""))
            report = replace(report, stages=(*report.stages, StageRecord("baseline", True,
                                                                           round(time.perf_counter() - begun, 3), note)),
                             wall_seconds=round(time.perf_counter() - started, 2))
            result = replace(result, report=report)
        bad = rejected_since(bad_before)
        if bad:  # a bad entry is never trusted: its result was computed again (cache/store.py)
            report = result.report
            result = replace(result, report=replace(report, stages=(*report.stages, StageRecord("cache", True, 0.0, bad))))
    finally:
        progress.done()
    if not options.no_cache:
        from metax_audit.cache.resultcache import trim

        trim()  # the least recently used results go once the cache is over its limit
    return result


def _review_one(options: ReviewOptions, progress: Progress, generate_waivers: bool) -> ReviewResult:
    from metax_audit.core.pysource import paused_gc
    from metax_audit.stages import snapshot as snapshot_mod

    started = time.perf_counter()
    if options.stack is None:  # the kernel stack's identity keys the caches: asked while the snapshot is exported
        from metax_audit.stages.introspect import prefetch_sys_path

        prefetch_sys_path(options.python)
    mode, rev, mode_note = options.mode, options.rev, ""
    if mode is None:
        mode, rev, mode_note = snapshot_mod.default_mode(options.repo)
    hint = options.config or snapshot_mod.export_config(options.repo, mode, options.config_file)
    package = hint.port_package
    # The static stages read only the port package, its config, C++ sources and stack pins; --test needs all.
    only = () if options.test_command else snapshot_mod.static_export(package, hint)
    run = _Run(export=only)
    from metax_audit.cache.kept_snapshot import KEPT_TREES
    from metax_audit.pipeline.review_cache import cacheable

    with snapshot_mod.snapshot(mode, options.repo, rev, python=options.python, package=package, only=only,
                               keep=KEPT_TREES if cacheable(options) else None) as snap:
        if mode_note:
            snap = replace(snap, notes=(*snap.notes, mode_note))
        run.stages.append(StageRecord("snapshot", True, round(time.perf_counter() - started, 3),
                                      f"{snap.mode} {snap.label}, {snap.files} files"))
        with paused_gc():  # hundreds of live syntax trees: see pysource.paused_gc
            report, waivers_text, config = _audit_snapshot(snap, options, run, progress, started, generate_waivers)
    return ReviewResult(report, waivers_text, config)


def _audit_snapshot(
    snap: SnapshotInfo, options: ReviewOptions, run: _Run, progress: Progress, started: float, generate_waivers: bool
) -> tuple[AuditReport, str | None, AuditConfig]:
    config = options.config or load_config(snap.root, options.config_file)
    changed = departures(config, snap.root)
    if changed:  # a config that narrows scope or raises limits is itself part of the record
        run.stages.append(StageRecord("config", True, 0.0, "the config narrows the review: " + "; ".join(changed)))
    from metax_audit.pipeline import review_cache

    entry = review_cache.entry_for(snap, config, options, progress, run.export)
    cached = review_cache.served_from_cache(entry, snap, run.stages, started, _still_kept(options))
    if cached is not None:
        from metax_audit.pipeline.incremental import served_discovery

        assert entry is not None
        served_discovery(entry, snap.repo, config.port_package, options.paths)
        return (*_waived(cached, snap, config, options, generate_waivers), config)
    background = _Background(run, _prestart_introspection(config, options))
    try:
        report = _audit_stages(_Stages(snap, config, options, run, progress), background, started)
    finally:
        background.close()
    # Unbound pins are kept only when each is on none of the indexes by a kept answer, which the served review
    # is checked against (review_cache.served_from_cache): an index down now may answer next time.
    if entry is not None and (not report.unbound or run.kept_misses is not None):
        review_cache.store(entry, snap, report, tuple(run.kept_misses or ()) if report.unbound else ())
        from metax_audit.pipeline.incremental import keep_discovery_of_review

        keep_discovery_of_review(entry, snap.repo, config.port_package, options.paths)
    return (*_waived(report, snap, config, options, generate_waivers), config)


def _still_kept(options: ReviewOptions) -> Callable[[str, str], bool]:
    """Whether the package index's "not there" of a public base (NAME==VERSION) and module is still kept
    (stack_pins.kept_miss): what a kept review with accepted unbound pins stands on (review_cache._usable)."""
    from metax_audit.cache.memo import review_memo
    from metax_audit.stages.introspect.stack_pins import kept_miss

    memo = review_memo(True)
    return lambda public, module: kept_miss(public, module, memo=memo, cache_dir=options.cache_dir,
                                            index_url=options.index_url) is not None


def _prestart_introspection(config: AuditConfig, options: ReviewOptions) -> introspect_mod.Prestarted | None:
    """Start the introspection worker now, importing the kernel packages while discover and trace
    run (seconds of import on the other core), unless its facts will likely come from the stack
    cache; the targets follow once the trace has found them (see _introspect)."""
    from metax_audit.stages import introspect as introspect_mod

    if options.stack is not None or options.extra_path or not config.kernel_modules:
        return None  # a manifest or a stub stack (tests, demo): nothing to gain
    if introspect_mod.stack_seen(python=options.python):
        return None
    return introspect_mod.prestart(config.kernel_modules, python=options.python, never_import=(config.port_package,))


@dataclass(frozen=True)
class _Stages:
    """What every stage function of one review reads: the snapshot, its config, the options, the
    run's bookkeeping and the progress display."""

    snap: SnapshotInfo
    config: AuditConfig
    options: ReviewOptions
    run: _Run
    progress: Progress

    @property
    def memo(self) -> Memo:
        """What the stages keep between reviews: the result cache, or nothing with --no-cache (core/memo.py)."""
        from metax_audit.cache.memo import review_memo

        return review_memo(not self.options.no_cache)


class _CountedFork(Forked[T]):
    """A forked stage whose child's rejected cache entries count in this review's stage note."""

    def __init__(self, fn: Callable[[], T], nice: int = 5) -> None:
        def counted() -> tuple[T, int, int]:
            from metax_audit.cache.store import rejected

            before = rejected()
            return fn(), rejected() - before, os.getpid()

        super().__init__(counted, nice=nice)  # type: ignore[arg-type]

    def result(self) -> T:
        from metax_audit.cache.store import add_rejected

        got: tuple[T, int, int] = super().result()  # type: ignore[assignment]
        if got[2] != os.getpid():  # computed here (no fork), it counted here already
            add_rejected(got[1])
        return got[0]


class _Background:
    """The one owner of the review's concurrency: the introspection worker prestarted before the
    snapshot's stages, a forked child on the other core for a pure stage, and a thread that waits
    on a subprocess. Stage functions ask it for work in the background and get back a function that
    waits; close() ends whatever is still running, however the review ends."""

    def __init__(self, run: _Run, prestarted: introspect_mod.Prestarted | None) -> None:
        self._run = run
        self.prestarted = prestarted
        self.pins: _PinsAhead | None = None  # the stack pins bound in a child or on a thread (_start_stack_pins)

    def fork(self, fn: Callable[[], T], nice: int = 5) -> Forked[T]:
        # Forked does not fork beside a live thread: a thread's bindings, and a sys.path question
        # still waiting on its subprocess (introspect/cache.py), are waited for first
        if self.pins is not None:
            self.pins.join()
        from metax_audit.stages.introspect.cache import settle_sys_path

        settle_sys_path()
        child = _CountedFork(fn, nice=nice)
        self._run.closers.append(child.close)
        return child

    def thread(self, name: str, work: Callable[[], T], describe: Callable[[T], list[str]], started: float,
               ) -> Callable[[], T]:
        """Run `work` in a thread now; the returned function waits for it and records stage `name`
        where it started, timed from `started` (its seconds overlap the stages that ran meanwhile)."""
        from concurrent.futures import ThreadPoolExecutor

        index = len(self._run.stages)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"metax-audit-{name}")
        future = pool.submit(lambda: (work(), time.perf_counter() - started))
        pool.shutdown(wait=False)

        def wait() -> T:
            result, seconds = future.result()  # re-raises the work's exception here
            pool.shutdown(wait=True)  # its thread ended: a fork that follows is not refused for it
            self._run.stages.insert(index, StageRecord(name, True, round(seconds, 3), "; ".join(describe(result))))
            return result

        return wait

    def close(self) -> None:
        if self.pins is not None:
            self.pins.join()  # its subprocesses end with it (a pip query, an index lookup)
        if self.prestarted is not None:
            self.prestarted.discard()  # a no-op once introspection used it
        for close in self._run.closers:
            close()


def _audit_stages(st: _Stages, background: _Background, started: float) -> AuditReport:
    from metax_audit.pipeline.incremental import start_compare, start_compare_early

    early = start_compare_early(background.fork, st.snap.root, st.config, *_early_releases(st), repo=st.snap.repo,
                                paths=st.options.paths, use_cache=not st.options.no_cache)  # beside discover
    background.pins = _start_stack_pins(st, background)  # beside discover and the trace (it waits on pip and the index)
    discovery = _discover_stage(st)
    upstream, base = _upstream_stage(st)
    ahead = start_compare(background.fork, discovery, st.config, upstream, base, repo=st.snap.repo,
                          paths=st.options.paths, use_cache=not st.options.no_cache, early=early)  # during the trace
    symbols = _symbols(st, upstream, base)
    during = _start_during_trace(st, ahead.predicted, symbols, upstream, base, background)
    discovery, trace = _trace_stage(st, discovery, upstream, symbols)
    here = ahead.running  # this process would only wait for the children: it runs the binding checks meanwhile
    binding, (contracts, dataflow) = _after_trace(st, discovery, trace, symbols, upstream, base, background, during, here)
    if here:
        binding()  # while the compare child and the stack pins' child finish; kept for the checks stage
    stand_ins = _stack_pins_stage(st, trace, background.pins)
    collect_facts = _introspect(st, discovery, trace, upstream, background, stand_ins)
    comparison = _compare_stage(st, discovery, upstream, base, ahead)
    from metax_audit.stages.checks.memo import FileMemo

    memo = FileMemo(discovery.root, memo=st.memo)  # per-file results of checks and triage
    facts = _checks_stage(st, discovery, trace, comparison, upstream, collect_facts, binding, memo, background.fork)
    flows = _dataflow_stage(st, contracts, dataflow)
    probe_results = _probe_stage(st, trace, flows)
    test_run = _test_stage(st)
    _triage(st, trace, comparison, upstream, facts, memo, discovery.switches)
    memo.save()
    from metax_audit.core.contracts import probe_suggester
    from metax_audit.stages.inventory import build_report, environment_summary

    report = build_report(
        snapshot=st.snap, discovery=discovery, trace=trace, comparison=comparison, findings=st.run.findings,
        probes=probe_results, stages=st.run.stages, upstream=upstream, environment=environment_summary(facts, st.options.python),
        test_run=test_run, wall_seconds=round(time.perf_counter() - started, 2), waivers={},
        tool_version=__version__, generated_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        suggest_probe=probe_suggester(contracts),
    )
    return replace(report, dataflow=tuple(flows), unbound=tuple(st.run.unbound))


def _early_releases(st: _Stages) -> tuple[UpstreamInfo | None, UpstreamInfo | None]:
    """The upstream and base releases for a compare started before discover (incremental.start_compare_early);
    (None, None) when they cannot be had quietly: the upstream stage then says why."""
    from metax_audit.pipeline.review_cache import cacheable, upstream_and_base
    from metax_audit.stages.upstream import Commit

    if not cacheable(st.options):
        return None, None
    try:
        return upstream_and_base(st.config, st.options, st.progress, Commit(Path(st.snap.repo), st.snap.commit, st.snap.label))
    except AuditError:
        return None, None


def kept_project_contracts(*, use_cache: bool = True) -> Contracts | None:
    """component-contracts.md as shipped with metax-audit, parsed once per review. With `use_cache`
    the parsed contracts are kept in the result cache under the file's bytes (importing yaml and
    parsing the 35 blocks was 0.05 s of every review)."""
    from metax_audit.core import contracts as contracts_mod

    path = contracts_mod.default_contracts_path()
    if not use_cache or not path.is_file():
        return contracts_mod.project_contracts()
    import hashlib

    from metax_audit.cache import resultcache
    from metax_audit.cache.store import Kind

    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return contracts_mod.load_contracts(path)  # says why in its own words
    entry = resultcache.key(Kind.CONTRACTS, path.name, hashlib.sha256(text.encode()).hexdigest())
    kept = resultcache.load(entry)
    if isinstance(kept, contracts_mod.Contracts):
        return kept
    parsed = contracts_mod.parse_contracts(text, path.name)
    resultcache.store(entry, parsed)
    return parsed


def _start_dataflow(st: _Stages, discovery: Discovery, background: _Background, nice: int = 5,
                    ) -> tuple[Contracts | None, Forked[_FlowResult]]:
    """Dataflow needs nothing past the trace: a child on the other core runs it while the review goes on."""
    from metax_audit.stages.checks import dataflow_for_review

    contracts = kept_project_contracts(use_cache=not st.options.no_cache)
    memo_common = None if st.options.no_cache else ["dataflow"]  # each file's walk kept with what it read
    return contracts, background.fork(partial(dataflow_for_review, discovery, st.config, contracts, memo_common, st.memo),
                                      nice=nice)


def _triage(st: _Stages, trace: TraceResult, comparison: Comparison | None, upstream: UpstreamInfo | None,
            facts: StackFacts | None, memo: FileMemo | None = None, switches: Sequence[ConfigSwitch] = ()) -> None:
    """One finding per root cause, and the differences the installed stack explains, before the inventory."""
    from metax_audit.stages.triage import Counterparts, triage

    counterparts = None
    if comparison is not None and upstream is not None and upstream.root is not None:
        counterparts = Counterparts(st.snap.root, upstream.root, upstream.version or "?",
                                    {f.path: f.upstream_path for f in comparison.files if f.upstream_path}, memo)
    platform = None
    if upstream is not None and upstream.root is not None:
        from metax_audit.stages.compare.consequence import read_vendor_platform
        from metax_audit.stages.compare.predicates import Capability, Evaluator, platform_capability

        root, config = st.snap.root, st.config
        capability = platform_capability(root / config.platform_path, config.platform_path)
        if not capability.known:
            capability = Capability.parse(config.device_capability, "device-capability in the config")
        platform = Evaluator(read_vendor_platform(root, config.platform_path), capability,
                             {config.upstream_package.split(".")[0]: upstream.root, config.port_package.split(".")[0]: root})
    st.run.findings = triage(st.run.findings, trace.calls, facts, counterparts, trace.backends, platform=platform,
                             roots=(st.snap.root, upstream.root) if upstream is not None and upstream.root is not None else None,
                             carried=_carried(st, upstream, comparison.base if comparison is not None else None),
                             switches=switches, port_package=st.config.port_package)


def _carried(st: _Stages, upstream: UpstreamInfo | None, base: UpstreamInfo | None) -> Carried | None:
    """What tells a port-only change the previous sync already had: the port's files at the commit that moved its
    declaration to the base release (read from its history only when a hunk asks), None without that history."""
    from metax_audit.stages.compare.carried import Carried
    from metax_audit.stages.upstream.base_infer import SyncPoint, file_at, previous_sync

    if upstream is None or upstream.root is None or base is None or base.root is None or not base.version \
            or not st.snap.commit or not st.snap.repo:
        return None
    repo, config, commit, version = Path(st.snap.repo), st.config, st.snap.commit, base.version

    @functools.cache
    def point() -> SyncPoint | None:  # one history walk, and only when a hunk asks
        return previous_sync(repo, commit, version, config.upstream_package, config.port_package)

    def old_text(path: str) -> str | None:
        sync = point()
        return file_at(repo, sync.commit, path) if sync is not None else None

    def since() -> str:
        sync = point()
        return sync.evidence if sync is not None else ""

    return Carried(st.snap.root, upstream.root, base.root, old_text, since, base.version, upstream.version or "?")


def _waived(report: AuditReport, snap: SnapshotInfo, config: AuditConfig, options: ReviewOptions,
            generate_waivers: bool) -> tuple[AuditReport, str | None]:
    """Waivers see the inventory's findings (deduplicated, fingerprinted, inactive-path included)."""
    from metax_audit.pipeline.waivers import apply_waivers
    from metax_audit.pipeline.waivers import generate_waivers as gen_waivers

    waivers_path = options.waivers or (snap.root / config.waivers if config.waivers else None)
    findings, waiver_summary = apply_waivers(report.findings, waivers_path, options.today)
    report = replace(report, findings=tuple(findings), waivers=waiver_summary)
    return report, (gen_waivers(findings) if generate_waivers else None)


def _discover_stage(st: _Stages) -> Discovery:
    from metax_audit.stages import discover as discover_mod

    with st.run.stage("discover", st.progress) as notes:
        discovery = discover_mod.discover(st.snap.root, st.config, st.options.paths, memo=st.memo)
        if not discovery.files and not discovery.left_out:
            raise AuditError(
                f"no file of {st.config.port_package!r} is in scope in this snapshot: is --repo the port's checkout, "
                "and is port-package right in its [tool.metax-audit] config?")
        st.run.findings += discover_mod.registration_findings(discovery)
        st.run.findings += discover_mod.coverage_findings(discovery)
        notes.append(f"{len(discovery.files)} files, {len(discovery.registrations)} registrations")
    return discovery


def _upstream_stage(st: _Stages) -> tuple[UpstreamInfo | None, UpstreamInfo | None]:
    """The upstream release (and the base one for the three-way view), or (None, None) when none is known."""
    from metax_audit.stages.upstream import Commit, base_release, installed_upstream_available, resolve_upstream

    options, config = st.options, st.config
    if not (options.upstream or installed_upstream_available(config.upstream_package)):
        st.run.skipped("upstream", "no --upstream given and no upstream package installed: compare did not run")
        return None, None
    with st.run.stage("upstream", st.progress, options.upstream or config.upstream_package) as notes:
        upstream = resolve_upstream(options.upstream or config.upstream_package, package=config.upstream_package,
                                    cache_dir=options.cache_dir)
        base, how = base_release(Commit(Path(st.snap.repo), st.snap.commit, st.snap.label), config, options, upstream)
        notes.append(upstream.source)
        if how:
            notes.append(how)
    return upstream, base


def _kernel_source_roots(st: _Stages) -> tuple[Path, ...]:
    """Static roots of the kernel stack named in config (kernel-sources, see upstream.kernel_source_roots)."""
    if not st.config.kernel_sources:
        return ()
    if st.run.kernel_roots is not None:
        return st.run.kernel_roots
    from metax_audit.stages.upstream import kernel_source_roots

    with st.run.stage("kernel-sources", st.progress, ", ".join(st.config.kernel_sources)) as notes:
        st.run.kernel_roots = kernel_source_roots(st.config.kernel_sources, st.options.cache_dir, notes)
    return st.run.kernel_roots


def _symbols(st: _Stages, upstream: UpstreamInfo | None, base: UpstreamInfo | None) -> SymbolTable:
    """The review's one symbol table: port snapshot, upstream release, base release (stack attached later)."""
    from metax_audit.stages.trace.symbols import SymbolTable

    return SymbolTable.build(st.snap.root, st.config.port_package, upstream.root if upstream else None,
                             st.config.upstream_package, max_bytes=st.config.max_file_bytes,
                             upstream_version=upstream.version if upstream else None,
                             base_root=base.root if base else None, base_version=base.version if base else None,
                             version_tests=st.config.version_tests)


@dataclass(frozen=True)
class _DuringTrace:
    """The work started during the trace on the discovery it is predicted to widen to (the last review's
    reached files; incremental.start_compare): kept only when the trace widens discovery to exactly that."""

    predicted: Discovery
    discovery_checks: Forked[tuple[list[Finding], list[Finding]]]
    contracts: Contracts | None
    dataflow: Forked[_FlowResult]


def _start_during_trace(st: _Stages, predicted: Discovery | None, symbols: SymbolTable, upstream: UpstreamInfo | None,
                        base: UpstreamInfo | None, background: _Background) -> _DuringTrace | None:
    """The checks that read no trace (imports, attributes) and the dataflow, in children on the other
    core while this process traces: they read the discovery's files only, which a one-file change
    does not alter. Nothing starts without a prediction (a first review, --no-cache)."""
    if predicted is None:
        return None
    from metax_audit.stages.checks import discovery_checks

    # waited for after the compare child (started before discover): a smaller share than it (Forked)
    checks = background.fork(partial(discovery_checks, predicted, symbols, memo=st.memo,
                                     memo_common=_binding_memo_common(st, upstream, base)), nice=10)
    contracts, dataflow = _start_dataflow(st, predicted, background, nice=10)
    return _DuringTrace(predicted, checks, contracts, dataflow)


def _after_trace(st: _Stages, discovery: Discovery, trace: TraceResult, symbols: SymbolTable, upstream: UpstreamInfo | None,
                 base: UpstreamInfo | None, background: _Background, during: _DuringTrace | None, here: bool = False,
                 ) -> tuple[Callable[[], list[Finding]], tuple[Contracts | None, Forked[_FlowResult]]]:
    """The binding checks (waited for by the checks stage) and the dataflow child: what started during
    the trace when the trace widened discovery as predicted, the rest (or all of it) started now. With
    `here` the binding checks not started during the trace run in this process, computed once when first
    asked for (this process would otherwise wait for the compare child while they took the other core)."""
    from metax_audit.pipeline.incremental import same_files

    memo_common = _binding_memo_common(st, upstream, base)
    if during is not None and same_files(during.predicted, discovery):
        calls = background.fork(partial(_binding_checks, discovery, trace, symbols, st.memo, memo_common,
                                        calls_only=True))
        early = during.discovery_checks
        st.run.during_trace = True

        def binding() -> list[Finding]:
            first, second = early.result()
            return [*first, *calls.result(), *second]  # the order of binding_checks

        return binding, (during.contracts, during.dataflow)
    if during is not None:
        during.discovery_checks.close()
        during.dataflow.close()
    work = partial(_binding_checks, discovery, trace, symbols, st.memo, memo_common)
    if here:
        # the dataflow child at a smaller share than the compare child it shares the other core with: this process
        # waits for the compare right after the binding checks, for the dataflow only after the checks (0.2 s sooner)
        return functools.cache(work), _start_dataflow(st, discovery, background, nice=12)
    binding_child = background.fork(work)  # beside compare
    return binding_child.result, _start_dataflow(st, discovery, background)


def _binding_checks(discovery: Discovery, trace: TraceResult, symbols: SymbolTable, memo: Memo,
                    memo_common: list[str] | None = None, calls_only: bool = False) -> list[Finding]:
    from metax_audit.stages.checks import binding_checks

    return binding_checks(discovery, trace, symbols, memo=memo, memo_common=memo_common, calls_only=calls_only)


def _binding_memo_common(st: _Stages, upstream: UpstreamInfo | None, base: UpstreamInfo | None) -> list[str]:
    """What every caller file's call bindings depend on besides the port names they read (trace/memo.py)."""
    from metax_audit.cache.resultcache import upstream_identity

    return [upstream_identity(upstream), upstream_identity(base), repr(st.config)]


def _trace_stage(st: _Stages, discovery: Discovery, upstream: UpstreamInfo | None, symbols: SymbolTable | None = None,
                 ) -> tuple[Discovery, TraceResult]:
    """The traced backends; the discovery widened by the port files the trace reached."""
    from metax_audit.stages import discover as discover_mod
    from metax_audit.stages import trace as trace_mod

    with st.run.stage("trace", st.progress) as notes:
        from metax_audit.cache.resultcache import upstream_identity

        # Each backend and file is a unit of the trace memo, kept with what it read (trace/memo.py).
        memo_common = None if st.options.no_cache else ["trace", upstream_identity(upstream), repr(st.config)]
        from metax_audit.stages.trace.memo import MemoCount

        memo_count = MemoCount()
        trace = trace_mod.trace_backends(discovery, st.config, upstream.root if upstream else None, symbols, memo_common,
                                         memo_count, st.memo)
        if trace.reached_files:
            discovery = discover_mod.widen(discovery, st.snap.root, trace.reached_files, memo=st.memo)
            st.run.findings += discover_mod.coverage_findings(
                replace(discovery, files=tuple(f for f in discovery.files if f.reason == "reached-by-trace")))
        st.run.findings += trace_mod.trace_findings(trace)
        notes.append(f"{len(trace.backends)} backends, {len(trace.calls)} call sites, {len(trace.unresolved)} unresolved"
                     + (f"; {memo_count.note()}" if memo_count.note() else ""))
    return discovery, trace


# bindings, kernel-sources roots, their notes and seconds, bind's seconds, the index's answers (stack_pins.index_answers)
_PinsDone = tuple["list[StackBinding]", tuple[Path, ...], list[str], float, float, dict[tuple[str, str], tuple[Path | None, str]]]


class _PinsAhead:
    """stack_pins.bind (and the kernel-sources roots it reads) started before discover: its seconds are
    mostly waits on subprocesses and the package index (`pip config list`, a lookup of the public base
    of a pin that is not installed), which overlap discover and the trace. It runs in a forked child
    where it can: its imports for the index lookup (unearth, an SSL context with the CA bundle, about
    1 s of CPU) then stay off this process's GIL, and a live thread would keep every later stage from
    forking. Where fork is refused (another thread runs: a terminal's spinner) it runs on a thread.
    result() hands back what bind returned or re-raises what it raised; the stages are recorded by
    the caller where they ran before (kernel-sources, then stack-pins), so the report reads the same."""

    def __init__(self, st: _Stages, fork: Callable[[Callable[[], _PinsDone]], Forked[_PinsDone]]) -> None:
        self._st = st
        self._done: tuple[str, object, list[str], float, float] | None = None
        self._thread = None
        self._child: Forked[_PinsDone] | None = fork(self._compute)
        if not self._child.started:  # no fork here: a thread, whose waits still overlap the trace
            import threading

            self._child = None
            self._thread = threading.Thread(target=self._work, name="metax-audit-stack-pins", daemon=True)
            self._thread.start()

    def _compute(self) -> _PinsDone:
        from metax_audit.stages.introspect import stack_pins
        from metax_audit.stages.upstream import kernel_source_roots

        st, roots_seconds, begun = self._st, 0.0, time.perf_counter()
        roots_notes: list[str] = []
        roots: tuple[Path, ...] = ()
        if st.config.kernel_sources:
            roots = kernel_source_roots(st.config.kernel_sources, st.options.cache_dir, roots_notes)
            roots_seconds = time.perf_counter() - begun
        bindings = stack_pins.bind(st.snap.root, st.config, python=st.options.python,
                                   manifest=st.options.stack is not None, cache_dir=st.options.cache_dir,
                                   fetch=not st.options.extra_path, kernel_roots=roots,
                                   index_url=st.options.index_url, memo=st.memo)
        # the index's answers go back with the bindings: the baseline review asks the same again
        return (bindings, roots, roots_notes, roots_seconds, time.perf_counter() - begun - roots_seconds,
                stack_pins.index_answers())

    def _work(self) -> None:
        from metax_audit.stages.introspect import stack_pins

        try:
            bindings, roots, roots_notes, roots_seconds, seconds, answers = self._compute()
        except BaseException as exc:  # re-raised by result, in the review's own thread
            self._done = ("raised", exc, [], 0.0, 0.0)
            return
        stack_pins.keep_index_answers(answers)
        self._roots = roots
        self._done = ("ok", bindings, roots_notes, roots_seconds, seconds)

    def join(self) -> None:
        """Wait for the thread (a fork beside it is refused); a child is waited for by result()."""
        if self._thread is not None:
            self._thread.join()

    def result(self, st: _Stages) -> list[StackBinding]:
        if self._child is not None:
            child, self._child = self._child, None
            from metax_audit.stages.introspect import stack_pins

            try:  # a child that failed is run here (Forked), so an error is raised here as it would be
                bindings, roots, roots_notes, roots_seconds, seconds, answers = child.result()
            except BaseException as exc:
                self._done = ("raised", exc, [], 0.0, 0.0)
            else:
                stack_pins.keep_index_answers(answers)
                self._roots = roots
                self._done = ("ok", bindings, roots_notes, roots_seconds, seconds)
        self.join()
        assert self._done is not None
        how, value, roots_notes, roots_seconds, seconds = self._done
        if st.config.kernel_sources and st.run.kernel_roots is None and hasattr(self, "_roots"):
            st.run.kernel_roots = self._roots
            st.run.stages.append(StageRecord("kernel-sources", True, round(roots_seconds, 3), "; ".join(roots_notes)))
        if how == "raised":
            assert isinstance(value, BaseException)
            raise value
        self.seconds = seconds
        return value  # type: ignore[return-value]


def _start_stack_pins(st: _Stages, background: _Background) -> _PinsAhead | None:
    """The stack pins bound beside discover and the trace (None when the revision pins nothing: the
    stage then only says so)."""
    from metax_audit.stages.introspect import stack_pins

    if not stack_pins.read_pins(st.snap.root, st.config):
        return None
    return _PinsAhead(st, partial(background.fork, nice=0))


def _stack_pins_stage(st: _Stages, trace: TraceResult, ahead: _PinsAhead | None = None) -> tuple[StackBinding, ...]:
    """The kernel stack the reviewed revision pins, and what each pinned package is bound against. A
    package that cannot be bound stops the review (StackBindingError: exit 2, one line each) unless
    allow-unbound accepts it; then the report counts the calls into it that went unchecked. With
    `ahead` the bindings were computed on its thread (started before discover): the stage's seconds
    are then bind's own, which overlapped discover and the trace."""
    from metax_audit.core.errors import StackBindingError
    from metax_audit.stages.introspect import stack_pins

    if ahead is None and not stack_pins.read_pins(st.snap.root, st.config):
        st.run.skipped("stack-pins", f"no pin of {', '.join(st.config.kernel_modules)} in {', '.join(st.config.stack_files)}")
        return ()
    if ahead is not None:
        bindings = ahead.result(st)
    with st.run.stage("stack-pins", st.progress) as notes:
        if ahead is None:
            bindings = stack_pins.bind(st.snap.root, st.config, python=st.options.python,
                                       manifest=st.options.stack is not None, cache_dir=st.options.cache_dir,
                                       fetch=not st.options.extra_path, kernel_roots=_kernel_source_roots(st),
                                       index_url=st.options.index_url, memo=st.memo)
        st.run.findings += stack_pins.binding_findings(bindings)
        def calls_into(module: str) -> int:
            return sum(1 for c in trace.calls if c.resolved and (c.resolved == module or c.resolved.startswith(module + ".")))

        notes.append(", ".join(f"{b.pin.module} {b.pin.version}: {b.bound} ({calls_into(b.pin.module)} calls)" for b in bindings))
        allowed, origin = ((st.options.allow_unbound, "--allow-unbound") if st.options.allow_unbound is not None
                           else (st.config.allow_unbound, "allow-unbound in the config"))
        names = {stack_pins.canonical(a) for a in allowed}
        refused: list[str] = []
        for b in (b for b in bindings if b.bound == "unbound"):
            if not names & {stack_pins.canonical(b.pin.module), stack_pins.canonical(b.pin.distribution)}:
                refused.append(stack_pins.unbound_line(b))
                continue
            st.run.unbound.append(UnboundPackage(b.pin.module, f"{b.pin.distribution}=={b.pin.version}", b.pin.location,
                                                 b.why, calls_into(b.pin.module), origin))
            if b.kept_since and b.public and st.run.kept_misses is not None:
                st.run.kept_misses.append((b.public, b.pin.module))
                notes.append(f"{b.pin.module}: the index's answer of {b.kept_since} kept (asked again a day after)")
            else:
                st.run.kept_misses = None
        if refused:
            raise StackBindingError(refused)
    if ahead is not None:  # bind's own seconds, not the moment left here
        st.run.stages[-1] = replace(st.run.stages[-1], seconds=round(ahead.seconds, 3))
    return tuple(b for b in bindings if b.bound == "public-base")  # kernel-sources roots are static roots already


def _compare_stage(st: _Stages, discovery: Discovery, upstream: UpstreamInfo | None, base: UpstreamInfo | None,
                   ahead: CompareAhead | None = None) -> Comparison | None:
    if upstream is None:
        st.run.skipped("compare", "no upstream sources")
        return None
    with st.run.stage("compare", st.progress) as notes:
        from metax_audit.stages.compare.per_file import cached_compare

        comparison, compare_findings, work = (ahead and ahead.take(discovery, upstream, base, st.memo)) or cached_compare(
            discovery, st.config, upstream, base, memo=st.memo)
        st.run.findings += compare_findings
        notes.append(f"{len(comparison.files)} files, {sum(len(f.differences) for f in comparison.files)} differences"
                     + (f"; {work.ahead} compared during the trace, {work.files} after it" if work.ahead else "")
                     + (f"; {work.files} recomputed, the rest from the per-file cache"
                        if work.files + work.ahead < len(comparison.files) else "")
                     + (f"; of their functions {work.functions_reused} reused, {work.functions_compared} compared"
                        if work.functions_reused else "")
                     + ("; compared during the trace" if ahead and ahead.used else "")
                     + (" (started before discover)" if ahead and ahead.used and ahead.early else ""))
    return comparison


def _checks_stage(st: _Stages, discovery: Discovery, trace: TraceResult, comparison: Comparison | None,
                  upstream: UpstreamInfo | None, collect_facts: Callable[[], StackFacts | None],
                  binding: Callable[[], list[Finding]] = list, memo: FileMemo | None = None,
                  fork: Callable[..., Forked[Sequence[CallSite]]] | None = None) -> StackFacts | None:
    """The checks over trace and installed facts; returns the facts (waited for here) for the report.
    The trace of the upstream counterparts (upstream_calls, read only by the signature checks) runs in
    a child on the other core, with `fork`, while this process checks the ops and the capabilities."""
    with st.run.stage("checks", st.progress) as notes:
        from metax_audit.stages.checks import (
            absorb_consequences,
            check_capabilities,
            check_inactive_paths,
            check_omitted_keywords,
            checked_callers,
            checks_for_review,
            counterpart_paths,
            op_findings,
            op_table_for_review,
            upstream_calls,
        )

        facts = collect_facts()  # first: its waiting thread is gone before the fork (Forked never forks beside one)
        find_up_calls = partial(upstream_calls, comparison, upstream, st.config, memo=st.memo,
                                callers=checked_callers(trace, facts))
        up_calls_child = fork(find_up_calls, nice=0) if fork is not None else None  # waited for below: no lower share
        ops = op_table_for_review(discovery, st.config, upstream, facts, memo=st.memo)
        op_names = op_findings(discovery, st.config, upstream, facts, table=ops, memo=memo)
        capabilities = list(check_capabilities(discovery, trace, upstream_root=upstream.root if upstream else None,
                                               counterparts=counterpart_paths(comparison.files) if comparison else None, memo=memo,
                                               platform_path=st.config.platform_path))
        omitted = list(check_omitted_keywords(discovery.root, upstream.root if upstream else None,
                                              counterpart_paths(comparison.files) if comparison else {}, memo=memo))
        inactive = list(check_inactive_paths(discovery, comparison, trace))  # counted with the report's files
        # waited for once everything that does not read upstream's calls is done (the child's 0.5 s of a cold review)
        up_calls = up_calls_child.result() if up_calls_child is not None else find_up_calls()
        stack = list(checks_for_review(discovery, trace, facts, upstream_calls=up_calls, vendor_ops=ops, memo=memo))
        # The forked binding checks are waited for last, once the work above is done (same order of findings).
        found = [*stack, *binding(), *op_names, *capabilities, *omitted]
        st.run.findings = absorb_consequences([*st.run.findings, *found])
        notes.append(f"{len(found)} findings" + (f"; {memo.describe()}" if memo is not None and memo.hits else "")
                     + ("; imports and attributes checked during the trace" if st.run.during_trace else ""))
        st.run.findings += inactive
    return facts


def _dataflow_stage(st: _Stages, contracts: Contracts | None, dataflow: Forked[_FlowResult],
                    ) -> list[LseFlow]:
    if contracts is None:
        dataflow.close()
        from metax_audit.core.contracts import default_contracts_path

        st.run.skipped("dataflow", f"no contracts file at {default_contracts_path()}: conventions unknown")
        return []
    with st.run.stage("dataflow", st.progress) as notes:
        # The findings come from the forked child; their rules (help text for SARIF and Markdown)
        # are declared when the checks package is imported, so here as well.
        import metax_audit.stages.checks  # noqa: F401

        flows, flow_findings, flow_unresolved = dataflow.result()
        st.run.findings += flow_findings
        notes.append(f"{len(flows)} LSE flows, {len(flow_findings)} mismatched, {len(flow_unresolved)} not followed"
                     + ("; followed during the trace" if st.run.during_trace else ""))
    return flows


def _probe_stage(st: _Stages, trace: TraceResult, flows: Sequence[LseFlow]) -> list[ProbeResult]:
    if not st.options.run_probes:
        st.run.skipped("probe", "not requested (review --probe runs the probes the findings name)")
        return []
    with st.run.stage("probe", st.progress) as notes:
        probe_results = _probes_for(trace, flows, st.options, notes, (st.config.port_package,))
        from metax_audit.stages.probing import probe_findings

        st.run.findings += probe_findings(probe_results)
    return probe_results


def _test_stage(st: _Stages) -> TestRun | None:
    """--test: the user's test command on the snapshot; a failing run is a finding."""
    if not st.options.test_command:
        return None
    with st.run.stage("test", st.progress, st.options.test_command) as notes:
        from metax_audit.core.findings import make_finding
        from metax_audit.core.models import Location
        from metax_audit.stages.snapshot import run_test_command

        test_run = run_test_command(st.options.test_command, st.snap.root)
        notes.append(f"exit {test_run.exit_code}")
        if test_run.exit_code != 0:
            st.run.findings.append(make_finding(
                "MXA003", Location("."), f"`{test_run.command}` exited {test_run.exit_code} on the snapshot",
                (test_run.output_tail[-1500:],)))
    return test_run


def _introspect(st: _Stages, discovery: Discovery, trace: TraceResult, upstream: UpstreamInfo | None,
                background: _Background, stand_ins: Sequence[StackBinding] = ()) -> Callable[[], StackFacts | None]:
    """Start introspection; returns the function that waits for its facts and records the stage.

    The worker is a subprocess on a core of its own, so compare and the upstream trace run while it
    imports the stack; the thread here only waits on its pipe. Facts of an unchanged stack come
    from the on-disk cache (not with --extra-path stub stacks, which are for tests and the demo)."""
    from metax_audit.stages import introspect as introspect_mod
    from metax_audit.stages.introspect import stack_pins

    config, options, run, progress = st.config, st.options, st.run, st.progress
    options = replace(options, static_roots=(st.snap.root, *((upstream.root,) if upstream and upstream.root else ()),
                                             *options.static_roots, *_kernel_source_roots(st)))
    targets = introspect_mod.stack_targets(discovery, trace, config.kernel_modules, memo=st.memo)
    prestarted = background.prestarted
    if prestarted is not None and not targets:
        prestarted.discard()
    if options.stack is not None:
        with run.stage("introspect", progress, f"manifest {options.stack}") as notes:
            manifest = introspect_mod.load_manifest(options.stack)
            notes.append(f"{len(manifest.facts)} callables from manifest captured {manifest.captured_at} on {manifest.host}")
        return lambda: manifest
    if not targets:
        run.skipped("introspect", "the trace reached no external kernel entry point")
        return lambda: None
    progress.stage("introspect", f"{len(targets)} entry points")
    started = time.perf_counter()
    # The port is read from the snapshot, never imported: an installed copy is not what is under review.
    # So is a kernel package bound to the public base of its pinned vendor build (stack_pins).
    never_import = (config.port_package, *(b.pin.module for b in stand_ins))
    static_roots = (*options.static_roots, *(b.root for b in stand_ins if b.root is not None))
    cache: bool | introspect_mod.CachePlan = False
    if not options.extra_path:
        cache = introspect_mod.plan_cache(targets, python=options.python, extra_path=options.extra_path,
                                          static_roots=static_roots, never_import=never_import,
                                          op_namespaces=config.op_namespaces)

    def work() -> StackFacts:
        facts = introspect_mod.introspect(targets, python=options.python, timeout=options.introspect_timeout,
                                          extra_path=options.extra_path, static_roots=static_roots,
                                          never_import=never_import, cache=cache, prestarted=prestarted,
                                          op_namespaces=config.op_namespaces)
        return stack_pins.mark_stand_ins(facts, stand_ins, config.vendor_extends)

    return background.thread("introspect", work, _introspect_notes, started)


def _introspect_notes(facts: StackFacts) -> list[str]:
    by_status: dict[str, int] = {}
    for fact in facts.facts.values():
        by_status[fact.status] = by_status.get(fact.status, 0) + 1
    notes = [", ".join(f"{v} {k}" for k, v in sorted(by_status.items()))]
    if facts.cache_entry:
        notes.append(f"facts from the stack cache (captured {facts.captured_at})")
    notes.append("ran alongside compare")  # its seconds overlap the next stages
    return notes


def _probes_for(trace: TraceResult, flows: Sequence[LseFlow], options: ReviewOptions, notes: list[str],
                port_packages: Sequence[str]) -> list[ProbeResult]:
    """The probes of every traced kernel with a built-in adapter, plus the probe each LSE flow
    names to confirm its verdict; each (target, family, probe) runs once."""
    from metax_audit.stages.probing import run_probes, targets_from_trace

    plan: dict[tuple[str, str], set[str]] = {}
    for chain in trace.backends:
        for target, family in targets_from_trace(chain):
            plan.setdefault((target, family), set())  # empty: every probe that applies
    for request in (r for flow in flows for r in flow.probes):
        key = (request.target, request.family)
        if key not in plan:
            plan[key] = set(request.probes)
        elif plan[key]:  # an empty set already means every probe
            plan[key].update(request.probes)
    results: list[ProbeResult] = []
    for (target, family), probes in sorted(plan.items()):
        results += run_probes(target=target, family=family, probes=tuple(sorted(probes)), python=options.python,
                              extra_path=options.extra_path, port_packages=port_packages)
    notes.append(f"{len(results)} probe results over {len(plan)} targets")
    return results

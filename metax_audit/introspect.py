# Installed-stack introspection: runs the introspect_worker package with the target interpreter in a
# subprocess (a hang or crash of the audited kernel package is a fact), and reads/writes manifests.
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

from metax_audit import subproc, tempdirs
from metax_audit.errors import IntrospectError, SubprocessError
from metax_audit.models import CallableFact, Discovery, FactStatus, ParamFact, StackFacts, TraceResult

WORKER = Path(__file__).with_name("introspect_worker") / "__main__.py"
# The port packages the worker must refuse (JSON list); read by introspect_worker.fence.enter_site, a
# standalone script this module never imports.
FENCE_ENV = "METAX_AUDIT_NEVER_IMPORT"
MANIFEST_SCHEMA = "metax-audit/stack/v1"
_FACT_FIELDS = {f.name for f in fields(CallableFact)}
# Cache/JIT directories of the usual kernel stack (XDG, torch extensions, Triton, FlashInfer).
_CACHE_VARS = ("XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def introspect(
    targets: Sequence[str],
    *,
    python: str | None = None,
    timeout: float = 120,
    extra_path: Sequence[Path] = (),
    static_roots: Sequence[Path] = (),
    never_import: Sequence[str] = (),
    cache: bool | CachePlan = False,
    prestarted: Prestarted | None = None,
    op_namespaces: Mapping[str, str] = {},  # read only: torch.ops namespace -> package documenting its schemas
) -> StackFacts:
    """Facts about each dotted target as the interpreter `python` sees it (default: this one).

    With `cache`, what the worker learns by importing the stack is kept on disk (see
    stack_cache_dir) and served again while the interpreter, its installed distributions and the
    static roots are unchanged; the port's own targets are always read afresh.

    Targets whose top-level package is in `never_import` (the port under review) are read
    statically from `static_roots` only (the snapshot), never imported.

    Every target gets a fact: "ok" (import or static), "import-error", "not-found",
    "no-signature", "timeout" or "crash". A target whose import hangs or kills the worker is
    recorded and the worker restarted for the rest; targets of the same top-level package are
    then read statically (importing it again would hang again). Raises IntrospectError only
    when the interpreter itself cannot be run.

    `prestarted` (see prestart) serves the first worker run when it was started for this
    interpreter and extra_path, and is discarded otherwise (also on a cache hit).
    """
    interpreter = python or sys.executable
    wanted = list(dict.fromkeys(targets))
    if cache:
        plan = cache if isinstance(cache, CachePlan) else plan_cache(
            wanted, python=interpreter, extra_path=extra_path, static_roots=static_roots, never_import=never_import,
            op_namespaces=op_namespaces)
        return _introspect_cached(wanted, interpreter, timeout, extra_path, static_roots, never_import, plan,
                                  prestarted, op_namespaces)
    if prestarted is not None and not prestarted.fits(interpreter, extra_path):
        prestarted.discard()
        prestarted = None
    facts: dict[str, CallableFact] = {}
    meta: dict[str, Any] = {}
    distributions: dict[str, dict[str, str]] = {}
    poisoned: dict[str, tuple[FactStatus, str]] = {}  # top-level package -> (status, error) of a hang/crash
    remaining = wanted
    while remaining:
        static_only = [t for t in remaining if t.split(".")[0] in poisoned]
        live = [t for t in remaining if t.split(".")[0] not in poisoned]
        if static_only:
            _run_worker(interpreter, static_only, extra_path, static_roots, timeout, True, facts, meta, distributions,
                        never_import, op_namespaces=op_namespaces)
            for t in static_only:
                status, error = poisoned[t.split(".")[0]]
                fact = facts.get(t)
                if fact is None or fact.status != "ok":
                    # a static "not-found" is weaker than what we know: importing it hung or crashed
                    note = f"; static read: {fact.status} {fact.error or ''}".rstrip() if fact is not None else ""
                    facts[t] = CallableFact(target=t, status=status, source="import", error=error + note)
                else:
                    facts[t] = _replace(fact, error=f"{error}; read statically" + (f": {fact.error}" if fact.error else ""))
        if not live:
            break
        outcome = _run_worker(interpreter, live, extra_path, static_roots, timeout, False, facts, meta, distributions,
                              never_import, prestarted, op_namespaces)
        prestarted = None  # used once; a restart after a hang or crash starts afresh
        if outcome is None:
            break
        culprit, status, error = outcome[0], cast(FactStatus, outcome[1]), outcome[2]  # the worker's word
        facts.pop(culprit, None)
        poisoned[culprit.split(".")[0]] = (status, error)
        remaining = [t for t in live if t not in facts]
    return StackFacts(
        python=str(meta.get("python") or interpreter),
        captured_at=str(meta.get("captured_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
        host=str(meta.get("host") or ""),
        facts={t: facts[t] for t in wanted if t in facts},
        distributions=distributions,
        source="import",
        torch_ops=_ops_json(meta.get("torch_ops")),
    )


def _ops_json(data: Any) -> dict[str, tuple[str, ...]] | None:
    """The torch.ops namespaces of a worker's done event or a manifest, {ns: (op, ...)} (None: not captured)."""
    if not isinstance(data, dict):
        return None
    return {str(ns): tuple(str(o) for o in ops) for ns, ops in data.items() if isinstance(ops, list)}


def stack_targets(discovery: Discovery, trace: TraceResult, packages: Sequence[str]) -> list[str]:
    """What introspection should look at: the trace's kernel entry points plus every name the
    port imports from the kernel `packages` (so the import check sees private helpers too)."""
    from metax_audit.pysource import imported_names
    from metax_audit.trace import kernel_entry_points

    paths = [f.path for f in discovery.files if f.parse_error is None]
    names = [i.target for i in imported_names(discovery.root, paths, packages)]
    return list(dict.fromkeys([*kernel_entry_points(trace), *names]))


def _run_worker(
    interpreter: str,
    targets: list[str],
    extra_path: Sequence[Path],
    static_roots: Sequence[Path],
    timeout: float,
    static_only: bool,
    facts: dict[str, CallableFact],
    meta: dict[str, Any],
    distributions: dict[str, dict[str, str]],
    never_import: Sequence[str] = (),
    prestarted: Prestarted | None = None,
    op_namespaces: Mapping[str, str] = {},  # read only
) -> tuple[str, str, str] | None:
    """Run one worker (or finish `prestarted`); fill `facts`. Returns (target, status, error) when
    it hung or died on one."""
    request = {
        "targets": targets,
        "extra_path": [str(p) for p in extra_path],
        "static_roots": [str(p) for p in static_roots],
        "static_only": static_only,
        "never_import": list(never_import),
        "op_namespaces": dict(op_namespaces),
    }
    if prestarted is not None:
        done = prestarted.finish(json.dumps(request), timeout)
    else:
        with _sandbox(never_import) as (cwd, env):
            done = subproc.run(worker_command(interpreter), cwd=cwd, env=env, timeout=timeout,
                               input=json.dumps(request))
    current: str | None = None
    finished = False
    preloading: str | None = None  # the package a prestarted worker was importing ahead of the targets
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.pop("event", None)
        if kind == "start":
            current = event.get("target")
        elif kind == "fact":
            facts[event["target"]] = fact_from_json(event)
            current = None
        elif kind == "done":
            finished = True
            distributions.update(event.get("distributions") or {})
            meta.update(event)
        elif kind == "preload":
            preloading = str(event.get("module"))
        elif kind == "preloaded":
            preloading = None
    if finished:
        return None
    if prestarted is not None and current is None and not any(t in facts for t in targets):
        # It failed before reaching a target, importing a kernel package ahead of time. A hang is
        # the first target of that package's hang (waiting it out again would double the wait);
        # anything else is run again the ordinary way, which attributes it to its target.
        top = (preloading or "").split(".")[0]
        culprit = next((t for t in targets if done.timed_out and top and t.split(".")[0] == top), None)
        if culprit is not None:
            return culprit, "timeout", f"importing or inspecting it did not finish within {timeout:g} s"
        return _run_worker(interpreter, targets, extra_path, static_roots, timeout, static_only, facts, meta,
                           distributions, never_import, op_namespaces=op_namespaces)
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])[:500]
    if current is None:
        if not any(t in facts for t in targets):
            raise IntrospectError(
                f"the introspection worker did not start under {interpreter} (exit {done.returncode}): {tail or 'no output'}; "
                "check --python points at a working interpreter"
            )
        current = next((t for t in targets if t not in facts), None)
        if current is None:
            return None
    if done.timed_out:
        return current, "timeout", f"importing or inspecting it did not finish within {timeout:g} s"
    return current, "crash", f"the worker died (exit {done.returncode}) on it: {tail or 'no stderr'}"


def worker_command(interpreter: str) -> list[str]:
    """The worker's command line: -S so that site (its .pth files and any sitecustomize) only runs
    inside the worker once the fence against the port stands (introspect_worker.fence.enter_site)."""
    return [interpreter, "-B", "-S", str(WORKER)]


@contextmanager
def _sandbox(never_import: Sequence[str] = ()) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty temp dir as the worker's cwd, so nothing is imported from, or written into, the
    user's tree; caches that kernel packages create at import time (JIT logs, build dirs) go there
    too, so capturing facts leaves the user's home and site-packages as they were."""
    with tempdirs.scratch("introspect") as cwd:
        sandbox = {name: str(Path(cwd) / "cache") for name in _CACHE_VARS}
        yield Path(cwd), {**subproc.PYTHON_ENV, FENCE_ENV: json.dumps(sorted(set(never_import))), **sandbox}


class Prestarted:
    """A worker started before its targets are known, importing the kernel packages meanwhile.
    introspect(prestarted=...) finishes it; discard() stops it when it is not needed."""

    def __init__(self, started: subproc.Started, sandbox: ExitStack, interpreter: str,
                 extra_path: Sequence[Path]) -> None:
        self._started: subproc.Started | None = started
        self._sandbox = sandbox
        self._interpreter = interpreter
        self._extra_path = [str(p) for p in extra_path]

    def fits(self, interpreter: str, extra_path: Sequence[Path]) -> bool:
        return interpreter == self._interpreter and [str(p) for p in extra_path] == self._extra_path

    def finish(self, request: str, timeout: float) -> subproc.Completed:
        """The worker's output once it answered `request`; the timeout counts from now."""
        assert self._started is not None, "a prestarted worker serves one request"
        started, self._started = self._started, None
        try:
            return started.finish(request, timeout)
        finally:
            self._sandbox.close()

    def discard(self) -> None:
        if self._started is not None:
            started, self._started = self._started, None
            started.kill()
            self._sandbox.close()


def prestart(preload: Sequence[str], *, python: str | None = None, extra_path: Sequence[Path] = (),
             never_import: Sequence[str] = ()) -> Prestarted | None:
    """Start a worker that imports `preload` (the kernel packages) while the caller finds the
    targets; None when it cannot be started (the ordinary run then reports why)."""
    interpreter = python or sys.executable
    stack = ExitStack()
    cwd, env = stack.enter_context(_sandbox(never_import))
    head = json.dumps({"preload": list(preload), "extra_path": [str(p) for p in extra_path]}) + "\n"
    try:
        started = subproc.start(worker_command(interpreter), cwd=cwd, env=env, first_input=head)
    except SubprocessError:
        stack.close()
        return None
    return Prestarted(started, stack, interpreter, extra_path)


def _replace(fact: CallableFact, **changes: Any) -> CallableFact:
    from dataclasses import replace

    return replace(fact, **changes)


def fact_from_json(data: dict[str, Any]) -> CallableFact:
    """A CallableFact from worker or manifest JSON; unknown keys (kind, wrapped, ...) are dropped."""
    values = {k: v for k, v in data.items() if k in _FACT_FIELDS}
    if values.get("params") is not None:
        values["params"] = tuple(ParamFact(p["name"], p["kind"], p.get("default")) for p in values["params"])
    if values.get("kwargs_reads") is not None:
        values["kwargs_reads"] = tuple(values["kwargs_reads"])
    values.setdefault("source", "import")
    values.setdefault("status", "crash")
    return CallableFact(**values)


def write_manifest(facts: StackFacts, path: Path) -> None:
    """Write the stack manifest `review --stack` reads on a machine without the vendor stack."""
    data = {
        "schema": MANIFEST_SCHEMA,
        "python": facts.python,
        "captured_at": facts.captured_at,
        "host": facts.host,
        "captured_from": facts.source,
        "distributions": facts.distributions,
        "facts": {t: _fact_json(f) for t, f in sorted(facts.facts.items())},
    }
    if facts.torch_ops is not None:
        data["torch_ops"] = {ns: list(ops) for ns, ops in facts.torch_ops.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise IntrospectError(f"cannot write the stack manifest {path}: {exc.strerror}") from exc


def _fact_json(fact: CallableFact) -> dict[str, Any]:
    data = asdict(fact)
    return {k: v for k, v in data.items() if v is not None}  # () means "none", None "unknown": keep both apart


def load_manifest(path: Path) -> StackFacts:
    """Read a stack manifest; its facts keep the source they were captured with (import/static)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise IntrospectError(f"cannot read the stack manifest {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise IntrospectError(f"{path} is not JSON ({exc}); capture it with `metax-audit evidence --capture-stack`") from exc
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA or not isinstance(data.get("facts"), dict):
        raise IntrospectError(f"{path} is not a metax-audit stack manifest (expected schema {MANIFEST_SCHEMA})")
    try:
        facts = {t: fact_from_json({**f, "target": t}) for t, f in data["facts"].items()}
    except (TypeError, KeyError) as exc:
        raise IntrospectError(f"{path}: malformed fact ({exc}); capture the manifest again") from exc
    return StackFacts(
        python=str(data.get("python", "")),
        captured_at=str(data.get("captured_at", "")),
        host=str(data.get("host", "")),
        facts=facts,
        distributions=data.get("distributions") or {},
        source=f"manifest:{path}",
        torch_ops=_ops_json(data.get("torch_ops")),
    )


# ---------------------------------------------------------------- on-disk cache of stack facts
# Importing the kernel stack (flashinfer pulls in torch) costs seconds on every review although the
# stack rarely changes; the facts are kept per (interpreter, targets, fingerprint of what the
# worker could read). The fingerprint is conservative: any install, upgrade or removal in a
# site-packages directory, or any file change under an editable/extra/static package, invalidates.

CACHE_SCHEMA = "metax-audit/stack-cache/v5"  # v2: static schemas of C++-registered ops (op-namespaces)
_UNCACHEABLE = {"timeout", "crash"}  # may be load or a flaky import: try again next time


def stack_cache_dir() -> Path:
    """`<cache>/stack`, the cache being $METAX_AUDIT_CACHE or ~/.cache/metax-audit."""
    from metax_audit.cachedir import cache_root

    return cache_root() / "stack"


@dataclass(frozen=True)
class CachePlan:
    """Which targets introspect(cache=...) may serve from the stack cache, and the entry that holds
    them. Computing it stats every distribution: do it on the calling thread, not on one that
    competes for the GIL with busy static stages (each stat there waits for a GIL switch)."""

    port: tuple[str, ...]  # the port's own targets: always read afresh from the snapshot
    stack: tuple[str, ...]
    roots: tuple[Path, ...]  # the static roots that can matter to `stack`
    entry: Path | None  # None: the fingerprint could not be taken, nothing is cached
    marker: Path | None = None  # see stack_seen


def plan_cache(
    targets: Sequence[str],
    *,
    python: str | None = None,
    extra_path: Sequence[Path] = (),
    static_roots: Sequence[Path] = (),
    never_import: Sequence[str] = (),
    op_namespaces: Mapping[str, str] = {},  # read only
) -> CachePlan:
    """The stack-cache entry for these targets as `python` would see them (see introspect)."""
    interpreter = python or sys.executable
    wanted = list(dict.fromkeys(targets))
    own = {t.split(".")[0] for t in never_import}
    port = [t for t in wanted if t.split(".")[0] in own]
    stack = [t for t in wanted if t.split(".")[0] not in own]
    # The snapshot is a fresh temp dir each run: it only matters to the stack targets when it holds
    # one of their packages, so otherwise it stays out of their request and of the key.
    tops = sorted({t.split(".")[0] for t in stack})
    roots = [Path(r) for r in static_roots if not any((Path(r) / o).exists() for o in own)
             or any((Path(r) / t).exists() or (Path(r) / f"{t}.py").exists() for t in tops)]
    # the namespaces change what the worker answers for ops whose library is not loaded: part of the key
    keyed = [*stack, *(f"op-namespace:{k}={v}" for k, v in sorted(op_namespaces.items()))]
    keys = _cache_keys(interpreter, keyed, extra_path, roots, tops) if stack else None
    if keys is None:
        return CachePlan(tuple(port), tuple(stack), tuple(roots), None)
    return CachePlan(tuple(port), tuple(stack), tuple(roots), stack_cache_dir() / f"{keys[0]}.json",
                     stack_cache_dir() / f"{keys[1]}.seen")


def stack_seen(*, python: str | None = None, extra_path: Sequence[Path] = ()) -> bool:
    """Whether facts were cached for this interpreter with its distributions as they are now, so
    this review will likely be served from the cache. Only a hint, for deciding whether to
    prestart a worker: a wrong answer costs time, never facts (the cache entry decides)."""
    key = stack_identity(python, tuple(extra_path))  # one --sys-path subprocess per review, shared
    return key is not None and (stack_cache_dir() / f"{key}.seen").is_file()


@functools.cache
def stack_identity(python: str | None, extra_path: tuple[Path, ...] = ()) -> str | None:
    """The kernel stack as `python` sees it now (interpreter, distributions, extra path): the key
    part of the stack_seen marker, for result caches; None when it cannot be taken."""
    keys = _cache_keys(python or sys.executable, [], extra_path, [], [])
    return keys[1] if keys else None


def _write_marker(path: Path) -> None:
    with contextlib.suppress(OSError):  # see _write_cache
        path.write_text("", encoding="utf-8")


def _introspect_cached(
    wanted: list[str], interpreter: str, timeout: float, extra_path: Sequence[Path], static_roots: Sequence[Path],
    never_import: Sequence[str], plan: CachePlan, prestarted: Prestarted | None = None,
    op_namespaces: Mapping[str, str] = {},  # read only
) -> StackFacts:
    port, stack, roots, path = list(plan.port), list(plan.stack), list(plan.roots), plan.entry
    facts: dict[str, CallableFact] = {}
    parts: list[StackFacts] = []
    cached: Path | None = None
    hit = _read_cache(path) if stack and path is not None else None
    if hit is not None or not stack:
        cached = path if hit is not None else None
        if prestarted is not None:
            prestarted.discard()
    else:
        hit = introspect(stack, python=interpreter, timeout=timeout, extra_path=extra_path, static_roots=roots,
                         prestarted=prestarted, op_namespaces=op_namespaces)
        if path is not None and not any(f.status in _UNCACHEABLE for f in hit.facts.values()):
            _write_cache(hit, path)
            if plan.marker is not None:
                _write_marker(plan.marker)
    if hit is not None:
        parts.append(hit)
    if port:
        parts.append(introspect(port, python=interpreter, timeout=timeout, extra_path=extra_path,
                                static_roots=static_roots, never_import=never_import))
    for part in parts:
        facts.update(part.facts)
    first = parts[-1] if parts else None
    distributions: dict[str, dict[str, str]] = {}
    for part in parts:
        distributions.update(part.distributions)
    return StackFacts(
        python=first.python if first else interpreter,
        captured_at=parts[0].captured_at if parts else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=first.host if first else "",
        facts={t: facts[t] for t in wanted if t in facts},
        distributions=distributions,
        source="import",
        cache_entry=str(cached) if cached is not None else None,
    )


def _cache_keys(interpreter: str, targets: list[str], extra_path: Sequence[Path], roots: Sequence[Path],
                tops: list[str]) -> tuple[str, str] | None:
    """sha256 of everything the worker's answers depend on, and of the part of it known before the
    trace (the interpreter and its distributions: the stack_seen marker); None when the
    interpreter's path cannot be read (then nothing is cached)."""
    import hashlib

    try:
        with _sandbox() as (cwd, env):
            done = subproc.run([*worker_command(interpreter), "--sys-path"], cwd=cwd, env=env, timeout=30)
        sys_path = [str(p) for p in json.loads(done.stdout)]
    except (SubprocessError, ValueError, TypeError):
        return None  # the worker run reports a broken interpreter in its own words
    real = Path(shutil.which(interpreter) or interpreter).resolve()  # a bare "python3" is found on PATH
    try:
        st = real.stat()
    except OSError:
        return None
    paths = [*(str(p) for p in extra_path), *sys_path]
    data = {
        "schema": CACHE_SCHEMA,
        "interpreter": [interpreter, str(real), st.st_size, st.st_mtime_ns],
        "targets": targets,
        "extra_path": [str(p) for p in extra_path],
        "static_roots": [str(p) for p in roots],
        "path": [_path_entry_fingerprint(Path(p), tops) for p in paths if p],
        "roots": [_tree_fingerprint(Path(r)) for r in roots],
    }
    seen = {**data, "targets": [], "static_roots": [], "roots": [],
            "path": [_path_entry_fingerprint(Path(p), []) for p in paths if p] if tops else data["path"]}
    return tuple(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:32]  # type: ignore[return-value]
                 for d in (data, seen))


def _path_entry_fingerprint(entry: Path, tops: list[str]) -> list[Any]:
    """What of one sys.path entry the worker can see: each distribution's metadata (pip rewrites
    RECORD on every install), .pth files, and the target packages found there; packages without
    installed metadata beside them (editable checkouts, --extra-path) by every file's stat."""
    try:
        names = sorted(os.listdir(entry))
    except OSError:
        return [str(entry), None]
    dists = []
    for name in names:
        if name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")):
            meta = entry / name
            for candidate in (meta / "RECORD", meta / "PKG-INFO", meta / "METADATA", meta):
                try:
                    cst = candidate.stat()
                except OSError:
                    continue
                dists.append([name, candidate.name, cst.st_size, cst.st_mtime_ns])
                break
            if name.endswith(".dist-info"):
                source = _editable_source(meta, tops)
                if source is not None:  # RECORD does not change when the checkout's files do
                    dists.append([name, "editable", _tree_fingerprint(source, (".py", ".so", ".pyd"))])
    installed = any(n.endswith(".dist-info") for n in names)
    found = []
    for top in tops:
        for cand in (entry / top, entry / f"{top}.py"):
            if cand.exists():
                found.append([top, cand.name, _dir_stat(cand) if installed else _tree_fingerprint(cand)])
    return [str(entry), dists, found]


def _editable_source(meta: Path, tops: list[str]) -> Path | None:
    """The project directory of an editable install (PEP 660 direct_url.json) that provides one of
    `tops`, judged by its top_level.txt or its distribution name."""
    try:
        direct = json.loads((meta / "direct_url.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if not (isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable")) or not url.startswith("file://"):
        return None
    try:
        provided = set((meta / "top_level.txt").read_text(encoding="utf-8").split())
    except OSError:
        provided = set()
    dist = meta.name.split("-")[0].lower().replace(".", "_")
    if not any(t in provided or dist.startswith(t.lower()) for t in tops):
        return None
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path))


def _dir_stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _tree_fingerprint(root: Path, suffixes: tuple[str, ...] | None = None) -> list[Any]:
    """(files, total size, newest mtime) under `root` (only names ending in `suffixes` when given):
    one stat per file, no reads; hidden directories and __pycache__ are skipped."""
    if root.is_file():
        st = root.stat()
        return [str(root), 1, st.st_size, st.st_mtime_ns]
    count = size = newest = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if suffixes is not None and not name.endswith(suffixes):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            count, size, newest = count + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return [str(root), count, size, newest]


def _read_cache(path: Path) -> StackFacts | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != CACHE_SCHEMA:
            return None
        facts = {t: fact_from_json({**f, "target": t}) for t, f in data["facts"].items()}
        return StackFacts(python=str(data["python"]), captured_at=str(data["captured_at"]), host=str(data["host"]),
                          facts=facts, distributions=data.get("distributions") or {}, source="import")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a missing or damaged entry is a miss


def _write_cache(facts: StackFacts, path: Path) -> None:
    data = {
        "schema": CACHE_SCHEMA,
        "python": facts.python,
        "captured_at": facts.captured_at,
        "host": facts.host,
        "distributions": facts.distributions,
        "facts": {t: _fact_json(f) for t, f in facts.facts.items()},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent review reads the old entry or the new one
    except OSError:
        pass  # a read-only cache only costs the next run its speed

# The introspect stage: the targets of the traced kernels, and a fact for each from the worker
# (or the stack cache); a hang or crash poisons its package, whose other targets are read statically.
from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from metax_audit.core.models import CallableFact, Discovery, FactStatus, StackFacts, TraceResult
from metax_audit.core.pysource import ImportedName
from metax_audit.stages.introspect.cache import (
    _UNCACHEABLE,
    CachePlan,
    _read_cache,
    _write_cache,
    _write_marker,
    plan_cache,
)
from metax_audit.stages.introspect.manifest import _ops_json, _replace
from metax_audit.stages.introspect.process import Prestarted, _run_worker

if TYPE_CHECKING:
    from metax_audit.core.memo import Memo, Products


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
    return _introspect_live(wanted, interpreter, timeout, extra_path, static_roots, never_import, prestarted,
                            op_namespaces)


def _introspect_live(
    wanted: list[str], interpreter: str, timeout: float, extra_path: Sequence[Path], static_roots: Sequence[Path],
    never_import: Sequence[str], prestarted: Prestarted | None, op_namespaces: Mapping[str, str],
) -> StackFacts:
    """introspect() without the cache: worker runs until every target has a fact; a target that
    hangs or crashes the worker poisons its package, whose remaining targets are read statically."""
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


def stack_targets(discovery: Discovery, trace: TraceResult, packages: Sequence[str], *,
                  memo: Memo | None = None) -> list[str]:
    """What introspection should look at: the trace's kernel entry points plus every name the
    port imports from the kernel `packages` (so the import check sees private helpers too).
    Each file's imports are asked of `memo` under its bytes (kept between reviews by the pipeline's)."""
    from metax_audit.core.pysource import imported_names
    from metax_audit.stages.trace import kernel_entry_points

    paths = [f.path for f in discovery.files if f.parse_error is None]
    if memo is not None and memo.enabled:
        from metax_audit.core.memo import Kind

        products = memo.products(Kind.INTROSPECT_IMPORTS, sorted(packages))
        found = sorted((i for p in paths for i in _file_imports(discovery.root, p, packages, products)),
                       key=lambda i: (i.path, i.line))
        products.save()
    else:
        found = imported_names(discovery.root, paths, packages)
    return list(dict.fromkeys([*kernel_entry_points(trace), *(i.target for i in found)]))


def _file_imports(root: Path, path: str, packages: Sequence[str], products: Products) -> list[ImportedName]:
    """imported_names of one file, kept under its bytes: reading it again needs its whole syntax tree
    walked (0.1 s over the real port's 34 files, each review)."""
    from metax_audit.core.pysource import imported_names

    try:
        data = (root / path).read_bytes()
    except OSError:
        return imported_names(root, [path], packages)
    return products.get(path, data, lambda: imported_names(root, [path], packages))


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
        here = _read_port_here(port, interpreter, static_roots)
        parts.append(here if here is not None else introspect(
            port, python=interpreter, timeout=timeout, extra_path=extra_path, static_roots=static_roots,
            never_import=never_import))
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


def _read_port_here(targets: list[str], interpreter: str, static_roots: Sequence[Path]) -> StackFacts | None:
    """The port's own targets read in this process, by the worker's code (introspect_worker.static.
    port_target) and through the JSON it would print: the port is never imported, only read from the
    static roots, so a worker process of the same interpreter binary (its parser, its ast.unparse)
    answers the same; starting one cost 0.1-0.15 s of CPU every review. None, and the worker reads
    them, when the interpreter is another binary, a static root is relative (the worker runs in an
    empty directory), or a re-export chain leaves the port for a package the worker would also look
    for on its interpreter's path."""
    import json
    import shutil
    import socket

    from metax_audit.stages.introspect.manifest import fact_from_json
    from metax_audit.stages.introspect_worker.static import NeedsInterpreter, port_target

    try:
        same = Path(shutil.which(interpreter) or interpreter).resolve() == Path(sys.executable).resolve()
    except (OSError, RuntimeError):
        return None
    roots = [str(p) for p in static_roots]
    if not same or not all(Path(r).is_absolute() for r in roots):
        return None
    facts: dict[str, CallableFact] = {}
    for target in targets:
        try:
            fact = port_target(target, roots, offline=True)
        except NeedsInterpreter:
            return None
        facts[target] = fact_from_json(json.loads(json.dumps(fact, default=str)))  # as the worker prints it
    return StackFacts(python=interpreter, captured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      host=socket.gethostname(), facts=facts, distributions={}, source="import")

# Installed-stack introspection: runs introspect_worker.py with the target interpreter in a
# subprocess (a hang or crash of the audited kernel package is a fact), and reads/writes manifests.
from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from metax_audit import subproc
from metax_audit.errors import IntrospectError
from metax_audit.models import CallableFact, Discovery, ParamFact, StackFacts, TraceResult

WORKER = Path(__file__).with_name("introspect_worker.py")
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
) -> StackFacts:
    """Facts about each dotted target as the interpreter `python` sees it (default: this one).

    Targets whose top-level package is in `never_import` (the port under review) are read
    statically from `static_roots` only (the snapshot), never imported.

    Every target gets a fact: "ok" (import or static), "import-error", "not-found",
    "no-signature", "timeout" or "crash". A target whose import hangs or kills the worker is
    recorded and the worker restarted for the rest; targets of the same top-level package are
    then read statically (importing it again would hang again). Raises IntrospectError only
    when the interpreter itself cannot be run.
    """
    interpreter = python or sys.executable
    wanted = list(dict.fromkeys(targets))
    facts: dict[str, CallableFact] = {}
    meta: dict[str, Any] = {}
    distributions: dict[str, dict[str, str]] = {}
    poisoned: dict[str, tuple[str, str]] = {}  # top-level package -> (status, error) of a hang/crash
    remaining = wanted
    while remaining:
        static_only = [t for t in remaining if t.split(".")[0] in poisoned]
        live = [t for t in remaining if t.split(".")[0] not in poisoned]
        if static_only:
            _run_worker(interpreter, static_only, extra_path, static_roots, timeout, True, facts, meta, distributions,
                        never_import)
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
                              never_import)
        if outcome is None:
            break
        culprit, status, error = outcome
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
    )


def stack_targets(discovery: Discovery, trace: TraceResult, packages: Sequence[str]) -> list[str]:
    """What introspection should look at: the trace's kernel entry points plus every name the
    port imports from the kernel `packages` (so the import check sees private helpers too)."""
    from metax_audit.checks.imports import imported_names
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
) -> tuple[str, str, str] | None:
    """Run one worker; fill `facts`. Returns (target, status, error) when it hung or died on one."""
    request = {
        "targets": targets,
        "extra_path": [str(p) for p in extra_path],
        "static_roots": [str(p) for p in static_roots],
        "static_only": static_only,
        "never_import": list(never_import),
    }
    # cwd is an empty temp dir so nothing is imported from, or written into, the user's tree.
    with tempfile.TemporaryDirectory(prefix="metax-audit-introspect-") as cwd:
        # Caches that kernel packages create at import time (JIT logs, build dirs) go to the
        # throwaway cwd too, so capturing facts leaves the user's home and site-packages as they were.
        sandbox = {name: str(Path(cwd) / "cache") for name in _CACHE_VARS}
        done = subproc.run(
            [interpreter, "-B", str(WORKER)],
            cwd=Path(cwd),
            env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1", **sandbox},
            timeout=timeout,
            input=json.dumps(request),
        )
    current: str | None = None
    finished = False
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
    if finished:
        return None
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
    )

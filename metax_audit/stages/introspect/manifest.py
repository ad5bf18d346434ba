# Stack facts as JSON: a fact from the worker's or a manifest's record, and the stack manifest
# `evidence --capture-stack` writes and `review --stack` reads.
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from metax_audit.core import inputs
from metax_audit.core.errors import IntrospectError
from metax_audit.core.models import CallableFact, ParamFact, StackFacts

MANIFEST_SCHEMA = "metax-audit/stack/v1"
_FACT_FIELDS = {f.name for f in fields(CallableFact)}


def _ops_json(data: Any) -> dict[str, tuple[str, ...]] | None:
    """The torch.ops namespaces of a worker's done event or a manifest, {ns: (op, ...)} (None: not captured)."""
    if not isinstance(data, dict):
        return None
    return {str(ns): tuple(str(o) for o in ops) for ns, ops in data.items() if isinstance(ops, list)}


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
    data = stack_facts_json(facts, MANIFEST_SCHEMA)
    if facts.torch_ops is not None:
        data["torch_ops"] = {ns: list(ops) for ns, ops in facts.torch_ops.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise IntrospectError(f"cannot write the stack manifest {path}: {exc.strerror}") from exc


def stack_facts_json(facts: StackFacts, schema: str) -> dict[str, Any]:
    """Captured facts as JSON, as the manifest and the stack cache both write them (each its schema)."""
    return {
        "schema": schema,
        "python": facts.python,
        "captured_at": facts.captured_at,
        "host": facts.host,
        "captured_from": facts.source,
        "distributions": facts.distributions,
        "facts": {t: _fact_json(f) for t, f in sorted(facts.facts.items())},
    }


def _fact_json(fact: CallableFact) -> dict[str, Any]:
    data = asdict(fact)
    return {k: v for k, v in data.items() if v is not None}  # () means "none", None "unknown": keep both apart


def load_manifest(path: Path) -> StackFacts:
    """Read a stack manifest; its facts keep the source they were captured with (import/static)."""
    try:
        data = json.loads(inputs.read_text(path))
    except OSError as exc:
        raise IntrospectError(f"cannot read the stack manifest {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise IntrospectError(f"{path} is not JSON ({exc}); capture it with `metax-audit evidence --capture-stack`") from exc
    except RecursionError:
        raise IntrospectError(f"{path}: nested too deeply to be a stack manifest; capture it with `metax-audit evidence --capture-stack`") from None
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

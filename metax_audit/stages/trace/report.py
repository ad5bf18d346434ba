# What the trace stage concludes on its own: rules MXA050-MXA059 (a chain that stops early, an
# unresolved call, a file it could not read) and the kernel entry points introspection imports.
from __future__ import annotations

from collections.abc import Iterator

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity, TraceResult, UnresolvedKind
from metax_audit.stages.trace.chain import is_kernel_call

rule(
    "MXA050",
    Category.REGISTRATION,
    Severity.ERROR,
    "registered backend does not lead to an implementation class",
    "The registered backend class has no get_impl_cls, or get_impl_cls does not return a class the "
    "tracer can read. Selecting this backend would fail or run something else. (A class path that "
    "does not exist at all is reported by discover.)",
)
rule(
    "MXA051",
    Category.REGISTRATION,
    Severity.ERROR,
    "backend implementation class has no forward method",
    "The impl class returned by get_impl_cls defines no forward (nor inherits one the tracer can "
    "read), so the attention layer has nothing to call.",
)
rule(
    "MXA052",
    Category.REGISTRATION,
    Severity.WARNING,
    "registered backend has no metadata builder",
    "get_builder_cls is missing or does not return a class with a build method; the attention "
    "metadata for this backend cannot be built.",
)
rule(
    "MXA053",
    Category.COVERAGE,
    Severity.WARNING,
    "backend chain reaches no kernel entry point",
    "No call from the impl or the builder resolves to a kernel package, torch.ops, a Triton "
    "launch or an ops module, so the kernel checks and probes cannot cover this backend.",
)
rule(
    "MXA054",
    Category.COVERAGE,
    Severity.INFO,
    "call in a backend chain could not be resolved statically",
    "The tracer could not tell what this call invokes (the reason is in the evidence); checks "
    "on its arguments did not run. Review it by hand or make the callee explicit.",
)
rule(
    "MXA055",
    Category.COVERAGE,
    Severity.WARNING,
    "file reached by the trace could not be read",
    "A module the chain imports has a syntax error, is not UTF-8, or is larger than the size "
    "limit for generated files; calls through it were not followed.",
)


def trace_findings(result: TraceResult) -> Iterator[Finding]:
    for ch in result.backends:
        roles = {h.role: h for h in ch.chain}
        where = ch.registered_at or Location("", 0)
        at = Location(where.path, where.line, ch.name)
        ev = (f"registered at {where}", f"class path {ch.class_path}")
        if "backend" not in roles or roles["backend"].resolved is None:
            continue  # a dangling class path is discover's registration finding, not repeated here
        is_mla_prefill = "get-impl-cls" not in roles and "impl" in roles and roles["impl"].qualname == roles["backend"].qualname
        if "impl" not in roles:
            hop = roles.get("get-impl-cls") or roles["backend"]
            yield make_finding("MXA050", Location(hop.path, hop.line, ch.name), f"{ch.name}: {roles['backend'].qualname} has no get_impl_cls returning a readable class", ev)
        elif not is_mla_prefill and "forward" not in roles and not any(h.role.startswith("impl.forward") for h in ch.chain):
            hop = roles["impl"]
            yield make_finding("MXA051", Location(hop.path, hop.line, ch.name), f"{ch.name}: impl {hop.qualname} has no forward method", ev)
        if not is_mla_prefill and ("builder" not in roles or "build" not in roles):
            hop = roles.get("builder") or roles["backend"]
            yield make_finding("MXA052", Location(hop.path, hop.line, ch.name), f"{ch.name}: no metadata builder with a build method", ev)
        if not any(is_kernel_call(c) for c in ch.calls):
            yield make_finding("MXA053", at, f"{ch.name}: no kernel entry point reached from the impl or builder", ev)
    for u in result.unresolved:
        if u.kind is UnresolvedKind.FILE_NOT_TRACED:
            yield make_finding("MXA055", u.location, f"{u.location.path} was not traced", (u.reason,))
        else:
            yield make_finding("MXA054", Location(u.location.path, u.location.line, u.location.symbol), f"unresolved call {u.text}", (u.reason, f"at {u.location}"))


def kernel_entry_points(result: TraceResult) -> list[str]:
    """Dotted callables, as imported, that introspection should import: kernel calls of all chains."""
    out: dict[str, None] = {}
    for ch in result.backends:
        for c in ch.calls:
            if c.resolved and is_kernel_call(c) and _importable(c.resolved):
                out.setdefault(c.resolved, None)
    return sorted(out)


def _importable(dotted: str) -> bool:
    """Class.method is importable; Class._private_attr.method (state of an instance) is not."""
    parts = dotted.split(".")
    for i, part in enumerate(parts[:-1]):
        if part[:1].isupper() and any(p.startswith("_") and not p.startswith("__") for p in parts[i + 1 :]):
            return False
    return True

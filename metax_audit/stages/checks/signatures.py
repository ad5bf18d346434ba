# Rule `signature`: does each call site still bind to the installed kernel's parameters
# (keywords, positional count, required parameters, positional meaning vs upstream's call)?
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import (
    CallableFact,
    CallArg,
    CallSite,
    Category,
    Finding,
    InstalledSignature,
    Location,
    ParamFact,
    Severity,
    Site,
    StackFacts,
    TraceResult,
)
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.op_registrations import OpTable
from metax_audit.stages.checks.passthrough import ForwardedOp, VendorSchema, forwarded_op, tail_name, vendor_schema
from metax_audit.stages.checks.stack import build_note, call_text, checked_calls, installed_record, usable

rule("MXA101", Category.SIGNATURE, Severity.ERROR, "call passes a keyword the installed kernel does not accept",
     "The installed callable has no parameter of that name and no **kwargs, so the call raises TypeError "
     "the first time it runs. Drop the keyword (and say so in a Metax Modification block) or upgrade the kernel.")
rule("MXA102", Category.SIGNATURE, Severity.ERROR, "call passes more positional arguments than the installed kernel takes",
     "The installed callable takes fewer positional parameters and has no *args; the call raises TypeError. "
     "Pass the extra values by keyword against the installed signature, or drop them.")
rule("MXA103", Category.SIGNATURE, Severity.ERROR, "call omits a required parameter of the installed kernel",
     "A parameter without default is bound neither by position nor by keyword; the call raises TypeError.")
rule("MXA104", Category.SIGNATURE, Severity.ERROR, "call binds an argument twice or passes a positional-only parameter by keyword",
     "Python rejects the call with TypeError (multiple values for an argument, or a positional-only name used as keyword).")
rule("MXA105", Category.SIGNATURE, Severity.WARNING, "positional argument lands on a different installed parameter than upstream's call passes it to",
     "Upstream's call of the same callee passes this value by a keyword (or at another position) whose name differs "
     "from the installed parameter at this position: the value's meaning moved. Pass it by keyword. One finding per "
     "call; an error when the port passes positionals upstream's call does not (the call follows an older signature); "
     "info when the installed callable only forwards its arguments by position to a torch op whose schema, as the port "
     "registers it, takes the values where the port passes them (they land right on the vendor stack).")
UNCHECKED_EXTENSION = rule(
    "MXA113", Category.SIGNATURE, Severity.INFO,
    "call not checked: the keyword is absent only from the public base of a vendor build that extends it",
    "The pinned vendor build is private, so the call was bound against the public release it derives from, and "
    "config's `vendor-extends` says that vendor build adds to the public API. A keyword the public base lacks may "
    "be one the vendor added: not a proven break, an unchecked call. It is counted in every headline as unchecked. "
    "Way out: on the vendor machine run `metax-audit evidence --capture-stack stack.json` and review with "
    "`--stack stack.json`: the vendor build's own signature then binds the call (an error if it lacks the keyword). "
    "A positional or required-argument break is an error even for such a package; so is a keyword the public base "
    "of a package not named in vendor-extends lacks.").id
rule("MXA106", Category.SIGNATURE, Severity.INFO, "call site could not be checked against the installed kernel",
     "Introspection of the callee failed (import error, hang, crash, no signature); this is not evidence of missing "
     "support. Capture a stack manifest on a machine where the kernel imports (`evidence --capture-stack`).")

_NAMED = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")
UNCHECKED_WAY_OUT = ("way out: capture the vendor build's signatures on the vendor machine (`metax-audit evidence "
                     "--capture-stack stack.json`) and review with `--stack stack.json`: that binds this call")


@dataclass
class Binding:
    """How a call's arguments map onto the installed parameters (stubtest-style: both sides kept)."""

    positional: list[tuple[CallArg, ParamFact | None]] = field(default_factory=list)
    keywords: list[tuple[CallArg, ParamFact | None]] = field(default_factory=list)
    swallowed: list[CallArg] = field(default_factory=list)  # keywords that land only in **kwargs
    unknown: list[CallArg] = field(default_factory=list)
    extra_positional: list[CallArg] = field(default_factory=list)
    into_varargs: list[CallArg] = field(default_factory=list)
    duplicate: list[tuple[CallArg, str]] = field(default_factory=list)
    missing: list[ParamFact] = field(default_factory=list)
    var_keyword: ParamFact | None = None


# Keywords a Triton launcher (`kernel[grid](...)`) consumes itself; they are not kernel parameters.
LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "warmup", "grid",
                            "stream", "debug", "launch_cooperative_grid", "launch_pdl", "num_buffers_warp_spec",
                            "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer", "extern_libs"})


def is_launch(call: CallSite) -> bool:
    return call.via == "kernel-launch" or call.callee_text.rstrip().endswith("]")


def call_args(call: CallSite) -> tuple[list[CallArg], list[CallArg]]:
    """(positional, keyword) actually passed: partial-bound first; commented-out, `*x`, `**x` dropped."""
    every = [a for a in (*call.partial_args, *call.args) if not a.commented_out and not a.text.startswith("*")]
    launch = is_launch(call)
    return ([a for a in every if a.name is None],
            [a for a in every if a.name is not None and not (launch and a.name in LAUNCH_OPTIONS)])


def _unbound_method_call(call: CallSite) -> bool:
    """`Cls.method(obj, ...)` passes self explicitly; the fact describes the bound method."""
    if not call.resolved:
        return False
    parts = call.resolved.split(".")
    written = call.callee_text.split(".")
    return len(parts) >= 2 and len(written) >= 2 and written[-2] == parts[-2] and parts[-2][:1].isupper()


def bind(call: CallSite, params: Sequence[ParamFact]) -> Binding:
    b = Binding()
    positional, keywords = call_args(call)
    if _unbound_method_call(call) and positional:
        positional = positional[1:]
    slots = [p for p in params if p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    varargs = next((p for p in params if p.kind == "VAR_POSITIONAL"), None)
    b.var_keyword = next((p for p in params if p.kind == "VAR_KEYWORD"), None)
    by_name = {p.name: p for p in params if p.kind in _NAMED}
    bound: set[str] = set()
    for i, arg in enumerate(positional):
        if i < len(slots):
            b.positional.append((arg, slots[i]))
            bound.add(slots[i].name)
        elif varargs is not None:
            b.positional.append((arg, varargs))
            b.into_varargs.append(arg)
        else:
            b.positional.append((arg, None))
            b.extra_positional.append(arg)
    seen_kw: set[str] = set()
    for arg in keywords:
        name = arg.name or ""
        param = by_name.get(name)
        if param is not None and param.kind == "POSITIONAL_ONLY":
            if b.var_keyword is not None:
                b.swallowed.append(arg)  # a positional-only name passed by keyword goes to **kwargs
                b.keywords.append((arg, b.var_keyword))
            else:
                b.duplicate.append((arg, f"{name} is positional-only"))
            continue
        if param is not None:
            # a keyword repeated between functools.partial and the call is an allowed override
            if name in bound and name not in seen_kw:
                b.duplicate.append((arg, f"{name} is already bound by position"))
            bound.add(name)
            seen_kw.add(name)
            b.keywords.append((arg, param))
        elif b.var_keyword is not None:
            b.swallowed.append(arg)
            b.keywords.append((arg, b.var_keyword))
        else:
            b.unknown.append(arg)
            b.keywords.append((arg, None))
    starred = any(a.text.startswith("*") for a in (*call.partial_args, *call.args) if not a.commented_out)
    if not (call.star_args or call.star_kwargs or starred):
        b.missing = [p for p in params if p.kind in _NAMED and p.default is None and p.name not in bound]
    return b


def _loc(call: CallSite, detail: str) -> Location:
    return Location(call.location.path, call.location.line, f"{call.caller}:{call.resolved}:{detail}")


def _accepted(params: Sequence[ParamFact]) -> str:
    names = [p.name for p in params if p.kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")]
    return ", ".join(names) if names else "(none)"


def check_signatures(
    root: Path,
    trace: TraceResult,
    facts: StackFacts,
    *,
    upstream_calls: Sequence[CallSite] = (),
    vendor_ops: OpTable | None = None,
    memo: FileMemo | None = None,
) -> Iterator[Finding]:
    """`memo` keeps what an installed wrapper's source forwards (passthrough.forwarded_op) per file."""
    not_checked: dict[str, list[CallSite]] = {}
    stand_in_keywords: dict[tuple[str, str], list[Finding]] = {}
    for call in checked_calls(trace):
        if not call.resolved or call.resolved not in facts.facts:
            continue  # not a target introspection was asked about: out of this check's scope
        fact = facts.facts[call.resolved]
        if not usable(fact):
            not_checked.setdefault(call.resolved, []).append(call)
            continue
        assert fact.params is not None
        b = bind(call, fact.params)
        installed = installed_record(fact, facts)  # typed; its text is the evidence line the Markdown shows
        both: tuple[str, ...] = (call_text(root, call), str(installed), *build_note(fact))
        severity = None
        # A public base the vendor build is known to extend (config vendor-extends): a keyword it lacks the vendor
        # build may take, so that call is unchecked (MXA113, counted in the headline), not a break. Positional and
        # required-argument breaks stay errors: an extension adds parameters, it does not move or require them.
        extended = bool(fact.stand_in and fact.stand_in_extended)
        if fact.error and "decorated with" in fact.error:
            if any(w in fact.error for w in ("autotune", "heuristics")):
                b.missing = []  # autotune configs and heuristics supply parameters at launch
            if any(d not in ("triton.jit", "jit") for d in _decorators(fact.error)):
                severity = Severity.WARNING  # the runtime signature may differ from the written one
                both = (*both, f"note: {fact.error}")
        for arg in b.unknown:
            if extended:
                finding = make_finding(UNCHECKED_EXTENSION, _loc(call, arg.name or ""),
                                       f"{call.callee_text}(..., {arg.name}=...) not checked: the public base of "
                                       f"{fact.target} has no parameter {arg.name!r}, and the vendor build extends it",
                                       [*both, f"accepted keywords of the public base: {_accepted(fact.params)}",
                                        UNCHECKED_WAY_OUT], installed=installed)
            else:
                finding = make_finding("MXA101", _loc(call, arg.name or ""),
                                       f"{call.callee_text}(..., {arg.name}=...) - installed {fact.target} has no parameter {arg.name!r}",
                                       [*both, f"accepted keywords: {_accepted(fact.params)}"], severity=severity,
                                       installed=installed)
            if fact.stand_in:  # one root cause: the port assumes the vendor build takes this keyword
                package = fact.target.split(".", 1)[0]
                stand_in_keywords.setdefault((package, arg.name or ""), []).append(finding)
            else:
                yield finding
        if b.extra_positional:
            takes = sum(1 for p in fact.params if p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"))
            given = takes + len(b.extra_positional)
            yield make_finding("MXA102", _loc(call, "positional"),
                               f"{call.callee_text} gets {given} positional arguments; installed {fact.target} takes {takes}",
                               [*both, "extra: " + ", ".join(a.text for a in b.extra_positional)], severity=severity,
                               installed=installed)
        for arg, why in b.duplicate:
            yield make_finding("MXA104", _loc(call, arg.name or ""), f"{call.callee_text}: {why} in installed {fact.target}", both,
                               severity=severity, installed=installed)
        for param in b.missing:
            yield make_finding("MXA103", _loc(call, param.name),
                               f"{call.callee_text} does not pass {param.name!r}, required by installed {fact.target}", both,
                               severity=severity, installed=installed)
        yield from _moved(call, b, fact, both, upstream_calls, vendor_ops, memo, installed)
    for (package, keyword), group in stand_in_keywords.items():
        yield _one_root_cause(package, keyword, group)
    for target, calls in not_checked.items():
        fact = facts.facts[target]
        first = calls[0]
        yield make_finding("MXA106", Location(first.location.path, first.location.line, f"{target}:not-checked"),
                           f"{len(calls)} call(s) of {target} not checked: introspection says {fact.status}",
                           [f"fact: {target} status={fact.status} source={fact.source} ({facts.source}): {fact.error or 'no signature'}",
                            *(call_text(root, c) for c in calls[:10])])


def _one_root_cause(package: str, keyword: str, group: list[Finding]) -> Finding:
    """Every call passing one keyword that the public base of a pinned vendor build lacks is one
    finding: the root cause is one assumption about the vendor build (it may have added the keyword),
    so it is fixed or confirmed once, not per call site. Each site stays in the evidence."""
    first = group[0]
    calls = tuple(Site(f.location.path, f.location.line, f.location.symbol.split(":", 1)[0], "call") for f in group)
    if len(group) == 1:
        return replace(first, sites=calls) if first.rule == UNCHECKED_EXTENSION else first
    sites = [f"also at {f.location}: {f.message}" for f in group[1:]]
    if first.rule == UNCHECKED_EXTENSION:
        message = (f"{len(group)} calls pass {keyword}=, not checked: the public base of {package} has no parameter for it "
                   f"and the vendor build extends it; first: {first.message}")
    else:
        message = f"{len(group)} calls pass {keyword}=, which the public base of {package} has no parameter for; first: {first.message}"
    return replace(first, message=message, evidence=(*first.evidence, *sites),
                   sites=calls if first.rule == UNCHECKED_EXTENSION else first.sites)


def _decorators(error: str) -> list[str]:
    """Decorator names out of the worker's "decorated with a, b: ..." note."""
    text = error.split("decorated with", 1)[1].split(":", 1)[0]
    return [d.strip() for d in text.split(",") if d.strip()]


def _caller_name(call: CallSite) -> str:
    """The enclosing function's own name (`forward` of `pkg.mod.Impl.forward`): what a port call and upstream's
    are matched by."""
    return call.caller.rsplit(".", 1)[-1]


def checked_callers(trace: TraceResult, facts: StackFacts | None) -> frozenset[str]:
    """The names of the functions whose upstream calls _upstream_match can read: those of the port's callers of
    a target the facts hold (none without facts: then no call is checked). The upstream calls are traced for
    these alone (upstream_calls)."""
    if facts is None:
        return frozenset()
    return frozenset(_caller_name(c) for c in checked_calls(trace) if c.resolved and c.resolved in facts.facts)


def _upstream_match(call: CallSite, upstream_calls: Sequence[CallSite]) -> CallSite | None:
    """The upstream call of the same callee from the same-named function sharing most argument texts."""
    method = _caller_name(call)
    same = [u for u in upstream_calls if u.resolved == call.resolved and _caller_name(u) == method]
    if not same:
        return None
    texts = {a.text for a in call.args}
    return max(same, key=lambda u: len(texts & {a.text for a in u.args}))


def _vendor_landing(b: Binding, fact: CallableFact, vendor_ops: OpTable | None, moved: Sequence[CallArg],
                    memo: FileMemo | None = None) -> tuple[ForwardedOp, VendorSchema, list[str]] | None:
    """Where the call's values land when the installed callable forwards them by position to a torch op
    the port registers itself with other names: (the forwarding, the port's schema, one line per value).
    Only when every moved value named like an op parameter lands on exactly that parameter (and one
    does), no value lands on a parameter named after another, and the op takes as many values as the
    wrapper forwards; otherwise the installed names are what counts."""
    if vendor_ops is None or fact.params is None:
        return None
    forward = forwarded_op(fact) if memo is None or not fact.sourcefile or not Path(fact.sourcefile).is_absolute() else \
        memo.get(fact.sourcefile, ("forwarded-op", fact.target, fact.line), partial(forwarded_op, fact), root=Path("/"))
    schema = vendor_schema(vendor_ops, forward.namespace, forward.op) if forward is not None else None
    if forward is None or schema is None or len(forward.forwarded) > len(schema.params) \
            or schema.params[:len(forward.forwarded)] == forward.forwarded:
        return None
    index = {name: i for i, name in enumerate(forward.forwarded)}
    landing: list[tuple[CallArg, str]] = []  # each value and the op parameter it reaches
    for arg, param in (*b.positional, *b.keywords):
        if param is None or param.name not in index:
            return None  # the value stays in the wrapper (or binds nowhere): nothing to explain
        landing.append((arg, schema.params[index[param.name]]))
    moved_ids = {id(a) for a in moved}
    named = [(arg, on) for arg, on in landing if tail_name(arg.text) in schema.params]
    # A value named like one op parameter must land on exactly that one; at least one moved value must.
    if any(tail_name(arg.text) != on for arg, on in named) or not any(id(arg) in moved_ids for arg, _ in named):
        return None
    landed = [f"{arg.text} -> {on}" + (" (same name)" if tail_name(arg.text) == on else "") for arg, on in landing]
    return forward, schema, landed


def _moved(call: CallSite, b: Binding, fact: CallableFact, both: tuple[str, ...], upstream_calls: Sequence[CallSite],
           vendor_ops: OpTable | None = None, memo: FileMemo | None = None,
           installed: InstalledSignature | None = None) -> Iterator[Finding]:
    up = _upstream_match(call, upstream_calls)
    if up is None:
        return
    up_by_text = {a.text: a for a in up.args if not a.commented_out}
    up_pos = [a for a in (*up.partial_args, *up.args) if a.name is None and not a.commented_out]
    moved: list[tuple[int, str]] = []
    for i, (arg, param) in enumerate(b.positional):
        if param is None or param.kind == "VAR_POSITIONAL":
            continue
        other = up_by_text.get(arg.text)
        if other is None:
            continue
        if other.name is not None and other.name != param.name:
            why = f"upstream passes it as {other.name}="
        elif other.name is None and other.position is not None and other.position != arg.position:
            landed = other.position
            why = f"upstream passes it at position {landed}"
        else:
            continue
        moved.append((i, f"positional {arg.text!r} binds to installed parameter {param.name!r}; {why}"))
    if not moved:
        return
    # One shifted call is one finding: an inserted or dropped positional moves every value after it.
    extra = [a.text for a, _ in b.positional if a.text not in up_by_text]
    cause = f" (the port's positional(s) {', '.join(map(repr, extra))} are not in upstream's call)" if extra else ""
    # More positionals than upstream's call, shifting values it shares with upstream onto other installed
    # parameters: the call follows an older signature of the kernel and breaks or computes wrong values.
    stale = bool(extra) and len(b.positional) > len(up_pos)
    evidence = [*both, f"upstream: {up.location}: {up.callee_text}(" + ", ".join(
                    (f"{a.name}={a.text}" if a.name else a.text) for a in up.args) + ")",
                f"port positional count: {len(b.positional)}, upstream positional count: {len(up_pos)}"
                + ("; the port's call follows an older signature of the installed callable" if stale else "")]
    message = f"{call.callee_text}: " + "; ".join(m for _, m in moved) + cause
    vendor = _vendor_landing(b, fact, vendor_ops, [b.positional[i][0] for i, _ in moved], memo)
    if vendor is not None:
        forward, schema, lands = vendor
        yield make_finding("MXA105", _loc(call, f"pos{moved[0][0]}"),
                           f"{call.callee_text}: the values follow the port's own schema of torch.ops.{schema.namespace}."
                           f"{schema.op}, not the installed wrapper's names: {fact.target} forwards them by position, "
                           f"so on the vendor stack they land as the port passes them ({message})",
                           [*evidence, f"installed wrapper forwards ({', '.join(forward.forwarded)}) by position to "
                                       f"torch.ops.{forward.namespace}.{forward.op} ({forward.where})",
                            f"port registers {schema.namespace}::{schema.op} at {schema.where}: {schema.text}",
                            "lands: " + "; ".join(lands),
                            "keeps working while the port's schema keeps this order; syncing the port's op to "
                            "upstream's order would break this call"],
                           severity=Severity.INFO, installed=installed)
        return
    yield make_finding("MXA105", _loc(call, f"pos{moved[0][0]}"), message, evidence,
                       severity=Severity.ERROR if stale else None, installed=installed)

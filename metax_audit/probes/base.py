# The probe framework's contract: the result record every probe returns, the probe and family
# specs the registry collects, the loaded-target wrapper, and the hypothesis-matching rule.
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "metax-audit/probe-outcome/v1"
VERDICTS = ("matched", "mismatch", "not-checkable", "skipped", "error")
NON_FINITE = "non-finite"  # the hypothesis a case matches when the target returned NaN/inf where no hypothesis has one


class ProbeSkip(Exception):
    """Raised inside a probe: the question cannot be asked here (no CUDA device, ...)."""


class ControlAbsent(Exception):
    """Raised inside a probe: the target lacks a control the probe needs (fail closed)."""

    def __init__(self, control: str, signature: str) -> None:
        super().__init__(f"control absent: {control!r} not accepted by target signature {signature}")
        self.control = control
        self.signature = signature


class NotCheckable(Exception):
    """Raised inside a probe: this target cannot answer the question here, for the stated reason
    (e.g. a plain callable under the CPU graph-capture simulation)."""


class ProbeInputError(Exception):
    """The probe's own inputs do not discriminate two hypotheses: a bug in the probe, never a verdict."""


@dataclass(frozen=True)
class Tolerance:
    """A hypothesis matches a tensor when |out - ref| <= atol + rtol * |ref| everywhere."""

    atol: float
    rtol: float

    def bound(self, ref_abs_max: float) -> float:
        return self.atol + self.rtol * ref_abs_max


@dataclass(frozen=True)
class HypothesisError:
    abs: float  # worst |out - ref|
    rel: float  # worst |out - ref| / (|ref| + atol), the scale-free view
    within: bool  # every element inside the tolerance
    shape_ok: bool = True  # False when the target's tensor could not be laid over this hypothesis


@dataclass(frozen=True)
class CaseResult:
    """One input set of a probe: which hypothesis the target matched and the error to each."""

    name: str
    matched: str | None
    errors: dict[str, HypothesisError]
    shapes: dict[str, list[int]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    strides: dict[str, list[int]] = field(default_factory=dict)
    note: str = ""
    expected: str | None = None  # this case's own expectation (e.g. "neutral" for an empty sequence); None: the probe's


@dataclass(frozen=True)
class ProbeOutcome:
    """The record one probe run on one target returns; `python -m metax_audit.probes` prints it as JSON."""

    probe: str
    family: str
    target: str
    verdict: str  # one of VERDICTS
    matched: str | None = None  # the hypothesis the target matched in every case, or "mixed: ..."
    expected: str | None = None  # the hypothesis a correct (or declared) kernel matches
    expected_source: str = ""  # where `expected` comes from: "convention" or "declared by adapter"
    hypotheses: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> {abs, rel} worst over cases
    worst_error: float | None = None  # worst abs error against `expected`
    tolerance: dict[str, float] = field(default_factory=dict)
    cases: tuple[CaseResult, ...] = ()
    device: dict[str, Any] = field(default_factory=dict)
    skipped_reason: str | None = None
    evidence: tuple[str, ...] = ()  # signature inspected, adapter notes, traceback tail on error
    details: dict[str, Any] = field(default_factory=dict)  # observations outside the verdict
    seconds: float = 0.0
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cases"] = [asdict(c) for c in self.cases]
        return _finite(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeOutcome:
        def num(v: Any) -> Any:
            return float(v) if isinstance(v, str) else v  # "inf" as written by to_json

        cases = tuple(
            CaseResult(**{**c, "errors": {k: HypothesisError(**{f: num(x) for f, x in v.items()}) for k, v in c.get("errors", {}).items()}})
            for c in data.get("cases", ())
        )
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in data.items() if k in known and k != "cases"}
        kw["evidence"] = tuple(kw.get("evidence", ()))
        return cls(**kw, cases=cases)


def _finite(obj: Any) -> Any:
    """JSON has no inf/nan: keep them readable as strings so the record survives a round trip."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------- contexts, targets, specs


@dataclass(frozen=True)
class ProbeContext:
    """What a probe may read besides the target: where to run and the user's options."""

    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"
    seed: int = 0
    options: dict[str, str] = field(default_factory=dict)  # --option k=v, e.g. merge=flashinfer:merge_state


@dataclass
class Target:
    """A callable that follows one family's convention, plus what we know about its controls.

    `fn` is the convention-following callable. `controls` are the keyword names it accepts
    (from its inspected signature; `**kwargs` counts as accepting all, since ignoring a
    control is exactly what the probes detect). `declares` holds the semantics the target
    documents (e.g. {"lse": "base-2"}); probes expect those instead of the convention default.
    `plan`/`run` are optional two-phase entry points (metadata outside, tensors inside) that
    graph capture uses.
    """

    name: str
    family: str
    fn: Callable[..., Any]
    signature: str
    controls: frozenset[str]
    declares: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    plan: Callable[..., Any] | None = None
    run: Callable[..., Any] | None = None

    def require(self, *controls: str) -> None:
        for c in controls:
            if c not in self.controls:
                raise ControlAbsent(c, f"{self.name}{self.signature}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def inspect_controls(fn: Callable[..., Any], candidates: Sequence[str]) -> tuple[str, frozenset[str]]:
    """The signature text and which of `candidates` it accepts (all of them behind **kwargs)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(<no signature>)", frozenset()
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return str(sig), frozenset(candidates)
    names = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return str(sig), frozenset(c for c in candidates if c in names)


@dataclass(frozen=True)
class ProbeSpec:
    """A semantics question: `run(target, ctx) -> ProbeOutcome` for each family in `families`."""

    name: str
    families: tuple[str, ...]
    run: Callable[[Target, ProbeContext], ProbeOutcome]
    category: str  # the finding category a mismatch is filed under (models.Category value)
    summary: str
    needs_cuda: bool = False


@dataclass(frozen=True)
class FamilySpec:
    """A calling convention: `load(spec, ctx) -> Target` for its built-in target names."""

    name: str
    convention: str  # the documented calling convention (shown by --help and the docs)
    load: Callable[[str, ProbeContext], Target]
    builtin_targets: tuple[str, ...]
    controls: tuple[str, ...] = ()  # keyword controls of the convention, for MOD:CALLABLE targets


# ---------------------------------------------------------------- hypothesis matching


def compare(out: Any, ref: Any, tol: Tolerance) -> HypothesisError:
    """Error of a target tensor against one hypothesis, flattened (memory order decides layout)."""
    import torch

    o = out.detach().to("cpu", torch.float64).reshape(-1)
    r = ref.detach().to("cpu", torch.float64).reshape(-1)
    if o.numel() != r.numel():
        return HypothesisError(abs=math.inf, rel=math.inf, within=False, shape_ok=False)
    if o.numel() == 0:
        return HypothesisError(abs=0.0, rel=0.0, within=True)
    both_inf = torch.isinf(o) & torch.isinf(r) & (torch.sign(o) == torch.sign(r))
    diff = torch.where(both_inf, torch.zeros_like(o), (o - r).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    rr = torch.where(torch.isinf(r), torch.zeros_like(r), r.abs())
    bound = tol.atol + tol.rtol * rr
    worst = float(diff.max())
    rel = float((diff / (rr + tol.atol)).max())
    return HypothesisError(abs=worst, rel=rel, within=bool((diff <= bound).all()))


def case_result(
    name: str,
    outs: Mapping[str, Any] | Any,
    hypotheses: Mapping[str, Any],
    tol: Tolerance,
    *,
    tensors: Mapping[str, Any] = (),  # type: ignore[assignment]
    note: str = "",
    check_separation: bool = True,
    nonfinite: str = NON_FINITE,
) -> CaseResult:
    """Match one case. `hypotheses[name]` is a tensor, or a tuple of tensors compared pairwise
    with `outs` (a tuple too); the error of a tuple is its worst part. Raises ProbeInputError
    when two hypotheses are closer than 4x the tolerance: such inputs cannot discriminate.

    Finiteness is part of the verdict: when no hypothesis matches and the target returned NaN or
    inf where every hypothesis is finite, the case matches the hypothesis named `nonfinite`
    (`non-finite`, or the caller's name for where it happened, e.g. `nan-on-empty`)."""
    errors: dict[str, HypothesisError] = {}
    for h, ref in hypotheses.items():
        errors[h] = _tuple_error(outs, ref, tol)
    if not any(e.within for e in errors.values()):
        bad = _nonfinite_where_finite(outs, hypotheses.values())
        if bad:
            errors[nonfinite] = HypothesisError(abs=0.0, rel=0.0, within=True)
            note = (note + "; " if note else "") + f"{bad} non-finite value(s) where every hypothesis is finite"
    if check_separation:
        names = list(hypotheses)
        wide = Tolerance(tol.atol * 4, tol.rtol * 4)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if _tuple_error(hypotheses[a], hypotheses[b], wide).within:
                    raise ProbeInputError(f"case {name}: hypotheses {a!r} and {b!r} are within 4x tolerance of each other")
    within = [h for h, e in errors.items() if e.within]
    matched = within[0] if len(within) == 1 else None
    if len(within) > 1:
        note = (note + "; " if note else "") + f"several hypotheses within tolerance: {within}"
    shapes = {k: list(v.shape) for k, v in dict(tensors).items()}
    dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in dict(tensors).items()}
    strides = {k: list(v.stride()) for k, v in dict(tensors).items()}
    return CaseResult(name=name, matched=matched, errors=errors, shapes=shapes, dtypes=dtypes, strides=strides, note=note)


def _nonfinite_where_finite(out: Any, refs: Any) -> int:
    """How many elements of the target's output are NaN/inf where every (same-shaped) hypothesis
    is finite; 0 when none, or when no hypothesis can be laid over the output."""
    import torch

    outs = out if isinstance(out, tuple | list) else (out,)
    count = 0
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            continue
        of = o.detach().to("cpu", torch.float64).reshape(-1)
        mask = ~torch.isfinite(of)
        if not bool(mask.any()):
            continue
        for ref in refs:
            r = (ref if isinstance(ref, tuple | list) else (ref,))[i]
            rf = r.detach().to("cpu", torch.float64).reshape(-1)
            if rf.numel() == of.numel():
                mask &= torch.isfinite(rf)
        count += int(mask.sum())
    return count


def _tuple_error(out: Any, ref: Any, tol: Tolerance) -> HypothesisError:
    outs = out if isinstance(out, tuple | list) else (out,)
    refs = ref if isinstance(ref, tuple | list) else (ref,)
    parts = [compare(o, r, tol) for o, r in zip(outs, refs, strict=True)]
    return HypothesisError(
        abs=max(p.abs for p in parts),
        rel=max(p.rel for p in parts),
        within=all(p.within for p in parts),
        shape_ok=all(p.shape_ok for p in parts),
    )


def conclude(
    probe: str,
    target: Target,
    cases: Sequence[CaseResult],
    *,
    expected: str,
    expected_source: str = "convention",
    tol: Tolerance,
    device: Mapping[str, Any] | None = None,
    details: Mapping[str, Any] | None = None,
    evidence: Sequence[str] = (),
) -> ProbeOutcome:
    """Fold the cases into one verdict: matched when every case matched `expected`."""
    worst: dict[str, dict[str, float]] = {}
    for c in cases:
        for h, e in c.errors.items():
            w = worst.setdefault(h, {"abs": 0.0, "rel": 0.0})
            w["abs"] = max(w["abs"], e.abs)
            w["rel"] = max(w["rel"], e.rel)
    per_case = {c.name: c.matched for c in cases}
    off = {c.matched for c in cases if c.matched != (c.expected or expected)}
    if not off:
        matched: str | None = expected
    elif len(off) == 1 and None not in off:
        matched = next(iter(off))  # one wrong hypothesis, wherever it showed (the cases say where)
    elif len(set(per_case.values())) == 1:
        matched = next(iter(per_case.values()))
    else:
        matched = "mixed: " + ", ".join(f"{k}={v or 'none'}" for k, v in per_case.items())
    verdict = "matched" if not off else "mismatch"
    return ProbeOutcome(
        probe=probe,
        family=target.family,
        target=target.name,
        verdict=verdict,
        matched=matched,
        expected=expected,
        expected_source=expected_source,
        hypotheses=worst,
        worst_error=worst.get(expected, {}).get("abs"),
        tolerance={"atol": tol.atol, "rtol": tol.rtol},
        cases=tuple(cases),
        device=dict(device or {}),
        details=dict(details or {}),
        evidence=(f"target signature: {target.name}{target.signature}", *target.notes, *evidence),
    )


def expected_for(target: Target, key: str, default: str) -> tuple[str, str]:
    """The hypothesis to expect: what the target declares for `key`, else the convention's."""
    if key in target.declares:
        return target.declares[key], f"declared by {target.name}"
    return default, "convention"

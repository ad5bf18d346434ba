# The dataflow stage's typed output: each LSE followed from its producing kernel call to a merge
# or reduction (with every step), kernel results unpacked as if they held the LSE, scale arguments
# at kernel calls, and what the walk could not follow. checks/lse.py and checks/scales.py judge them.
from __future__ import annotations

from dataclasses import dataclass

# The flow records are the report's too (AuditReport.dataflow): they live in models.
from metax_audit.core.models import (
    FlowEnd,
    FlowMismatch,
    FlowStep,
    FlowVerdict,
    Location,
    LseFlow,
    ProbeRequest,
    Unresolved,
)

TH = "[tokens, heads]"
HT = "[heads, tokens]"

Verdict = FlowVerdict
Mismatch = FlowMismatch  # what a mismatched flow gets wrong

__all__ = ["HT", "TH", "DataflowFacts", "FlowEnd", "FlowStep", "LseFlow", "Mismatch", "ScaleArgument", "ScaleCall", "Unpacking",
           "Verdict"]


@dataclass(frozen=True)
class Unpacking:
    """A kernel result unpacked as if it held the LSE while the call does not ask for the LSE."""

    location: Location  # the call; symbol "function:name the LSE is bound to"
    callee: str
    target_text: str  # the unpacking target as written, e.g. "(out, lse)"
    lse_name: str
    lse_result: int  # index of the LSE in the result, by the contract
    switch: str  # "return_lse=False" or "return_lse not passed (default False)"
    statement: str  # "path:line: source line" of the assignment
    convention: Location
    flag: str  # the flag's name, what it selects when true and when false, its other spellings
    when_true: str
    when_false: str
    aliases: tuple[str, ...]
    probe: ProbeRequest | None


@dataclass(frozen=True)
class ScaleArgument:
    param: str  # k_scale, v_scale, ...
    text: str  # the argument as written
    form: str | None  # "float" | "tensor" as written (None: cannot tell)
    why: str  # how the form was read from the text ("" when it cannot tell)
    expected: str  # the form the contract gives for the parameter


@dataclass(frozen=True)
class ScaleCall:
    """The scale arguments at one visit of a kernel call whose contract names scale parameters."""

    location: Location  # the call; symbol: the enclosing function
    callee: str
    statement: str  # "path:line: source line"
    convention: Location
    scale_form: str  # the contract's words on the scales' form
    arguments: tuple[ScaleArgument, ...]
    probe: ProbeRequest | None


@dataclass(frozen=True)
class DataflowFacts:
    flows: tuple[LseFlow, ...]  # every flow with its verdict, by consumer location
    unpackings: tuple[Unpacking, ...]  # in visit order (a call may be visited more than once)
    scale_calls: tuple[ScaleCall, ...]  # in visit order
    too_deep: tuple[Unresolved, ...]  # statements whose expressions nest too deeply to walk
    unresolved: tuple[Unresolved, ...]  # values the walk could not follow


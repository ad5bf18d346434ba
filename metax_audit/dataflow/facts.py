# The dataflow stage's typed output: each LSE followed from its producing kernel call to a merge
# or reduction (with every step), kernel results unpacked as if they held the LSE, scale arguments
# at kernel calls, and what the walk could not follow. checks/lse.py and checks/scales.py judge them.
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from metax_audit.models import Location, ProbeRequest, Unresolved

TH = "[tokens, heads]"
HT = "[heads, tokens]"
Verdict = Literal["match", "mismatch", "unknown"]
Mismatch = Literal["base", "layout"]  # what a mismatched flow gets wrong


@dataclass(frozen=True)
class FlowStep:
    location: Location
    text: str  # the source line of the step, stripped
    base: str  # the LSE base after the step: "2" | "e" | "se" (exponentiated) | "?"
    layout: str  # "[tokens, heads]" | "[heads, tokens]" | "?"


@dataclass(frozen=True)
class FlowEnd:
    callee: str  # resolved dotted callee
    location: Location
    base: str
    layout: str
    arg: str = ""  # consumer: the parameter receiving the LSE
    via: str = ""  # how the callee was resolved
    convention: str = ""  # where the convention is written (component-contracts.md:line)


@dataclass(frozen=True)
class LseFlow:
    producer: FlowEnd
    consumer: FlowEnd
    steps: tuple[FlowStep, ...]
    verdict: Verdict
    reasons: tuple[str, ...] = ()
    probes: tuple[ProbeRequest, ...] = ()  # the probes that confirm the verdict at run time
    mismatches: tuple[Mismatch, ...] = ()  # set when the verdict is mismatch


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


# The abstract values the dataflow interpreter tracks (an LSE with its base, layout and path; a
# tuple holding LSEs; alternatives; callables and instances) and the small readers of constants.
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

from metax_audit.core.models import Location
from metax_audit.stages.dataflow.facts import HT, TH, FlowEnd, FlowStep

FLIP = {TH: HT, HT: TH}


@dataclass(frozen=True)
class Val:
    base: str
    layout: str
    producer: FlowEnd
    steps: tuple[FlowStep, ...] = ()

    def step(self, loc: Location, text: str, base: str | None = None, layout: str | None = None) -> Val:
        b, lay = base or self.base, layout or self.layout
        steps = self.steps
        if steps and steps[-1].location.path == loc.path and steps[-1].location.line == loc.line:
            # One step per source line; an annotated text of that line ("returned by ...") is kept.
            if steps[-1].text.startswith(text):
                text = steps[-1].text
            steps = steps[:-1]
        return Val(b, lay, self.producer, (*steps, FlowStep(loc, text, b, lay)))


@dataclass(frozen=True)
class TupleVal:
    items: dict[int, Val]


@dataclass(frozen=True)
class Alt:
    """Several values one expression may have (a call dispatched to one of several helpers)."""

    options: tuple[object, ...]


def flatten(v: object | None) -> list[object]:
    if v is None:
        return []
    return [o for o in v.options if o is not None] if isinstance(v, Alt) else [v]


@dataclass(frozen=True)
class Fn:
    """A callable value: a dotted target plus keywords bound by functools.partial."""

    dotted: str
    bound: dict[str, ast.expr] = field(default_factory=dict)
    via: str = ""


@dataclass(frozen=True)
class Inst:
    cls: str
    via: str = ""


NEUTRAL = {"contiguous", "view", "reshape", "float", "to", "clone", "squeeze", "unsqueeze", "detach", "flatten",
            "view_as", "reshape_as", "type", "cuda", "narrow", "expand", "__getitem__"}
FLIPS = {"transpose", "t", "swapaxes", "swapdims"}
GENERIC_METHODS = {"forward", "run", "build", "plan", "apply", "call", "get", "update", "copy_", "to", "view"}
MAX_ALTS = 8  # alternatives kept per name; beyond this a path is dropped (rare in attention code)
LN2 = math.log(2)
LOG2E = 1 / math.log(2)
CONST_NAMES = re.compile(r"^_?(LN_?2|LOG_?2|LOG2_?E|LOG_?2_?E|RCP_LN2|INV_LN2)$", re.IGNORECASE)


def source_text(node: ast.AST, src_lines: list[str]) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node the parser produces
        return src_lines[getattr(node, "lineno", 1) - 1].strip()


def literal_bool(node: ast.expr | None) -> bool | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return None

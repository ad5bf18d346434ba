# The abstract values static resolution works with (module, class, function, instance, partial,
# external dotted path, the layer, unknown with its reason) and the helpers over sets of them.
from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from metax_audit.stages.trace.modules import ModuleInfo

if TYPE_CHECKING:
    from metax_audit.stages.trace.scopes import Scope  # a Func's closure; scopes hold values

# ---------------------------------------------------------------- abstract values


@dataclass(frozen=True)
class Val:
    via: str = field(default="", compare=False, kw_only=True)


@dataclass(frozen=True)
class Mod(Val):
    info: ModuleInfo = field(compare=False, hash=False)
    name: str = ""


@dataclass(frozen=True)
class Cls(Val):
    dotted: str
    info: ModuleInfo = field(compare=False, hash=False)
    node: ast.ClassDef = field(compare=False, hash=False)

    @property
    def origin(self) -> str:
        return self.info.origin


@dataclass(frozen=True)
class Func(Val):
    dotted: str
    info: ModuleInfo = field(compare=False, hash=False)
    node: ast.FunctionDef | ast.AsyncFunctionDef = field(compare=False, hash=False)
    owner: Cls | None = None  # defining class for methods
    bound: Val | None = None  # the instance (or class) the method was looked up on
    closure: Scope | None = field(default=None, compare=False, hash=False)  # enclosing function's names


@dataclass(frozen=True)
class Ext(Val):
    """Something outside the readable sources, kept as the dotted path it was imported by.

    `lazy` marks an upstream name not read yet: a direct call needs only its dotted path, so the
    upstream module is parsed only when an attribute, a call result or a base class needs it."""

    dotted: str
    lazy: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Inst(Val):
    cls: Cls | Ext


@dataclass(frozen=True)
class Partial(Val):
    func: Val
    call: ast.Call = field(compare=False, hash=False)
    info: ModuleInfo = field(compare=False, hash=False)


@dataclass(frozen=True)
class Layer(Val):
    """The attention layer passed to forward(): its attribute reads are the layer binding."""

    name: str = "layer"


@dataclass(frozen=True)
class Super(Val):
    cls: Cls
    inst: Val


class UnknownKind(Enum):
    OTHER = "other"
    TORCH_RESULT = "result of a torch callable"  # a tensor (or tensors): its methods are no kernels
    LAYER_ATTRIBUTE = "layer attribute"  # read off the attention layer passed to forward()


@dataclass(frozen=True)
class Unknown(Val):
    reason: str
    kind: UnknownKind = UnknownKind.OTHER


def _result_of(dotted: str) -> Unknown:
    """What calling `dotted` returns when its return type is unknown."""
    kind = UnknownKind.TORCH_RESULT if dotted.startswith("torch.") else UnknownKind.OTHER
    return Unknown(f"result of {dotted}", kind)


Vals = tuple[Val, ...]


def known(vals: Iterable[Val]) -> Vals:
    """Drop unknowns when something is known: a union keeps the candidates we can follow."""
    vals = tuple(dict.fromkeys(vals))
    good = tuple(v for v in vals if not isinstance(v, Unknown))
    return good if good else vals[:1]


def first_unknown(vals: Vals) -> Unknown | None:
    return next((v for v in vals if isinstance(v, Unknown)), None)


def with_via(vals: Iterable[Val], via: str) -> Vals:
    return tuple(v if v.via else replace(v, via=via) for v in vals)


def force_via(vals: Iterable[Val], via: str) -> Vals:
    return tuple(replace(v, via=via) for v in vals)


_KEEP_VIA = frozenset({"module-getattr", "inherited", "attr-assigned"})


def plain(vals: Iterable[Val]) -> Vals:
    """Forget how another module named a value: `via` describes the caller's own step."""
    return tuple(v if not v.via or v.via in _KEEP_VIA else replace(v, via="") for v in vals)

# Rule `claim` for advertised capabilities: what a backend class advertises to vLLM's selector
# (kv-cache dtypes, head sizes, sinks, sliding window, attention types) against its impl's guards.
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import BackendChain, Category, Discovery, Finding, Location, Severity, Site, TraceResult
from metax_audit.core.pysource import ast_walk, walk_nodes
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import parse_file, source_line

T = TypeVar("T")

rule("MXA180", Category.CLAIM, Severity.ERROR, "advertised capability that the impl's constructor rejects",
     "The backend class tells vLLM's selector it supports a value (a kv-cache dtype in supported_kv_cache_dtypes, "
     "a head size, sinks, a sliding window, an attention type), so the selector picks it for that configuration, "
     "and the impl's __init__ raises or asserts against exactly that value: the model fails to load. Either stop "
     "advertising the value or implement it. Both lines are the evidence.")
rule("MXA181", Category.CLAIM, Severity.WARNING, "advertised capability that an impl method rejects",
     "A method of the impl (forward or a path it dispatches to) raises or asserts against a value the backend "
     "advertises: requests that take that path fail at run time. Both lines are the evidence.")
rule("MXA183", Category.CLAIM, Severity.WARNING, "causal flag hard-coded although the backend advertises non-causal attention",
     "The backend's supports_non_causal() returns True, so the selector routes non-causal (bidirectional) decoder "
     "attention to it, but a kernel call of its builder or impl passes causal=True where upstream's counterpart "
     "passes the request's flag: those requests are computed with a causal mask. Pass the metadata's causal flag "
     "(as upstream does) or stop advertising non-causal support. An error when the backend's own code asserts that "
     "the wrapper's recorded causal flag equals the request's: a non-causal request then fails that assert.")
rule("MXA184", Category.CLAIM, Severity.ERROR, "advertised capability whose only path raises NotImplementedError on the vendor",
     "The backend advertises a value (a quantized KV-cache dtype), the layer that runs its impl takes a path for "
     "that value through a CustomOp of the port, and on an out-of-tree platform an enabled CustomOp runs forward_oot "
     "(vLLM's CustomOp.dispatch_forward), whose body in the port only raises NotImplementedError: every request of "
     "that configuration fails whenever the op is enabled (compilation_config.custom_ops; a disabled op runs "
     "forward_native, which does not raise). The advertised value, the gate of the call (with the impl attribute it reads, as the "
     "impl's class sets it) and the raising forward_oot are the evidence. Implement forward_oot or stop advertising.")
rule("MXA185", Category.REGISTRATION, Severity.WARNING, "a class-level list appended to on every config check",
     "The platform's check_and_update_config (which vLLM calls for every config it builds) appends to an attribute "
     "that upstream declares as a class-level list (`ClassVar[list[...]]`): the list is shared by every instance, so "
     "each config check adds the entries again and they pile up (duplicates in the splitting ops, longer each time). "
     "Add an entry only when it is not there, or set an instance copy.")
rule("MXA182", Category.CLAIM, Severity.INFO, "advertised capability rejected on a path inherited unchanged from upstream",
     "The same guard is in upstream's counterpart: the limitation is upstream's, kept as is.")

_RAISES = ("NotImplementedError", "ValueError", "RuntimeError", "TypeError", "AssertionError")
_OFF = object()  # a feature turned off (None / falsy) in the probe environment
_UNKNOWN = object()


@dataclass(frozen=True)
class Advertised:
    capability: str  # "kv-cache dtype" | "head size" | "sinks" | "sliding window" | "attention type"
    param: str  # the impl parameter that carries it
    value: Any  # the value probed ("fp8", 96, True, "ENCODER_ONLY")
    line: int  # where the backend advertises it
    text: str  # how it is advertised


@dataclass(frozen=True)
class Guard:
    line: int
    test: ast.expr  # raises when true (an if before a raise) / must be true (an assert)
    asserts: bool
    method: str
    local: dict[str, ast.expr]  # simple assignments before it in the method (unsupported = [a, b])
    path: tuple[tuple[ast.expr, bool], ...] = ()  # enclosing if-tests and the branch taken


# ---------------------------------------------------------------- advertised


def _returns(fn: ast.FunctionDef) -> ast.expr | None:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None


def advertised(cls: ast.ClassDef) -> list[Advertised]:
    """The capabilities a backend class states in its own body, as literal values only."""
    out: list[Advertised] = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "supported_kv_cache_dtypes" for t in targets) and isinstance(
                    node.value, ast.List | ast.Tuple):
                for elt in node.value.elts:
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        out.append(Advertised("kv-cache dtype", "kv_cache_dtype", elt.value, elt.lineno,
                                              f"supported_kv_cache_dtypes includes {elt.value!r}"))
        if not isinstance(node, ast.FunctionDef):
            continue
        ret = _returns(node)
        if ret is None:
            continue
        if node.name == "get_supported_head_sizes" and isinstance(ret, ast.List | ast.Tuple):
            for elt in ret.elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, int):
                    out.append(Advertised("head size", "head_size", elt.value, node.lineno,
                                          f"get_supported_head_sizes() returns {elt.value}"))
        elif node.name in {"supports_sink", "supports_sliding_window"} and isinstance(ret, ast.Constant) and ret.value is True:
            cap, param = ("sinks", "sinks") if node.name == "supports_sink" else ("sliding window", "sliding_window")
            out.append(Advertised(cap, param, True, node.lineno, f"{node.name}() returns True"))
        elif node.name == "supports_attn_type":
            for name in _attn_types(ret):
                if name != "DECODER":
                    out.append(Advertised("attention type", "attn_type", name, node.lineno,
                                          f"supports_attn_type() accepts AttentionType.{name}"))
    return out


def _attn_types(expr: ast.expr) -> list[str]:
    """`attn_type in (AttentionType.A, ...)` / `attn_type == AttentionType.A` -> ["A", ...]."""
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        right = expr.comparators[0]
        items = right.elts if isinstance(right, ast.Tuple | ast.List | ast.Set) and isinstance(expr.ops[0], ast.In) else (
            [right] if isinstance(expr.ops[0], ast.Eq) else [])
        return [i.attr for i in items if isinstance(i, ast.Attribute)]
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        return [n for v in expr.values for n in _attn_types(v)]
    return []


# ---------------------------------------------------------------- guards


def guards(cls: ast.ClassDef) -> list[Guard]:
    """`if <test>: raise ...` (the raise first in the branch) and `assert <test>` in the impl's methods,
    each with the branch conditions it sits under."""
    out: list[Guard] = []
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef):
            _walk(fn.body, fn.name, (), {}, out)
    return out


def _walk(body: Sequence[ast.stmt], method: str, path: tuple[tuple[ast.expr, bool], ...],
          local: dict[str, ast.expr], out: list[Guard]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            local.setdefault(stmt.targets[0].id, stmt.value)
        elif isinstance(stmt, ast.Assert):
            out.append(Guard(stmt.lineno, stmt.test, True, method, dict(local), path))
        elif isinstance(stmt, ast.If):
            if stmt.body and isinstance(stmt.body[0], ast.Raise) and _raises(stmt.body[0]):
                out.append(Guard(stmt.lineno, stmt.test, False, method, dict(local), path))
            _walk(stmt.body, method, (*path, (stmt.test, True)), local, out)
            _walk(stmt.orelse, method, (*path, (stmt.test, False)), local, out)
        elif isinstance(stmt, ast.For | ast.While | ast.With | ast.Try):
            for part in ("body", "orelse", "finalbody"):
                _walk(getattr(stmt, part, []) or [], method, path, local, out)
            for handler in getattr(stmt, "handlers", []) or []:
                _walk(handler.body, method, path, local, out)


def _raises(node: ast.Raise) -> bool:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id in _RAISES


class _Eval:
    """A small evaluator of guard tests over the impl's parameters: the probed capability set to its
    advertised value, every other feature off. Anything it cannot decide is _UNKNOWN (no finding)."""

    def __init__(self, env: dict[str, Any], local: dict[str, ast.expr]) -> None:
        self.env = env
        self.local = local
        self.depth = 0

    def __call__(self, e: ast.expr) -> Any:
        self.depth += 1
        try:
            return _UNKNOWN if self.depth > 50 else self._eval(e)
        finally:
            self.depth -= 1

    def _name(self, name: str) -> Any:
        if name in self.env:
            return self.env[name]
        if name in self.local:
            return self(self.local.pop(name))  # each local once: no cycles
        return _UNKNOWN

    def _eval(self, e: ast.expr) -> Any:
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Name):
            return self._name(e.id)
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self":
                return self._name(e.attr)
            if isinstance(e.value, ast.Name) and e.value.id == "AttentionType":
                return e.attr
            return _UNKNOWN
        if isinstance(e, ast.List | ast.Tuple | ast.Set):
            return [self(x) for x in e.elts]
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = self(e.operand)
            return _UNKNOWN if v is _UNKNOWN else not _truthy(v)
        if isinstance(e, ast.BoolOp):
            vals = [self(v) for v in e.values]
            if isinstance(e.op, ast.And):
                if any(v is not _UNKNOWN and not _truthy(v) for v in vals):
                    return False
                return _UNKNOWN if any(v is _UNKNOWN for v in vals) else True
            if any(v is not _UNKNOWN and _truthy(v) for v in vals):
                return True
            return _UNKNOWN if any(v is _UNKNOWN for v in vals) else False
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            left, right = self(e.left), self(e.comparators[0])
            if left is _UNKNOWN or right is _UNKNOWN:
                return _UNKNOWN
            return _compare(e.ops[0], left, right)
        if isinstance(e, ast.Call):
            return self._call(e)
        return _UNKNOWN

    def _call(self, e: ast.Call) -> Any:
        func = e.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = [self(a) for a in e.args]
        if any(a is _UNKNOWN for a in args) or e.keywords:
            return _UNKNOWN
        if name in {"any", "all"} and len(args) == 1 and isinstance(args[0], list):
            vals = [_truthy(v) for v in args[0] if v is not _UNKNOWN]
            if len(vals) != len(args[0]):
                return True if name == "any" and any(vals) else _UNKNOWN
            return any(vals) if name == "any" else all(vals)
        if name == "is_quantized_kv_cache" and len(args) == 1 and isinstance(args[0], str):
            return args[0] not in {"auto", "float16", "bfloat16", "float32", "half"}  # vLLM's contract: not a float dtype
        if isinstance(func, ast.Attribute) and name in {"startswith", "endswith"}:
            owner = self(func.value)
            if isinstance(owner, str) and all(isinstance(a, str | tuple) for a in args):
                return getattr(owner, name)(*args)
        return _UNKNOWN


def _truthy(v: Any) -> bool:
    return False if v is _OFF else bool(v)


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Is | ast.IsNot):
        if right is None:
            is_none = left is _OFF or left is None
            return is_none if isinstance(op, ast.Is) else not is_none
        return _UNKNOWN
    if left is _OFF or right is _OFF:
        return _UNKNOWN
    try:
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.In):
            return left in right
        if isinstance(op, ast.NotIn):
            return left not in right
        if isinstance(op, ast.Lt):
            return left < right
        if isinstance(op, ast.LtE):
            return left <= right
        if isinstance(op, ast.Gt):
            return left > right
        if isinstance(op, ast.GtE):
            return left >= right
    except TypeError:
        return _UNKNOWN
    return _UNKNOWN


_BASE_ENV: dict[str, Any] = {"kv_cache_dtype": "auto", "sinks": _OFF, "sliding_window": _OFF, "attn_type": "DECODER",
                             "alibi_slopes": _OFF, "logits_soft_cap": _OFF, "kv_sharing_target_layer_name": _OFF}


def rejects(guard: Guard, adv: Advertised, siblings: Sequence[Any] = ()) -> bool:
    """Whether the guard raises (or its assert fails) for the advertised value, every other feature off,
    while it does not for the baseline (so the guard is about this capability, not always on): the
    feature off, or for head sizes another advertised size the guard lets through."""
    def outcome(value: Any) -> Any:
        env = {**_BASE_ENV, adv.param: _OFF if value is None else value}
        if adv.param == "sinks" and value is True:
            env["sinks"] = object()  # a tensor: not None
        if adv.param == "sliding_window" and value is True:
            env["sliding_window"] = 4096
        for test, branch in guard.path:  # a guard under a branch the value never takes does not fire
            taken = _Eval(env, dict(guard.local))(test)
            if taken is not _UNKNOWN and _truthy(taken) != branch:
                return False
        result = _Eval(env, dict(guard.local))(guard.test)
        if result is _UNKNOWN:
            return _UNKNOWN
        return (not _truthy(result)) if guard.asserts else _truthy(result)

    baseline = {"kv-cache dtype": "auto", "attention type": "DECODER", "sinks": None, "sliding window": None,
                "head size": None}[adv.capability]
    if adv.capability == "head size":
        return outcome(adv.value) is True and any(outcome(v) is False for v in siblings if v != adv.value)
    return outcome(adv.value) is True and outcome(baseline) is False


# ---------------------------------------------------------------- the check


def _class(root: Path, path: str, qualname: str) -> ast.ClassDef | None:
    tree = parse_file(str(root / path))
    name = qualname.rsplit(".", 1)[-1]
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _hop(chain: BackendChain, role: str) -> tuple[str, str] | None:
    for hop in chain.chain:
        if hop.role == role and not hop.inherited_from:
            return hop.path, hop.qualname
    return None


def _upstream_tests(root: Path | None, path: str | None, memo: FileMemo | None = None) -> set[str]:
    """The guard tests written in upstream's counterpart file (to tell an inherited limitation apart)."""
    if root is None or path is None:
        return set()
    if memo is not None:
        return memo.get(path, ("guard-tests",), partial(_guard_tests, root, path), root=root)
    return _guard_tests(root, path)


def _guard_tests(root: Path, path: str) -> set[str]:
    tree = parse_file(str(root / path))
    if tree is None:
        return set()
    out = set()
    for node in walk_nodes(tree):
        if isinstance(node, ast.If | ast.Assert):
            out.add(ast.unparse(node.test))
    return out


def check_capabilities(discovery: Discovery, trace: TraceResult, *, upstream_root: Path | None = None,
                       counterparts: dict[str, str] | None = None, memo: FileMemo | None = None,
                       platform_path: str = "") -> Iterator[Finding]:
    """One finding per (backend, advertised value, rejecting guard) on each traced backend's impl. What is
    read of upstream's files is kept per file in `memo`; the port side follows the trace's chains."""
    root = discovery.root
    seen: set[tuple[str, int, str]] = set()
    for chain in trace.backends:
        backend, impl = _hop(chain, "backend"), _hop(chain, "impl")
        if backend is None or impl is None:
            continue
        bcls, icls = _class(root, *backend), _class(root, *impl)
        if bcls is None or icls is None:
            continue
        claims = advertised(bcls)
        if not claims:
            continue
        up_tests = _upstream_tests(upstream_root, (counterparts or {}).get(impl[0]), memo)
        for guard in guards(icls):
            for adv in claims:
                key = (impl[0], guard.line, f"{adv.capability}:{adv.value}")
                siblings = [c.value for c in claims if c.capability == adv.capability]
                if key in seen or not rejects(guard, adv, siblings):
                    continue
                seen.add(key)
                yield _finding(root, chain, backend[0], impl[0], adv, guard, ast.unparse(guard.test) in up_tests)
    yield from check_causal(discovery, trace, upstream_root=upstream_root, counterparts=counterparts or {}, memo=memo)
    yield from check_oot_raises(discovery, trace, upstream_root=upstream_root, counterparts=counterparts or {})
    if platform_path and upstream_root is not None:
        yield from check_config_hook_appends(root, platform_path, upstream_root)


_GROWS = frozenset({"append", "extend", "insert"})


def check_config_hook_appends(root: Path, platform_path: str, upstream_root: Path) -> Iterator[Finding]:
    """MXA185: `x.<attr>.append(...)` in the platform's check_and_update_config where upstream declares `<attr>` a
    class-level list (ClassVar)."""
    tree = parse_file(str(root / platform_path))
    appends: dict[str, list[tuple[int, str]]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)) if tree is not None else ():
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "check_and_update_config"):
            for node in ast_walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _GROWS \
                        and isinstance(node.func.value, ast.Attribute):
                    appends.setdefault(node.func.value.attr, []).append((node.lineno, ast.unparse(node)))
    declarations = _class_level_lists(upstream_root, set(appends)) if appends else {}
    for attr, calls in appends.items():
        declared = declarations.get(attr)
        if declared is None:
            continue
        up_path, up_line, text = declared
        first = calls[0][0]
        yield make_finding(
            "MXA185", Location(platform_path, first, f"config-hook-append:{attr}"),
            f"check_and_update_config appends to {attr}, a class-level list upstream shares across every config "
            f"({len(calls)} append(s)): each config check adds them again",
            [*(f"port: {platform_path}:{n}: {t}" for n, t in calls), f"upstream: {up_path}:{up_line}: {text}",
             "contract: vLLM calls Platform.check_and_update_config for every VllmConfig it builds"],
            sites=[Site(platform_path, n, "check_and_update_config", "append", t) for n, t in calls])


def _class_level_lists(upstream_root: Path, attrs: set[str]) -> dict[str, tuple[str, int, str]]:
    """Where upstream declares each of `attrs` as `<attr>: ClassVar[list...]` (one pass over its files, read as text)."""
    needle = re.compile(r"^\s+(?P<attr>\w+)\s*:\s*(typing\.)?ClassVar\[\s*list\b")
    wanted = [a.encode() for a in attrs]
    out: dict[str, tuple[str, int, str]] = {}
    for path in sorted(upstream_root.rglob("*.py")):
        try:
            with open(path, "rb") as fh:
                data = fh.read()
            # the bytes first: decoding every upstream file (38 MB for vLLM) was most of this pass
            if b"ClassVar" not in data or not any(a in data for a in wanted):
                continue
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = needle.match(line)
            if m and m["attr"] in attrs and m["attr"] not in out:
                out[m["attr"]] = (path.relative_to(upstream_root).as_posix(), n, line.strip())
    return out


_QUANTIZED = re.compile(r"^(fp8\w*|int8\w*|fp4\w*|nvfp4\w*|int4\w*)$")


def check_oot_raises(discovery: Discovery, trace: TraceResult, *, upstream_root: Path | None = None,
                     counterparts: dict[str, str] | None = None) -> Iterator[Finding]:
    """MXA184: a backend advertising a quantized KV-cache dtype whose layer calls, under a test of that dtype (and of
    an impl attribute the impl's class sets True), a port CustomOp whose forward_oot only raises. Where upstream's
    class of the same name (in the op file's counterpart) defines a forward_native the port's class does not, a
    disabled op is no way out either: it runs the inherited forward_native, not upstream's (said, with its line)."""
    root = discovery.root
    trees = {f.path: t for f in discovery.files if f.path.endswith(".py") for t in [parse_file(str(root / f.path))] if t is not None}
    classes = {n.name: (path, n) for path, t in trees.items() for n in t.body if isinstance(n, ast.ClassDef)}
    raising = {name: (path, fn.lineno) for name, (path, cls) in classes.items() for fn in cls.body
               if isinstance(fn, ast.FunctionDef) and fn.name == "forward_oot" and _only_raises_not_implemented(fn)}
    if not raising:
        return
    seen: set[tuple[str, int, str]] = set()
    for path, tree in trees.items():
        for holder in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            ops = {attr: name for attr, name in _self_constructed(holder).items() if name in raising}
            for fn, call, gate, attr in _gated_op_calls(holder, ops):
                impl_attrs = [a for a in _impl_attrs(gate)]
                if not _reads_quantized_kv(fn, gate):
                    continue
                for chain in trace.backends:
                    backend, impl = _hop(chain, "backend"), _hop(chain, "impl")
                    bcls = _class(root, *backend) if backend else None
                    if backend is None or impl is None or bcls is None:
                        continue
                    quantized = [a for a in advertised(bcls) if a.capability == "kv-cache dtype" and isinstance(a.value, str)
                                 and _QUANTIZED.match(a.value)]
                    mro = _port_mro(impl[1].rsplit(".", 1)[-1], classes)
                    if not quantized or not any(p == path for p, _ in mro):  # the impl's base lives beside the layer
                        continue
                    values = {a: _attr_value(mro, a) for a in impl_attrs}
                    if any(v is not True for v, _ in values.values()):
                        continue
                    key = (path, call.lineno, chain.name)
                    if key in seen:
                        continue
                    seen.add(key)
                    op_path, op_line = raising[ops[attr]]
                    adv = quantized[0]
                    # Built with enforce_enable=True the op is enabled whatever custom_ops says: the condition is gone.
                    enabled = ("(it is built with enforce_enable=True, so always enabled)" if attr in _enforced(holder)
                               else "with that CustomOp enabled (compilation_config.custom_ops)")
                    native = _native_left_to_base(classes[ops[attr]][1], op_path, upstream_root, counterparts or {})
                    disabled = ""
                    if native is not None and attr not in _enforced(holder):
                        disabled = (f"; disabled, it runs {native[2]}.forward_native, not the forward_native upstream's "
                                    f"{ops[attr]} defines")
                    yield make_finding(
                        "MXA184", Location(path, call.lineno, f"oot-raises:{chain.name}:{ops[attr]}"),
                        f"NotImplementedError when {chain.name} runs with a {adv.value!r} KV cache: {holder.name}.{fn.name} calls "
                        f"self.{attr} ({ops[attr]}) under `{ast.unparse(gate)}`, and on an out-of-tree platform, {enabled}, "
                        f"its forward_oot only raises{disabled}", [
                            f"advertised: {backend[0]}:{adv.line}: {adv.text}",
                            f"path: {path}:{call.lineno}: {source_line(root, path, call.lineno)}  (under `{ast.unparse(gate)}`)",
                            *(f"impl: {where}: {a} is True for {impl[1].rsplit('.', 1)[-1]}" for a, (_, where) in values.items()),
                            f"raises: {op_path}:{op_line}: {ops[attr]}.forward_oot only raises NotImplementedError",
                            "contract: vLLM's CustomOp.dispatch_forward runs forward_oot when the op is enabled and "
                            "current_platform.is_out_of_tree(); a disabled op runs forward_native instead",
                            *([f"disabled: {op_path}:{classes[ops[attr]][1].lineno}: the port's {ops[attr]} defines no "
                               f"forward_native, so a disabled op runs the inherited {native[2]}.forward_native; upstream's "
                               f"class defines its own: {native[0]}:{native[1]}: "
                               f"{source_line(upstream_root, native[0], native[1]) if upstream_root else ''}"]
                              if disabled and native is not None else []),
                        ],
                        sites=[Site(backend[0], adv.line, chain.name, "advertised", adv.text),
                               Site(path, call.lineno, f"{holder.name}.{fn.name}", "call", ast.unparse(gate)),
                               Site(op_path, op_line, f"{ops[attr]}.forward_oot", "raise")])


def _native_left_to_base(cls: ast.ClassDef, path: str, upstream_root: Path | None,
                         counterparts: dict[str, str]) -> tuple[str, int, str] | None:
    """(upstream path, line, the port class's first base) when upstream's class of this name, in the counterpart of
    `path`, defines forward_native (a def or an assignment in its body) and the port's class does not."""
    up_path = counterparts.get(path)
    if upstream_root is None or up_path is None or _defines(cls, "forward_native") or not cls.bases:
        return None
    tree = parse_file(str(upstream_root / up_path))
    theirs = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.name), None) if tree else None
    line = _defines(theirs, "forward_native") if theirs is not None else 0
    return (up_path, line, ast.unparse(cls.bases[0])) if line else None


def _defines(cls: ast.ClassDef, name: str) -> int:
    """The line where the class body defines `name` (a def, or an assignment to it), 0 when it does not."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node.lineno
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.lineno
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.lineno
    return 0


def _only_raises_not_implemented(fn: ast.FunctionDef) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None \
        and "NotImplementedError" in ast.unparse(body[0].exc)


def _self_constructed(cls: ast.ClassDef) -> dict[str, str]:
    """`self.<attr> = Name(...)` anywhere in the class: attr -> class name."""
    out: dict[str, str] = {}
    for node in ast_walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out[t.attr] = node.value.func.id
    return out


def _enforced(cls: ast.ClassDef) -> set[str]:
    """`self.<attr> = Name(..., enforce_enable=True)` anywhere in the class: the attrs (CustomOp's constructor
    keyword that enables the op whatever compilation_config.custom_ops says)."""
    out: set[str] = set()
    for node in ast_walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                k.arg == "enforce_enable" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.value.keywords):
            out.update(t.attr for t in node.targets
                       if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self")
    return out


def _gated_op_calls(cls: ast.ClassDef, ops: dict[str, str]) -> Iterator[tuple[ast.FunctionDef, ast.Call, ast.expr, str]]:
    """Calls `self.<op>(...)` in the class's methods with the test of the innermost `if` holding them."""
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        for node in ast_walk(fn):
            if isinstance(node, ast.If):
                for call in (c for st in node.body for c in ast_walk(st) if isinstance(c, ast.Call)):
                    f = call.func
                    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in ops:
                        yield fn, call, node.test, f.attr


def _impl_attrs(gate: ast.expr) -> list[str]:
    """`self.impl.<attr>` read by the gate."""
    return [n.attr for n in ast_walk(gate) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
            and n.value.attr == "impl"]


def _reads_quantized_kv(fn: ast.FunctionDef, gate: ast.expr) -> bool:
    """The gate reads a name the function sets from a quantized-KV-cache test (`x = is_quantized_kv_cache(...)`)."""
    names = {n.id for n in ast_walk(gate) if isinstance(n, ast.Name)}
    for node in ast_walk(fn):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            text = ast.unparse(node.value)
            if "quantized_kv_cache" in text or re.search(r"kv_cache_dtype.*fp8|fp8.*kv_cache_dtype", text):
                return True
    return False


def _port_mro(name: str, classes: dict[str, tuple[str, ast.ClassDef]]) -> list[tuple[str, ast.ClassDef]]:
    """The port classes of `name`'s bases, depth first (names resolved among the files in scope)."""
    out: list[tuple[str, ast.ClassDef]] = []
    todo = [name]
    while todo:
        found = classes.get(todo.pop(0))
        if found is None or found in out:
            continue
        out.append(found)
        todo.extend(ast.unparse(b.value if isinstance(b, ast.Subscript) else b).rsplit(".", 1)[-1] for b in found[1].bases)
    return out


def _attr_value(mro: list[tuple[str, ast.ClassDef]], attr: str) -> tuple[object, str]:
    """The constant the first class of the MRO that sets `attr` (class level or `self.attr = ...`) gives it."""
    for path, cls in mro:
        for node in ast_walk(cls):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                for t in targets:
                    hit = (isinstance(t, ast.Name) and t.id == attr) or (
                        isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self")
                    if hit:
                        value = node.value.value if isinstance(node.value, ast.Constant) else None
                        return value, f"{path}:{node.lineno} {cls.name}"
    return None, ""


def _non_causal(cls: ast.ClassDef) -> int | None:
    """The line of `supports_non_causal()` when it returns True."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "supports_non_causal":
            ret = _returns(node)
            if isinstance(ret, ast.Constant) and ret.value is True:
                return node.lineno
    return None


def _causal_calls(tree: ast.AST) -> list[tuple[str, str, int, str]]:
    """(method, callee as written, line of the keyword, causal value as written) of every call passing
    causal=/is_causal=, for each function holding it (ast.walk order, nested functions included)."""
    nodes = walk_nodes(tree) if isinstance(tree, ast.Module) else tuple(ast_walk(tree))
    lines = {n.lineno for n in nodes if isinstance(n, ast.Call) and any(kw.arg in {"causal", "is_causal"} for kw in n.keywords)}
    out: list[tuple[str, str, int, str]] = []
    for fn in nodes if lines else ():
        if not isinstance(fn, ast.FunctionDef):
            continue
        # every node under a def lies within its lines (decorators included): skip the defs holding no such call
        first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
        if not any(first <= line <= (fn.end_lineno or fn.lineno) for line in lines):
            continue
        for node in ast_walk(fn):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg in {"causal", "is_causal"}:
                        out.append((fn.name, ast.unparse(node.func), kw.value.lineno, ast.unparse(kw.value)))
    return out


def _file_causal_calls(root: Path, path: str) -> list[tuple[str, str, int, str]] | None:
    tree = parse_file(str(root / path))
    return None if tree is None else _causal_calls(tree)


def _class_causal_calls(root: Path, path: str, qualname: str) -> list[tuple[str, str, int, str]] | None:
    cls = _class(root, path, qualname)
    return None if cls is None else _causal_calls(cls)


def _file_causal_asserts(root: Path, path: str) -> list[tuple[str, int, str]]:
    """`assert <wrapper>._causal == <metadata>.causal` (either order, == or is): the port's own check that the causal
    flag a kernel was planned with is the request's."""
    tree = parse_file(str(root / path))
    out: list[tuple[str, int, str]] = []
    for node in ast_walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is):
            sides = [test.left, test.comparators[0]]
            names = sorted(x.attr for x in sides if isinstance(x, ast.Attribute))
            if names == ["_causal", "causal"]:
                out.append((path, node.lineno, ast.unparse(node)))
    return out


def _class_non_causal(root: Path, path: str, qualname: str) -> int | None:
    cls = _class(root, path, qualname)
    return None if cls is None else _non_causal(cls)


def check_causal(discovery: Discovery, trace: TraceResult, *, upstream_root: Path | None,
                 counterparts: dict[str, str], memo: FileMemo | None = None) -> Iterator[Finding]:
    """causal=True written where upstream's counterpart passes the request's flag, in a backend that
    advertises non-causal attention (MXA183)."""
    root = discovery.root
    seen: set[tuple[str, int]] = set()

    def kept(path: str, unit: tuple[str, ...], compute: Callable[[], T], at: Path = root) -> T:
        return memo.get(path, unit, compute, root=at) if memo else compute()

    for chain in trace.backends:
        backend = _hop(chain, "backend")
        line = kept(backend[0], ("non-causal", backend[1]), partial(_class_non_causal, root, *backend)) if backend else None
        if backend is None or line is None or upstream_root is None:
            continue
        for role in ("builder", "impl"):
            hop = _hop(chain, role)
            calls = kept(hop[0], ("class-causal-calls", hop[1]), partial(_class_causal_calls, root, *hop)) if hop else None
            up_path = counterparts.get(hop[0]) if hop else None
            up_calls = kept(up_path, ("causal-calls",), partial(_file_causal_calls, upstream_root, up_path), upstream_root) \
                if up_path else None
            if hop is None or calls is None or up_calls is None or up_path is None:
                continue
            upstream: dict[tuple[str, str], list[tuple[int, str]]] = {}
            for m, callee, ln, text in up_calls:
                upstream.setdefault((m, callee), []).append((ln, text))
            for method, tail, ln, text in calls:
                theirs = upstream.get((method, tail), [])
                # upstream passes the request's flag to this very call, and never a literal True
                if text != "True" or not theirs or any(t in {"True", "False"} for _, t in theirs) or (hop[0], ln) in seen:
                    continue
                seen.add((hop[0], ln))
                up_line, up_text = theirs[0]
                evidence = [f"advertised: {backend[0]}:{line}: supports_non_causal() returns True",
                            f"port: {hop[0]}:{ln}: {source_line(root, hop[0], ln)}  (in {method})",
                            f"upstream: {up_path}:{up_line}: {source_line(upstream_root, up_path, up_line)}"]
                sites = [Site(hop[0], ln, method, "call", source_line(root, hop[0], ln))]
                # Proven, not only suspected: the port itself asserts that the wrapper's recorded flag equals the
                # request's, so a non-causal request (which the backend advertises) fails that assert.
                checks = [c for path in dict.fromkeys(h.path for h in chain.chain if h.path)
                          for c in kept(path, ("causal-asserts",), partial(_file_causal_asserts, root, path))]
                severity = None
                message = (f"{chain.name} advertises non-causal attention, but {method} calls {tail}(causal=True) "
                           f"where upstream passes causal={up_text}")
                if checks:
                    apath, aline, atext = checks[0]
                    severity = Severity.ERROR
                    message = (f"AssertionError when a non-causal request runs: {method} plans {tail}(causal=True) where upstream "
                               f"passes causal={up_text}, and {apath}:{aline} asserts the wrapper's flag equals the request's "
                               f"({chain.name} advertises non-causal attention)")
                    evidence.append(f"fails: {apath}:{aline}: {atext}  (the flag the plan recorded is compared with the request's)")
                    sites += [Site(p, n, "", "assert", t) for p, n, t in checks]
                yield make_finding("MXA183", Location(hop[0], ln, f"causal:{chain.name}:{method}:{tail}"), message, evidence,
                                   severity=severity, sites=sites)


def _finding(root: Path, chain: BackendChain, bpath: str, ipath: str, adv: Advertised, guard: Guard,
             inherited: bool) -> Finding:
    rule_id = "MXA182" if inherited else "MXA180" if guard.method == "__init__" else "MXA181"
    kind = "asserts against" if guard.asserts else "raises for"
    what = f"{adv.value!r}" if not isinstance(adv.value, bool) else "it"
    evidence = [f"advertised: {bpath}:{adv.line}: {adv.text}",
                f"implemented: {ipath}:{guard.line}: {source_line(root, ipath, guard.line)}  (in {guard.method})",
                f"backend {chain.name} ({chain.class_path})" + ("" if chain.active else ", not in the platform's priority lists")]
    if inherited:
        evidence.append("the same guard is in upstream's counterpart file")
    msg = f"{chain.name} advertises {adv.capability} {what}, but its impl's {guard.method} {kind} it"
    return make_finding(rule_id, Location(ipath, guard.line, f"capability:{chain.name}:{adv.capability}:{adv.value}"),
                        msg, evidence)


def counterpart_paths(files: Sequence[Any]) -> dict[str, str]:
    """port path -> upstream path from the comparison's file records."""
    return {f.path: f.upstream_path for f in files if getattr(f, "upstream_path", None)}

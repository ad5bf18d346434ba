# Severity by consequence for compare's differences: which hunks can change what a kernel computes or
# whether it runs on the vendor device (warning), and which are known vendor adaptations or code the
# vendor never runs (info, with the reason or the gate as evidence). Pure functions over ast nodes.
from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from metax_audit.core.pysource import ast_children, ast_walk, read_source_cached

# Predicates whose answer on any out-of-tree platform is known without running it (vLLM's Platform
# compares its enum): the port's own platform class may override them, and then its answer wins.
OUT_OF_TREE_ANSWERS: dict[str, bool] = {
    "is_cuda": False, "is_rocm": False, "is_xpu": False, "is_tpu": False, "is_cpu": False,
    "is_hpu": False, "is_neuron": False, "is_out_of_tree": True,
}
# Words that name what a kernel computes or how it is laid out: a hunk that changes one of them can
# change a kernel's result; a hunk that changes none of them is bookkeeping.
_KERNEL_WORDS = re.compile(
    r"dtype|scale|layout|lse|causal|shape|stride|head_?size|head_?dim|block_?size|page_?size|kv_?cache|"
    r"window|soft_?cap|sink|alibi|fp8|fp4|nvfp4|int8|uint8|bf16|bfloat16|float16|float32|half|split|"
    r"pad|view|permute|transpose|reshape|contiguous|num_heads|num_kv_heads|num_qo_heads|topk|indptr|"
    r"indices|seq_?len|query_?len|block_?table|workspace|cu_seqlens|max_seqlen|ln_?2|log2|exp2", re.IGNORECASE)
# Callees that are kernels or ops (the port's, upstream's or the kernel stack's): an argument change there matters.
_KERNEL_CALLEE = re.compile(r"flash|attn|attention|mla|kernel|ops\.|triton|cutlass|\.run$|\.plan$|merge|decode|prefill|cache",
                            re.IGNORECASE)
# Method names a framework calls on a backend class to decide whether and how it runs.
CAPABILITY_HOOK = re.compile(r"^(supports_\w+|get_supported_\w+|get_preferred_\w+|get_required_\w+|"
                             r"get_min_\w+|is_supported\w*|validate_\w+)$")
NOT_KERNEL = "no kernel argument, dtype, scale, layout, LSE, causal or shape expression changes"


@dataclass(frozen=True)
class VendorPlatform:
    """What the port's platform answers without a device: predicate name -> (value, evidence)."""

    answers: dict[str, tuple[bool, str]] = field(default_factory=dict)
    # Functions of the compared port file that return a constant (`return True, None`), by bare name.
    returns: dict[str, tuple[object, str]] = field(default_factory=dict)
    # The KV-cache dtypes the port file's backends list as supported (empty: unknown), and where.
    kv_dtypes: frozenset[str] = frozenset()
    kv_dtypes_at: str = ""
    # `self.<attr>` that every assignment in a class of the port file sets to one constant, by class name.
    attrs: dict[str, dict[str, tuple[object, str]]] = field(default_factory=dict)
    cls: str = ""  # the class whose code is being judged (its constant attributes apply), "" for none

    def in_class(self, name: str) -> VendorPlatform:
        """These answers, judging code of class `name` (its constant `self.` attributes are known)."""
        return self if name == self.cls else replace(self, cls=name)

    def known(self, expr: ast.AST) -> tuple[object, str] | None:
        """The value of a literal, a call of a constant-returning port function, or a constant attribute."""
        if isinstance(expr, ast.Constant):
            return expr.value, ""
        if isinstance(expr, ast.Call):
            return self.returns.get(_callee(expr))
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            return self.attrs.get(self.cls, {}).get(expr.attr)
        return None

    def kv_dtype_excluded(self, values: list[str]) -> str:
        """Evidence that none of `values` is a KV-cache dtype the port supports, or ""."""
        if not self.kv_dtypes or not values or any(v in self.kv_dtypes for v in values):
            return ""
        return f"the port's supported_kv_cache_dtypes ({', '.join(sorted(self.kv_dtypes))}) at {self.kv_dtypes_at} exclude {', '.join(values)}"

    def value(self, call: ast.Call) -> tuple[bool, str] | None:
        name = _callee(call).rsplit(".", 1)[-1]
        if name in self.answers:
            return self.answers[name]
        found = self.returns.get(_callee(call))
        return (found[0], found[1]) if found is not None and isinstance(found[0], bool) else None

    def with_file(self, tree: ast.Module, path: str, root: Path | None = None, package: str = "") -> VendorPlatform:
        """These answers plus the functions of `path` that return a constant, the ones it imports from the
        port's own package (read under `root`), and the `self.` attributes its classes set to a constant."""
        returns = _constant_functions(tree, path)
        if root is not None and package:
            for rel, names in port_imports(tree, package, root).items():
                src = read_source_cached((root / rel).parent, Path(rel).name, 5_000_000)
                consts = _constant_functions(src.tree, rel) if src.tree is not None else {}
                returns.update({alias: consts[name] for name, alias in names if name in consts and alias not in returns})
        attrs = _constant_attributes(tree, path, returns)
        dtypes: set[str] = set()
        where = ""
        for node in ast_walk(tree):
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            value = node.value
            if isinstance(target, ast.Name) and target.id == "supported_kv_cache_dtypes" and isinstance(value, ast.List | ast.Tuple | ast.Set):
                found = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(found) != len(value.elts):
                    return VendorPlatform(self.answers, returns, attrs=attrs)  # a computed entry: the list is not known
                dtypes.update(found)
                where = where or f"{path}:{node.lineno}"
        return VendorPlatform(self.answers, returns, frozenset(dtypes), where, attrs)


def _constant_functions(tree: ast.Module, path: str) -> dict[str, tuple[object, str]]:
    """Module-level functions whose only effect is to return one literal whatever their arguments (a log
    call or docstring before the return aside)."""
    returns: dict[str, tuple[object, str]] = {}
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and (isinstance(s.value, ast.Constant) or is_log_call(s.value)))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            try:
                value = ast.literal_eval(body[0].value)
            except ValueError:
                continue
            returns[fn.name] = (value, f"{path}:{fn.lineno} {fn.name}() returns {value!r}")
    return returns


def port_imports(tree: ast.Module, package: str, root: Path) -> dict[str, list[tuple[str, str]]]:
    """The port modules a file imports names from at module level (`from <package>.x import f as g`), as
    file paths under `root` -> [(name, bound name)]; modules not found as files are left out."""
    out: dict[str, list[tuple[str, str]]] = {}
    for base, names in imported_port_modules(tree, package):
        rel = port_module_file(root, base)
        if rel is not None:
            out.setdefault(rel, []).extend(names)
    return out


def imported_port_modules(tree: ast.Module, package: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """What port_imports reads of a file's tree: each module-level `from <package>.x import ...` as the
    module's path without suffix ("vllm_metax/x") and its [(name, bound name)], in port_imports' order."""
    top = package.split(".")[0]
    out: list[tuple[str, list[tuple[str, str]]]] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If | ast.Try):
            stack.extend(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
        if not isinstance(node, ast.ImportFrom) or node.level or (node.module or "").split(".")[0] != top:
            continue
        out.append(((node.module or "").replace(".", "/"), [(a.name, a.asname or a.name) for a in node.names]))
    return out


def port_module_file(root: Path, base: str) -> str | None:
    """The file under `root` of a module path without suffix ("vllm_metax/x"): x.py, else x/__init__.py."""
    return next((r for r in (f"{base}.py", f"{base}/__init__.py") if (root / r).is_file()), None)


def _constant_attributes(tree: ast.Module, path: str, returns: dict[str, tuple[object, str]]) -> dict[str, dict[str, tuple[object, str]]]:
    """Per class: `self.<attr>` whose every store in the class's methods is the same literal, or a call of
    one constant-returning function (`self.version = get_version(...)` where get_version returns 2)."""
    out: dict[str, dict[str, tuple[object, str]]] = {}
    for cls in ast_walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        seen: dict[str, tuple[object, str] | None] = {}
        for node in ast_walk(cls):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets, value = [node.target], node.value if isinstance(node, ast.AnnAssign) else None
            for t in [e for tg in targets for e in (tg.elts if isinstance(tg, ast.Tuple) else [tg])]:
                if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"):
                    continue
                found: tuple[object, str] | None = None
                if value is not None and len(targets) == 1 and t is targets[0] and not isinstance(node, ast.AugAssign):
                    if isinstance(value, ast.Constant):
                        found = (value.value, f"{path}:{t.lineno} sets self.{t.attr} = {value.value!r}")
                    elif isinstance(value, ast.Call) and _callee(value) in returns:
                        fv, fwhy = returns[_callee(value)]
                        found = (fv, f"{path}:{t.lineno} sets self.{t.attr} from {_callee(value)}(), and {fwhy}")
                previous = seen.get(t.attr, found)
                seen[t.attr] = found if found is not None and previous is not None and previous[0] == found[0] else None
        known = {name: v for name, v in seen.items() if v is not None}
        if known:
            out[cls.name] = known
    return out


_LOG_CALL = re.compile(r"^(logger|logging|log|_logger|LOGGER)\.\w+$|^print$|^warnings\.warn$")


def is_log_call(node: ast.AST) -> bool:
    """A call that only writes a log line (logger.info_once(...), print(...), warnings.warn(...))."""
    return isinstance(node, ast.Call) and bool(_LOG_CALL.match(_callee(node)))


def read_vendor_platform(root: Path, platform_path: str) -> VendorPlatform:
    """Predicates the port's platform file answers with a constant (`return False`), plus the fixed
    answers of an out-of-tree platform for the in-tree platform predicates it does not override."""
    answers: dict[str, tuple[bool, str]] = {}
    path = root / platform_path
    src = read_source_cached(path.parent, path.name, 5_000_000) if path.is_file() else None
    if src is None or src.tree is None:
        return VendorPlatform(answers)
    classes = [n for n in src.tree.body if isinstance(n, ast.ClassDef)]
    for cls in classes:  # `_enum = PlatformEnum.OOT`: vLLM answers the in-tree predicates from the enum
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_enum" for t in stmt.targets) \
                    and ast.unparse(stmt.value).endswith(".OOT"):
                answers.update({name: (value, f"{name}() is {value} on an out-of-tree platform ({platform_path}:{stmt.lineno} "
                                              f"{cls.name}._enum = {ast.unparse(stmt.value)})")
                                for name, value in OUT_OF_TREE_ANSWERS.items()})
    for cls in classes:
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, bool):
                value = body[0].value.value
                answers[fn.name] = (value, f"{platform_path}:{fn.lineno} {cls.name}.{fn.name} returns {value}")
            elif fn.name in answers:
                del answers[fn.name]  # the port decides it at run time: no fixed answer
    return VendorPlatform(answers)


def constant(expr: ast.AST, platform: VendorPlatform) -> tuple[bool, str] | None:
    """The value of a condition on the vendor platform when the platform's answers decide it."""
    dtype = _kv_dtype_test(expr, platform)
    if dtype is not None:
        return dtype
    if isinstance(expr, ast.Call):
        return platform.value(expr)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        return _compare_known(expr, platform)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call) and isinstance(expr.slice, ast.Constant):
        found = platform.returns.get(_callee(expr.value))
        if found is not None and isinstance(found[0], tuple) and isinstance(expr.slice.value, int) \
                and -len(found[0]) <= expr.slice.value < len(found[0]) and isinstance(found[0][expr.slice.value], bool):
            return found[0][expr.slice.value], found[1]
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = constant(expr.operand, platform)
        return (not inner[0], inner[1]) if inner else None
    if isinstance(expr, ast.BoolOp):
        decisive = isinstance(expr.op, ast.Or)  # True decides an `or`, False decides an `and`
        known = [constant(v, platform) for v in expr.values]
        for k in known:
            if k is not None and k[0] == decisive:
                return decisive, k[1]
        if all(k is not None for k in known):
            return (not decisive), "; ".join(k[1] for k in known if k)
    return None


_OPS: dict[type, object] = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


def _compare_known(expr: ast.Compare, platform: VendorPlatform) -> tuple[bool, str] | None:
    """`x == 4` where the port fixes x (a constant attribute or the result of a constant-returning function)."""
    left, right = platform.known(expr.left), platform.known(expr.comparators[0])
    if right is None and isinstance(expr.comparators[0], ast.Tuple | ast.List | ast.Set):
        try:
            right = (ast.literal_eval(expr.comparators[0]), "")
        except ValueError:
            right = None
    op = _OPS.get(type(expr.ops[0]))
    if left is None or right is None or op is None or not (left[1] or right[1]):
        return None
    try:
        value = bool(op(left[0], right[0]))  # type: ignore[operator]
    except TypeError:
        return None
    subject = ast.unparse(expr.left if left[1] else expr.comparators[0])
    return value, f"{subject} is {(left if left[1] else right)[0]!r} on the port ({left[1] or right[1]})"


def _kv_dtype_test(expr: ast.AST, platform: VendorPlatform) -> tuple[bool, str] | None:
    """`kv_cache_dtype == "nvfp4"`, `... in ("fp8", ...)`, `kv_cache_dtype.startswith("fp8")` against the port's
    supported list: a dtype the port never accepts makes the test constant."""
    if not platform.kv_dtypes:
        return None
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and _names_kv_dtype(expr.left):
        right, op = expr.comparators[0], expr.ops[0]
        values = [right.value] if isinstance(right, ast.Constant) and isinstance(right.value, str) else [
            e.value for e in getattr(right, "elts", []) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(values) != (1 if isinstance(right, ast.Constant) else len(getattr(right, "elts", []) or [None])):
            return None
        why = platform.kv_dtype_excluded(values)
        if why and isinstance(op, ast.Eq | ast.In):
            return False, why
        if why and isinstance(op, ast.NotEq | ast.NotIn):
            return True, why
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "startswith" \
            and _names_kv_dtype(expr.func.value) and expr.args and isinstance(expr.args[0], ast.Constant):
        prefix = expr.args[0].value
        if isinstance(prefix, str) and not any(d.startswith(prefix) for d in platform.kv_dtypes):
            return False, platform.kv_dtype_excluded([f"{prefix}*"])
    return None


def _names_kv_dtype(node: ast.AST) -> bool:
    try:
        return ast.unparse(node).endswith("kv_cache_dtype")
    except Exception:  # pragma: no cover - unparse of a parsed tree does not fail
        return False


def gate_of(stmts: Iterable[ast.AST], platform: VendorPlatform) -> str:
    """Evidence that the first statement is a branch the vendor never takes, or ""."""
    for node in stmts:
        if isinstance(node, ast.If | ast.IfExp):
            value = constant(node.test, platform)
            if value is not None and value[0] is False:
                return f"branch `if {_short(ast.unparse(node.test))}` never runs there: {value[1]}"
        return ""
    return ""


def enclosing_gate(fn: ast.AST, lines: tuple[int, int], platform: VendorPlatform) -> str:
    """Evidence that port lines sit inside a branch the vendor never takes (or after an unconditional raise)."""
    first, last = lines
    for node in _walk_holding(fn, first, last):
        if not isinstance(node, ast.If):
            continue
        value = constant(node.test, platform)
        if value is None:
            continue
        dead = node.orelse if value[0] else node.body
        if dead and dead[0].lineno <= first and last <= (dead[-1].end_lineno or dead[-1].lineno):
            return f"inside `if {_short(ast.unparse(node.test))}` ({'else ' if value[0] else ''}never taken there: {value[1]})"
    return ""


def _walk_holding(tree: ast.AST, first: int, last: int) -> Iterator[ast.AST]:
    """ast.walk's order, leaving out the subtrees of nodes whose lines do not hold first..last: no
    statement under such a node can (a statement lies within the lines of what holds it; a def's
    decorators come before its line, but hold no statement)."""
    todo = deque([tree])
    while todo:
        node = todo.popleft()
        start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if start is not None and end is not None and not (start <= first and last <= end):
            continue
        todo.extend(ast_children(node))
        yield node


def kernel_relevant(texts: Iterable[str]) -> str:
    """The first kernel word a changed text holds, or ""."""
    for text in texts:
        m = _KERNEL_WORDS.search(text)
        if m:
            return m.group(0)
    return ""


def only_port_names(pairs: Iterable[tuple[str, str]], port_names: frozenset[str]) -> bool:
    """Every change swaps an upstream name for one the port defines or imports from its own package."""
    seen = False
    for _up, port in pairs:
        idents = re.findall(r"[A-Za-z_]\w*", port)
        if not idents or any(i not in port_names for i in idents):
            return False
        seen = True
    return seen


def only_fields(nodes: Iterable[ast.AST]) -> bool:
    """Statements that only store attributes or names (a field the port adds), calling no kernel."""
    nodes = list(nodes)
    if not nodes:
        return False
    for n in nodes:
        if not isinstance(n, ast.Assign | ast.AnnAssign):
            return False
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        # A field is an attribute of an object (`self.x = ...`, `metadata.x = ...`); a local variable may pick the kernel.
        if not all(isinstance(t, ast.Attribute) for t in targets):
            return False
    return True


def _callee(call: ast.Call) -> str:
    try:
        return ast.unparse(call.func)
    except Exception:  # pragma: no cover - unparse of a parsed tree does not fail
        return "?"


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fold(stmts: list[ast.stmt], platform: VendorPlatform) -> tuple[list[ast.stmt], list[str]]:
    """Upstream's statements as the vendor platform runs them: every branch whose condition the platform
    answers is replaced by the branch it takes. Returns the folded copy and the answers used."""
    used: list[str] = []

    class _Fold(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
            self.generic_visit(node)
            value = constant(node.test, platform)
            if value is None:
                return node
            used.append(value[1])
            return (node.body if value[0] else node.orelse) or []

        def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
            self.generic_visit(node)
            value = constant(node.test, platform)
            if value is None:
                return node
            used.append(value[1])
            return node.body if value[0] else node.orelse

    if not any(isinstance(n, ast.If | ast.IfExp) and constant(n.test, platform) is not None for st in stmts for n in ast_walk(st)):
        return list(stmts), []  # nothing the platform answers: the statements as they are (callers only read them)
    import copy

    module = ast.Module(body=copy.deepcopy(stmts), type_ignores=[])
    folded = _Fold().visit(module)
    return list(folded.body), used


def same_code(a: list[ast.stmt], b: list[ast.stmt]) -> bool:
    """Equal statements, line numbers aside."""
    return len(a) == len(b) and all(ast.dump(x) == ast.dump(y) for x, y in zip(a, b, strict=True))


# Questions and records, not kernels: predicates, getters, specs and configs.
_NOT_KERNEL_CALLEE = re.compile(r"^(can_|is_|has_|supports_|get_|use_)|(Spec|Config|Metadata|Meta)$")


def kernel_call_changed(un: list[ast.AST], pn: list[ast.AST]) -> str:
    """The callee of a kernel or op call whose arguments differ between the two sides, or ""."""
    def calls(nodes: list[ast.AST]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for n in nodes:
            for c in ast_walk(n):
                if isinstance(c, ast.Call):
                    callee = _callee(c)
                    if _KERNEL_CALLEE.search(callee) and not _NOT_KERNEL_CALLEE.search(callee.rsplit(".", 1)[-1]):
                        out.setdefault(callee, set()).add(ast.unparse(c))
        return out

    uc, pc = calls(un), calls(pn)
    for callee in sorted(set(uc) & set(pc)):
        if uc[callee] != pc[callee]:
            return callee
    if uc and pc and set(uc) != set(pc):  # a different kernel is called
        return sorted(set(uc) ^ set(pc))[0]
    return ""


# ---------------------------------------------------------------- removed code whose consequence is known

# Questions that are true on exactly one NVIDIA architecture (not floors: "at least 8.0" is `_floor`'s case).
_EXACT_CAPABILITY = frozenset({"is_device_capability", "is_device_capability_family", "is_hopper", "is_blackwell",
                               "is_sm90", "is_sm100", "is_sm100f_supported"})


def _exact_capability(test: ast.AST) -> str:
    """The NVIDIA capability test a condition requires (alone or as one operand of an `and`), or ""."""
    operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for op in operands:
        if isinstance(op, ast.Call) and _callee(op).rsplit(".", 1)[-1] in _EXACT_CAPABILITY:
            return ast.unparse(op)
        if isinstance(op, ast.Compare) and len(op.ops) == 1 and isinstance(op.ops[0], ast.Eq) \
                and re.search(r"capabilit|\.major$", ast.unparse(op.left)) and isinstance(op.comparators[0], ast.Constant | ast.Tuple | ast.Call):
            return ast.unparse(op)
    return ""


def nvidia_only_guards(items: list[tuple[ast.AST, int]]) -> tuple[set[int], str]:
    """Guards among a hunk's flattened statements ((shallow node, depth) pairs, nested statements after
    their parent) that only reject (raise) and only when the device reports one NVIDIA architecture
    (`if is_device_capability(90) and ...: raise NotImplementedError`): the indices they cover and the
    evidence, or (set(), "") when there is none. A guard that rejects a dtype or shape on every device is not one."""
    covered: set[int] = set()
    why: list[str] = []
    i = 0
    while i < len(items):
        node, depth = items[i]
        j = i + 1
        while j < len(items) and items[j][1] > depth:
            j += 1
        inner = [n for n, _ in items[i + 1 : j]]
        if isinstance(node, ast.If) and inner and (j >= len(items) or not _is_else(items[j], depth)):
            test = _exact_capability(node.test)
            raises = [n for n in inner if isinstance(n, ast.Raise)]
            if test and raises and all(isinstance(n, ast.Raise) or (isinstance(n, ast.Expr) and (
                    isinstance(n.value, ast.Constant) or is_log_call(n.value))) for n in inner):
                exc = raises[0].exc
                name = _callee(exc) if isinstance(exc, ast.Call) else (ast.unparse(exc) if exc is not None else "raise")
                covered.update(range(i, j))
                why.append(f"`if {_short(ast.unparse(node.test), 90)}` raises {name} only when the device reports that NVIDIA "
                           f"architecture ({test})")
        i = j
    return covered, "; ".join(why)


def _is_else(item: tuple[ast.AST, int], depth: int) -> bool:
    return item[1] == depth and isinstance(item[0], ast.Pass)  # the `<orelse>` marker the flattening writes


def only_feeds_log(nodes: list[ast.AST], fn: ast.AST | None, lines: tuple[int, int]) -> bool:
    """Removed statements that only write a log line: log calls, and assignments of local names that nothing
    outside these lines of `fn` reads (they only feed the log call)."""
    if not nodes or fn is None or not any(isinstance(n, ast.Expr) and is_log_call(n.value) for n in nodes):
        return False
    names: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Expr) and is_log_call(n.value):
            continue
        if not isinstance(n, ast.Assign) or not all(isinstance(t, ast.Name) for t in n.targets):
            return False
        if any(isinstance(c, ast.Call) and not _READS_ONLY.search(_callee(c)) for c in ast_walk(n.value)):
            return False  # a call other than a question could do something besides feeding the log
        names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    first, last = lines
    return not any(isinstance(x, ast.Name) and x.id in names and isinstance(x.ctx, ast.Load)
                   and not first <= getattr(x, "lineno", 0) <= last for x in ast_walk(fn))


# Calls that only read: getters and questions (a log line may show their answer).
_READS_ONLY = re.compile(r"(^|\.)(get_\w+|is_\w+|has_\w+|str|repr|len|format|join|getattr)$")


def keyword_only_uses(nodes: list[ast.AST], fn: ast.AST | None, lines: tuple[int, int]) -> list[tuple[str, str]]:
    """Removed assignments of local names (`seqused_k = metadata.seq_lens`) whose only reads in `fn`, outside
    these lines, are as a keyword argument (`kernel(seqused_k=seqused_k)`): [(callee, keyword)], or []
    when a statement is something else or the name is read another way."""
    if not nodes or fn is None:
        return []
    names: set[str] = set()
    for n in nodes:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if not targets or not all(isinstance(t, ast.Name) for t in targets):
            return []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    first, last = lines
    as_keyword: dict[int, tuple[str, str]] = {}
    for call in ast_walk(fn):
        if isinstance(call, ast.Call):
            for kw in call.keywords:
                if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in names:
                    as_keyword[id(kw.value)] = (_callee(call), kw.arg)
    uses: list[tuple[str, str]] = []
    for x in ast_walk(fn):
        if isinstance(x, ast.Name) and x.id in names and isinstance(x.ctx, ast.Load) and not first <= x.lineno <= last:
            if id(x) not in as_keyword:
                return []
            uses.append(as_keyword[id(x)])
    return sorted(set(uses))


# ---------------------------------------------------------------- which hunk leads a grouped finding

# Hunk kinds, most consequential first. A hunk whose text holds a kernel or op call comes before any other:
# a path that now returns early around it, the call dropped, its arguments changed or commented out, its
# statement rewritten, a fallback, the call added. Then the rest: a case skipped, a statement rewritten or
# dropped, ..., down to a statement or import the port only adds (its use is where it matters).
_KERNEL_LEAD = ("feature-disabled", "removed", "call-changed", "argument-commented-out", "changed", "upstream-not-followed",
                "fallback-added", "added")
_OTHER_LEAD = ("feature-disabled", "changed", "removed", "upstream-not-followed", "arch-check", "signature-changed",
               "fallback-added", "class-attribute", "vendor-kernel-import", "port-module-import", "added")
_CALL_TEXT = re.compile(r"([A-Za-z_][\w.]*)\(")


def names_kernel_call(text: str) -> bool:
    """The text holds a call of a kernel or op (not a question, getter, spec or config)."""
    return any(_KERNEL_CALLEE.search(c) and not _NOT_KERNEL_CALLEE.search(c.rsplit(".", 1)[-1]) for c in _CALL_TEXT.findall(text))


def lead_rank(kind: str, detail: str) -> tuple[int, int]:
    """Sort key of a hunk for leading its finding: kernel-call hunks first, then by kind (an unknown kind
    ranks with an added statement)."""
    kernel = kind in {"call-changed", "argument-commented-out"} or names_kernel_call(detail)
    order: tuple[str, ...] = _KERNEL_LEAD if kernel else _OTHER_LEAD
    return (0 if kernel else 1, order.index(kind) if kind in order else len(order) - 1)

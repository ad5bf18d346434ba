# The audit's one symbol table: the port snapshot, the upstream release (and the base release the
# port last synced to) and the kernel stack behind one question, "what does this name mean here".
from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from metax_audit.core.models import ParamFact, StackFacts
from metax_audit.core.pysource import ast_walk
from metax_audit.stages.trace.modules import ModuleIndex, ModuleInfo, resolve_relative
from metax_audit.stages.trace.resolve import Resolver

# Usage (trace, the signature/import/attribute/binding checks, and any later check):
#   symbols = SymbolTable.build(root, config.port_package, upstream_root, config.upstream_package, ...)
#   symbols.resolver                      -> the one Resolver (values of names, attributes, calls)
#   symbols.lookup_import("vllm.x", "Y") -> NameAnswer(status, provider, label, where, near, ...)
#   symbols.module_names(info)            -> every name bound at a module's top level, with its line
#   symbols.params(func_node, bound=True) -> the static parameter list, as the installed check reads it
#   symbols.attach_stack(facts)           -> the kernel stack's facts, once introspection is done
#   symbols.base_resolver()               -> a Resolver over the base release (None without --base)
# No check keeps an index or a resolver of its own: they ask this object, so one parse per module
# serves every stage.


class Provider(StrEnum):
    PORT = "port"
    UPSTREAM = "upstream"
    STACK = "stack"
    NONE = "none"  # outside what the audit reads (torch, transformers, compiled extensions)


class Status(StrEnum):
    DEFINED = "defined"
    SUBMODULE = "submodule"
    DYNAMIC = "dynamic"  # provided at runtime: module __getattr__, globals() writes, star import of unread code
    MISSING_MODULE = "missing-module"
    MISSING_NAME = "missing-name"
    NOT_CHECKED = "not-checked"  # the provider is not readable here (no upstream given, unparsable file)


@dataclass(frozen=True)
class NameAnswer:
    status: Status
    provider: Provider
    label: str  # "upstream vllm 0.26.0", "port snapshot": what the evidence names
    module: str
    name: str | None
    where: str = ""  # "vllm/x.py:12" where the name (or module) is defined
    reason: str = ""
    near: tuple[str, ...] = ()  # closest existing names (difflib) when missing

    @property
    def ok(self) -> bool:
        return self.status in (Status.DEFINED, Status.SUBMODULE, Status.DYNAMIC)

    @property
    def missing(self) -> bool:
        return self.status in (Status.MISSING_MODULE, Status.MISSING_NAME)


class SymbolTable:
    """One resolver over port, upstream, base and kernel stack; see the usage block above."""

    def __init__(self, index: ModuleIndex, *, upstream_label: str = "upstream", port_label: str = "port snapshot",
                 base_index: ModuleIndex | None = None, base_label: str = "", upstream_version: str | None = None,
                 version_tests: Mapping[str, str] | None = None) -> None:
        self.index = index
        # The upstream release under review and the port's tests of it (config version-tests: a helper's
        # name -> how it compares the installed release with its argument): a branch on such a test is
        # decided for this release (core.versions).
        self.upstream_version = upstream_version
        self.version_tests: dict[str, str] = dict(version_tests or {})
        self.resolver = Resolver(index)
        self.upstream_label = upstream_label
        self.port_label = port_label
        self.base_index = base_index
        self.base_label = base_label
        self.facts: StackFacts | None = None
        self._base_resolver: Resolver | None = None
        self._names: dict[int, dict[str, int]] = {}
        self._text_names: dict[str, frozenset[str]] = {}
        self._dynamic: dict[int, str] = {}
        self._lazy: dict[int, frozenset[str]] = {}

    @classmethod
    def build(cls, port_root: Path, port_package: str, upstream_root: Path | None, upstream_package: str, *,
              max_bytes: int = 2_000_000, upstream_version: str | None = None, base_root: Path | None = None,
              base_version: str | None = None, version_tests: Mapping[str, str] | None = None) -> SymbolTable:
        index = ModuleIndex(port_root, port_package, upstream_root, upstream_package, max_bytes)
        base = None
        if base_root is not None:
            # The base release is read only where an answer needs it ("did the name exist at the base?").
            base = ModuleIndex(Path("/nonexistent-port-root"), port_package, base_root, upstream_package, max_bytes)
        return cls(index, upstream_label=f"upstream {upstream_package} {upstream_version or '(version unknown)'}",
                   base_index=base, base_label=f"base {upstream_package} {base_version or '(version unknown)'}",
                   upstream_version=upstream_version, version_tests=version_tests)

    def attach_stack(self, facts: StackFacts | None) -> None:
        """The kernel stack's facts (installed, manifest or static) arrive after introspection."""
        self.facts = facts

    # ---- providers

    def provider(self, dotted: str) -> Provider:
        origin = self.index.origin_of(dotted)
        if origin == "port":
            return Provider.PORT
        if origin == "upstream":
            return Provider.UPSTREAM if self.index.upstream_root is not None else Provider.NONE
        if self.facts is not None and any(t.split(".")[0] == dotted.split(".")[0] for t in self.facts.facts):
            return Provider.STACK
        return Provider.NONE

    def label(self, provider: Provider) -> str:
        if provider is Provider.PORT:
            return self.port_label
        if provider is Provider.UPSTREAM:
            return self.upstream_label
        if provider is Provider.STACK and self.facts is not None:
            return f"kernel stack ({self.facts.source})"
        return "not read by the audit"

    # ---- module level names

    def module_names(self, info: ModuleInfo) -> dict[str, int]:
        """Every name a module binds at its top level (also in if/try/with/for blocks) -> line."""
        key = id(info.tree)
        got = self._names.get(key)
        if got is None:
            got, dynamic = _bound_names(info)
            self._names[key] = got
            getattr_fn = _module_getattr(info)
            if getattr_fn is not None and not dynamic:
                provides = _getattr_provides(info, getattr_fn)
                if provides is None:
                    dynamic = f"module-level __getattr__ in {info.path}:{getattr_fn.lineno} provides names at runtime"
                else:
                    self._lazy[key] = provides
            if dynamic:
                self._dynamic[key] = dynamic
        return got

    def lazy_names(self, info: ModuleInfo) -> frozenset[str] | None:
        """The names a module-level __getattr__ maps when it maps a fixed set and raises AttributeError
        for any other (None: no such function, or one the audit cannot evaluate)."""
        self.module_names(info)
        return self._lazy.get(id(info.tree))

    def dynamic_reason(self, info: ModuleInfo) -> str:
        """Why names of this module may appear at runtime without a definition ('' when none)."""
        self.module_names(info)
        return self._dynamic.get(id(info.tree), "")

    def member(self, info: ModuleInfo, name: str, index: ModuleIndex | None = None, _seen: frozenset[str] = frozenset()) -> tuple[Status, str]:
        """Is `name` an attribute of module `info` once imported? (status, where-or-reason)."""
        index = index or self.index
        names = self.module_names(info)
        if name in names:
            return Status.DEFINED, f"{info.path}:{names[name]}"
        if index.exists(f"{info.name}.{name}"):
            return Status.SUBMODULE, f"submodule {info.name}.{name}"
        for star in info.star_imports:
            if star in _seen:
                continue
            sub = index.get(star) if index.origin_of(star) else None
            if sub is None:
                return Status.DYNAMIC, f"star import from {star}, which the audit does not read"
            status, where = self.member(sub, name, index, _seen | {info.name})
            if status is not Status.MISSING_NAME:
                return status, f"{where} (star-imported by {info.name})"
        dynamic = self.dynamic_reason(info)
        if dynamic:
            return Status.DYNAMIC, dynamic
        lazy = self.lazy_names(info)
        if lazy is not None:
            fn = f"module __getattr__ in {info.path}:{names.get('__getattr__', 0)}"
            if name in lazy:
                return Status.DYNAMIC, f"{fn} provides it"
            sample = ", ".join(sorted(lazy)[:5]) + (", ..." if len(lazy) > 5 else "")
            return Status.MISSING_NAME, (f"{fn} maps only {len(lazy)} name(s) ({sample}) and raises AttributeError "
                                         "for any other")
        return Status.MISSING_NAME, ""

    # ---- imports

    def lookup_import(self, module: str, name: str | None) -> NameAnswer:
        """`import module` (name None) or `from module import name`, in the provider of module."""
        provider = self.provider(module)
        label = self.label(provider)
        if provider is Provider.STACK:
            return self._stack_answer(module, name, label)
        if provider is Provider.NONE:
            return NameAnswer(Status.NOT_CHECKED, provider, label, module, name, reason=f"{module.split('.')[0]} is outside the audit's providers")
        index = self.index
        # Each package on the way must exist (import a.b.c imports a, a.b, a.b.c).
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            pkg = ".".join(parts[:i])
            if not index.exists(pkg) and index.namespace_dir(pkg) is None:
                parent = ".".join(parts[: i - 1])
                if parent and index.get(parent) is not None:
                    # `import a.b` where a's __init__ binds b (or lazily provides it) is not a file.
                    status, where = self.member(index.get(parent), parts[i - 1])  # type: ignore[arg-type]
                    if status in (Status.DEFINED, Status.DYNAMIC) and i == len(parts) and name is None:
                        return NameAnswer(status, provider, label, module, name, where)
                near = tuple(difflib.get_close_matches(parts[i - 1], index.submodules(parent), n=3, cutoff=0.6)) if parent else ()
                return NameAnswer(Status.MISSING_MODULE, provider, label, module, name,
                                  reason=f"no module {pkg} in the {label}", near=near)
        if name is not None and self._text_defines(module, name):
            # A definition-shaped line in the source: defined, without parsing a module the trace did
            # not need (parsing is the costly part; a missing name is always parsed and answered exactly).
            # Asked whether or not the module was parsed already, so that the answer is a function of
            # the module's text, never of which lookups ran before (per-file units depend on that).
            return NameAnswer(Status.DEFINED, provider, label, module, name, f"{module} (definition line)")
        info = index.get(module)
        if info is None and index.namespace_dir(module) is not None:
            if name is None or index.exists(f"{module}.{name}") or index.namespace_dir(f"{module}.{name}") is not None:
                return NameAnswer(Status.SUBMODULE, provider, label, module, name, f"namespace package {module}")
            near = tuple(difflib.get_close_matches(name, index.submodules(module), n=3, cutoff=0.6))
            return NameAnswer(Status.MISSING_NAME, provider, label, module, name, reason=f"namespace package {module} has no module {name}", near=near)
        if info is None:
            skip = next((s.reason for s in index.skips.values() if s.path.endswith(module.replace(".", "/") + ".py")), "unreadable")
            return NameAnswer(Status.NOT_CHECKED, provider, label, module, name, reason=skip)
        if name is None:
            return NameAnswer(Status.DEFINED, provider, label, module, None, info.path)
        status, where = self.member(info, name)
        if status is Status.MISSING_NAME:
            pool = [n for n in self.module_names(info) if not n.startswith("__")] + sorted(self.lazy_names(info) or ())
            near = tuple(difflib.get_close_matches(name, pool, n=3, cutoff=0.6))
            return NameAnswer(status, provider, label, module, name, info.path,
                              f"{name} is not defined in {module} ({info.path})" + (f"; {where}" if where else ""), near)
        return NameAnswer(status, provider, label, module, name, where)

    def base_resolver(self) -> Resolver | None:
        """A resolver over the base release (for "did the base accept this?"), built on first use."""
        if self.base_index is None:
            return None
        if self._base_resolver is None:
            self._base_resolver = Resolver(self.base_index)
        return self._base_resolver

    def _text_defines(self, module: str, name: str) -> bool:
        """Does a line of the module's source bind `name` at the start of a statement or in an import?
        Only a yes is trusted (a nested def with the same name could fool it: a lost finding, never a
        false one); a no leads to the exact, parsed answer."""
        text = self.index.text_of(module)
        if not text or name not in text:
            return False
        if name.isidentifier():
            # The names every such line binds, found in one pass over the text per module (a search per
            # name compiled a pattern for each: most of the import check's time on the real port).
            names = self._text_names.get(module)
            if names is None:
                names = self._text_names[module] = text_bound_names(text)
            return name in names
        n = re.escape(name)
        pattern = (rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{n}\b|^[ \t]*{n}[ \t]*(?::|=(?!=)|,|\)?[ \t]*(?:#.*)?$)"
                   rf"|\bimport\b[^\n#]*\b{n}\b|\bas[ \t]+{n}\b")
        return re.search(pattern, text, re.MULTILINE) is not None

    def at_base(self, module: str, name: str | None) -> bool | None:
        """Did the base release define it? None when there is no base, or the module is not upstream's."""
        base = self.base_index
        if base is None or self.index.origin_of(module) != "upstream":
            return None
        info = base.get(module)
        if info is None:
            return base.exists(module) if name is None else False
        if name is None:
            return True
        return self.member(info, name, base)[0] is not Status.MISSING_NAME

    def _stack_answer(self, module: str, name: str | None, label: str) -> NameAnswer:
        assert self.facts is not None
        target = f"{module}.{name}" if name else module
        fact = self.facts.facts.get(target)
        if fact is None:
            return NameAnswer(Status.NOT_CHECKED, Provider.STACK, label, module, name, reason="introspection was not asked about it")
        dist = " ".join(x for x in (fact.distribution, fact.version) if x)
        label = f"kernel stack {dist}".strip() if dist else label
        if fact.status == "ok":
            return NameAnswer(Status.DEFINED, Provider.STACK, label, module, name, fact.sourcefile or "")
        if fact.status == "not-found":
            return NameAnswer(Status.MISSING_NAME, Provider.STACK, label, module, name, reason=fact.error or "")
        return NameAnswer(Status.NOT_CHECKED, Provider.STACK, label, module, name, reason=f"{fact.status}: {fact.error or ''}")

    # ---- signatures

    @staticmethod
    def params(node: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_first: bool) -> tuple[ParamFact, ...]:
        """The parameters of a readable function in the installed check's form (defaults as text)."""
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        out: list[ParamFact] = []
        for i, (p, d) in enumerate(zip(positional, defaults, strict=True)):
            if i == 0 and drop_first:
                continue
            kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
            out.append(ParamFact(p.arg, kind, None if d is None else ast.unparse(d)))
        if a.vararg is not None:
            out.append(ParamFact(a.vararg.arg, "VAR_POSITIONAL"))
        for p, kd in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            out.append(ParamFact(p.arg, "KEYWORD_ONLY", None if kd is None else ast.unparse(kd)))
        if a.kwarg is not None:
            out.append(ParamFact(a.kwarg.arg, "VAR_KEYWORD"))
        return tuple(out)


def absolute_module(info: ModuleInfo, node: ast.ImportFrom) -> str:
    return resolve_relative(info.package, node.level, node.module) if node.level else (node.module or "")


def _module_getattr(info: ModuleInfo) -> ast.FunctionDef | None:
    found = None
    for st in info.tree.body:
        if isinstance(st, ast.FunctionDef) and st.name == "__getattr__":
            found = st  # the last definition wins at runtime
    return found


def _getattr_provides(info: ModuleInfo, fn: ast.FunctionDef) -> frozenset[str] | None:
    """The fixed set of names a module `__getattr__(name)` answers, when its body is a chain of
    `if name in TABLE` / `if name == "x"` / `if name in ("a", "b")` branches (TABLE a module-level
    literal dict, set, list or tuple of strings that nothing at module level mutates) ending in
    `raise AttributeError`; None for any other shape (then every name may exist)."""
    if not fn.args.args or fn.args.vararg or fn.args.kwarg:
        return None
    param = fn.args.args[0].arg
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body or not _raises_attribute_error(body[-1]):
        return None
    tables = _literal_tables(info)
    names: set[str] = set()
    branches: list[ast.stmt] = list(body[:-1])
    while branches:
        st = branches.pop(0)
        if not isinstance(st, ast.If):
            return None
        got = _tested_names(st.test, param, tables)
        if got is None:
            return None
        names |= got
        if len(st.orelse) == 1 and isinstance(st.orelse[0], ast.If):
            branches.insert(0, st.orelse[0])  # elif
        elif st.orelse and not _raises_attribute_error(st.orelse[-1]):
            return None
    return frozenset(names)


def _raises_attribute_error(st: ast.stmt) -> bool:
    if not isinstance(st, ast.Raise) or st.exc is None:
        return False
    exc = st.exc.func if isinstance(st.exc, ast.Call) else st.exc
    return ast.unparse(exc).rsplit(".", 1)[-1] == "AttributeError"


def _tested_names(test: ast.expr, param: str, tables: dict[str, frozenset[str]]) -> set[str] | None:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        out: set[str] = set()
        for v in test.values:
            got = _tested_names(v, param, tables)
            if got is None:
                return None
            out |= got
        return out
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) and test.left.id == param):
        return None
    op, right = test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
        return {right.value}
    if isinstance(op, ast.In):
        if isinstance(right, ast.Name) and right.id in tables:
            return set(tables[right.id])
        literal = _string_literal(right)
        return set(literal) if literal is not None else None
    return None


def _string_literal(node: ast.expr | None) -> frozenset[str] | None:
    if isinstance(node, ast.Dict):
        keys = node.keys
    elif isinstance(node, ast.Set | ast.List | ast.Tuple):
        keys = list(node.elts)
    else:
        return None
    if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
        return None
    return frozenset(k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


def _literal_tables(info: ModuleInfo) -> dict[str, frozenset[str]]:
    """Module-level names bound once to a literal of strings (dict keys or elements) and never
    mutated at module level or rebound (subscript store, augmented assignment, a method call on it)."""
    tables: dict[str, frozenset[str]] = {}
    spoiled: set[str] = set()
    for st in info.tree.body:
        target = value = None
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            target, value = st.targets[0].id, st.value
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            target, value = st.target.id, st.value
        if target is not None:
            literal = _string_literal(value)
            if literal is None or target in tables:
                spoiled.add(target)
            else:
                tables[target] = literal
    for node in ast_walk(info.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del) and isinstance(node.value, ast.Name):
            spoiled.add(node.value.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            spoiled.add(node.target.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.attr in {"update", "add", "append", "extend", "setdefault", "insert", "__setitem__"}):
            spoiled.add(node.func.value.id)
    return {k: v for k, v in tables.items() if k not in spoiled}


def _bound_names(info: ModuleInfo) -> tuple[dict[str, int], str]:
    names: dict[str, int] = {}
    dynamic = ""
    stack: list[ast.stmt] = list(reversed(info.tree.body))
    while stack:
        st = stack.pop()
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.setdefault(st.name, st.lineno)
            continue  # a module-level __getattr__ is evaluated by SymbolTable.module_names
        if isinstance(st, ast.Import):
            for a in st.names:
                names.setdefault(a.asname or a.name.split(".")[0], st.lineno)
        elif isinstance(st, ast.ImportFrom):
            for a in st.names:
                if a.name != "*":
                    names.setdefault(a.asname or a.name, st.lineno)
        else:
            for node in ast_walk(st) if not isinstance(st, ast.If | ast.Try | ast.With | ast.For | ast.While) else _heads(st):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.setdefault(node.id, st.lineno)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"globals", "setattr"} and not dynamic:
                    dynamic = f"{info.path}:{node.lineno} writes module names at runtime ({node.func.id}())"
        for block in ("body", "orelse", "finalbody"):
            sub = getattr(st, block, None)
            if isinstance(sub, list) and not isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.extend(reversed(sub))
        for h in getattr(st, "handlers", []) or []:
            if h.name:
                names.setdefault(h.name, h.lineno)
            stack.extend(reversed(h.body))
    return names, dynamic


def _heads(st: ast.stmt) -> list[ast.AST]:
    """The expressions of a compound statement outside its blocks (for targets, with-as names)."""
    out: list[ast.AST] = []
    if isinstance(st, ast.For):
        out += list(ast_walk(st.target)) + list(ast_walk(st.iter))
    elif isinstance(st, ast.With):
        for item in st.items:
            out += list(ast_walk(item.context_expr))
            if item.optional_vars is not None:
                out += list(ast_walk(item.optional_vars))
    elif isinstance(st, ast.If | ast.While):
        out += list(ast_walk(st.test))
    return out


_BOUND_AT_LINE_START = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)|^[ \t]*(\w+)[ \t]*(?::|=(?!=)|,|\)?[ \t]*(?:#.*)?$)",
                                  re.MULTILINE)
_IMPORT_TAIL = re.compile(r"import(?=\b([^\n#]*))")
_AS_NAME = re.compile(r"as(?=[ \t]+(\w+))")
_WORD = re.compile(r"\w+")


def text_bound_names(text: str) -> frozenset[str]:
    """Every identifier `SymbolTable._text_defines`'s per-name pattern finds in `text`: a def or class
    name, a name that starts a line before `:`, `=`, `,` or the line's end, a word after `import` on
    its line (before a comment), a name after `as`. Each alternative's name is a whole word there, so
    the maximal word a capture takes is exactly the name the per-name pattern would match."""
    names: set[str] = set()
    for m in _BOUND_AT_LINE_START.finditer(text):
        names.add(m.group(1) or m.group(2))
    # `import` and `as` are searched as literals (re then skips ahead to each occurrence; a leading \b
    # made it try every position: 2.4x slower) and a match inside a longer word is dropped here; the
    # lookaheads consume only the keyword, so a dropped match never hides the next one.
    for m in _IMPORT_TAIL.finditer(text):
        if not _inside_word(text, m.start()):
            names.update(_WORD.findall(m.group(1)))
    names.update(m.group(1) for m in _AS_NAME.finditer(text) if not _inside_word(text, m.start()))
    return frozenset(names)


def _inside_word(text: str, start: int) -> bool:
    """Whether the character before `start` is a word character (as \b would see it)."""
    if not start:
        return False
    before = text[start - 1]
    return before.isalnum() or before == "_"

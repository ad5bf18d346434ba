# Attributes: `self.x`, `cls.x`, `super().x`, `Class.x` and `module.x` read by port code resolve in
# their provider along the base classes (upstream bases included), asked of the one symbol table.
from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity, Site
from metax_audit.core.pysource import ast_walk, walk_nodes
from metax_audit.stages.checks.imports import READ, kept_import_sites, read_from
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.trace.modules import ModuleInfo
from metax_audit.stages.trace.resolve import Resolver
from metax_audit.stages.trace.symbols import Provider, Status, SymbolTable
from metax_audit.stages.trace.values import Cls, Ext, Scope, known

rule("MXA125", Category.IMPORT, Severity.ERROR, "attribute read on self, a class or super() that no class in its MRO defines",
     "Neither the class nor any base class (port or upstream, read statically) defines or assigns the attribute, "
     "and nothing makes attributes dynamic (__getattr__, setattr with a computed name, an unreadable base such as "
     "torch.nn.Module): the read raises AttributeError when it runs. One finding per class and attribute, every read "
     "in the evidence.")
rule("MXA126", Category.IMPORT, Severity.ERROR, "attribute read on an imported module that the module does not define",
     "The module (port snapshot or upstream release) neither defines the name at top level nor has such a submodule, "
     "and has no module-level __getattr__ that provides it (one that maps a fixed set of names and raises AttributeError "
     "otherwise is evaluated): the read raises AttributeError when it runs.")

# Bases that add no instance attributes the port could read: anything else unreadable makes the
# class's attributes unknown (nn.Module's __getattr__, Enum, NamedTuple, C extensions).
_NEUTRAL_BASES = frozenset({"builtins.object", "abc.ABC", "typing.Generic", "typing.Protocol",
                            "typing_extensions.Protocol"})
_DYNAMIC_HOOKS = frozenset({"__getattr__", "__getattribute__", "__setattr__"})


@dataclass
class _ClassFacts:
    names: set[str]  # defined in a body or assigned on self/cls/obj in a method
    dynamic: str  # why attributes may appear at runtime ('' when none)


class _Attributes:
    def __init__(self, symbols: SymbolTable, memo: FileMemo | None = None) -> None:
        self.s = symbols
        self.r = symbols.resolver
        self.memo = memo
        self._own: dict[int, _ClassFacts] = {}

    def own(self, cls: Cls) -> _ClassFacts:
        """What one class body (and its methods) defines: a function of its file's bytes and its place
        there (kept per file in the memo for a class of the snapshot)."""
        key = id(cls.node)
        got = self._own.get(key)
        if got is None:
            node = cls.node
            place = ("class-facts", cls.dotted, node.name, node.lineno, node.col_offset)
            got = self._own[key] = self.memo.get(cls.info.path, place, partial(_own, cls)) \
                if self.memo is not None and read_from(cls.info, cls.info.path) else _own(cls)
        return got

    def along(self, cls: Cls, skip_first: bool = False) -> tuple[set[str], str, list[str]]:
        """Names defined along the MRO, why they may be dynamic, and the classes read."""
        names: set[str] = set()
        read: list[str] = []
        chain = self.r.mro(cls)
        for c in chain[1:] if skip_first else chain:
            if isinstance(c, Cls) and (lost := _unresolved_base(self.r, c)):
                return names, f"base {lost} of {c.dotted} does not resolve (its import is broken or it is computed)", read
            if isinstance(c, Ext):
                if c.dotted in _NEUTRAL_BASES:
                    continue
                return names, f"base {c.dotted} is not read by the audit", read
            facts = self.own(c)
            if facts.dynamic:
                return names, facts.dynamic, read
            names |= facts.names
            read.append(f"{c.info.origin}:{c.dotted} ({c.info.path}:{c.node.lineno})")
        for c in chain:  # a decorated class (dataclass, ...) may gain generated members
            if isinstance(c, Cls) and c.node.decorator_list and not all(
                    ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] in {"dataclass", "final"} for d in c.node.decorator_list):
                return names, f"{c.dotted} is decorated ({', '.join(ast.unparse(d) for d in c.node.decorator_list)})", read
        return names, "", read


def _unresolved_base(r: Resolver, cls: Cls) -> str:
    """The first base expression of `cls` that resolves to no class (an import that does not resolve, a call):
    what it gives the class is unknown, so its attributes are. '' when every base resolves."""
    for b in cls.node.bases:
        expr = b.value if isinstance(b, ast.Subscript) else b
        if not any(isinstance(v, Cls | Ext) for v in r.materialize(r.eval(expr, Scope.of(cls.info, None), 1))):
            return ast.unparse(expr)
    return ""


def _own(cls: Cls) -> _ClassFacts:
    """_Attributes.own, computed."""
    names: set[str] = set()
    dynamic = ""
    for item in cls.node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
            if item.name in _DYNAMIC_HOOKS:
                dynamic = f"{cls.dotted} defines {item.name}"
        for node in ast_walk(item) if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else ():
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
            for elt in ast_walk(item.value):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    names.add(elt.value)
    for node in walk_nodes(cls.node):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)  # self.x = ..., cls.x = ..., other.x = ... (a sibling instance)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"setattr", "delattr"} and len(node.args) >= 2:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
            elif not dynamic:
                dynamic = f"{cls.info.path}:{node.lineno} sets attributes with a computed name"
        elif isinstance(node, ast.Attribute) and node.attr == "__dict__" and not dynamic:
            dynamic = f"{cls.info.path}:{node.lineno} reaches the instance __dict__"
    if cls.node.keywords and not dynamic:
        dynamic = f"{cls.dotted} has a metaclass or class keywords"
    return _ClassFacts(names, dynamic)


@dataclass(frozen=True)
class _Read:
    owner: str  # class or module the attribute is looked up on
    attr: str
    path: str
    line: int
    text: str


def check_attributes(discovery: Discovery, symbols: SymbolTable, memo: FileMemo | None = None) -> Iterator[Finding]:
    """What each file reads and assigns is a function of its bytes (kept per file in `memo`); whether a
    read resolves is asked of the symbol table along the classes and modules it names, every time."""
    a = _Attributes(symbols, memo)
    external_sets = _assigned_anywhere(discovery, symbols, memo)
    class_reads: dict[tuple[str, str], list[_Read]] = {}
    class_info: dict[str, tuple[Cls, list[str], bool]] = {}
    module_reads: dict[tuple[str, str], list[_Read]] = {}
    module_nodes: dict[tuple[str, str], list[tuple[ModuleInfo, str, int, int]]] = {}
    scope_classes: list[Cls] = []
    for sf in discovery.files:
        if sf.parse_error is not None or not sf.path.endswith(".py"):
            continue
        info = symbols.index.module_for_path(sf.path)
        if info is None:
            continue
        lines = info.source.splitlines()
        kept = memo is not None and read_from(info, sf.path)
        per_class = memo.get(sf.path, ("method-reads",), partial(_method_reads, info)) if memo and kept else _method_reads(info)
        for cls, methods in zip(_classes(info), per_class, strict=True):
            scope_classes.append(cls)
            for recv_reads, super_reads in methods:
                for attr, line in recv_reads:
                    class_reads.setdefault((cls.dotted, attr), []).append(
                        _Read(cls.dotted, attr, sf.path, line, _line(lines, line)))
                    class_info.setdefault(cls.dotted, (cls, [], False))
                for attr, line in super_reads:
                    key = (cls.dotted + " super()", attr)
                    class_reads.setdefault(key, []).append(_Read(cls.dotted, attr, sf.path, line, _line(lines, line)))
                    class_info.setdefault(cls.dotted + " super()", (cls, [], True))
        for mod, attr, (alias, _, line, col) in _module_reads(info, symbols, memo if kept else None):
            module_reads.setdefault((mod, attr), []).append(_Read(mod, attr, sf.path, line, _line(lines, line)))
            module_nodes.setdefault((mod, attr), []).append((info, alias, line, col))
    for (owner, attr), reads in class_reads.items():
        if attr.startswith("__") or attr in external_sets:
            continue
        cls, _, is_super = class_info[owner]
        names, dynamic, read = a.along(cls, skip_first=is_super)
        if dynamic or attr in names or not read:
            continue
        if is_super and not any(isinstance(c, Cls) for c in symbols.resolver.mro(cls)[1:]):
            continue
        if not is_super and _subclass_sets(symbols, cls, attr, scope_classes):
            continue  # a subclass sets it on self: a mixin's or base's read on the subclass's instances
        near = difflib.get_close_matches(attr, sorted(n for n in names if not n.startswith("__")), n=3, cutoff=0.7)
        reads = sorted(reads, key=lambda r: (r.path, r.line))
        first = reads[0]
        real = None if is_super else _real_class(discovery, symbols, a, cls, attr, scope_classes)
        if real is not None:
            # The object's real class is a subclass that defines the name (it is constructed as one, or its class is
            # swapped to it): the read runs on that class, not on the one the method is written in.
            sub, how = real
            yield make_finding("MXA125", Location(first.path, first.line, f"{cls.dotted}.{attr}"),
                               f"reads {attr!r} on {cls.node.name}, which only its subclass {sub.node.name} defines; the object "
                               f"is really a {sub.node.name} where this runs ({how})",
                               [*(f"{READ}{r.path}:{r.line}: {r.text}" for r in reads[:8]),
                                f"defined by: {sub.dotted} (a subclass of {cls.node.name})", f"real class: {how}"],
                               severity=Severity.INFO, sites=[Site(r.path, r.line, cls.dotted, "read", r.text) for r in reads])
            continue
        what = f"super().{attr}" if is_super else f"{attr!r} on {cls.node.name}"
        ev = [*(f"{READ}{r.path}:{r.line}: {r.text}" for r in reads[:8]),
              "classes read (MRO): " + " -> ".join(read),
              *([f"closest existing names: {', '.join(near)}"] if near else []),
              "no class in the MRO defines or assigns it, and nothing makes its attributes dynamic"]
        yield make_finding("MXA125", Location(first.path, first.line, f"{cls.dotted}.{attr}"),
                           f"reads {what}, which no class in its MRO defines ({len(reads)} read(s))", ev,
                           sites=[Site(r.path, r.line, cls.dotted, "read", r.text) for r in reads])
    yield from _module_findings(module_reads, module_nodes, symbols)
    yield from _enum_findings(discovery, symbols)
    yield from _constructed_findings(discovery, symbols, a, external_sets)


def _constructed(cls_node: ast.ClassDef) -> dict[str, list[tuple[str, int]]]:
    """self.<x> = <Name or dotted>(...) in a class's methods: attribute -> [(constructor text, line)];
    an attribute assigned anything else too maps to a sentinel ("", line)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for fn in cls_node.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast_walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
            value = getattr(node, "value", None)
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    ctor = ast.unparse(value.func) if isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute) else ""
                    out.setdefault(t.attr, []).append((ctor, t.lineno))
    return out


def _constructed_findings(discovery: Discovery, symbols: SymbolTable, a: _Attributes, external_sets: set[str]) -> Iterator[Finding]:
    """MXA125 for `self.<x>.<attr>` where the class only ever assigns self.<x> an instance of one port class
    it constructs (`self.input_batch = MacaInputBatch(...)`) and no class in that class's MRO defines attr:
    the read is bound against the class the code constructs, not the upstream class an annotation names."""
    for sf in discovery.files:
        if sf.parse_error is not None or not sf.path.endswith(".py"):
            continue
        info = symbols.index.module_for_path(sf.path)
        if info is None:
            continue
        lines = info.source.splitlines()
        for owner in _classes(info):
            made = _constructed(owner.node)
            kinds: dict[str, tuple[Cls, int]] = {}
            for attr, ctors in made.items():
                texts = {c for c, _ in ctors}
                if len(texts) != 1 or "" in texts:
                    continue
                dotted = _dotted_in(info, next(iter(texts)))
                vals = [v for v in known(symbols.resolver.lookup(dotted))] if dotted else []
                if len(vals) == 1 and isinstance(vals[0], Cls) and vals[0].info.origin == "port":
                    kinds[attr] = (vals[0], ctors[0][1])
            if not kinds:
                continue
            reads: dict[tuple[str, str], list[_Read]] = {}
            for node in walk_nodes(owner.node):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute)
                        and isinstance(node.value.value, ast.Name) and node.value.value.id == "self" and node.value.attr in kinds):
                    reads.setdefault((node.value.attr, node.attr), []).append(
                        _Read(owner.dotted, node.attr, sf.path, node.lineno, _line(lines, node.lineno)))
            for (field_name, attr), rs in reads.items():
                if attr.startswith("__") or attr in external_sets:
                    continue
                cls, line = kinds[field_name]
                names, dynamic, read = a.along(cls)
                if dynamic or attr in names or not read:
                    continue
                near = difflib.get_close_matches(attr, sorted(n for n in names if not n.startswith("__")), n=3, cutoff=0.7)
                rs = sorted(rs, key=lambda r: r.line)
                ev = [*(f"{READ}{r.path}:{r.line}: {r.text}" for r in rs[:8]),
                      f"port: {sf.path}:{line}: {_line(lines, line)}  (self.{field_name} is only ever a {cls.node.name})",
                      "classes read (MRO): " + " -> ".join(read), *([f"closest existing names: {', '.join(near)}"] if near else []),
                      "no class in the MRO defines or assigns it, and nothing makes its attributes dynamic"]
                yield make_finding("MXA125", Location(rs[0].path, rs[0].line, f"{owner.dotted}.{field_name}.{attr}"),
                                   f"reads self.{field_name}.{attr}, which {cls.node.name} (the class {owner.node.name} constructs) "
                                   f"does not define ({len(rs)} read(s))", ev)


_ENUM_BASES = frozenset({"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag", "enum.ReprEnum"})


def _enum_api() -> frozenset[str]:
    import enum

    return frozenset(dir(enum.Enum)) | frozenset(dir(enum.EnumMeta)) | frozenset(dir(enum.StrEnum)) | frozenset(dir(enum.Flag)) \
        | {"_name_", "_value_", "_missing_", "_generate_next_value_", "_ignore_", "_order_", "__members__"}


def _enum_members(cls: Cls, symbols: SymbolTable) -> tuple[set[str], str] | None:
    """(the names an Enum class and its bases bind, its file:line) when `cls` is an Enum whose members are
    exactly its bodies' names; None for a class that is not one, or one whose attributes may be dynamic
    (a metaclass or base that defines __getattr__, a decorated class, a base the audit cannot read)."""
    chain = symbols.resolver.mro(cls)
    if not any(isinstance(c, Ext) and c.dotted in _ENUM_BASES for c in chain):
        return None
    names: set[str] = set()
    for c in chain:
        if isinstance(c, Ext):
            if c.dotted not in _ENUM_BASES and c.dotted not in _NEUTRAL_BASES:
                return None
            continue
        if c.node.decorator_list:
            return None
        for kw in c.node.keywords:
            if kw.arg != "metaclass":
                return None
            meta = known(symbols.resolver.lookup(_dotted_in(c.info, ast.unparse(kw.value)) or ""))
            metas = [m for m in meta if isinstance(m, Cls)]
            if len(metas) != 1 or any(isinstance(i, ast.FunctionDef) and i.name in _DYNAMIC_HOOKS for m in symbols.resolver.mro(metas[0])
                                      if isinstance(m, Cls) for i in m.node.body):
                return None
        facts = _own(c)
        if facts.dynamic and not facts.dynamic.endswith("has a metaclass or class keywords"):
            return None
        names |= facts.names
    return names, f"{cls.info.path}:{cls.node.lineno}"


def _dotted_in(info: ModuleInfo, name: str) -> str | None:
    """The dotted path a module-level name of `info` stands for: a class defined there or a name it imports."""
    head, _, rest = name.partition(".")
    found = info.body_names().get(head)
    if found is None:
        return None
    defined_here, dotted = found
    return f"{info.name}.{name}" if defined_here else dotted + (f".{rest}" if rest else "")


def _enum_findings(discovery: Discovery, symbols: SymbolTable) -> Iterator[Finding]:
    """MXA125 for a member read on an Enum class (port or upstream) that no body of its MRO binds:
    `AttentionBackendEnum.TREE_ATTN` after upstream dropped the member raises AttributeError."""
    api = _enum_api()
    reads: dict[tuple[str, str], list[_Read]] = {}
    classes: dict[str, tuple[Cls, set[str], str] | None] = {}
    for sf in discovery.files:
        if sf.parse_error is not None or not sf.path.endswith(".py"):
            continue
        info = symbols.index.module_for_path(sf.path)
        if info is None:
            continue
        lines = info.source.splitlines()
        for node in walk_nodes(info.tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)):
                continue
            if node.attr in api or node.attr.startswith("__"):
                continue
            dotted = _dotted_in(info, node.value.id)
            if dotted is None:
                continue
            if dotted not in classes:
                vals = [v for v in known(symbols.resolver.lookup(dotted)) if isinstance(v, Cls)]
                got = _enum_members(vals[0], symbols) if len(vals) == 1 else None
                classes[dotted] = (vals[0], *got) if got is not None else None
            if classes[dotted] is not None and node.attr not in classes[dotted][1]:  # type: ignore[index]
                reads.setdefault((dotted, node.attr), []).append(_Read(dotted, node.attr, sf.path, node.lineno, _line(lines, node.lineno)))
    for (dotted, attr), rs in reads.items():
        cls, names, where = classes[dotted]  # type: ignore[misc]
        label = symbols.label(symbols.provider(dotted))
        near = difflib.get_close_matches(attr, sorted(n for n in names if not n.startswith("_")), n=3, cutoff=0.6)
        base = symbols.at_base(dotted.rsplit(".", 1)[0], dotted.rsplit(".", 1)[1])
        at_base = ""
        if base and symbols.base_index is not None:
            info = symbols.base_index.get(dotted.rsplit(".", 1)[0])
            base_cls = next((st for st in info.tree.body if isinstance(st, ast.ClassDef) and st.name == cls.node.name), None) if info else None
            if base_cls is not None and any(isinstance(n, ast.Name) and n.id == attr and isinstance(n.ctx, ast.Store) for n in ast_walk(base_cls)):
                at_base = "the base release's enum has the member: removed upstream since the port's last sync"
        rs = sorted(rs, key=lambda r: (r.path, r.line))
        ev = [*(f"{READ}{r.path}:{r.line}: {r.text}" for r in rs[:8]),
              f"{label}: enum {cls.node.name} ({where}) has no member {attr}; its members: "
              + ", ".join(sorted(n for n in names if not n.startswith("_"))[:12]) + (" ..." if len(names) > 12 else ""),
              *([f"closest existing names: {', '.join(near)}"] if near else []), *([at_base] if at_base else [])]
        yield make_finding("MXA125", Location(rs[0].path, rs[0].line, f"{dotted}.{attr}"),
                           f"reads {cls.node.name}.{attr}, which enum {cls.node.name} of {label} does not define ({len(rs)} read(s))", ev)


def _module_findings(module_reads: dict[tuple[str, str], list[_Read]],
                     module_nodes: dict[tuple[str, str], list[tuple[ModuleInfo, str, int, int]]],
                     symbols: SymbolTable) -> Iterator[Finding]:
    """MXA126: reads of a module attribute the module does not define (outside function locals)."""
    for (mod, attr), reads in module_reads.items():
        answer = symbols.lookup_import(mod, attr)
        if answer.status is not Status.MISSING_NAME:
            continue
        info = symbols.index.get(mod)
        live = [line for i, alias, line, col in module_nodes[(mod, attr)] if (line, col) not in _function_locals(i, alias)]
        if info is None or not live:
            continue
        reads = [r for r in reads if r.line in live]
        provider = symbols.provider(mod)
        label = symbols.label(provider)
        near = difflib.get_close_matches(attr, [n for n in symbols.module_names(info) if not n.startswith("__")], n=3, cutoff=0.6)
        base = symbols.at_base(mod, attr)
        first = reads[0]
        ev = [*(f"{READ}{r.path}:{r.line}: {r.text}" for r in reads[:8]),
              f"{label}: {answer.reason or f'{attr} is not defined in {mod} ({info.path})'}"
              + ("" if symbols.lazy_names(info) is not None else " and the module has no __getattr__"),
              *([f"closest existing names: {', '.join(near)}"] if near else []),
              *(["the base release defines it: removed or renamed upstream since the port's last sync"] if base else [])]
        yield make_finding("MXA126", Location(first.path, first.line, f"{mod}.{attr}"),
                           f"reads {mod}.{attr}, which {label} does not define ({len(reads)} read(s))", ev,
                           sites=[Site(r.path, r.line, "", "read", r.text) for r in reads])


def _line(lines: list[str], n: int) -> str:
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def _classes(info: ModuleInfo) -> Iterator[Cls]:
    for node in info.tree.body:
        if isinstance(node, ast.ClassDef):
            yield Cls(f"{info.name}.{node.name}", info, node)


_Places = list[tuple[str, int]]  # (attribute, line)


def _method_reads(info: ModuleInfo) -> list[list[tuple[_Places, _Places]]]:
    """For each class of the module (_classes' order), each method's receiver and super() reads."""
    return [[([(n.attr, n.lineno) for n in reads], [(n.attr, n.lineno) for n in supers]) for _recv, reads, supers in _methods(cls)]
            for cls in _classes(info)]


def _methods(cls: Cls) -> Iterator[tuple[str, list[ast.Attribute], list[ast.Attribute]]]:
    """(receiver name, receiver.x reads, super().x reads) of each method with a receiver (self or cls).

    One walk per method. Reads guarded by hasattr(receiver, "x") are left out, and so is a method
    whose nested function or lambda rebinds the receiver's name (that `self` may be another object)."""
    for item in cls.node.body:
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = [*item.args.posonlyargs, *item.args.args]
        if not args or any(ast.unparse(d) == "staticmethod" for d in item.decorator_list):
            continue
        recv = args[0].arg
        reads: list[ast.Attribute] = []
        supers: list[ast.Attribute] = []
        guarded: set[str] = set()
        rebound = False
        for body_stmt in item.body:
            for n in ast_walk(body_stmt):
                if isinstance(n, ast.Attribute):
                    if not isinstance(n.ctx, ast.Load):
                        continue
                    v = n.value
                    if isinstance(v, ast.Name) and v.id == recv:
                        reads.append(n)
                    elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super" and not v.args:
                        supers.append(n)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "hasattr" and len(n.args) == 2:
                    if isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                        guarded.add(n.args[1].value)
                elif isinstance(n, ast.arg) and n.arg == recv:
                    rebound = True
        if rebound:
            continue
        yield recv, [r for r in reads if r.attr not in guarded], supers


def _subclass_sets(symbols: SymbolTable, cls: Cls, attr: str, scope_classes: list[Cls]) -> bool:
    """Whether a class in scope that has `cls` in its MRO assigns `self.attr` (or `cls.attr`) in its body."""
    return any(c.dotted != cls.dotted and cls in symbols.resolver.mro(c)[1:] and any(
        isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr == attr and isinstance(n.value, ast.Name)
        and n.value.id in {"self", "cls"} for n in walk_nodes(c.node)) for c in scope_classes)


def _real_class(discovery: Discovery, symbols: SymbolTable, a: _Attributes, cls: Cls, attr: str,
               scope_classes: list[Cls]) -> tuple[Cls, str] | None:
    """A subclass of `cls` (in scope) that defines `attr`, with where the port makes an object of it: `x.__class__ =
    Sub` or `Sub(...)` anywhere in the port package (a swap is often written outside the attention scope)."""
    subs = []
    for c in scope_classes:
        if c.dotted == cls.dotted or cls not in symbols.resolver.mro(c)[1:]:
            continue
        names, _, _ = a.along(c)
        if attr in names:
            subs.append(c)
    if not subs:
        return None
    package = discovery.root / discovery.port_package.replace(".", "/")
    for sub in subs:
        made = re.compile(rf"\.__class__\s*=\s*(?:\w+\.)*{re.escape(sub.node.name)}\b|\b{re.escape(sub.node.name)}\(")
        for path in sorted(package.rglob("*.py")) if package.is_dir() else ():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if sub.node.name not in text:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                m = made.search(line)
                if m and not line.lstrip().startswith(("class ", "#")):
                    rel = path.relative_to(discovery.root).as_posix()
                    kind = "its class is swapped to it" if "__class__" in m.group(0) else "constructed as it"
                    return sub, f"{kind} at {rel}:{n}: {line.strip()}"
    return None


def _assigned_anywhere(discovery: Discovery, symbols: SymbolTable, memo: FileMemo | None = None) -> set[str]:
    """Attribute names the port's files in scope assign on an object other than self or cls: an
    instance attribute set from outside its class (a builder filling a metadata object) is defined for
    this check. `self.x = ...` in a method defines x for that class and the classes of its MRO (the
    class facts), not for an unrelated class that reads self.x."""
    out: set[str] = set()
    swapped_to: set[str] = set()  # classes an object is switched to at runtime (`obj.__class__ = Sub`)
    classes: dict[str, list[set[str]]] = {}
    for sf in discovery.files:
        info = symbols.index.module_for_path(sf.path) if sf.parse_error is None and sf.path.endswith(".py") else None
        if info is None:
            continue
        kept = memo is not None and read_from(info, sf.path)
        assigned, swapped, members = memo.get(sf.path, ("assigned-elsewhere",), partial(_assigned_in, info)) if memo and kept \
            else _assigned_in(info)
        out |= assigned
        swapped_to |= swapped
        for name, names in members:
            classes.setdefault(name, []).append(names)
    # After `obj.__class__ = Sub` the object answers with Sub's methods: a read of a name only Sub
    # defines, written in the class it started as, is defined when it runs.
    for name in swapped_to:
        for names in classes.get(name, []):
            out |= names
    return out


def _assigned_in(info: ModuleInfo) -> tuple[set[str], set[str], list[tuple[str, set[str]]]]:
    """One module's part of _assigned_anywhere: the attribute names it assigns, the class names it
    switches objects to, and each class's method and assigned names."""
    out: set[str] = set()
    swapped_to: set[str] = set()
    classes: list[tuple[str, set[str]]] = []
    for node in walk_nodes(info.tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}):
                out.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) >= 2:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value)
        elif isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
            classes.append((node.name, members))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets):
            value = node.value
            name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else None
            if name:
                swapped_to.add(name)
    return out, swapped_to, classes


_Load = tuple[str, str, int, int]  # `name.attr` read: name, attr, line, column of the name


def _module_reads(info: ModuleInfo, symbols: SymbolTable, memo: FileMemo | None = None,
                  ) -> Iterator[tuple[str, str, _Load]]:
    """`alias.x` where alias is bound at module level only by an import of a port/upstream module
    (not shadowed by a local of the enclosing function: the caller checks that for missing names).
    `memo` only when info was read from the snapshot file info.path."""
    bound: dict[str, list[str]] = {}
    for site in kept_import_sites(info, info.path, memo):
        if site.function:
            continue
        if site.name is None:  # `import a.b` binds a; `import a.b as c` binds c to a.b
            target = site.module if site.local != site.module.split(".")[0] else site.local
        else:
            target = f"{site.module}.{site.name}"
        bound.setdefault(site.local, []).append(target)
    stored = memo.get(info.path, ("stored-names",), partial(_stored_names, info)) if memo else _stored_names(info)
    modules: dict[str, str] = {}
    for local, targets in bound.items():
        if len(set(targets)) != 1 or local in stored or symbols.provider(targets[0]) not in (Provider.PORT, Provider.UPSTREAM):
            continue
        if symbols.index.exists(targets[0]):
            modules[local] = targets[0]
    if not modules:
        return
    for load in memo.get(info.path, ("attribute-loads",), partial(_attribute_loads, info)) if memo else _attribute_loads(info):
        mod = modules.get(load[0])
        if mod is not None:
            yield mod, load[1], load


def _attribute_loads(info: ModuleInfo) -> list[_Load]:
    """Every `name.attr` read of the module, in walk order."""
    return [(node.value.id, node.attr, node.lineno, node.value.col_offset) for node in walk_nodes(info.tree)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)]


def _stored_names(info: ModuleInfo) -> set[str]:
    """Names the module assigns or defines anywhere (then an alias may not be the module)."""
    out: set[str] = set()
    for n in walk_nodes(info.tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
    return out


def _function_locals(info: ModuleInfo, name: str) -> set[tuple[int, int]]:
    """(line, column) of the Name nodes `name` inside functions that bind it locally (params, imports,
    stores): two Name nodes never start at one place."""
    out: set[tuple[int, int]] = set()
    for fn in walk_nodes(info.tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        local = {a.arg for a in ast_walk(fn.args) if isinstance(a, ast.arg)}
        for n in ast_walk(fn):
            if isinstance(n, ast.Import | ast.ImportFrom):
                local |= {(a.asname or a.name).split(".")[0] for a in n.names}
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                local.add(n.id)
        if name in local:
            out |= {(n.lineno, n.col_offset) for n in ast_walk(fn) if isinstance(n, ast.Name) and n.id == name}
    return out

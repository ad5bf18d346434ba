# Rule `registration` for op names: every `torch.ops.<ns>.<op>` use and `"ns::op"` string in scope
# must resolve to a registration the target stack loads, read statically from every provider we have.
from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.checks.stack import parse_file, source_line
from metax_audit.config import AuditConfig
from metax_audit.findings import make_finding, rule
from metax_audit.models import Category, Discovery, Finding, Location, Severity, StackFacts, UpstreamInfo
from metax_audit.pysource import walk_nodes

rule("MXA170", Category.REGISTRATION, Severity.ERROR, "op name that nothing on the target stack registers",
     "`torch.ops.<ns>.<op>` (or an op-referencing call such as register_fake(\"ns::op\")) fails with "
     "AttributeError/RuntimeError on first use: neither the port's Python or C++ registrations, nor upstream's "
     "Python registrations or compiled extensions, nor the stack manifest define it. The evidence lists every "
     "provider read and the closest registered names. Register the op, or call the name the provider defines.")
rule("MXA171", Category.REGISTRATION, Severity.WARNING, "op name in a configuration list that nothing registers",
     "A `\"ns::op\"` string (e.g. an attention op appended to the compilation config's splitting ops) names no "
     "registered op, so whatever the list asks for (a piecewise graph split) never happens for it. Usually a "
     "stale name left after the op was renamed or removed: fix or drop the entry.")
rule("MXA172", Category.REGISTRATION, Severity.INFO, "op name could not be checked against its registrations",
     "The namespace (or op) is provided by something this audit cannot read statically (a compiled package "
     "of the kernel stack, a registration with a computed name); this is not evidence that the op is missing. "
     "A stack manifest captured on the vendor stack (`metax-audit evidence --capture-stack`) closes the gap.")
rule("MXA173", Category.REGISTRATION, Severity.INFO, "guarded use of an op that nothing registers",
     "The use sits under `hasattr(torch.ops.<ns>, ...)` or a try/except, so the fallback runs instead; check the "
     "fallback is what the vendor device should run.")

# torch's own namespaces: its operator registry is not something a port or upstream declares.
TORCH_NAMESPACES = frozenset({"aten", "prims", "higher_order", "quantized", "_quantized", "c10d", "_c10d_functional",
                              "_c10d_functional_autograd", "_dtensor", "profiler", "rngprims", "debugprims", "mkldnn",
                              "inductor", "_inductor_test", "_test", "torchvision", "onednn", "quantized_decomposed",
                              "symm_mem", "_quantized_decomposed", "_higher_order_ops"})
# Calls whose first argument names an existing op (they raise when it is not defined).
OP_REFERENCING = frozenset({"register_fake", "impl", "register_kernel", "register_autograd", "register_torch_dispatch",
                            "register_vmap", "impl_abstract", "opcheck", "_register_fake"})
NATIVE_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".h", ".hpp", ".cuh")
_OP_STRING = re.compile(r"^([A-Za-z_]\w*)::([A-Za-z_]\w*)(?:\.\w+)?$")
_PY_REG_WORDS = ("direct_register_custom_op", "Library(", "custom_op(", ".define(")
_PY_REG_CALL = re.compile(r"\b(?:direct_register_custom_op|custom_op|define|Library)\s*\(")
_DOTTED_TAIL = re.compile(r"[A-Za-z_][\w.]*\.$")
_PY_REF = re.compile(r"torch\.ops\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?")
_CPP_LIB = re.compile(r"\b(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT)?(?:_EXPAND)?\s*\(\s*([^,()]+(?:\([^()]*\))?)\s*,\s*(\w+)\s*\)\s*\{")
_CPP_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_SCHEMA_NAME = re.compile(r"^\s*([A-Za-z_]\w*)(?:\.\w+)?\s*(?:\(|$)")


@dataclass(frozen=True)
class OpRegistration:
    namespace: str  # "" when the C++ library's namespace is a macro (TORCH_EXTENSION_NAME)
    name: str  # "" for a namespace-level declaration (Library("ns", "DEF"), TORCH_LIBRARY(ns, m) with no def yet)
    provider: str  # "port python" | "port C++" | "upstream python" | "upstream compiled" | "manifest"
    where: str  # "path:line" (repo- or package-relative) or the extension file

    def text(self) -> str:
        op = f"{self.namespace or '<macro>'}::{self.name}" if self.name else f"namespace {self.namespace}"
        return f"{self.provider}: {op} at {self.where}"


@dataclass(frozen=True)
class OpUse:
    path: str
    line: int
    namespace: str
    name: str | None  # None: the namespace alone (hasattr(torch.ops._C, ...))
    kind: str  # "torch.ops" | "op-call" (register_fake("ns::op")...) | "string" (a list entry, a comparison)
    guard: str = ""  # the hasattr/try guard the use sits under


@dataclass(frozen=True)
class OpTable:
    """Every registration read, by (namespace, op), plus what could not be read and why."""

    ops: dict[tuple[str, str], tuple[OpRegistration, ...]]
    namespaces: dict[str, tuple[str, ...]]  # namespace -> providers that declare it
    macro_ops: dict[str, OpRegistration] = field(default_factory=dict)  # op -> def in a macro-named C++ library
    dynamic: dict[str, tuple[str, ...]] = field(default_factory=dict)  # namespace -> literal prefixes of computed names
    compiled: dict[str, str] = field(default_factory=dict)  # namespace -> provider whose op list is opaque here
    compiled_names: frozenset[str] | None = None  # op names upstream's compiled extensions define (None: unread)
    compiled_note: str = ""
    native_files: tuple[Path, ...] = ()  # the port's C++ sources read
    packages: dict[str, str] = field(default_factory=dict)  # namespace -> kernel package (config op-namespaces)
    read: tuple[str, ...] = ()  # the providers read, for the evidence


# ---------------------------------------------------------------- Python registrations


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _arg(call: ast.Call, pos: int, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[pos] if len(call.args) > pos else None


def _tail(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _prefix(node: ast.AST | None) -> str | None:
    """The literal start of a computed op name (f"mx_{x}" -> "mx_"); None when the name is a literal."""
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    return None if _str(node) is not None else ""


def python_registrations(tree: ast.Module, where: str, provider: str, default_ns: str,
                         ) -> tuple[list[OpRegistration], list[tuple[str, str]]]:
    """Ops a module defines: direct_register_custom_op, torch.library.custom_op/define, Library(...).define.
    Returns the registrations and the (namespace, literal prefix) of registrations with computed names."""
    libs: dict[str, str] = {}  # variable -> namespace of a Library("ns", kind) assigned to it
    for node in walk_nodes(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _tail(node.value.func) == "Library":
            ns = _str(_arg(node.value, 0, "ns"))
            if ns:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        libs[t.id] = ns
                    elif isinstance(t, ast.Attribute):
                        libs[t.attr] = ns
    regs: list[OpRegistration] = []
    dynamic: list[tuple[str, str]] = []
    for ns in sorted(set(libs.values())):
        regs.append(OpRegistration(ns, "", provider, where))

    def add(ns: str, name_node: ast.AST | None, line: int) -> None:
        name = _str(name_node)
        if name is not None:
            m = _OP_STRING.match(name)
            if m:  # "ns::op" given whole
                ns, name = m.group(1), m.group(2)
            regs.append(OpRegistration(ns, name.split("(")[0].split(".")[0], provider, f"{where}:{line}"))
        else:
            dynamic.append((ns, _prefix(name_node) or ""))

    for node in walk_nodes(tree):
        if not isinstance(node, ast.Call):
            continue
        tail = _tail(node.func)
        if tail == "direct_register_custom_op":
            lib = _arg(node, 4, "target_lib")
            ns = default_ns
            if lib is not None:
                key = lib.id if isinstance(lib, ast.Name) else lib.attr if isinstance(lib, ast.Attribute) else ""
                ns = libs.get(key, "")
                if not ns:
                    dynamic.append(("", ""))  # a library we cannot name: its ops are unknown here
                    continue
            add(ns, _arg(node, 0, "op_name"), node.lineno)
        elif tail in {"custom_op", "define"} and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_key = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if owner_key in libs and tail == "define":  # lib.define("op(Tensor x) -> Tensor")
                schema = _str(_arg(node, 0, "schema"))
                m = _SCHEMA_NAME.match(schema or "")
                if m:
                    regs.append(OpRegistration(libs[owner_key], m.group(1), provider, f"{where}:{node.lineno}"))
                else:
                    dynamic.append((libs[owner_key], ""))
            elif owner_key == "library" or ast.unparse(owner).endswith("torch.library"):
                qual = _str(_arg(node, 0, "qualname" if tail == "define" else "name"))
                m = _OP_STRING.match(qual or "")
                if m:
                    regs.append(OpRegistration(m.group(1), m.group(2), provider, f"{where}:{node.lineno}"))
        elif tail == "custom_op" and isinstance(node.func, ast.Name):  # from torch.library import custom_op
            m = _OP_STRING.match(_str(_arg(node, 0, "name")) or "")
            if m:
                regs.append(OpRegistration(m.group(1), m.group(2), provider, f"{where}:{node.lineno}"))
    return regs, dynamic


def default_namespace(text: str, fallback: str) -> str:
    """The namespace `direct_register_custom_op` registers into by default, read from the module that
    defines it: its module-level Library(...) (vLLM: Library("vllm", "FRAGMENT")); `fallback` otherwise."""
    m = re.search(r"^\w+\s*=\s*(?:torch\.library\.)?Library\(\s*[\"'](\w+)[\"']", text, re.M)
    return m.group(1) if m else fallback


# ---------------------------------------------------------------- C++ registrations


def cpp_registrations(text: str, where: str, provider: str) -> tuple[list[OpRegistration], dict[str, OpRegistration]]:
    """Ops defined in TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT blocks (and the STABLE_ variants): every
    `<var>.def("name(...)...")` inside the block; a macro namespace (TORCH_EXTENSION_NAME) is kept apart.
    Returns (registrations, ops of macro-named libraries)."""
    regs: list[OpRegistration] = []
    macro: dict[str, OpRegistration] = {}
    for m in _CPP_LIB.finditer(text):
        ns_token, var = m.group(1).strip(), m.group(2)
        macro_name = re.fullmatch(r"[A-Z][A-Z0-9_]{3,}", ns_token) is not None  # TORCH_EXTENSION_NAME
        ns = ns_token if re.fullmatch(r"[A-Za-z_]\w*", ns_token) and not macro_name else ""
        body_start = m.end()
        body = text[body_start:_close(text, body_start, "{}", 1)]
        line0 = text.count("\n", 0, body_start) + 1
        if ns:
            regs.append(OpRegistration(ns, "", provider, f"{where}:{text.count(chr(10), 0, m.start()) + 1}"))
        for d in re.finditer(rf"\b{re.escape(var)}\s*\.\s*def\s*\(\s*((?:\"(?:[^\"\\\\\n]|\\\\.)*\"\s*)+)", body):
            schema = "".join(_CPP_STRING.findall(d.group(1)))  # adjacent literals concatenate
            name_m = _SCHEMA_NAME.match(schema)
            if not name_m:
                continue
            reg = OpRegistration(ns, name_m.group(1), provider, f"{where}:{line0 + body.count(chr(10), 0, d.start())}")
            if ns:
                regs.append(reg)
            else:
                macro.setdefault(reg.name, reg)
    return regs, macro


# ---------------------------------------------------------------- building the table


def _py_files(root: Path, package: str) -> Iterator[Path]:
    pkg = root / package.replace(".", "/")
    if pkg.is_dir():
        yield from sorted(pkg.rglob("*.py"))


_BRACKETS = {"{}": re.compile(r"[{}]"), "()": re.compile(r"[()]")}


def _close(text: str, pos: int, pair: str, depth: int) -> int:
    """Index just past the bracket that closes `depth` open ones before `pos` (len(text) when unbalanced)."""
    for m in _BRACKETS[pair].finditer(text, pos):
        depth += 1 if m.group() == pair[0] else -1
        if depth == 0:
            return m.end()
    return len(text)


def registration_snippets(text: str) -> ast.Module | None:
    """The registration calls of a module, each parsed alone (with its `x = ` target and line number): a
    registry module is often large, and parsing only its registration calls keeps this stage cheap."""
    body: list[ast.stmt] = []
    for m in _PY_REG_CALL.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        dotted = _DOTTED_TAIL.search(text, line_start, m.start())
        call_start = dotted.start() if dotted else m.start()
        prefix = text[line_start:call_start]
        if prefix.lstrip().startswith(("def ", "#", "import ", "from ")):
            continue
        i = _close(text, m.end(), "()", 1)
        head = prefix.strip()
        start = line_start if re.fullmatch(r"[A-Za-z_][\w.]*\s*(?::[^=]+)?=|@", head) else call_start
        snippet = text[start:i].strip()
        try:
            parsed = ast.parse(snippet.lstrip("@"))
        except (SyntaxError, ValueError, RecursionError):
            continue
        ast.increment_lineno(parsed, text.count("\n", 0, start))
        body += parsed.body
    return ast.Module(body=body, type_ignores=[]) if body else None


def scan_python(root: Path, package: str, provider: str, default_ns: str,
                refs: dict[str, set[str]] | None = None) -> tuple[list[OpRegistration], list[tuple[str, str]], str]:
    """Registrations of every module of `package` under `root` (and, with refs, every torch.ops.<ns>.<op>
    the sources name). An empty `default_ns` is read from the module defining direct_register_custom_op."""
    texts: list[tuple[Path, str]] = []
    for path in _py_files(root, package):
        try:
            texts.append((path, path.read_text(encoding="utf-8", errors="replace")))
        except OSError:
            continue
    if not default_ns:
        default_ns = next((default_namespace(t, package) for _, t in texts if "def direct_register_custom_op" in t), package)
    regs: list[OpRegistration] = []
    dynamic: list[tuple[str, str]] = []
    for path, text in texts:
        if refs is not None and "torch.ops." in text:
            for ns, op in _PY_REF.findall(text):
                refs.setdefault(ns, set()).add(op)
        if not any(w in text for w in _PY_REG_WORDS):
            continue
        tree = registration_snippets(text)
        if tree is None:
            continue
        found, dyn = python_registrations(tree, path.relative_to(root).as_posix(), provider, default_ns)
        regs += found
        dynamic += dyn
    return regs, dynamic, default_ns


def _native_files(root: Path, prefixes: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for prefix in prefixes:
        base = root / prefix
        if base.is_dir():
            out += sorted(p for p in base.rglob("*") if p.suffix in NATIVE_SUFFIXES and p.is_file())
    return out


def _scan_native(files: list[Path], root: Path, regs: list[OpRegistration], macro: dict[str, OpRegistration]) -> None:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "TORCH_LIBRARY" not in text:
            continue
        found, mac = cpp_registrations(text, path.relative_to(root).as_posix(), "port C++")
        regs += found
        for k, v in mac.items():
            macro.setdefault(k, v)


def cpp_function(files: Iterable[Path], root: Path, name: str) -> str | None:
    """Where the port's C++ defines a function `name` (for the evidence of an unregistered op)."""
    pattern = re.compile(rf"^(?:[\w:<>]+[ \t]+)+[*&]?{re.escape(name)}\s*\(", re.M)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = pattern.search(text) if name in text else None
        if m:
            return f"{path.relative_to(root).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}"
    return None


_UPSTREAM_INDEX = ".metax-audit-ops.json"  # beside the cached upstream sources; rebuilt when its format changes
_INDEX_FORMAT = 2
_MEMO: dict[tuple[str, str], tuple[list[OpRegistration], list[tuple[str, str]], dict[str, set[str]], str]] = {}


def upstream_registrations(upstream: UpstreamInfo,
                           ) -> tuple[list[OpRegistration], list[tuple[str, str]], dict[str, set[str]], str]:
    """Upstream's Python registrations and torch.ops references. Reading 2,000 files costs ~0.3 s, so a
    pip cache entry (immutable once complete) keeps the result beside its sources."""
    import json

    from metax_audit.upstream import COMPLETE_MARKER

    assert upstream.root is not None
    key = (str(upstream.root), upstream.package)
    if key in _MEMO:
        return _MEMO[key]
    index = upstream.root / _UPSTREAM_INDEX
    cacheable = (upstream.root / COMPLETE_MARKER).is_file()
    if cacheable and index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            if data.get("format") == _INDEX_FORMAT:
                result = ([OpRegistration(*r) for r in data["regs"]], [tuple(d) for d in data["dynamic"]],
                          {k: set(v) for k, v in data["refs"].items()}, str(data["default_ns"]))
                _MEMO[key] = result  # type: ignore[assignment]
                return _MEMO[key]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # rebuilt below
    refs: dict[str, set[str]] = {}
    regs, dynamic, default_ns = scan_python(upstream.root, upstream.package, "upstream python", "", refs)
    _MEMO[key] = (regs, dynamic, refs, default_ns)
    if cacheable:
        payload = {"format": _INDEX_FORMAT, "default_ns": default_ns,
                   "regs": [[r.namespace, r.name, r.provider, r.where] for r in regs],
                   "dynamic": [list(d) for d in dynamic], "refs": {k: sorted(v) for k, v in refs.items()}}
        try:
            tmp = index.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload), encoding="utf-8")
            tmp.replace(index)
        except OSError:
            pass  # a read-only cache only costs the rescan
    return _MEMO[key]


def build_table(root: Path, port_package: str, native_prefixes: Iterable[str], upstream: UpstreamInfo | None,
                compiled_names: frozenset[str] | None = None, compiled_note: str = "",
                manifest_ops: dict[str, tuple[str, ...]] | None = None,
                op_packages: dict[str, str] | None = None) -> OpTable:
    """Read every provider: the port's Python and C++ (snapshot), upstream's Python (and the op names its
    compiled extensions define, when the caller could read them), the stack manifest's torch.ops."""
    macro: dict[str, OpRegistration] = {}
    read: list[str] = []
    up_regs: list[OpRegistration] = []
    up_dynamic: list[tuple[str, str]] = []
    refs: dict[str, set[str]] = {}
    up_default = ""
    if upstream is not None and upstream.root is not None:
        up_regs, up_dynamic, refs, up_default = upstream_registrations(upstream)
    regs, dynamic, _ = scan_python(root, port_package, "port python", up_default)
    read.append(f"port python ({port_package}, snapshot)")
    native = _native_files(root, native_prefixes)
    _scan_native(native, root, regs, macro)
    read.append(f"port C++ ({len(native)} files under {', '.join(native_prefixes) or 'no configured native source dir'})")
    compiled: dict[str, str] = {}
    if upstream is not None and upstream.root is not None:
        regs += up_regs
        dynamic += up_dynamic
        declared = {r.namespace for r in up_regs}
        label = f"{upstream.package} {upstream.version or ''}".strip()
        for ns in refs:  # namespaces upstream calls but never registers in Python: its compiled extensions'
            if ns not in declared and ns not in TORCH_NAMESPACES:
                compiled[ns] = f"upstream compiled extensions ({label})"
        read.append(f"upstream python ({label})")
        if compiled_names is not None:
            read.append(f"upstream compiled extensions ({label}: {compiled_note or f'{len(compiled_names)} op names'})")
    for ns, names in (manifest_ops or {}).items():
        regs.append(OpRegistration(ns, "", "manifest", "stack manifest"))
        regs += [OpRegistration(ns, n, "manifest", "stack manifest") for n in names]
    if manifest_ops is not None:
        read.append(f"stack manifest ({len(manifest_ops)} torch.ops namespaces)")
    ops: dict[tuple[str, str], list[OpRegistration]] = {}
    namespaces: dict[str, list[str]] = {}
    for r in regs:
        namespaces.setdefault(r.namespace, [])
        if r.provider not in namespaces[r.namespace]:
            namespaces[r.namespace].append(r.provider)
        if r.name:
            ops.setdefault((r.namespace, r.name), []).append(r)
    for ns, provider in compiled.items():
        namespaces.setdefault(ns, [])
        if provider not in namespaces[ns]:
            namespaces[ns].append(provider)
    for ns, package in (op_packages or {}).items():  # declared by config: the package's compiled library
        if ns not in (manifest_ops or {}):
            namespaces.setdefault(ns, [])
            namespaces[ns].append(f"kernel package {package} (config op-namespaces)")
    dyn: dict[str, list[str]] = {}
    for ns, prefix in dynamic:
        dyn.setdefault(ns, []).append(prefix)
    return OpTable(ops={k: tuple(v) for k, v in ops.items()}, namespaces={k: tuple(v) for k, v in namespaces.items()},
                   macro_ops=macro, dynamic={k: tuple(v) for k, v in dyn.items()}, compiled=compiled,
                   compiled_names=compiled_names, compiled_note=compiled_note, native_files=tuple(native),
                   packages={ns: p for ns, p in (op_packages or {}).items() if ns not in (manifest_ops or {})},
                   read=tuple(read))


# ---------------------------------------------------------------- uses in scope


def _torch_ops(node: ast.AST) -> tuple[str, str | None] | None:
    """`torch.ops.ns.op` -> (ns, op); `torch.ops.ns` -> (ns, None)."""
    chain: list[str] = []
    cur = node
    while isinstance(cur, ast.Attribute):
        chain.append(cur.attr)
        cur = cur.value
    if not (isinstance(cur, ast.Name) and cur.id == "torch"):
        return None
    chain.reverse()
    if len(chain) < 2 or chain[0] != "ops":
        return None
    return chain[1], (chain[2] if len(chain) > 2 else None)


def _guards(tree: ast.Module) -> dict[int, str]:
    """Lines under a `hasattr(torch.ops.<ns>, "op")` test or a try whose handlers catch the failure."""
    out: dict[int, str] = {}
    for node in walk_nodes(tree):
        body: list[ast.stmt] = []
        text = ""
        if isinstance(node, ast.If | ast.IfExp) and "hasattr(torch.ops" in ast.unparse(node.test):
            body, text = (list(node.body) if isinstance(node, ast.If) else []), ast.unparse(node.test)
            if isinstance(node, ast.IfExp):
                out.setdefault(node.lineno, ast.unparse(node.test))
        elif isinstance(node, ast.Try):
            caught = {ast.unparse(h.type) if h.type is not None else "" for h in node.handlers}
            if any(c == "" or any(w in c for w in ("AttributeError", "RuntimeError", "Exception")) for c in caught):
                body, text = list(node.body), f"try/except {', '.join(sorted(c or 'bare' for c in caught))}"
        for stmt in body:
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                out.setdefault(line, text)
    return out


def op_uses(root: Path, paths: Iterable[str]) -> list[OpUse]:
    uses: list[OpUse] = []
    for rel in paths:
        tree = parse_file(str(root / rel))
        if tree is None:
            continue
        guards = _guards(tree)
        inner: set[int] = set()  # ids of torch.ops.ns nodes that are part of a longer chain
        found: list[tuple[ast.AST, tuple[str, str | None]]] = []
        for node in walk_nodes(tree):
            if isinstance(node, ast.Attribute):
                hit = _torch_ops(node)
                if hit is not None:
                    found.append((node, hit))
                    if isinstance(node.value, ast.Attribute):
                        inner.add(id(node.value))
            elif isinstance(node, ast.Call) and node.args and _tail(node.func) in OP_REFERENCING:
                m = _OP_STRING.match(_str(node.args[0]) or "")
                if m:
                    inner.add(id(node.args[0]))
                    uses.append(OpUse(rel, node.lineno, m.group(1), m.group(2), "op-call", guards.get(node.lineno, "")))
            elif isinstance(node, ast.Call) and _tail(node.func) == "hasattr" and len(node.args) == 2:
                hit = _torch_ops(node.args[0])
                if hit is not None and hit[1] is None:  # hasattr(torch.ops.ns, "op") is the guard, not a use
                    inner.add(id(node.args[0]))
        for node in walk_nodes(tree):
            if isinstance(node, ast.Constant) and id(node) not in inner:
                m = _OP_STRING.match(_str(node) or "")
                if m:
                    uses.append(OpUse(rel, node.lineno, m.group(1), m.group(2), "string", guards.get(node.lineno, "")))
        seen: set[tuple[int, str, str | None]] = set()
        for node, (ns, op) in found:
            if id(node) in inner:
                continue
            line = getattr(node, "lineno", 0)
            if op is not None and op in {"default"}:
                continue
            key = (line, ns, op)
            if key not in seen:
                seen.add(key)
                uses.append(OpUse(rel, line, ns, op, "torch.ops", guards.get(line, "")))
    return sorted(uses, key=lambda u: (u.path, u.line, u.namespace, u.name or ""))


# ---------------------------------------------------------------- the check


def _lookup(table: OpTable, ns: str, op: str) -> tuple[OpRegistration, ...]:
    found = table.ops.get((ns, op), ())
    if not found and op in table.macro_ops:
        found = (table.macro_ops[op],)
    if not found and table.compiled_names is not None and ns in table.compiled and op in table.compiled_names:
        found = (OpRegistration(ns, op, "upstream compiled", table.compiled[ns]),)
    return found


def _unknowable(table: OpTable, ns: str, op: str | None) -> str | None:
    """Why a miss is not proof: a provider of the namespace whose op list we could not read."""
    if ns not in table.namespaces:
        return None
    prefixes = table.dynamic.get(ns, ()) + table.dynamic.get("", ())
    for prefix in prefixes:
        if op is None or op.startswith(prefix):
            return f"a registration into {ns or 'an unnamed library'} computes its op name" + (f" (prefix {prefix!r})" if prefix else "")
    if ns in table.packages:
        return f"{ns} is the op library of kernel package {table.packages[ns]} (config op-namespaces), not read here"
    if ns in table.compiled and table.compiled_names is None:
        return f"{ns} is also provided by {table.compiled[ns]}, whose op list could not be read: {table.compiled_note or 'no compiled extensions in the upstream source'}"
    return None


def check_ops(discovery: Discovery, table: OpTable) -> Iterator[Finding]:
    """One finding per op name in scope that no provider registers (or that could not be checked)."""
    paths = [f.path for f in discovery.files if f.parse_error is None]
    unchecked: dict[str, list[OpUse]] = {}
    for use in op_uses(discovery.root, paths):
        if use.namespace in TORCH_NAMESPACES:
            continue
        op = use.name
        what = f"torch.ops.{use.namespace}" + (f".{op}" if op else "") if use.kind == "torch.ops" else f"{use.namespace}::{op}"
        loc = Location(use.path, use.line, f"op:{use.namespace}::{op or ''}")
        port_side = f"port: {use.path}:{use.line}: {source_line(discovery.root, use.path, use.line)}"
        if op is not None and _lookup(table, use.namespace, op):
            continue
        if use.namespace not in table.namespaces:
            unchecked.setdefault(f"namespace {use.namespace} is declared by nothing read here", []).append(use)
            continue
        if op is None:
            continue
        why = _unknowable(table, use.namespace, op)
        if why:
            unchecked.setdefault(why, []).append(use)
            continue
        evidence = [port_side, f"namespace {use.namespace}: declared by {', '.join(table.namespaces[use.namespace])}",
                    *(f"read: {r}" for r in table.read)]
        same_ns = sorted(n for (ns, n) in table.ops if ns == use.namespace)
        close = difflib.get_close_matches(op, same_ns, n=3, cutoff=0.6)
        if close:
            evidence.append("closest registered: " + ", ".join(
                f"{use.namespace}::{c} ({table.ops[(use.namespace, c)][0].text()})" for c in close))
        cpp = cpp_function(table.native_files, discovery.root, op)
        if cpp:
            evidence.append(f"port C++ defines a function {op} at {cpp}, but no library .def registers it as an op")
        if table.compiled_names is not None and use.namespace in table.compiled:
            evidence.append(f"not among the {len(table.compiled_names)} op schemas of {table.compiled[use.namespace]}")
        if use.guard:
            yield make_finding("MXA173", loc, f"{what} is registered by nothing read here; the use is guarded by {use.guard}",
                               evidence)
        elif use.kind == "string":
            yield make_finding("MXA171", loc, f"{what} names an op nothing registers", evidence)
        else:
            yield make_finding("MXA170", loc, f"{what} is registered by nothing on the target stack", evidence)
    for why, uses in unchecked.items():
        first = uses[0]
        names = sorted({f"{u.namespace}::{u.name or '*'}" for u in uses})
        yield make_finding("MXA172", Location(first.path, first.line, f"op-unchecked:{why.split(':')[0]}"),
                           f"{len(uses)} op use(s) not checked: {why}",
                           [*(f"op: {n}" for n in names[:15]), *(f"use: {u.path}:{u.line}" for u in uses[:10]),
                            *(f"read: {r}" for r in table.read)])


def upstream_cpp_ops(root: Path) -> tuple[frozenset[str], str]:
    """Op names upstream's C++ sources define (a git export keeps csrc/): what its compiled extensions hold."""
    files = _native_files(root, ("csrc",))
    regs: list[OpRegistration] = []
    macro: dict[str, OpRegistration] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "TORCH_LIBRARY" in text:
            found, mac = cpp_registrations(text, path.relative_to(root).as_posix(), "upstream C++")
            regs += found
            macro.update(mac)
    names = frozenset({r.name for r in regs if r.name} | set(macro))
    return names, f"{len(names)} ops defined in upstream's C++ sources ({len(files)} files under csrc/)"


def op_findings(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo | None,
                facts: StackFacts | None) -> list[Finding]:
    """The op-name check as the review runs it: every provider read, then the uses in scope."""
    compiled, note = (None, "")
    if upstream is not None:
        from metax_audit.upstream import compiled_op_names

        compiled, note = compiled_op_names(upstream)
        if compiled is None and upstream.root is not None and (upstream.root / "csrc").is_dir():
            compiled, note = upstream_cpp_ops(upstream.root)
    manifest = facts.torch_ops if facts is not None and facts.source.startswith("manifest:") else None
    table = build_table(discovery.root, discovery.port_package, config.native_sources, upstream,
                        compiled_names=compiled, compiled_note=note, manifest_ops=manifest,
                        op_packages=config.op_namespaces)
    return list(check_ops(discovery, table))

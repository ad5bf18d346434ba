# Op registrations read statically: the records of the op-name check (a registration, a use, the
# table), and the readers of Python (`direct_register_custom_op`, `Library.define`) and C++
# (`TORCH_LIBRARY`) registrations.
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.core.pysource import walk_nodes

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
    schema: str = ""  # the registered schema text when the source states it ("op(Tensor x, int n) -> ()")

    def text(self) -> str:
        op = f"{self.namespace or '<macro>'}::{self.name}" if self.name else f"namespace {self.namespace}"
        return f"{self.provider}: {op} at {self.where}"


@dataclass(frozen=True)
class OpUse:
    path: str
    line: int
    namespace: str
    name: str | None  # None: the namespace alone (hasattr(torch.ops._C, ...))
    kind: str  # "torch.ops" | "op-call" (register_fake("ns::op")...) | "string" (a list entry, a comparison) | "namespace-call"
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
    libs = _libraries(tree)
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
                    regs.append(OpRegistration(libs[owner_key], m.group(1), provider, f"{where}:{node.lineno}",
                                               schema=schema or ""))
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


def _libraries(tree: ast.Module) -> dict[str, str]:
    """Variable (or attribute) -> namespace of each `Library("ns", kind)` assigned to it."""
    libs: dict[str, str] = {}
    for node in walk_nodes(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _tail(node.value.func) == "Library":
            ns = _str(_arg(node.value, 0, "ns"))
            if ns:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        libs[t.id] = ns
                    elif isinstance(t, ast.Attribute):
                        libs[t.attr] = ns
    return libs


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
            reg = OpRegistration(ns, name_m.group(1), provider, f"{where}:{line0 + body.count(chr(10), 0, d.start())}",
                                 schema=schema)
            if ns:
                regs.append(reg)
            else:
                macro.setdefault(reg.name, reg)
    return regs, macro


_BRACKETS = {"{}": re.compile(r"[{}]"), "()": re.compile(r"[()]")}


def _close(text: str, pos: int, pair: str, depth: int) -> int:
    """Index just past the bracket that closes `depth` open ones before `pos` (len(text) when unbalanced)."""
    for m in _BRACKETS[pair].finditer(text, pos):
        depth += 1 if m.group() == pair[0] else -1
        if depth == 0:
            return m.end()
    return len(text)

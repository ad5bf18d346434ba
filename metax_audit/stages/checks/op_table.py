# The op table of the op-name check: every registration the target stack may load, read from the
# port's Python and native sources, upstream (its sources, its C++ and its compiled extensions) and
# the stack's op manifest.
from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.core import fstree
from metax_audit.core.models import UpstreamInfo
from metax_audit.stages.checks.op_registrations import (
    _DOTTED_TAIL,
    _PY_REF,
    _PY_REG_CALL,
    _PY_REG_WORDS,
    NATIVE_SUFFIXES,
    TORCH_NAMESPACES,
    OpRegistration,
    OpTable,
    _close,
    cpp_registrations,
    default_namespace,
    python_registrations,
)

if TYPE_CHECKING:
    from metax_audit.core.memo import Memo, Products

# ---------------------------------------------------------------- building the table


def _py_files(root: Path, package: str) -> Iterator[Path]:
    pkg = root / package.replace(".", "/")
    if pkg.is_dir():
        yield from fstree.files(pkg, ".py")


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


def _python_file(text: str, where: str, provider: str, default_ns: str,
                 ) -> tuple[list[OpRegistration], list[tuple[str, str]]] | None:
    tree = registration_snippets(text)
    return None if tree is None else python_registrations(tree, where, provider, default_ns)


def scan_python(root: Path, package: str, provider: str, default_ns: str,
                refs: dict[str, set[str]] | None = None, products: Products | None = None,
                ) -> tuple[list[OpRegistration], list[tuple[str, str]], str]:
    """Registrations of every module of `package` under `root` (and, with refs, every torch.ops.<ns>.<op>
    the sources name). An empty `default_ns` is read from the module defining direct_register_custom_op.
    With `products`, each module's registrations are kept under its text, provider and namespace."""
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
        where = path.relative_to(root).as_posix()
        read = products.get(f"{where}|{provider}|{default_ns}", text, partial(_python_file, text, where, provider, default_ns)) \
            if products is not None else _python_file(text, where, provider, default_ns)
        if read is None:
            continue
        found, dyn = read
        regs += found
        dynamic += dyn
    return regs, dynamic, default_ns


def _native_files(root: Path, prefixes: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for prefix in prefixes:
        base = root / prefix
        if base.is_dir():
            out += [p for p in fstree.files(base) if p.suffix in NATIVE_SUFFIXES]
    return out


def _scan_native(files: list[Path], root: Path, regs: list[OpRegistration], macro: dict[str, OpRegistration],
                 products: Products | None = None) -> None:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "TORCH_LIBRARY" not in text:
            continue
        where = path.relative_to(root).as_posix()
        found, mac = products.get(where, text, partial(cpp_registrations, text, where, "port C++")) \
            if products is not None else cpp_registrations(text, where, "port C++")
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

    from metax_audit.stages.upstream import COMPLETE_MARKER

    assert upstream.root is not None
    key = (str(upstream.root), upstream.package)
    if key in _MEMO:
        return _MEMO[key]
    index = upstream.root / _UPSTREAM_INDEX
    cacheable = (upstream.root / COMPLETE_MARKER).is_file()
    if cacheable and index.is_file():
        try:
            from metax_audit.core.memo import read_kept_file

            raw = read_kept_file(index)  # a link or a FIFO there is a miss, never a hang
            data = json.loads(raw.decode("utf-8")) if raw is not None else {}
            if data.get("format") == _INDEX_FORMAT:
                result = ([OpRegistration(*r) for r in data["regs"]], [tuple(d) for d in data["dynamic"]],
                          {k: set(v) for k, v in data["refs"].items()}, str(data["default_ns"]))
                _MEMO[key] = result  # type: ignore[assignment]
                return _MEMO[key]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
                op_packages: dict[str, str] | None = None, *, memo: Memo | None = None) -> OpTable:
    """Read every provider: the port's Python and C++ (snapshot), upstream's Python (and the op names its
    compiled extensions define, when the caller could read them), the stack manifest's torch.ops. What
    each port source registers is asked of `memo` under its text (the review's keeps it: parsing the
    registration calls of the port's modules and C++ files was 0.1 s a review)."""
    from metax_audit.core.memo import NO_MEMO, Kind

    python_products = (memo or NO_MEMO).products(Kind.OP_TABLE_PYTHON, sys.version)
    native_products = (memo or NO_MEMO).products(Kind.OP_TABLE_NATIVE)
    macro: dict[str, OpRegistration] = {}
    read: list[str] = []
    up_regs: list[OpRegistration] = []
    up_dynamic: list[tuple[str, str]] = []
    refs: dict[str, set[str]] = {}
    up_default = ""
    if upstream is not None and upstream.root is not None:
        up_regs, up_dynamic, refs, up_default = upstream_registrations(upstream)
    regs, dynamic, _ = scan_python(root, port_package, "port python", up_default, products=python_products)
    read.append(f"port python ({port_package}, snapshot)")
    native = _native_files(root, native_prefixes)
    _scan_native(native, root, regs, macro, native_products)
    python_products.save()
    native_products.save()
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

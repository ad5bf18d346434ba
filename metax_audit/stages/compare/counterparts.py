# Which upstream file and class each port file and class follows: by path (with config
# overrides), by name with the vendor prefix stripped, else by the backend enum member it registers.
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.core.pysource import cached_parse
from metax_audit.stages.compare.roles import PortLoader, RolePair, UpstreamClasses, main_path, role_pairs

# Where upstream keeps its backend enum (read statically; importing vLLM is not an option here).
_REGISTRY_FILES = ("v1/attention/backends/registry.py", "attention/backends/registry.py", "platforms/registry.py")
_ENUM_SUFFIX = "BackendEnum"


@dataclass(frozen=True)
class FileCounterpart:
    path: str  # port file, repo-relative
    upstream_path: str | None  # upstream file relative to the upstream root, None when vendor-only
    how: str  # "path" | "path-map" | "subfolder" | "registration:<MEMBER>" | "role" | "vendor-only"
    # For "role": the port classes and the upstream classes whose role they take (compared by contract).
    roles: tuple[RolePair, ...] = ()
    why_not: str = ""  # for vendor-only: what was looked for

    @property
    def vendor_only(self) -> bool:
        return self.upstream_path is None


def default_upstream_path(port_path: str, config: AuditConfig) -> str | None:
    """`vllm_metax/x/y.py` -> `vllm/x/y.py`; None for a file outside the port package."""
    port_dir = config.port_package.replace(".", "/")
    up_dir = config.upstream_package.replace(".", "/")
    if port_path == port_dir or not port_path.startswith(port_dir + "/"):
        return None
    return up_dir + port_path[len(port_dir):]


def module_of(path: str) -> str:
    mod = path[:-3] if path.endswith(".py") else path
    mod = mod.replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def path_of_module(module: str) -> str:
    return module.replace(".", "/") + ".py"


def read_registry(upstream_root: Path | None, package: str) -> dict[str, str]:
    """"Enum.MEMBER" -> default class path, read from upstream's backend registry (every *BackendEnum)."""
    if upstream_root is None:
        return {}
    out: dict[str, str] = {}
    for rel in _REGISTRY_FILES:
        path = upstream_root / package / rel
        try:
            tree = cached_parse(path)[1]  # the trace reads the registry too: one parse
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if not (isinstance(node, ast.ClassDef) and node.name.endswith(_ENUM_SUFFIX)):
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    and stmt.value.value
                ):
                    out.setdefault(f"{node.name}.{stmt.targets[0].id}", stmt.value.value)
    return out


def registered_members(tree: ast.Module) -> dict[str, str]:
    """Port class -> "Enum.MEMBER", from `@register_backend(XEnum.MEMBER, ...)` decorators."""
    found: dict[str, str] = {}
    for node in tree.body:  # registered backends are module-level classes
        if not isinstance(node, ast.ClassDef):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            args = list(dec.args) + [k.value for k in dec.keywords if k.arg in {"backend", "backend_enum"}]
            for arg in args:
                if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id.endswith(_ENUM_SUFFIX):
                    found[node.name] = f"{arg.value.id}.{arg.attr}"
                    break
    return found


def map_file(
    port_path: str,
    config: AuditConfig,
    upstream_root: Path | None,
    registered: Mapping[str, str] = {},  # read only
    registry: Mapping[str, str] = {},  # read only
    port_tree: ast.Module | None = None,
    upstream_classes: UpstreamClasses | None = None,
    port_loader: PortLoader | None = None,
) -> FileCounterpart:
    """The upstream file a port file follows: config override, same path (or moved into a subfolder)
    when the two share definitions, the registered enum member's file, else the upstream classes its
    classes take the role of (bases, config class-map)."""
    if port_path in config.path_map:
        return FileCounterpart(port_path, config.path_map[port_path], "path-map")
    candidate = default_upstream_path(port_path, config)
    if upstream_root is None:
        return FileCounterpart(port_path, candidate, "path")
    # Classes registered for an enum member stand for upstream's class of that member (renamed classes).
    aliases = {registry[m].rsplit(".", 1)[-1] for m in registered.values() if "." in registry.get(m, "")}
    not_copies: list[str] = []
    for how, rel in (("path", candidate), ("subfolder", _subfolder_move(upstream_root, candidate, config))):
        if rel and (upstream_root / rel).is_file():
            if _shares_definitions(port_tree, upstream_root / rel, config, aliases):
                return FileCounterpart(port_path, rel, how)
            not_copies.append(rel)
    # Moved upstream file: the class registered for the same enum member says where it lives now.
    for member in sorted(set(registered.values())):
        class_path = registry.get(member)
        if class_path and "." in class_path:
            rel = path_of_module(class_path.rsplit(".", 1)[0])
            if (upstream_root / rel).is_file():
                if _shares_definitions(port_tree, upstream_root / rel, config, aliases):
                    return FileCounterpart(port_path, rel, f"registration:{member}")
                not_copies.append(rel)
    if port_tree is not None:
        classes = upstream_classes or UpstreamClasses(upstream_root, config.upstream_package)
        pairs = role_pairs(port_tree, module_of(port_path), port_path.endswith("__init__.py"), classes, config.class_map,
                           port_loader)
        if pairs:
            return FileCounterpart(port_path, main_path(pairs), "role", tuple(pairs))
    why = (f"{', '.join(not_copies)} shares no class or function with it (same name, different code)"
           if not_copies else f"no {candidate or 'mapped path'} under upstream (nor in a subfolder of its directory)")
    return FileCounterpart(port_path, None, "vendor-only",
                           why_not=why + "; no registered enum member points to an upstream file; no class subclasses an upstream class")


def _subfolder_move(upstream_root: Path, candidate: str | None, config: AuditConfig) -> str | None:
    """`x/y/f.py` absent upstream but present with one folder inserted into its path: per-platform folders,
    `x/y/<sub>/f.py` (vllm/models/deepseek_v4/nvidia/flashmla.py) or higher up, `x/<sub>/y/f.py`
    (vllm/models/deepseek_v4/common/ops/fused_indexer_q.py for models/deepseek_v4/ops/). The nearest level that has
    one wins; at a level, the preferred subfolder (config upstream-subfolders, in order) or the only one."""
    if not candidate or (upstream_root / candidate).is_file():
        return None
    parts = Path(candidate).parts
    for cut in range(len(parts) - 1, 1, -1):  # the folder inserted after parts[:cut], nearest the file first
        parent, rest = upstream_root.joinpath(*parts[:cut]), Path(*parts[cut:])
        try:
            found = sorted(p.name for p in parent.iterdir() if p.is_dir() and (p / rest).is_file())
        except OSError:
            continue
        pick = next((s for s in config.upstream_subfolders if s in found), None) or (found[0] if len(found) == 1 else None)
        if pick:
            return Path(*parts[:cut], pick, rest).as_posix()
        if found:
            return None  # several platforms' copies at the nearest level, none preferred: ambiguous
    return None


def _definitions(tree: ast.Module, prefixes: Iterable[str]) -> set[str]:
    return {strip_prefix(s.name, prefixes) for s in tree.body
            if isinstance(s, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}


def _shares_definitions(port_tree: ast.Module | None, upstream_file: Path, config: AuditConfig,
                        aliases: frozenset[str] | set[str] = frozenset()) -> bool:
    """A copied file keeps upstream's classes and functions; a file that only shares the name does not.
    Without the port's tree (or with a file that defines nothing) the path is taken as it is."""
    if port_tree is None:
        return True
    mine = _definitions(port_tree, config.class_prefixes) | aliases
    if not mine:
        return True
    try:
        theirs = _definitions(cached_parse(upstream_file)[1], ())  # the compare reads this file next: one parse
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return True
    return bool(mine & theirs) or not theirs


def strip_prefix(name: str, prefixes: Iterable[str]) -> str:
    for prefix in sorted(prefixes, key=len, reverse=True):
        if name.startswith(prefix) and len(name) > len(prefix) and name[len(prefix)].isupper():
            return name[len(prefix):]
    return name


def map_classes(
    port_classes: Iterable[str],
    upstream_classes: Iterable[str],
    config: AuditConfig,
    upstream_module: str | None,
    registered: Mapping[str, str] = {},  # read only
    registry: Mapping[str, str] = {},  # read only
) -> dict[str, str]:
    """Port class -> upstream class in the counterpart file (same name, prefix stripped, enum member)."""
    ups = set(upstream_classes)
    out: dict[str, str] = {}
    for name in port_classes:
        if name in ups:
            out[name] = name
            continue
        stripped = strip_prefix(name, config.class_prefixes)
        if stripped in ups:
            out[name] = stripped
            continue
        member = registered.get(name)
        class_path = registry.get(member or "")
        if class_path and "." in class_path:
            mod, cls = class_path.rsplit(".", 1)
            if cls in ups and (upstream_module is None or mod == upstream_module):
                out[name] = cls
    return out

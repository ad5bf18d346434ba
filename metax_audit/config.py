# Audit configuration: `[tool.metax-audit]` in the port's pyproject.toml or `.metax-audit.yaml`.
# Defaults fit vllm_metax; nothing else in the code may assume MetaX where this can say it.
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from metax_audit.errors import ConfigError

DEFAULT_SCOPE = (
    "{port}/v1/attention/**/*.py",
    "{port}/model_executor/layers/attention/**/*.py",
    "{port}/registry/custom_ops/layers/sparse_attn_indexer/**/*.py",
    "{port}/models/*/attention.py",
    "{port}/models/*/flashmla.py",
    "{port}/models/*/sparse_mla.py",
    "{port}/platform.py",
)


@dataclass(frozen=True)
class AuditConfig:
    port_package: str = "vllm_metax"
    upstream_package: str = "vllm"
    scope: tuple[str, ...] = DEFAULT_SCOPE
    platform_file: str = "{port}/platform.py"
    # Vendor prefixes stripped from class names to find the upstream class (MacaFoo -> Foo).
    class_prefixes: tuple[str, ...] = ("Maca", "MACA", "Metax", "MetaX")
    # Port path -> upstream path, for files the port moved (repo-relative, posix).
    path_map: dict[str, str] = field(default_factory=dict)
    # Lenient markers of declared vendor differences in comments (case-insensitive substrings).
    modification_markers: tuple[str, ...] = ("metax modification", "metax modify", "metax:", "[metax]", "maca modification")
    waivers: str | None = None
    severity_overrides: dict[str, str] = field(default_factory=dict)
    # Kernel packages whose versions matter for the evidence record.
    kernel_packages: tuple[str, ...] = ("flashinfer", "flashinfer-python", "flash_attn", "flash-attn", "flash_mla", "torch", "triton")
    # Import packages of the kernel stack whose names the port imports (checked against what is installed).
    kernel_modules: tuple[str, ...] = ("flashinfer", "flash_attn", "flash_mla")
    # Port class -> "upstream.module.Class" whose role it takes, when it neither copies nor subclasses it.
    class_map: dict[str, str] = field(default_factory=dict)
    # Upstream per-platform subfolders to prefer when upstream moved a file into several of them.
    upstream_subfolders: tuple[str, ...] = ("nvidia", "cuda")
    # torch.ops namespaces of the kernel stack -> the package whose sources document their schemas
    # (read statically when the op library is not loaded where the review runs).
    op_namespaces: dict[str, str] = field(default_factory=dict)
    # Public wheels (pip pins NAME==VERSION) or directories of the kernel stack whose Python sources are
    # read statically when the stack cannot be imported here (downloaded once, .py files cached).
    kernel_sources: tuple[str, ...] = ()
    # Platform methods that return backend class paths as strings (read as registrations).
    selectors: tuple[str, ...] = ("get_attn_backend_cls",)
    max_file_bytes: int = 2_000_000  # larger files are recorded as not analysed (generated code)

    def expand(self, pattern: str) -> str:
        return pattern.replace("{port}", self.port_package.replace(".", "/"))

    @property
    def scope_globs(self) -> tuple[str, ...]:
        return tuple(self.expand(p) for p in self.scope)

    @property
    def platform_path(self) -> str:
        return self.expand(self.platform_file)


_LIST_FIELDS = {"scope", "class_prefixes", "modification_markers", "kernel_packages", "kernel_modules", "selectors", "upstream_subfolders", "kernel_sources"}
_MAP_FIELDS = {"path_map", "class_map", "op_namespaces"}


def _from_mapping(data: dict[str, Any], origin: str) -> AuditConfig:
    known = {f.name.replace("_", "-"): f.name for f in fields(AuditConfig)}
    known.update({f.name: f.name for f in fields(AuditConfig)})
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"{origin}: unknown setting {key!r} (known: {', '.join(sorted(k for k in known if '-' not in k))})")
        name = known[key]
        if name in _LIST_FIELDS:
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{origin}: {key} must be a list of strings")
            value = tuple(value)
        elif name in _MAP_FIELDS and (not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
            raise ConfigError(f"{origin}: {key} must be a mapping of strings to strings")
        values[name] = value
    return replace(AuditConfig(), **values)


def load_config(root: Path, explicit: Path | None = None) -> AuditConfig:
    """Read the config from the snapshot root (or an explicit file); defaults when absent."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"config file {explicit} does not exist")
        return _load_file(explicit)
    yaml_path = root / ".metax-audit.yaml"
    if yaml_path.is_file():
        return _load_file(yaml_path)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from exc
        section = data.get("tool", {}).get("metax-audit")
        if isinstance(section, dict):
            return _from_mapping(section, "pyproject.toml [tool.metax-audit]")
    return AuditConfig()


def _load_file(path: Path) -> AuditConfig:
    if path.suffix in {".yaml", ".yml"}:
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    else:
        import tomllib

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("metax-audit", {})
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return _from_mapping(data, str(path))

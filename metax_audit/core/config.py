# Audit configuration: `[tool.metax-audit]` in the port's pyproject.toml or `.metax-audit.yaml`.
# Defaults fit vllm_metax; nothing else in the code may assume MetaX where this can say it.
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from metax_audit.core import inputs
from metax_audit.core.errors import ConfigError
from metax_audit.core.versions import COMPARISONS

DEFAULT_SCOPE = (
    "{port}/v1/attention/**/*.py",
    "{port}/model_executor/layers/attention/**/*.py",
    # the sparse-indexer ops wherever the port keeps them: customized/layers/sparse_attn_indexer.py (v0.17),
    # customized/layers/sparse_attn_indexer/ (v0.19-v0.25), registry/custom_ops/layers/sparse_attn_indexer/ since,
    # and the indexer ops of a model (models/deepseek_v4/ops/fused_indexer_q.py)
    "{port}/**/sparse_attn_indexer/**/*.py",
    "{port}/**/*indexer*.py",
    "{port}/models/*/attention.py",
    "{port}/customized/pluggable_layer/*attention*.py",  # the DeepSeek-V4 MLA wrapper up to v0.25 (since: models/*/attention.py)
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
    # The port's helpers that test the installed upstream release: name -> how the release compares with the
    # helper's one literal argument (vllm-ascend: {vllm_version_is: "=="}). A branch on one is decided for the
    # release under review (an import in a branch it does not take is info, never a break of that release).
    version_tests: dict[str, str] = field(default_factory=dict)
    max_file_bytes: int = 2_000_000  # larger files are recorded as not analysed (generated code)
    # The port's C++/CUDA source dirs (repo-relative): its TORCH_LIBRARY op registrations are read statically.
    native_sources: tuple[str, ...] = ("csrc",)
    # Files that pin the vendor kernel stack of a revision (requirements dirs, setup.py, Dockerfiles).
    stack_files: tuple[str, ...] = ("requirements", "setup.py", "docker", "Dockerfile")
    # Vendor distribution name -> the public distribution its builds derive from (for the static stand-in).
    stack_public_names: dict[str, str] = field(default_factory=lambda: {"flashinfer": "flashinfer-python"})
    # Kernel packages whose vendor builds add to the public API they derive from (MetaX's flash_attn takes s_aux=,
    # which flash-attn 2.6.3 lacks): a keyword their public base lacks is a warning, for the others an error.
    vendor_extends: tuple[str, ...] = ("flash_attn",)
    # The CUDA-style capability the vendor device reports ("8.0"; "none": it reports none; "": unknown), for the
    # NVIDIA capability questions upstream's helpers ask (is_device_capability(90), ...) when the port's platform
    # class does not answer them itself (a platform class returning a constant wins). MACA devices report 8.0, as
    # the port's own FlashInfer backend says where it checks the capability range.
    device_capability: str = "8.0"
    # The gate, so that a hook or a workflow needs no flags (each flag overrides its setting; GATE_SETTINGS).
    upstream: str | None = None  # --upstream: vllm==X.Y.Z, a directory, an installed package
    base: str | None = None  # --base
    stack: str | None = None  # --stack: a stack manifest, repo-relative (evidence --capture-stack, committed)
    python: str | None = None  # --python: the kernel stack's interpreter
    fail_on: str | None = None  # --fail-on: error | warning | info | never
    new_only: bool | None = None  # --new-only
    allow_unbound: tuple[str, ...] = ()  # --allow-unbound: pinned kernel packages reviewed without binding

    def expand(self, pattern: str) -> str:
        return pattern.replace("{port}", self.port_package.replace(".", "/"))

    @property
    def scope_globs(self) -> tuple[str, ...]:
        return tuple(self.expand(p) for p in self.scope)

    @property
    def platform_path(self) -> str:
        return self.expand(self.platform_file)


# The settings of the gate itself (the CLI reads them; the report says where each came from).
GATE_SETTINGS = ("upstream", "base", "stack", "python", "fail_on", "new_only", "allow_unbound")
FAIL_ON = ("error", "warning", "info", "never")
_LIST_FIELDS = {"allow_unbound", "vendor_extends", "scope", "class_prefixes", "modification_markers", "kernel_packages", "kernel_modules", "selectors", "upstream_subfolders", "kernel_sources",
                "native_sources", "stack_files"}
_SEVERITIES = ("error", "warning", "info")
_MAX_FILE_BYTES_CEILING = 1 << 30  # past this a "limit" is no limit: say so instead of reading it


def _fail(origin: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{origin}: {key} {why}")


def _repo_path(origin: str, key: str, value: object, *, glob: bool = False) -> str:
    """A path (or glob) that stays inside the repository: relative, no `..`, not empty."""
    from pathlib import PurePosixPath

    if not isinstance(value, str) or not value.strip():
        raise _fail(origin, key, f"must be a non-empty repo-relative {'glob' if glob else 'path'} (got {value!r})")
    text = value.replace("\\", "/")
    pure = PurePosixPath(text)
    if pure.is_absolute() or text.startswith("~") or ".." in pure.parts:
        raise _fail(origin, key, f"must stay inside the repository (got {value!r}: absolute or with '..')")
    if glob:
        try:
            list(Path("/nonexistent-metax-audit-dir").glob(text))
        except (ValueError, NotImplementedError) as exc:
            raise _fail(origin, key, f"is not a valid glob {value!r}: {exc}") from None
    return text


def _package(origin: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value or not all(p.isidentifier() for p in value.split(".")):
        raise _fail(origin, key, f"must be a dotted Python package name such as vllm_metax (got {value!r})")
    return value


def _check(name: str, key: str, value: object, default: object, origin: str) -> object:
    """One setting checked against its schema; the value to use, or a ConfigError naming the key."""
    if name in ("port_package", "upstream_package"):
        return _package(origin, key, value)
    if name in ("platform_file", "waivers"):
        if value is None and name == "waivers":
            return None
        return _repo_path(origin, key, value)
    if name == "scope":
        if not isinstance(value, list | tuple) or not value:
            raise _fail(origin, key, f"must be a non-empty list of repo-relative globs (got {value!r})")
        return tuple(_repo_path(origin, key, v, glob=True) for v in value)
    if name in ("native_sources", "stack_files"):  # exported from the repo: they must stay inside it
        if not isinstance(value, list | tuple):
            raise _fail(origin, key, f"must be a list of repo-relative paths (got {value!r})")
        return tuple(_repo_path(origin, key, v) for v in value)
    if name == "path_map":
        if not isinstance(value, dict):
            raise _fail(origin, key, f"must be a mapping of port path to upstream path (got {type(value).__name__})")
        return {_repo_path(origin, key, k): _repo_path(origin, key, v) for k, v in value.items()}
    if name == "version_tests":
        if not isinstance(value, dict):
            raise _fail(origin, key, f"must be a mapping of a function name to one of {' '.join(COMPARISONS)} (got {value!r})")
        for fn, op in value.items():
            if not isinstance(fn, str) or not fn.isidentifier() or op not in COMPARISONS:
                raise _fail(origin, key, f"maps {fn!r} to {op!r}: a function name must map to one of {' '.join(COMPARISONS)}")
        return dict(value)
    if name == "severity_overrides":
        if not isinstance(value, dict):
            raise _fail(origin, key, f"must be a mapping of rule id to error, warning or info (got {value!r})")
        for rule_id, sev in value.items():
            if not isinstance(rule_id, str) or sev not in _SEVERITIES:
                raise _fail(origin, key, f"maps {rule_id!r} to {sev!r}: a rule id must map to error, warning or info")
        return dict(value)
    if name in ("upstream", "base", "python"):
        if not isinstance(value, str) or not value.strip():
            raise _fail(origin, key, f"must be a non-empty string (got {value!r})")
        return value
    if name == "stack":
        return _repo_path(origin, key, value)
    if name == "fail_on":
        if value not in FAIL_ON:
            raise _fail(origin, key, f"must be one of {', '.join(FAIL_ON)} (got {value!r})")
        return value
    if name == "new_only":
        if not isinstance(value, bool):
            raise _fail(origin, key, f"must be true or false (got {value!r})")
        return value
    if name == "device_capability":
        import re

        if not isinstance(value, str) or not re.fullmatch(r"(\d{1,2}\.\d{1,2})?|none", value.strip().lower()):
            raise _fail(origin, key, f'must be a capability such as "8.0", "none" (the device reports none) or "" (unknown) (got {value!r})')
        return value.strip().lower()
    if name == "max_file_bytes":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_FILE_BYTES_CEILING:
            raise _fail(origin, key, f"must be a whole number of bytes from 1 to {_MAX_FILE_BYTES_CEILING} (got {value!r})")
        return value
    # Any other setting: the type of its default (a list of strings, a mapping of strings, ...).
    if name in _LIST_FIELDS or isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise _fail(origin, key, "must be a list of strings")
        return tuple(value)
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise _fail(origin, key, "must be a mapping of strings to strings")
        return dict(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise _fail(origin, key, f"must be true or false (got {value!r})")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(origin, key, f"must be a whole number (got {value!r})")
        return value
    if isinstance(default, str) and not isinstance(value, str):
        raise _fail(origin, key, f"must be a string (got {value!r})")
    return value


def _from_mapping(data: dict[str, Any], origin: str) -> AuditConfig:
    defaults = AuditConfig()
    known = {f.name.replace("_", "-"): f.name for f in fields(AuditConfig)}
    known.update({f.name: f.name for f in fields(AuditConfig)})
    values: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in known:
            raise ConfigError(f"{origin}: unknown setting {key!r} (known: {', '.join(sorted(k for k in known if '_' not in k))})")
        name = known[key]
        values[name] = _check(name, key, value, getattr(defaults, name), origin)
    return replace(defaults, **values)


def python_files(root: Path, pattern: str) -> list[str]:
    """Repo-relative paths of the .py files under `root` that `pattern` matches. Path.glob understands
    "**" as any number of directories; only files ending .py can be parsed, so other matches are not
    part of the Python scope."""
    from metax_audit.core import fstree  # Path.glob recurses once per directory level (3.11)

    return [p.relative_to(root).as_posix() for p in fstree.glob(root, pattern) if p.suffix == ".py" and p.is_file()
            and "__pycache__" not in p.parts]


def scope_files(root: Path, config: AuditConfig) -> list[str]:
    """The files in the scope of `config` under `root`, each once, in the order of its globs."""
    return list(dict.fromkeys(rel for pattern in config.scope_globs for rel in python_files(root, pattern)))


def departures(config: AuditConfig, root: Path) -> list[str]:
    """What in `config` makes the review of the repository at `root` see less than the defaults
    would, or lets more through: a narrower scope or a raised limit. A review reports these, so a
    repository's own config cannot turn a failing review into a passing one without saying so.

    The scope and the kernel modules are judged by what they leave out of this repository, not by
    the globs and names of the MetaX defaults: a config for another port (docs/ports/vllm-ascend.yaml)
    does not narrow anything by leaving out default globs that select nothing in its repository,
    or kernel packages that none of its files import."""
    default = replace(AuditConfig(), port_package=config.port_package)
    out: list[str] = []
    default_scope, scope = scope_files(root, default), scope_files(root, config)
    left = sorted(set(default_scope) - set(scope))
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        out.append(f"scope leaves out {len(left)} file(s) the default globs select ({shown})")
    if config.platform_path != default.platform_path:
        out.append(f"platform-file is {config.platform_path} (default {default.platform_path})")
    if config.max_file_bytes > default.max_file_bytes:
        out.append(f"max-file-bytes raised to {config.max_file_bytes} (default {default.max_file_bytes})")
    dropped = [m for m in default.kernel_modules if m not in config.kernel_modules]
    missing = sorted(_imported(root, {*default_scope, *scope}, dropped)) if dropped else []
    if missing:
        out.append(f"kernel-modules leaves out {', '.join(missing)}, which the port imports")
    if config.severity_overrides:
        out.append(f"severity-overrides change {len(config.severity_overrides)} rule(s)")
    wider = sorted(set(config.vendor_extends) - set(default.vendor_extends))
    if wider:  # a keyword their public base lacks becomes an unchecked call (counted in the headline), not an error
        out.append(f"vendor-extends adds {', '.join(wider)} (calls passing keywords their public base lacks go unchecked, "
                   "not errors)")
    if config.allow_unbound:
        out.append(f"allow-unbound accepts {', '.join(config.allow_unbound)} unbound (calls into it go unchecked)")
    return out


def _imported(root: Path, files: set[str], modules: list[str]) -> set[str]:
    """Those of `modules` (top-level packages) that an import statement of one of `files` names."""
    from metax_audit.core.pysource import cached_text, scan_imports

    found: set[str] = set()
    for rel in files:
        try:
            text = cached_text(root / rel)
        except (OSError, ValueError):
            continue
        for stmt in scan_imports(text):
            heads = [stmt.module] if stmt.module and not stmt.level else [] if stmt.level else list(stmt.names)
            found.update(m for m in modules if any(h == m or h.startswith(m + ".") for h in heads))
    return found


def config_origin(root: Path, explicit: Path | None = None) -> str | None:
    """Which file load_config reads the config from (for the report's record of the gate's settings)."""
    if explicit is not None:
        return str(explicit)
    if (root / ".metax-audit.yaml").is_file():
        return ".metax-audit.yaml"
    if (root / "pyproject.toml").is_file():
        return "pyproject.toml [tool.metax-audit]"
    return None


def load_config(root: Path, explicit: Path | None = None) -> AuditConfig:
    """Read the config from the snapshot root (or an explicit file); defaults when absent."""
    try:
        return _load_config(root, explicit)
    except RecursionError:  # a 5,000-deep YAML or TOML value: the parsers recurse per level
        raise ConfigError(f"{explicit or root / '.metax-audit.yaml'}: nested too deeply to read") from None


def _load_config(root: Path, explicit: Path | None) -> AuditConfig:
    if explicit is not None:
        if not os.path.lexists(explicit):
            raise ConfigError(f"config file {explicit} does not exist")
        return _load_file(explicit)
    yaml_path = root / ".metax-audit.yaml"
    if os.path.lexists(yaml_path):  # a FIFO or a broken link is refused by name, never skipped quietly
        return _load_file(yaml_path)
    pyproject = root / "pyproject.toml"
    if os.path.lexists(pyproject):
        import tomllib

        try:
            data = tomllib.loads(_read_text(pyproject))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{pyproject}: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{pyproject}: nested too deeply to read") from None
        tool = data.get("tool")
        section = tool.get("metax-audit") if isinstance(tool, dict) else None
        if isinstance(section, dict):
            return _from_mapping(section, "pyproject.toml [tool.metax-audit]")
    return AuditConfig()


def _load_file(path: Path) -> AuditConfig:
    if path.suffix in {".yaml", ".yml"}:
        import yaml

        try:
            data = yaml.safe_load(_read_text(path)) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {yaml_error_line(exc)}") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to read") from None
        except ValueError as exc:  # a value YAML cannot build: a 5,000-digit integer, the date 2026-13-01
            raise ConfigError(f"{path}: {exc}") from None
    else:
        import tomllib

        try:
            data = tomllib.loads(_read_text(path)).get("tool", {}).get("metax-audit", {})
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except ValueError as exc:  # a 5,000-digit integer
            raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return _from_mapping(data, str(path))


def _read_text(path: Path) -> str:
    """A config file's text: UTF-8, a regular file (a symlink out of the repo is not followed)."""
    if path.is_symlink():
        raise ConfigError(f"{path}: the config file is a symlink; metax-audit reads only a regular file")
    try:
        return inputs.read_text(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def yaml_error_line(exc: Exception) -> str:
    """PyYAML's multi-line message as one line: the problem and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"

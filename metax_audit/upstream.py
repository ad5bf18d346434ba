# Where the upstream sources come from: a directory, an installed distribution, or a pinned
# release fetched once with pip whose .py files are kept in a cache that later runs reuse.
from __future__ import annotations

import ast
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

from metax_audit import subproc, tempdirs
from metax_audit.cachedir import cache_root
from metax_audit.errors import UpstreamError
from metax_audit.models import UpstreamInfo

# Written last, after every file is in place: a cache entry without it is an interrupted
# extraction and is redone rather than trusted.
COMPLETE_MARKER = ".metax-audit-complete"
PIP_TIMEOUT_S = 1800  # the vLLM wheel is ~300 MB
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")


def resolve_upstream(spec: str, *, package: str = "vllm", cache_dir: Path | None = None) -> UpstreamInfo:
    """Turn `--upstream SPEC` into the directory holding the upstream package.

    SPEC is a directory (holding `package/`, or the package dir itself), `NAME==VERSION`
    (downloaded once with pip, only .py files cached under `<cache>/upstream/NAME-VERSION/`),
    or the name of an installed distribution. `cache_dir` is the cache root (default
    $METAX_AUDIT_CACHE or ~/.cache/metax-audit). Raises UpstreamError when none fits.
    """
    spec = spec.strip()
    if not spec:
        raise UpstreamError("empty --upstream spec: give a directory, NAME==VERSION or an installed distribution")
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_directory(path, package)
    pin = _PIN.match(spec)
    if pin:
        return _from_pip(pin.group(1), pin.group(2), package, cache_root(cache_dir))
    if any(sep in spec for sep in ("/", os.sep)) or spec.startswith("."):
        raise UpstreamError(f"upstream directory {spec} does not exist")
    return _from_installed(spec, package)


# ---------------------------------------------------------------- directory / installed


def _from_directory(path: Path, package: str) -> UpstreamInfo:
    path = path.resolve()
    if (path / package).is_dir():
        root = path
    elif path.name == package and (path / "__init__.py").is_file():
        root = path.parent
    else:
        raise UpstreamError(f"upstream directory {path} holds no '{package}' package (expected {path}/{package}/)")
    return UpstreamInfo(package=package, version=read_version(root, package), source=f"directory:{path}", root=root)


def _from_installed(name: str, package: str) -> UpstreamInfo:
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise UpstreamError(
            f"upstream spec {name!r} is not a directory, not NAME==VERSION and not an installed distribution"
        ) from None
    root = Path(str(dist.locate_file(""))).resolve()
    if not (root / package).is_dir():
        raise UpstreamError(f"installed distribution {name} {dist.version} has no '{package}' package under {root}")
    return UpstreamInfo(package=package, version=dist.version, source=f"installed:{name}=={dist.version}", root=root)


# ---------------------------------------------------------------- pip


def _from_pip(name: str, version: str, package: str, root_dir: Path) -> UpstreamInfo:
    entry = root_dir / "upstream" / f"{name}-{version}"
    pin = f"{name}=={version}"
    if not (entry / COMPLETE_MARKER).is_file():
        _download_and_extract(pin, entry, root_dir)
    if not (entry / package).is_dir():
        raise UpstreamError(f"{pin} (cache {entry}) holds no '{package}' package; is --upstream the right distribution?")
    found = read_version(entry, package) or version
    return UpstreamInfo(package=package, version=found, source=f"pip:{pin} (cache {entry})", root=entry)


def _download_and_extract(pin: str, entry: Path, root_dir: Path) -> None:
    root_dir.mkdir(parents=True, exist_ok=True)
    if entry.exists():  # interrupted earlier: never trust a half-written entry
        shutil.rmtree(entry)
    tempdirs.reclaim(root_dir)  # a download a killed run left half done
    with tempdirs.scratch("download", parent=root_dir) as tmp:
        dest = Path(tmp) / "dl"
        dest.mkdir()
        # Wheels only: an sdist would make pip build metadata, which can need a compiler or torch.
        done = subproc.run_python(
            sys.executable, ["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), pin],
            timeout=PIP_TIMEOUT_S, isolated=True,
        )
        if done.timed_out:
            raise UpstreamError(f"pip download {pin} timed out after {PIP_TIMEOUT_S}s")
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if ln.strip()]
            raise UpstreamError(f"pip download {pin} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
        wheels = sorted(dest.glob("*.whl"))
        if not wheels:
            raise UpstreamError(f"pip download {pin} produced no wheel in {dest}")
        partial = Path(tmp) / "extract"
        _extract_py(wheels[0], partial)
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(entry)  # same filesystem: the tmp dir lives in the cache root
    (entry / COMPLETE_MARKER).write_text(f"{pin}\n", encoding="utf-8")


def _extract_py(wheel: Path, target: Path) -> int:
    """Keep only Python sources (and the dist-info METADATA, for the version)."""
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = info.filename
                keep = name.endswith(".py") or (name.endswith(".dist-info/METADATA") and name.count("/") == 1)
                if not keep or info.is_dir():
                    continue
                out = (target / name).resolve()
                if not out.is_relative_to(target.resolve()):  # a hostile archive path
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
    except zipfile.BadZipFile as exc:
        raise UpstreamError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    return count


# ---------------------------------------------------------------- version


def read_version(root: Path, package: str) -> str | None:
    """The version the package says it is: _version.py / version.py, then dist-info METADATA."""
    for name in ("_version.py", "version.py"):
        found = _static_version(root / package / name)
        if found:
            return found
    for meta in sorted(root.glob("*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
            if not line.strip():
                break
    return None


def _static_version(path: Path) -> str | None:
    # Read statically: importing vllm's version module would import vllm.
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if names & {"__version__", "version"}:
                return node.value.value
    return None

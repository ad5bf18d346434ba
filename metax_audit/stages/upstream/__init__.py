# Where the upstream sources come from: a directory, an installed distribution, or a pinned
# release fetched once with pip whose .py files are kept in a cache that later runs reuse.
from __future__ import annotations

import ast
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.core import fstree, gitcmd, subproc, tempdirs
from metax_audit.core.cachedir import cache_root
from metax_audit.core.errors import ConfigError, SubprocessError, UpstreamError
from metax_audit.core.models import UpstreamInfo
from metax_audit.core.pysource import ast_walk, keep_trees_under

if TYPE_CHECKING:
    from metax_audit.core.config import AuditConfig
    from metax_audit.core.options import ReviewOptions

# Written last, after every file is in place: a cache entry without it is an interrupted
# extraction and is redone rather than trusted.
COMPLETE_MARKER = ".metax-audit-complete"
PIP_TIMEOUT_S = 1800  # the vLLM wheel is ~300 MB
_AT_REV = re.compile(r"^(.+)@([^@/\s][^@\s]*)$")  # PATH@REV: a git clone at a commit, tag or branch
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")


def resolve_upstream(spec: str, *, package: str = "vllm", cache_dir: Path | None = None) -> UpstreamInfo:
    """Turn `--upstream SPEC` into the directory holding the upstream package.

    SPEC is a directory (holding `package/`, or the package dir itself), `PATH@REV` (a git clone of
    upstream at a revision, exported with `git archive` into the cache, nothing checked out), `NAME==VERSION`
    (downloaded once with pip, only .py files cached under `<cache>/upstream/NAME-VERSION/`),
    or the name of an installed distribution. `cache_dir` is the cache root (default
    $METAX_AUDIT_CACHE or ~/.cache/metax-audit). Raises UpstreamError when none fits.
    """
    spec = spec.strip()
    if not spec:
        raise UpstreamError("empty --upstream spec: give a directory, NAME==VERSION or an installed distribution")
    path = Path(spec).expanduser()
    if path.is_dir():
        found = _from_directory(path, package)
        entries = (cache_root(cache_dir) / "upstream").resolve()
        if found.root is not None and found.root.parent == entries and (found.root / COMPLETE_MARKER).is_file():
            _keep_trees(found.root, entries.parent)  # a cache entry named by its path is no less complete
        return found
    at = _AT_REV.match(spec)
    if at and Path(at.group(1)).expanduser().is_dir():
        return _from_git(Path(at.group(1)).expanduser().resolve(), at.group(2), package, cache_root(cache_dir))
    pin = _PIN.match(spec)
    if pin:
        return _from_pip(pin.group(1), pin.group(2), package, cache_root(cache_dir))
    if any(sep in spec for sep in ("/", os.sep)) or spec.startswith("."):
        raise UpstreamError(f"upstream directory {spec} does not exist")
    return _from_installed(spec, package)


def installed_upstream_available(package: str) -> bool:
    """Whether the upstream package is importable here (then it is the default upstream)."""
    import importlib.util

    return importlib.util.find_spec(package) is not None


def kernel_source_roots(specs: Sequence[str], cache_dir: Path | None, notes: list[str]) -> tuple[Path, ...]:
    """Static roots of the kernel stack named in config (kernel-sources): public wheels' Python
    sources (pip pins, downloaded once and cached like upstream) or directories, read only when the
    stack cannot be imported by the target interpreter (the facts then say "static"). One note per spec."""
    roots: list[Path] = []
    for spec in specs:
        if "==" in spec:
            name = spec.split("==", 1)[0].strip()
            info = resolve_upstream(spec, package=name.replace("-", "_").lower(), cache_dir=cache_dir)
            if info.root is not None:
                roots.append(info.root)
            notes.append(f"{spec}: {info.source}")
        else:
            path = Path(spec).expanduser()
            if not path.is_dir():
                raise ConfigError(f"kernel-sources entry {spec!r} is neither NAME==VERSION nor a directory")
            roots.append(path)
            notes.append(f"{spec}: directory")
    return tuple(roots)


@dataclass(frozen=True)
class Commit:
    """The reviewed commit in the user's repository (where the port's history is read), as the user named it."""

    repo: Path
    sha: str | None
    label: str = ""


def base_release(commit: Commit, config: AuditConfig, options: ReviewOptions,
                 upstream: UpstreamInfo) -> tuple[UpstreamInfo | None, str]:
    """--base, else the release the port's history says it was last synced to (base_infer.py), its
    source saying so; None and why when neither is known (the report then says drift was not separated)."""
    if options.base:
        return resolve_upstream(options.base, package=config.upstream_package, cache_dir=options.cache_dir), ""
    if commit.sha is None or not upstream.version:
        return None, "base: not inferred (no --base, and no commit or upstream version to read it against)"
    from metax_audit.stages.upstream.base_infer import infer_base

    guess = infer_base(commit.repo, commit.sha, upstream.version, config.upstream_package, config.port_package,
                       commit.label or commit.sha[:12])
    if guess.version is None:
        return None, f"base: {guess.evidence}"
    try:
        base = resolve_upstream(f"{config.upstream_package}=={guess.version}", package=config.upstream_package,
                                cache_dir=options.cache_dir)
    except UpstreamError as e:
        return None, f"base: {guess.evidence}, but it could not be read: {e}"
    return replace(base, source=f"{guess.evidence}; {base.source}"), f"base: {guess.evidence}"


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


# ---------------------------------------------------------------- git


def _from_git(repo: Path, rev: str, package: str, root_dir: Path) -> UpstreamInfo:
    """`PATH@REV`: the package (and its C++ sources, for op registrations) as committed at REV, read
    raw from git's objects (gitcmd: no filter of the clone runs) into `<cache>/upstream/git-<sha>/`;
    the clone's work tree and index are untouched."""
    done = gitcmd.run(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}", timeout=60)
    if done.timed_out or done.returncode != 0 or not done.stdout.strip():
        inside = gitcmd.run(repo, "rev-parse", "--git-dir", timeout=60)
        if inside.returncode != 0:
            raise UpstreamError(f"--upstream {repo}@{rev}: {repo} is not a git repository")
        raise UpstreamError(f"--upstream {repo}@{rev}: unknown revision {rev!r} in {repo}")
    sha = done.stdout.strip()
    entry = root_dir / "upstream" / f"git-{sha}"
    if not (entry / COMPLETE_MARKER).is_file():
        _archive(repo, sha, package, entry, root_dir)
    if not (entry / package).is_dir():
        raise UpstreamError(f"{repo}@{rev} (commit {sha[:12]}) holds no '{package}' package at its top level")
    _keep_trees(entry, root_dir)
    described = gitcmd.run(repo, "describe", "--tags", "--always", sha, timeout=60)
    version = read_version(entry, package) or (described.stdout.strip() if described.returncode == 0 else None)
    return UpstreamInfo(package=package, version=version or sha[:12], source=f"git:{repo}@{rev} (commit {sha})",
                        root=entry)


def _archive(repo: Path, sha: str, package: str, entry: Path, root_dir: Path) -> None:
    tops = gitcmd.run(repo, "ls-tree", "--name-only", "-z", sha, timeout=60).stdout.split("\0")
    paths = [p for p in (package, "csrc") if p in tops]
    if not paths:
        raise UpstreamError(f"{repo} at {sha[:12]} holds no '{package}' package at its top level")
    try:
        entries = [e for e in gitcmd.ls_tree(repo, sha, *paths)
                   if e.mode in ("100644", "100755") and (e.path.endswith(".py") or e.path.startswith("csrc/"))]
    except SubprocessError as exc:
        raise UpstreamError(f"reading {sha[:12]} in {repo} failed: {exc}") from exc
    root_dir.mkdir(parents=True, exist_ok=True)
    if entry.exists():
        fstree.rmtree(entry)
    with tempdirs.scratch("git", parent=root_dir) as tmp:
        partial = Path(tmp) / "extract"
        partial.mkdir()
        def place(root: Path, rel: str) -> Path:
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise UpstreamError(f"{repo} at {sha[:12]} names a path that leaves its tree: {rel!r}")
            target = root.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            return target

        try:
            gitcmd.write_blobs(repo, partial, entries, place)
        except SubprocessError as exc:
            raise UpstreamError(f"reading {sha[:12]} in {repo} failed: {exc}") from exc
        for p in paths:  # the package directory exists even when it holds no .py file
            (partial / p).mkdir(exist_ok=True)
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(entry)
    (entry / COMPLETE_MARKER).write_text(f"git {sha}\n", encoding="utf-8")


# ---------------------------------------------------------------- pip


def _from_pip(name: str, version: str, package: str, root_dir: Path) -> UpstreamInfo:
    entry = root_dir / "upstream" / f"{name}-{version}"
    pin = f"{name}=={version}"
    if not (entry / COMPLETE_MARKER).is_file():
        _download_and_extract(pin, entry, root_dir)
    if not (entry / package).is_dir():
        raise UpstreamError(f"{pin} (cache {entry}) holds no '{package}' package; is --upstream the right distribution?")
    _keep_trees(entry, root_dir)
    found = read_version(entry, package) or version
    return UpstreamInfo(package=package, version=found, source=f"pip:{pin} (cache {entry})", root=entry)


def _keep_trees(entry: Path, root_dir: Path) -> None:
    """A complete cache entry is never written again (only removed and extracted whole): the parsed
    trees of its modules are kept in `<cache>/upstream-trees/<entry>/` for the reviews that follow."""
    keep_trees_under(entry, root_dir / "upstream-trees" / entry.name)


def _download_and_extract(pin: str, entry: Path, root_dir: Path) -> None:
    root_dir.mkdir(parents=True, exist_ok=True)
    if entry.exists():  # interrupted earlier: never trust a half-written entry
        fstree.rmtree(entry)
    tempdirs.reclaim(root_dir)  # a download a killed run left half done
    with tempdirs.scratch("download", parent=root_dir) as tmp:
        wheel = _download_wheel(pin, Path(tmp))
        partial = Path(tmp) / "extract"
        _extract_py(wheel, partial)
        write_compiled_index(wheel, partial)
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(entry)  # same filesystem: the tmp dir lives in the cache root
    (entry / COMPLETE_MARKER).write_text(f"{pin}\n", encoding="utf-8")


def _download_wheel(pin: str, tmp: Path) -> Path:
    """`pip download` the wheel of `pin` into tmp/dl; its path."""
    dest = tmp / "dl"
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
    return wheels[0]


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


# ---------------------------------------------------------------- compiled extensions

# The op names the wheel's compiled extensions define, read from their schema strings when the wheel is
# extracted (the .so files themselves are not kept): `ops.def("name(Tensor x) -> ()")` leaves the schema
# as one string in the binary. Lets the op-name check tell "not compiled upstream" from "not read".
COMPILED_INDEX = ".metax-audit-compiled-ops.json"
_ARROW = re.compile(rb"\)\s?->")
_SCHEMA_HEAD = re.compile(rb"\s*([A-Za-z_]\w*)(?:\.\w+)?\(")


def schema_names(binary: bytes) -> set[str]:
    """Op names of every `name(...) -> ...` schema string in a compiled extension."""
    names: set[str] = set()
    for m in _ARROW.finditer(binary):
        start = binary.rfind(b"\x00", max(0, m.start() - 8192), m.start()) + 1
        head = _SCHEMA_HEAD.match(binary, start, m.end())
        if head:
            names.add(head.group(1).decode("ascii"))
    return names


def write_compiled_index(wheel: Path, target: Path) -> int:
    """Write COMPILED_INDEX into `target`: {extension member: [op names]}; returns the extension count."""
    import json

    found: dict[str, list[str]] = {}
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.filename.endswith((".so", ".pyd")) and not info.is_dir():
                    found[info.filename] = sorted(schema_names(zf.read(info)))
    except zipfile.BadZipFile as exc:
        raise UpstreamError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    target.mkdir(parents=True, exist_ok=True)
    (target / COMPILED_INDEX).write_text(json.dumps({"wheel": wheel.name, "extensions": found}), encoding="utf-8")
    return len(found)


def compiled_op_names(info: UpstreamInfo, *, fetch: bool = True) -> tuple[frozenset[str] | None, str]:
    """The op names upstream's compiled extensions define, and a note saying where they come from or why
    there are none. A pip cache entry made before the index existed is indexed once (the wheel is
    downloaded again, as on first use) unless `fetch` is off."""
    import json

    if info.root is None:
        return None, "no upstream sources"
    index = info.root / COMPILED_INDEX
    marker = info.root / COMPLETE_MARKER
    if not index.is_file() and fetch and marker.is_file():
        pin = marker.read_text(encoding="utf-8").strip()
        if _PIN.match(pin):
            try:
                with tempdirs.scratch("wheel", parent=info.root.parent) as tmp:
                    write_compiled_index(_download_wheel(pin, Path(tmp)), Path(tmp) / "index")
                    (Path(tmp) / "index" / COMPILED_INDEX).replace(index)
            except (UpstreamError, OSError) as exc:
                return None, f"the wheel of {pin} could not be indexed: {exc}"
    if not index.is_file():
        return None, (f"{info.source} holds Python sources only; its compiled extensions were not read"
                      if not marker.is_file() else "the cache entry has no compiled-extension index")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        extensions = data["extensions"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable compiled-extension index {index.name}: {exc}"
    names = frozenset(n for ops in extensions.values() for n in ops)
    return names, f"{len(names)} op schemas in {len(extensions)} compiled extensions of {data.get('wheel', 'the wheel')}"


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
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast_walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if names & {"__version__", "version"}:
                return node.value.value
    return None

# The on-disk cache of stack facts: which entry serves which targets, the fingerprint of what the
# worker can see that keys it, and whether this stack was seen before.
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metax_audit.core import fstree, inputs, subproc
from metax_audit.core.errors import SubprocessError
from metax_audit.core.models import StackFacts
from metax_audit.stages.introspect.manifest import fact_from_json, stack_facts_json
from metax_audit.stages.introspect.process import _sandbox, worker_command

# ---------------------------------------------------------------- on-disk cache of stack facts
# Importing the kernel stack (flashinfer pulls in torch) costs seconds on every review although the
# stack rarely changes; the facts are kept per (interpreter, targets, fingerprint of what the
# worker could read). The fingerprint is conservative: any install, upgrade or removal in a
# site-packages directory, or any file change under an editable/extra/static package, invalidates.

CACHE_SCHEMA = "metax-audit/stack-cache/v5"  # v2: static schemas of C++-registered ops (op-namespaces)
_UNCACHEABLE = {"timeout", "crash"}  # may be load or a flaky import: try again next time


def stack_cache_dir() -> Path:
    """`<cache>/stack`, the cache being $METAX_AUDIT_CACHE or ~/.cache/metax-audit."""
    from metax_audit.core.cachedir import cache_root

    return cache_root() / "stack"


@dataclass(frozen=True)
class CachePlan:
    """Which targets introspect(cache=...) may serve from the stack cache, and the entry that holds
    them. Computing it stats every distribution: do it on the calling thread, not on one that
    competes for the GIL with busy static stages (each stat there waits for a GIL switch)."""

    port: tuple[str, ...]  # the port's own targets: always read afresh from the snapshot
    stack: tuple[str, ...]
    roots: tuple[Path, ...]  # the static roots that can matter to `stack`
    entry: Path | None  # None: the fingerprint could not be taken, nothing is cached
    marker: Path | None = None  # see stack_seen


def plan_cache(
    targets: Sequence[str],
    *,
    python: str | None = None,
    extra_path: Sequence[Path] = (),
    static_roots: Sequence[Path] = (),
    never_import: Sequence[str] = (),
    op_namespaces: Mapping[str, str] = {},  # read only
) -> CachePlan:
    """The stack-cache entry for these targets as `python` would see them (see introspect)."""
    interpreter = python or sys.executable
    wanted = list(dict.fromkeys(targets))
    own = {t.split(".")[0] for t in never_import}
    port = [t for t in wanted if t.split(".")[0] in own]
    stack = [t for t in wanted if t.split(".")[0] not in own]
    # The snapshot is a fresh temp dir each run: it only matters to the stack targets when it holds
    # one of their packages, so otherwise it stays out of their request and of the key.
    tops = sorted({t.split(".")[0] for t in stack})
    roots = [Path(r) for r in static_roots if not any((Path(r) / o).exists() for o in own)
             or any((Path(r) / t).exists() or (Path(r) / f"{t}.py").exists() for t in tops)]
    # the namespaces change what the worker answers for ops whose library is not loaded: part of the key
    keyed = [*stack, *(f"op-namespace:{k}={v}" for k, v in sorted(op_namespaces.items()))]
    keys = _cache_keys(interpreter, keyed, extra_path, roots, tops) if stack else None
    if keys is None:
        return CachePlan(tuple(port), tuple(stack), tuple(roots), None)
    return CachePlan(tuple(port), tuple(stack), tuple(roots), stack_cache_dir() / f"{keys[0]}.json",
                     stack_cache_dir() / f"{keys[1]}.seen")


def stack_seen(*, python: str | None = None, extra_path: Sequence[Path] = ()) -> bool:
    """Whether facts were cached for this interpreter with its distributions as they are now, so
    this review will likely be served from the cache. Only a hint, for deciding whether to
    prestart a worker: a wrong answer costs time, never facts (the cache entry decides)."""
    key = stack_identity(python, tuple(extra_path))  # one --sys-path subprocess per review, shared
    return key is not None and (stack_cache_dir() / f"{key}.seen").is_file()


@functools.cache
def stack_identity(python: str | None, extra_path: tuple[Path, ...] = ()) -> str | None:
    """The kernel stack as `python` sees it now (interpreter, distributions, extra path): the key
    part of the stack_seen marker, for result caches; None when it cannot be taken."""
    keys = _cache_keys(python or sys.executable, [], extra_path, [], [])
    return keys[1] if keys else None


def _write_marker(path: Path) -> None:
    """An empty marker file, put in place by rename: a FIFO or a link already at `path` is replaced,
    never opened (opening a FIFO for writing waited for a reader forever)."""
    with contextlib.suppress(OSError):  # see _write_cache
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        os.close(fd)
        os.replace(tmp, path)


def _cache_keys(interpreter: str, targets: list[str], extra_path: Sequence[Path], roots: Sequence[Path],
                tops: list[str]) -> tuple[str, str] | None:
    """sha256 of everything the worker's answers depend on, and of the part of it known before the
    trace (the interpreter and its distributions: the stack_seen marker); None when the
    interpreter's path cannot be read (then nothing is cached)."""
    import hashlib

    sys_path = _worker_sys_path(interpreter)
    if sys_path is None:
        return None  # the worker run reports a broken interpreter in its own words
    real = Path(shutil.which(interpreter) or interpreter).resolve()  # a bare "python3" is found on PATH
    try:
        st = real.stat()
    except OSError:
        return None
    paths = [*(str(p) for p in extra_path), *sys_path]
    data = {
        "schema": CACHE_SCHEMA,
        "interpreter": [interpreter, str(real), st.st_size, st.st_mtime_ns],
        "targets": targets,
        "extra_path": [str(p) for p in extra_path],
        "static_roots": [str(p) for p in roots],
        "path": [_path_entry_fingerprint(Path(p), tops) for p in paths if p],
        "roots": [_root_fingerprint(Path(r)) for r in roots],
    }
    seen = {**data, "targets": [], "static_roots": [], "roots": [],
            "path": [_path_entry_fingerprint(Path(p), []) for p in paths if p] if tops else data["path"]}
    return tuple(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:32]  # type: ignore[return-value]
                 for d in (data, seen))


_SysPathKey = tuple[str, tuple[tuple[str, str], ...]]
_SYS_PATHS: dict[_SysPathKey, tuple[str, ...]] = {}
_ASKING: dict[_SysPathKey, threading.Thread] = {}


def _sys_path_key(interpreter: str) -> _SysPathKey:
    return (interpreter, tuple(sorted(os.environ.items())))  # the worker inherits the environment


def _ask_sys_path(interpreter: str, asked: _SysPathKey) -> None:
    try:
        with _sandbox() as (cwd, env):
            done = subproc.run([*worker_command(interpreter), "--sys-path"], cwd=cwd, env=env, timeout=30)
        _SYS_PATHS[asked] = tuple(str(p) for p in json.loads(done.stdout))
    except (SubprocessError, ValueError, TypeError):
        pass  # not kept: the next question asks again


def prefetch_sys_path(python: str | None) -> None:
    """Start asking the worker's sys.path (see _worker_sys_path) on a thread that only waits on the
    subprocess, so the snapshot's export runs meanwhile; the first stack_identity or plan_cache
    takes the answer."""
    interpreter = python or sys.executable
    asked = _sys_path_key(interpreter)
    if asked not in _SYS_PATHS and asked not in _ASKING:
        # not a daemon: a review that ends early (a bad config, exit 2) waits the fraction of a second
        # for it at exit, so its sandbox directory is removed instead of left in the temp dir
        thread = threading.Thread(target=_ask_sys_path, args=(interpreter, asked), name="metax-audit-sys-path",
                                  daemon=False)
        _ASKING[asked] = thread
        thread.start()


def settle_sys_path() -> None:
    """Wait for every sys.path question still on its thread (each waits on one short subprocess): the
    review forks its children only where no other thread runs (core/forked.py)."""
    for asked, thread in list(_ASKING.items()):
        thread.join()
        _ASKING.pop(asked, None)


def _worker_sys_path(interpreter: str) -> tuple[str, ...] | None:
    """sys.path as the worker sees it under `interpreter` (None when it cannot be run), asked once
    per process and environment: the result-cache key and the stack-cache plan of one review both
    need it (one subprocess, not two)."""
    asked = _sys_path_key(interpreter)
    if asked not in _SYS_PATHS:
        thread = _ASKING.pop(asked, None)
        if thread is not None:
            thread.join()
        if asked not in _SYS_PATHS:  # not prefetched, or that attempt failed: ask (again) here
            _ask_sys_path(interpreter, asked)
    return _SYS_PATHS.get(asked)


def _path_entry_fingerprint(entry: Path, tops: list[str]) -> list[Any]:
    """What of one sys.path entry the worker can see: each distribution's metadata (pip rewrites
    RECORD on every install), .pth files, and the target packages found there; packages without
    installed metadata beside them (editable checkouts, --extra-path) by every file's stat."""
    try:
        names = sorted(os.listdir(entry))
    except OSError:
        return [str(entry), None]
    dists = []
    for name in names:
        if name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")):
            meta = entry / name
            for candidate in (meta / "RECORD", meta / "PKG-INFO", meta / "METADATA", meta):
                try:
                    cst = candidate.stat()
                except OSError:
                    continue
                dists.append([name, candidate.name, cst.st_size, cst.st_mtime_ns])
                break
            if name.endswith(".dist-info"):
                source = _editable_source(meta, tops)
                if source is not None:  # RECORD does not change when the checkout's files do
                    dists.append([name, "editable", _tree_fingerprint(source, (".py", ".so", ".pyd"))])
    installed = any(n.endswith(".dist-info") for n in names)
    found = []
    for top in tops:
        for cand in (entry / top, entry / f"{top}.py"):
            if cand.exists():
                found.append([top, cand.name, _dir_stat(cand) if installed else _tree_fingerprint(cand)])
    return [str(entry), dists, found]


def _editable_source(meta: Path, tops: list[str]) -> Path | None:
    """The project directory of an editable install (PEP 660 direct_url.json) that provides one of
    `tops`, judged by its top_level.txt or its distribution name."""
    try:
        direct = json.loads((meta / "direct_url.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if not (isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable")) or not url.startswith("file://"):
        return None
    try:
        provided = set((meta / "top_level.txt").read_text(encoding="utf-8").split())
    except OSError:
        provided = set()
    dist = meta.name.split("-")[0].lower().replace(".", "_")
    if not any(t in provided or dist.startswith(t.lower()) for t in tops):
        return None
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path))


def _dir_stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _root_fingerprint(root: Path) -> list[Any]:
    """A static root's fingerprint: a release extracted into the cache (upstream, stack sources) is
    never changed once its completion marker is written (a new extraction writes a new marker), so
    the marker stands for its files (a stat of each of vLLM's 2,238 files took 0.06 s every review);
    any other root by the stat of every file."""
    from metax_audit.core.cachedir import cache_root
    from metax_audit.stages.upstream import COMPLETE_MARKER

    try:
        if root.parent.parent == cache_root() and root.parent.name in ("upstream", "public-base"):  # stack_pins.PUBLIC_BASE_DIR
            marker = root / COMPLETE_MARKER
            st = marker.stat()
            return [str(root), "complete", inputs.read_text(marker, follow_symlinks=False), st.st_size, st.st_mtime_ns]
    except (OSError, ValueError):
        pass
    return _tree_fingerprint(root)


def _tree_fingerprint(root: Path, suffixes: tuple[str, ...] | None = None) -> list[Any]:
    """(files, total size, newest mtime) under `root` (only names ending in `suffixes` when given):
    one stat per file, no reads; hidden directories and __pycache__ are skipped."""
    if root.is_file():
        st = root.stat()
        return [str(root), 1, st.st_size, st.st_mtime_ns]
    count = size = newest = 0
    for dirpath, dirnames, filenames in fstree.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if suffixes is not None and not name.endswith(suffixes):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            count, size, newest = count + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return [str(root), count, size, newest]


def _read_cache(path: Path) -> StackFacts | None:
    from metax_audit.core.memo import read_kept_file

    raw = read_kept_file(path)  # a link or a FIFO in place of an entry is a miss, never a hang
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("schema") != CACHE_SCHEMA:
            return None
        facts = {t: fact_from_json({**f, "target": t}) for t, f in data["facts"].items()}
        return StackFacts(python=str(data["python"]), captured_at=str(data["captured_at"]), host=str(data["host"]),
                          facts=facts, distributions=data.get("distributions") or {}, source="import")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # a missing or damaged entry is a miss


def _write_cache(facts: StackFacts, path: Path) -> None:
    data = stack_facts_json(facts, CACHE_SCHEMA)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent review reads the old entry or the new one
    except OSError:
        pass  # a read-only cache only costs the next run its speed

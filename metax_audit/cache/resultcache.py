# Review results kept on disk and served again when nothing they depend on changed: the whole
# review of a snapshot, and per file the compare stage's result; under <cache>/results.
"""Keys are sha256 over everything the result depends on:

- the tool: metax-audit's own source files and contracts (size and mtime of each; a changed
  checkout is a different tool even under one version string) and `__version__`;
- the upstream and base releases (their source; a directory by the stat of its .py files);
- the kernel stack (introspect.stack_identity: the interpreter and its distributions, or the
  manifest's bytes, or the stat of every --extra-path file);
- the options that change findings (scope PATHS, config file, static roots);
- the content: for a whole review every exported file's bytes, for a file its bytes and those of
  the upstream/base counterparts it is compared with (the compare package decides which).

The baseline review of `review --staged` (HEAD) is normally served whole: the staged snapshot that
became HEAD was reviewed by the last pre-commit run. A one-file change recomputes the compare
stage for that file only. Waivers, baselines and probes are applied after the cache (their inputs
are not in the key); a review with `--test` or `--probe` is never cached. A cache that cannot be
read or written is skipped silently: it only ever costs time."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metax_audit.cache.store import SUFFIX, Key, Kind, Store
from metax_audit.core import fstree
from metax_audit.core.memo import content_state, file_digest  # noqa: F401 - the cache's own keys use them too
from metax_audit.core.models import UpstreamInfo

CACHE_SCHEMA = "metax-audit/result-cache/v2"  # v2: checksummed data entries (cache/store.py), v1 pickles never read
_PACKAGE = Path(__file__).resolve().parents[1]


def results_dir() -> Path:
    from metax_audit.core.cachedir import cache_root

    return cache_root() / "results"


@functools.cache
def tool_identity() -> str:
    """metax-audit as it runs now: version plus the stat of each of its source files."""
    from metax_audit import __version__

    h = hashlib.sha256(f"{CACHE_SCHEMA}|{__version__}".encode())
    for dirpath, dirnames, filenames in os.walk(_PACKAGE):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith((".py", ".md", ".json")):
                path = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)  # follows the contracts link to the top-level file
                    h.update(f"{os.path.relpath(path, _PACKAGE)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def upstream_identity(info: UpstreamInfo | None) -> str:
    if info is None:
        return "none"
    if info.source.startswith("pip:"):  # an extracted release in the cache never changes
        return f"{info.source}|{info.version}"
    return f"{info.source}|{info.version}|{_stat_digest(info.root) if info.root else ''}"


@functools.cache
def _stat_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in fstree.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(dirpath, name))
                    h.update(f"{dirpath}/{name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def tree_digest(root: Path) -> str:
    """sha256 over every file's repo-relative path and bytes (the snapshot export is small)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in fstree.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                h.update(f"{os.path.relpath(path, root)}|->{os.readlink(path)}\n".encode())
                continue
            with contextlib.suppress(OSError), open(path, "rb") as fh:
                h.update(f"{os.path.relpath(path, root)}|".encode())
                h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def digest(*parts: Any) -> str:
    """sha256 of `parts` (JSON, other values by their str) and the tool: a part of a key that names many inputs."""
    return hashlib.sha256(json.dumps([CACHE_SCHEMA, tool_identity(), *parts], sort_keys=True, default=str).encode()).hexdigest()[:40]


def key(kind: Kind, *parts: Any) -> Key:
    """The typed key of an entry of `kind` computed from `parts` by this tool (cache/store.py)."""
    return STORE.key(kind, *parts)


def _store() -> Store:
    from metax_audit.cache.records import registry

    return Store(results_dir, tool_identity, registry)


STORE = _store()


def load(entry: Key) -> Any | None:
    """The value kept under `entry`, None when there is none or it was rejected (cache/store.py)."""
    return STORE.get(entry)


# ---------------------------------------------------------------- units kept with what they read

UNIT_KEEP = 4  # entries per unit key: HEAD and the staged state alternate in a pre-commit loop


def find_unit(entry: Key, root: str, state: Callable[[str, str], Any]) -> tuple[list[Any], tuple[Any] | None]:
    """The entries stored under `entry` (each: the snapshot root it names or None, its reads as
    (kind, name) -> state, its value) and, as a 1-tuple, the value of the first whose every read has
    the same state now (`state(kind, name)`), rebased to this snapshot's `root`; None when none holds."""
    stored = load(entry)
    entries = [e for e in stored if isinstance(e, tuple) and len(e) == 3] if isinstance(stored, list) else []
    for old_root, reads, value in entries:
        if all(state(k, name) == then for (k, name), then in reads.items()):
            return entries, (rebase(value, old_root, root) if old_root not in (None, root) else value,)
    return entries, None


def keep_unit(entry: Key, root: str, reads: dict[tuple[str, str], Any], value: Any, entries: list[Any]) -> None:
    """Store `value` with the state of what it read, ahead of up to UNIT_KEEP - 1 entries of other states;
    the snapshot root is kept only when the value names it (then it is rebased when served)."""
    kept = [e for e in entries if e[1] != reads][: UNIT_KEEP - 1]
    names_root = names(value, root)
    store(entry, [(root if names_root else None, reads, value), *kept])


def names(value: Any, text: str) -> bool:
    """Whether `text` (a snapshot root) occurs in `value` as the cache keeps it."""
    from metax_audit.cache.codec import CodecError
    from metax_audit.cache.records import registry

    try:
        return json.dumps(text)[1:-1].encode("ascii") in registry().dumps(value)
    except CodecError:
        return True  # it is not kept anyway


class FileProducts:
    """Products of one kind computed from single files (a file's imports, its parse status), each kept
    under the file's path and text plus `common` (what else they read: tool, settings), all in one
    entry: one load per review instead of one per file. Disabled (--no-cache), get() always computes."""

    def __init__(self, kind: Kind, *common: Any, enabled: bool = True) -> None:
        self.kind = kind
        self.entry = key(kind, *common) if enabled else None
        self._stored: dict[tuple[str, str], Any] | None = None
        self._used: dict[tuple[str, str], Any] = {}
        self._fresh = 0

    def get(self, path: str, content: str | bytes, compute: Callable[[], Any]) -> Any:
        """compute(), a product of the file `path` whose text or bytes are `content`."""
        if self.entry is None:
            return compute()
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        name = (path, hashlib.blake2b(data, digest_size=16).hexdigest())
        if name in self._used:
            return self._used[name]
        if self._stored is None:
            stored = load(self.entry)
            self._stored = stored if isinstance(stored, dict) else {}
        if name in self._stored:
            value = self._stored[name]
        else:
            value = compute()
            self._fresh += 1
        self._used[name] = value
        return value

    def save(self) -> None:
        """Store what this review used, then up to as many entries of earlier states (HEAD and the
        staged state alternate); nothing is written when everything was found."""
        if self.entry is None or not self._fresh:
            return
        older = [(k, v) for k, v in (self._stored or {}).items() if k not in self._used][: max(len(self._used), 64)]
        store(self.entry, {**self._used, **dict(older)})
        self._stored, self._fresh = {**(self._stored or {}), **self._used}, 0


DEFAULT_LIMIT_MB = 1024
TRIM_EVERY_S = 600.0


def trim(limit_bytes: int | None = None, every_s: float = TRIM_EVERY_S) -> int:
    """Keep the result cache under its limit ($METAX_AUDIT_CACHE_MAX_MB, default 1 GiB): when it is
    over, delete the least recently used entries (written or read last longest ago) down to 80% of
    it. Runs at most once per `every_s` seconds (a stamp file), since every review stores entries and
    a daily pre-commit loop would otherwise fill the disk. Returns the bytes freed."""
    root = results_dir()
    stamp = root / ".trimmed"
    now = time.time()
    try:
        if now - stamp.stat().st_mtime < every_s:
            return 0
    except FileNotFoundError:
        pass
    except OSError:
        return 0
    if limit_bytes is None:
        try:
            limit_bytes = int(float(os.environ.get("METAX_AUDIT_CACHE_MAX_MB", DEFAULT_LIMIT_MB)) * 1024 * 1024)
        except ValueError:
            limit_bytes = DEFAULT_LIMIT_MB * 1024 * 1024
    entries: list[tuple[float, int, str]] = []
    with contextlib.suppress(OSError):
        for kind in os.scandir(root):
            if not kind.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(kind.path):
                # .pickle: entries of v1, never read again, removed first (their mtime is older)
                if e.name.endswith((SUFFIX, ".pickle")) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime, st.st_size, e.path))
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    total = sum(size for _, size, _ in entries)
    if total <= limit_bytes:
        return 0
    freed = 0
    for _, size, path in sorted(entries):
        if total - freed <= limit_bytes * 0.8:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            freed += size
    return freed


def store(entry: Key, value: Any) -> None:
    """Keep `value` (atomically, as checksummed data); failure to write is not an error."""
    STORE.put(entry, value)


def options_identity(paths: Sequence[str], config_file: Path | None, static_roots: Sequence[Path],
                     stack: str) -> list[Any]:
    return [sorted(paths), file_digest(config_file) if config_file else None, [str(r) for r in static_roots], stack]


def rebase(value: Any, old: str, new: str) -> Any:
    """`value` with the temp path of the snapshot it was computed on replaced by this one's
    (reports scrub the current snapshot path; a cached one must not leak). Frozen dataclasses are
    rebuilt only where a string changed."""
    import dataclasses

    if isinstance(value, str):
        return value.replace(old, new) if old in value else value
    if isinstance(value, Path):
        text = str(value)
        return Path(text.replace(old, new)) if old in text else value
    if isinstance(value, tuple | list):
        items = [rebase(v, old, new) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if isinstance(value, list) or type(value) is tuple else type(value)(*items)
    if isinstance(value, dict):
        out = {rebase(k, old, new): rebase(v, old, new) for k, v in value.items()}
        return value if all(a is b for a, b in zip(out.values(), value.values(), strict=True)) and list(out) == list(value) else out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            cur = getattr(value, f.name)
            nxt = rebase(cur, old, new)
            if nxt is not cur:
                changes[f.name] = nxt
        return dataclasses.replace(value, **changes) if changes else value
    return value

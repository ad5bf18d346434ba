# The one store of the result cache: typed keys (a kind, a digest of the inputs, the tool and schema
# version), entries as checksummed data written atomically, read only from regular files in the cache.
"""An entry is one file `<cache>/results/<kind>/<digest>.entry`:

    metax-audit-cache <schema> <kind> <tool> <sha256 of the payload> <payload bytes>\\n<payload>

the payload being the codec's JSON (cache/codec.py). Reading an entry opens it with O_NOFOLLOW and
O_NONBLOCK below a kind folder opened the same way (a symlink, to a FIFO or out of the cache, is never
followed; a FIFO never blocks), takes only a regular file of at most MAX_ENTRY_BYTES, checks the
header against the key and the checksum against the payload, and decodes it into registered records
only. Anything else is a *rejected* entry: counted (`rejected()`, the review's stage note says how
many), treated as absent, so the result is computed again and the entry rewritten. A missing entry is
a plain miss. Writing goes to a temp file in the kind folder, renamed over the entry (os.replace):
a concurrent reader sees the old entry or the new one, never part of one. A read-modify-write of one
entry (`update`) holds an flock on the kind folder's lock file. A cache that cannot be read or written
only costs time: no failure here is an error of the review."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from metax_audit.cache.codec import CodecError, Registry
from metax_audit.core.memo import Kind

SCHEMA: Final = "v2"  # v1: pickles (metax-audit/result-cache/v1), never read
MAGIC: Final = b"metax-audit-cache"
SUFFIX: Final = ".entry"
MAX_ENTRY_BYTES: Final = 256 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


# What an entry of each kind holds at its top (a record by its class name: the cache imports no stage);
# the callers check what is inside as they use it. Anything else is a rejected entry ("wrong shape").
SHAPES: Final[dict[Kind, type | tuple[type, ...] | str]] = {
    Kind.REVIEW: tuple, Kind.REVIEW_DISCOVERY: tuple, Kind.REVISION: "RevisionEntry", Kind.REACHED: tuple,
    Kind.DISCOVERY: tuple, Kind.COMPARE: tuple, Kind.COMPARE_FACTS: tuple, Kind.COMPARE_PARTS: (tuple, dict),
    Kind.CHECKS_FILE: dict, Kind.BINDING_FILE: dict, Kind.UPSTREAM_CALLS: tuple, Kind.CONTRACTS: "Contracts",
    Kind.TRACE_UNIT: list, Kind.DATAFLOW_UNIT: list, Kind.DATAFLOW_SCOPE: dict, Kind.DISCOVER_PARSED: dict,
    Kind.DISCOVER_IMPORTS: dict, Kind.DISCOVER_REGISTRATIONS: dict, Kind.DISCOVER_BINDINGS: dict,
    Kind.DISCOVER_PRIORITIES: dict, Kind.DISCOVER_SWITCHES: dict, Kind.DISCOVER_COMPILED: dict,
    Kind.INTROSPECT_IMPORTS: dict, Kind.OP_TABLE_PYTHON: dict, Kind.OP_TABLE_NATIVE: dict,
    Kind.INDEX_MISS: dict,
}


def has_shape(kind: Kind, value: Any) -> bool:
    shape = SHAPES[kind]
    return type(value).__qualname__ == shape if isinstance(shape, str) else isinstance(value, shape)


@dataclass(frozen=True)
class Key:
    """Where an entry lives: its kind and the digest of everything it depends on (the tool included)."""

    kind: Kind
    digest: str

    def beside(self, kind: Kind) -> Key:
        """The entry of another kind about the same inputs (a review's discovery beside the review)."""
        return Key(kind, self.digest)


def digest(tool: str, kind: Kind, parts: tuple[Any, ...]) -> Key:
    """The key of an entry of `kind` computed from `parts` (JSON-able; other values by their str) by `tool`."""
    text = json.dumps([SCHEMA, tool, kind.value, *parts], sort_keys=True, default=str)
    return Key(kind, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40])


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rejected: dict[str, int] = {}

    def reject(self, why: str, count: int = 1) -> None:
        with self._lock:
            self.rejected[why] = self.rejected.get(why, 0) + count

    def total(self) -> int:
        return sum(self.rejected.values())


STATS = _Stats()


def rejected() -> int:
    """How many entries this process found bad (and recomputed) so far."""
    return STATS.total()


def rejection_counts() -> dict[str, int]:
    """The rejections so far by reason (for rejected_since)."""
    with STATS._lock:
        return dict(STATS.rejected)


def rejected_since(before: dict[str, int]) -> str:
    """The stage note of the entries rejected since `before` (rejection_counts()), "" when none was."""
    now = rejection_counts()
    delta = {why: n - before.get(why, 0) for why, n in sorted(now.items()) if n > before.get(why, 0)}
    total = sum(delta.values())
    if not total:
        return ""
    reasons = ", ".join(f"{n} {why}" for why, n in delta.items())
    return f"{total} cache {'entry' if total == 1 else 'entries'} rejected ({reasons}): computed again, not trusted"


def add_rejected(count: int) -> None:
    """Entries a forked child of this process rejected (forked.py hands the count back)."""
    if count > 0:
        STATS.reject("in a forked stage", count)


class Store:
    """get/put of typed entries under one results folder (`root()` is asked each time: tests and the
    CLI point $METAX_AUDIT_CACHE elsewhere between reviews)."""

    def __init__(self, root: Callable[[], os.PathLike[str] | str], tool: Callable[[], str], registry: Callable[[], Registry]) -> None:
        self._root = root
        self._tool = tool
        self._registry = registry

    def key(self, kind: Kind, *parts: Any) -> Key:
        return digest(self._tool(), kind, parts)

    # ------------------------------------------------------------ read

    def get(self, key: Key) -> Any | None:
        """The value kept under `key`, or None (missing, unreadable or rejected)."""
        raw = self._read(key)
        if raw is None:
            return None
        try:
            value = self._registry().loads(self._payload(key, raw))
        except CodecError as exc:
            STATS.reject(str(exc).split(":")[0][:60])
            return None
        if not has_shape(key.kind, value):
            STATS.reject("wrong shape")
            return None
        return value

    def _payload(self, key: Key, raw: bytes) -> bytes:
        head, sep, payload = raw.partition(b"\n")
        if not sep:
            raise CodecError("no header")
        fields = head.split(b" ")
        if len(fields) != 6 or fields[0] != MAGIC:
            raise CodecError("bad header")
        if fields[1] != SCHEMA.encode() or fields[3] != self._tool().encode():
            raise CodecError("other version")
        if fields[2] != key.kind.value.encode():
            raise CodecError("other kind")
        if not fields[5].isdigit() or int(fields[5]) != len(payload):
            raise CodecError("truncated")
        if hashlib.sha256(payload).hexdigest().encode() != fields[4]:
            raise CodecError("bad checksum")
        return payload

    def _read(self, key: Key) -> bytes | None:
        name = key.digest + SUFFIX
        try:
            with self._folder(key.kind, create=False) as dfd:
                fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                STATS.reject("not a regular file")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                STATS.reject("not a regular file")
                return None
            if st.st_size > MAX_ENTRY_BYTES:
                STATS.reject("too large")
                return None
            chunks, left = [], st.st_size + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 24))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            with contextlib.suppress(OSError):
                os.utime(fd)  # used now: trim() removes the least recently used entries first
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _folder(self, kind: Kind, *, create: bool) -> Iterator[int]:
        """A descriptor of the kind's folder, opened without following a link (the results folder
        and the kind folder are the cache's own; a link there would lead out of it)."""
        results = os.fspath(self._root())
        if create:
            os.makedirs(os.path.join(results, kind.value), exist_ok=True)
        top = os.open(results, _DIR_FLAGS)
        try:
            dfd = os.open(kind.value, _DIR_FLAGS, dir_fd=top)
        finally:
            os.close(top)
        try:
            yield dfd
        finally:
            os.close(dfd)

    # ------------------------------------------------------------ write

    def encode(self, key: Key, value: Any) -> bytes | None:
        """The bytes of the entry of `value` under `key`, or None when it holds what the codec cannot keep."""
        try:
            payload = self._registry().dumps(value)
        except CodecError:
            return None
        head = b" ".join((MAGIC, SCHEMA.encode(), key.kind.value.encode(), self._tool().encode(),
                          hashlib.sha256(payload).hexdigest().encode(), str(len(payload)).encode()))
        return head + b"\n" + payload

    def put(self, key: Key, value: Any) -> bool:
        """Keep `value` under `key` (atomically); False when nothing was written."""
        data = self.encode(key, value)
        return data is not None and self._write(key, data)

    def _write(self, key: Key, data: bytes) -> bool:
        name = key.digest + SUFFIX
        tmp = f".tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"
        try:
            with self._folder(key.kind, create=True) as dfd:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                             | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=dfd)
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    return True
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dfd)
        except OSError:
            return False

    def update(self, key: Key, merge: Callable[[Any | None], Any]) -> bool:
        """Replace the entry under `key` by merge(what it holds now, or None), holding the kind's lock
        so that two reviews merging into one entry do not drop each other's part."""
        try:
            import fcntl
        except ImportError:  # no flock: the last writer wins, which only costs time
            return self.put(key, merge(self.get(key)))
        try:
            with self._folder(key.kind, create=True) as dfd:
                lock = os.open(".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                               0o600, dir_fd=dfd)
        except OSError:
            return self.put(key, merge(self.get(key)))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self.put(key, merge(self.get(key)))
        finally:
            os.close(lock)  # closing drops the flock

# The snapshot of `review --staged` (and `--worktree`) kept between reviews in the cache dir (one per
# repository and mode) and brought up to date by what changed, instead of exporting every file afresh.
"""A kept snapshot is a directory `tree/` beside a `manifest` and a `lock`. The manifest records, for
every file of the tree, the index entry it was written from (mode, blob id), what the file looked like
once written (size, mtime_ns, ctime_ns, permission bits: a write, chmod or utime moves ctime) and its
sha256. The worktree's kept snapshot records the lstat of the worktree file each copy was made from.

A review holds the lock (flock, non-blocking) from the update to the end of the review; one that finds
it held exports afresh into a temp dir (snapshot.py). Before anything in the tree is changed the
manifest is removed, and it is written again (atomically) once the tree matches it: a run killed in
between leaves no manifest, and the next one rebuilds the tree from nothing. Each use walks the tree
once: a file or directory the manifest does not name is removed, a file whose stat differs from the
manifest is written again (a stage, a tool or a person may have written into it).

Only plain trees are kept: regular files in the selection, none below a symlink, no gitlink or unmerged
entry. A file checkout-index writes is checked to hold exactly its blob's bytes (an attribute that
converts it sends the review to a fresh export for as long as that entry is in the index), and kept
files are reused only under the checkout identity they were written under (.gitattributes, attributes
files, git config files, the git program: checkout_identity); config includes, GIT_CONFIG_* and
replace refs are not followed: such repositories are exported afresh, exactly as before."""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core import fstree, gitcmd, inputs
from metax_audit.core.cachedir import cache_root
from metax_audit.core.errors import SubprocessError
from metax_audit.core.gitcmd import IndexEntry

FORMAT = 2
KEEP = 8  # kept snapshots (one per repository); the least recently used go first
_PLAIN_MODES = ("100644", "100755")
RACY_NS = 50_000_000  # a file whose ctime is this close to the manifest's is re-read (_racy_changed)
# Settings naming files that change what checkout-index writes, which are not followed here.
_CONFIG_WORDS = ("attributesfile", "include")


@dataclass
class Held:
    """A kept snapshot brought up to date and locked for this review; release() unlocks it."""

    root: Path
    count: int
    digest: str  # resultcache.tree_digest of root, computed from the manifest
    written: int  # files written by this update (all of them on a rebuild)
    removed: int
    rebuilt: bool
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def store_dir(top: Path, kind: str = "index") -> Path:
    return cache_root() / "snapshots" / f"{kind}-{hashlib.sha256(str(top).encode()).hexdigest()[:20]}"


def _config_files(gitdir: Path, common: Path) -> list[Path]:
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return [common / "config", gitdir / "config.worktree", home / ".gitconfig", xdg / "git" / "config",
            Path("/etc/gitconfig")]


def _stat_key(path: Path | str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def checkout_identity(top: Path, gitdir: Path, entries: list[IndexEntry], selected: list[IndexEntry]) -> str | None:
    """What decides the bytes checkout-index writes for a blob, as a digest: the .gitattributes files
    (index entries, and the worktree's in every directory of the selection), the attributes files, the
    git config files and the git program; None when the tree is not kept (see the module doc).

    Every file the kept snapshot writes is checked to hold exactly its blob's bytes; a kept file is
    reused only while this identity is the one it was written under, so a fresh export would write
    the same bytes."""
    if any(e.mode == "160000" or e.stage != "0" for e in entries):
        return None  # a gitlink or an unmerged entry
    if any(e.mode not in _PLAIN_MODES for e in selected):
        return None  # a symlink
    if any(k.startswith(("GIT_CONFIG", "GIT_ATTR")) for k in os.environ):
        return None
    common = gitdir
    with contextlib.suppress(OSError):
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    with contextlib.suppress(OSError):
        if any(os.scandir(common / "refs" / "replace")):
            return None
    parts: list[object] = [sorted((e.path, e.mode, e.blob) for e in entries
                                  if e.path.rpartition("/")[2] == ".gitattributes")]
    configs = _config_files(gitdir, common)
    for path in configs:
        try:
            text = inputs.read_bytes(path).decode(errors="replace").lower()
        except OSError:
            continue
        if any(word in text for word in _CONFIG_WORDS):
            return None  # an include or an attributes file elsewhere: not followed here
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    others: list[Path | str] = [common / "info" / "attributes", gitdir / "info" / "attributes", xdg / "git" / "attributes",
              shutil.which("git") or "git"]
    parts.append([(str(p), _stat_key(p)) for p in [*configs, *others]])
    # checkout-index also reads a .gitattributes of the worktree (when the index has none there)
    wheres = sorted({a for e in selected for a in _parents(e.path)} | {""})
    found = ((w, _stat_key(os.path.join(top, w, ".gitattributes"))) for w in wheres)
    parts.append([(w, key) for w, key in found if key is not None])
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _parents(path: str) -> list[str]:
    """The directories above a repo-relative path, nearest last: "a/b/c.py" -> ["a", "a/b"]."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def hold_index(top: Path, selected: list[IndexEntry], identity: str) -> Held | None:
    """The kept snapshot of `selected` (index entries), updated and locked; None when another review
    holds it or it cannot be kept (the caller exports afresh). Files are their blobs' raw bytes, read
    with cat-file --batch (gitcmd.write_blobs: no filter of the repo runs), as a fresh export writes them."""
    def write(tree: Path, paths: list[str]) -> dict[str, tuple | None] | None:
        def place(root: Path, rel: str) -> Path:
            target = root / rel
            os.makedirs(target.parent, exist_ok=True)
            return target

        entries = [gitcmd.TreeEntry(want[p][0], want[p][1], p) for p in paths]
        try:
            gitcmd.write_blobs(top, tree, entries, place)
        except (SubprocessError, OSError):
            return None
        return {p: want[p] for p in paths}

    def is_blob(path: str, data: bytes) -> bool:
        return _blob_id(data, want[path][1]) == want[path][1]

    want = {e.path: (e.mode, e.blob) for e in selected}
    return _hold(store_dir(top), (str(top), identity), want, write, is_blob)


def hold_worktree(top: Path, selected: list[str]) -> Held | None:
    """The kept snapshot of the worktree files `selected` (None when one is a symlink or below one),
    copied as the fresh export copies them (bytes, permission bits); a file is copied
    again when its lstat (inode, size, mtime, ctime, mode) differs from the one it was copied at, or
    when it changed too close to that copy for its stat to tell (RACY_NS)."""
    want: dict[str, tuple] = {}
    linked: dict[str, bool] = {}
    for rel in selected:
        for d in _parents(rel):
            if d not in linked:
                linked[d] = os.path.islink(os.path.join(top, d))
            if linked[d]:
                return None  # below a directory the worktree replaced by a symlink: noted by a fresh export
        try:
            st = os.lstat(os.path.join(top, rel))
        except FileNotFoundError:
            continue  # deleted in the worktree but still in the index: the worktree no longer has it
        if stat.S_ISLNK(st.st_mode) or rel.endswith("/"):
            return None  # a symlink (recorded or removed by a fresh export), a nested repository
        if stat.S_ISREG(st.st_mode):
            want[rel] = _source_key(st)

    def write(tree: Path, paths: list[str]) -> dict[str, tuple | None] | None:
        import time

        start = time.time_ns()
        done: dict[str, tuple | None] = {}
        for rel in paths:
            target = tree / rel
            os.makedirs(target.parent, exist_ok=True)
            src = os.path.join(top, rel)
            with open(src, "rb") as fin, open(target, "xb") as fout:
                shutil.copyfileobj(fin, fout)
            os.chmod(target, want[rel][4])
            key = _source_key(os.lstat(src))
            if key != want[rel]:
                return None  # changed while we copied it: exported afresh
            done[rel] = None if max(key[2], key[3]) >= start - RACY_NS else key
        return done

    return _hold(store_dir(top, "worktree"), (str(top), "worktree"), want, write, lambda path, data: True)


def _source_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, stat.S_IMODE(st.st_mode)


def _hold(base: Path, owner: tuple[str, str], want: dict[str, tuple],
          write: Callable[[Path, list[str]], dict[str, tuple | None] | None], check: Callable[[str, bytes], bool],
          ) -> Held | None:
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    try:
        held = _update(base, owner, want, write, check, fd)
    except OSError:  # the kept tree could not be brought up to date (a path too long, a full disk): export afresh
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if held is None:
        os.close(fd)
    return held


def _load(base: Path, owner: tuple[str, str]) -> dict[str, tuple] | tuple | None:
    """The manifest's files; a (path, mode, blob) that checkout-index did not write as the blob's bytes
    under this identity (see _update); None when there is no manifest of this repository and identity."""
    try:
        data = marshal.loads(inputs.read_bytes(base / "manifest", follow_symlinks=False))  # never a FIFO
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not (isinstance(data, tuple) and len(data) == 3 and data[0] == FORMAT and data[1] == owner
            and isinstance(data[2], dict | tuple)):
        return None
    return data[2]


def _save(base: Path, owner: tuple[str, str], files: dict[str, tuple] | tuple) -> None:
    tmp = base / f"manifest.{os.getpid()}"
    with open(tmp, "wb") as fh:
        marshal.dump((FORMAT, owner, files), fh)
    os.replace(tmp, base / "manifest")


def _stat_record(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, stat.S_IMODE(st.st_mode)


def _walk(tree: Path) -> tuple[dict[str, os.stat_result], set[str], list[str]]:
    """Regular files (path -> lstat), directories, and anything else found under `tree`; never follows a link."""
    files: dict[str, os.stat_result] = {}
    dirs: set[str] = set()
    other: list[str] = []
    stack = [("", str(tree))]
    while stack:
        rel, full = stack.pop()
        with os.scandir(full) as it:
            for entry in it:
                path = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    dirs.add(path)
                    stack.append((path + "/", entry.path))
                elif entry.is_file(follow_symlinks=False):
                    files[path] = entry.stat(follow_symlinks=False)
                else:
                    other.append(path)
    return files, dirs, other


def _blob_id(data: bytes, like: str) -> str:
    """git's object id of a blob with these bytes (sha1, or sha256 in a sha256 repository)."""
    algo = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return algo(b"blob %d\0" % len(data) + data).hexdigest()


def _update(base: Path, owner: tuple[str, str], want: dict[str, tuple],
            write: Callable[[Path, list[str]], dict[str, tuple | None] | None], check: Callable[[str, bytes], bool],
            fd: int) -> Held | None:
    """Bring the tree under `base` to `want` (path -> what the file is written from); a manifest
    record is (that key, the written file's _stat_record, its sha256)."""
    tree = base / "tree"
    manifest = _load(base, owner)
    if isinstance(manifest, tuple):
        if len(manifest) == 2 and want.get(manifest[0]) == manifest[1]:
            return None  # still the entry checkout-index converts: exported afresh
        manifest = None
    rebuilt = manifest is None or not tree.is_dir()
    if rebuilt:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base / "manifest")
        fstree.rmtree(tree, ignore_errors=True)
        if os.path.lexists(tree):
            return None
        tree.mkdir()
        manifest = {}
        _trim(base)
    assert manifest is not None
    saved_ns = 0 if rebuilt else os.stat(base / "manifest").st_mtime_ns
    files, dirs, other = _walk(tree)
    needed_dirs = {d for path in want for d in _parents(path)}
    stale = {p for p, rec in manifest.items() if rec[0] != want.get(p)}
    damaged = {p for p, rec in manifest.items() if p not in stale
               and (p not in files or _stat_record(files[p]) != rec[1] or _racy_changed(os.path.join(tree, p), rec, saved_ns))}
    racy = any(rec[1][2] >= saved_ns - RACY_NS for p, rec in manifest.items() if p not in stale)
    extra = sorted([p for p in files if p not in manifest] + other)
    todo = sorted(p for p in want if p not in manifest or p in stale or p in damaged)
    odd_dirs = sorted(d for d in dirs if d not in needed_dirs)
    if todo or stale or extra or odd_dirs or racy:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base / "manifest")  # from here until _save, a crash leaves a tree the next run rebuilds
        for p in sorted(stale | damaged) + extra:
            _remove(tree / p)
        for d in odd_dirs:  # a removed parent takes its children with it
            fstree.rmtree(tree / d, ignore_errors=True)
        for p in todo:  # a file's path that is a directory on disk (before a rename it was one)
            _remove(tree / p)
        manifest = {p: rec for p, rec in manifest.items() if p not in stale and p not in damaged}
        written = write(tree, todo) if todo else {}
        if written is None:
            return None
        for p in todo:
            full = tree / p
            st = os.lstat(full)
            with open(full, "rb") as fh:
                data = fh.read()
            if not check(p, data):
                # not the blob's bytes (an attribute converts it): exported afresh while it is in the index
                fstree.rmtree(tree, ignore_errors=True)
                _save(base, owner, (p, want[p]))
                return None
            if _stat_record(os.lstat(full)) != _stat_record(st):
                return None  # written into meanwhile: exported afresh, and rebuilt next time
            manifest[p] = (written[p], _stat_record(st), hashlib.sha256(data).digest())
        _save(base, owner, manifest)
    else:
        with contextlib.suppress(OSError):
            os.utime(base / "lock")  # used now: _trim removes the least recently used first
    return Held(tree, len(want), _digest(manifest), len(todo), len(stale - set(want)) + len(extra), rebuilt, fd)


def _racy_changed(path: str, rec: tuple, saved_ns: int) -> bool:
    """A file whose ctime is within a clock tick of the manifest's write could have been written again
    in the same tick with the same size (same stat): such a file is read and its bytes compared."""
    if rec[1][2] < saved_ns - RACY_NS:
        return False
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).digest() != rec[2]
    except OSError:
        return True


def _remove(full: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(full) and not os.path.islink(full):
            fstree.rmtree(full)
        else:
            os.unlink(full)


def _digest(manifest: dict[str, tuple]) -> str:
    """resultcache.tree_digest of the tree, from the recorded sha256 of each file (same walk order:
    a directory's files sorted, then its subdirectories sorted, depth first)."""
    root: dict = {}
    for path, rec in manifest.items():
        node = root
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part + "/", {})
        node[parts[-1]] = rec[2]
    h = hashlib.sha256()

    def visit(node: dict, prefix: str) -> None:
        for name in sorted(k for k in node if not k.endswith("/")):
            h.update(f"{os.path.join(prefix, name) if prefix else name}|".encode())
            h.update(node[name])
        for name in sorted(k[:-1] for k in node if k.endswith("/")):
            visit(node[name + "/"], os.path.join(prefix, name) if prefix else name)

    visit(root, "")
    return h.hexdigest()


def _trim(current: Path) -> None:
    """Keep KEEP snapshots: the least recently used beyond that go (never one another review holds)."""
    import fcntl

    parent = current.parent
    try:
        others = [p for p in parent.iterdir() if p != current and p.is_dir() and not p.is_symlink()]
    except OSError:
        return
    if len(others) < KEEP:
        return

    def used(p: Path) -> float:
        try:
            return os.stat(p / "lock").st_mtime
        except OSError:
            return 0.0

    for old in sorted(others, key=used)[: len(others) - KEEP + 1]:
        try:
            fd = os.open(old / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fstree.rmtree(old / "tree", ignore_errors=True)
            fstree.rmtree(old, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(fd)


class KeptTrees:
    """The kept snapshots as the snapshot stage asks for them (core.memo.KeptTrees): the pipeline hands
    KEPT_TREES to a review the result cache serves, nothing to one it does not."""

    def hold_worktree(self, top: Path, selected: list[str]) -> Held | None:
        return hold_worktree(top, selected)

    def hold_index(self, top: Path, gitdir: Path, entries: list[IndexEntry], selected: list[IndexEntry]) -> Held | None:
        identity = checkout_identity(top, gitdir, entries, selected)
        return None if identity is None else hold_index(top, selected, identity)


KEPT_TREES = KeptTrees()

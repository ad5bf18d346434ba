# Directory walks and removals that never recurse on a tree's depth: os.walk, Path.rglob and
# shutil.rmtree recurse once per level in Python 3.11, so a 2,000-deep directory raised RecursionError.
"""Iterative replacements for the stdlib's recursive tree functions.

A reviewed repository (or a leftover of a killed run in the temp dir) can hold a directory nested
thousands of levels deep. ``os.walk`` and ``Path.rglob`` (3.11) recurse once per level and raise
``RecursionError`` past ~1,000; ``shutil.rmtree`` does too, and also holds one descriptor per level.
``walk`` keeps an explicit stack; ``rmtree`` holds one directory descriptor at a time (climbing back
with ``..``, checked against the parent it came from), so neither depends on the recursion limit
or on ``RLIMIT_NOFILE``. Neither ever follows a symlink."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def walk(top: str | os.PathLike[str]) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk(top) (top-down, no onerror, symlinked directories listed in dirnames but never
    entered), in the same order, without recursion: the caller may prune or sort dirnames in place."""
    stack = [os.fspath(top)]
    while stack:
        path = stack.pop()
        dirs: list[str] = []
        nondirs: list[str] = []
        links: set[str] = set()
        try:
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else nondirs).append(entry.name)
                    if is_dir and entry.is_symlink():
                        links.add(entry.name)
        except OSError:
            continue
        yield path, dirs, nondirs
        stack.extend(os.path.join(path, d) for d in reversed(dirs) if d not in links)


def files(root: str | os.PathLike[str], suffixes: str | tuple[str, ...] | None = None) -> list[Path]:
    """The regular files (or links to one) under `root` whose names end in `suffixes`, sorted:
    sorted(p for p in root.rglob("*") if p.is_file()) without recursion."""
    out: list[Path] = []
    for dirpath, _dirs, names in walk(root):
        for name in names:
            if suffixes is None or name.endswith(suffixes):
                p = Path(dirpath, name)
                if p.is_file():
                    out.append(p)
    return sorted(out)


def glob(root: str | os.PathLike[str], pattern: str) -> list[Path]:
    """Path(root).glob(pattern) (Python 3.11's semantics: `**` is any number of directories and never
    enters a symlinked one, a pattern ending in `**` names directories, other wildcards follow links)
    in the same order, without recursion on the tree's depth or the pattern's length."""
    parts = PurePosixPath(pattern).parts
    matchers = [None if p == "**" or not _WILDCARD.search(p) else re.compile(fnmatch.translate(p)).fullmatch
                for p in parts]
    seen: set[Path] = set()
    out: list[Path] = []
    stack: list[Iterator[tuple[Path, int]]] = [iter([(Path(root), 0)])]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        path, i = item
        if i == len(parts):
            if path not in seen:
                seen.add(path)
                out.append(path)
            continue
        stack.append(_glob_step(path, parts[i], matchers[i], i, last=i == len(parts) - 1))
    return out


_WILDCARD = re.compile(r"[*?\[]")


def _glob_step(path: Path, part: str, match: Callable[[str], object] | None, i: int, last: bool,
               ) -> Iterator[tuple[Path, int]]:
    if part == "**":
        for dirpath, _dirs, _names in walk(path):
            yield Path(dirpath), i + 1
        return
    if match is None:  # a literal name
        child = path / part
        if child.exists() if last else child.is_dir():
            yield child, i + 1
        return
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        return
    for entry in entries:
        if not match(entry.name):
            continue
        if not last:
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
        yield path / entry.name, i + 1


def _scan(fd: int) -> list[str]:
    """Unlink every non-directory in the directory `fd`; return its subdirectories' names."""
    subdirs: list[str] = []
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
                continue
        except OSError:
            pass
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.name, dir_fd=fd)
    return subdirs


def rmtree(path: str | os.PathLike[str], ignore_errors: bool = False) -> None:
    """shutil.rmtree(path) without recursion and with one open directory at a time; a symlink at
    `path` is unlinked, never followed; a missing path is not an error. With `ignore_errors`, an
    OSError stops the removal quietly (what could be removed is gone)."""
    try:
        _rmtree(os.fspath(path))
    except FileNotFoundError:
        pass
    except OSError:
        if not ignore_errors:
            raise


def _rmtree(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    fd = os.open(path, _DIR_FLAGS)
    try:
        # each frame: the name of the directory we are in (inside its parent), the parent's
        # (st_dev, st_ino), and the parent's subdirectories still to remove
        frames: list[tuple[str, tuple[int, int], list[str]]] = []
        pending = _scan(fd)
        while True:
            if pending:
                name = pending.pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError:  # replaced by a link or file meanwhile: unlink what is there
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
                    continue
                here = os.fstat(fd)
                frames.append((name, (here.st_dev, here.st_ino), pending))
                os.close(fd)
                fd = child
                pending = _scan(fd)
                continue
            if not frames:
                break
            name, parent_id, pending = frames.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            up = os.fstat(fd)
            if (up.st_dev, up.st_ino) != parent_id:
                raise OSError(f"{path}: a directory moved while it was being removed")
            os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)

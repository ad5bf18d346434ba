# The one way to read a file the user (or the audited repo) names as input: config, waivers, a stack
# manifest, an environment record. Only a regular file is read; a FIFO, device or directory is refused.
"""Reading input files without hanging.

``open()`` of a FIFO blocks until a writer appears, and reading a character device (``/dev/zero``)
never ends: a waivers file or config that is one hung the review forever. read_text opens with
``O_NONBLOCK`` (an open that cannot block), checks with ``fstat`` that the descriptor is a regular file
(the check and the read are on the same descriptor: no race with a rename), refuses anything else and
anything past MAX_BYTES, then reads it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_BYTES = 64 * 1024 * 1024  # no input file of the tool is anywhere near this


class InputFileError(OSError):
    """An input file that is not a readable regular file; `reason` is one short phrase."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(reason)
        self.path = str(path)
        self.reason = reason
        self.strerror = reason


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(path: Path | str, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at `path`; InputFileError (an OSError whose strerror says what
    the path is instead) for a FIFO, device, socket, directory, a symlink when not `follow_symlinks`,
    or a file past MAX_BYTES; other OSErrors as they come."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow_symlinks and os.path.islink(path):
            raise InputFileError(path, "a symlink; only a regular file is read") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(path, f"{_kind(st.st_mode)}; only a regular file is read")
        if st.st_size > MAX_BYTES:
            raise InputFileError(path, f"{st.st_size} bytes, more than the {MAX_BYTES // (1024 * 1024)} MiB an input may have")
        os.set_blocking(fd, True)
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_BYTES:
                raise InputFileError(path, f"more than the {MAX_BYTES // (1024 * 1024)} MiB an input may have")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, *, follow_symlinks: bool = True) -> str:
    """read_bytes decoded as UTF-8 (UnicodeDecodeError as it comes), universal newlines as read_text."""
    return read_bytes(path, follow_symlinks=follow_symlinks).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")

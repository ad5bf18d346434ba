# Runs a pure, CPU-bound stage in a forked child on another core while the parent goes on, and
# hands its pickled result back; where fork is missing or the child fails, it runs in-process.
from __future__ import annotations

import contextlib
import os
import pickle
import signal
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Forked(Generic[T]):
    """`fn` started in a child now; result() waits for it, close() drops it (both idempotent).

    The child only computes and writes to a pipe (every other descriptor it inherited is closed):
    it never prints, never unwinds the parent's
    stack (no snapshot clean-up, no atexit handlers) and ignores SIGINT/SIGTERM (the parent
    handles those; a child whose parent is gone ends on the broken pipe). Any failure of the
    child, an exception included, makes result() run `fn` here, so an error is raised where it
    would have been without the fork."""

    def __init__(self, fn: Callable[[], T], timeout: float = 120, nice: int = 5) -> None:
        self._fn = fn
        self._timeout = timeout  # seconds result() waits for the child before running fn here
        self._pid: int | None = None
        self._read: int | None = None
        # Forking a process that runs other threads (a terminal progress spinner, a pool) can leave
        # a lock held forever in the child; then the stage just runs here, as without fork.
        import threading

        if not hasattr(os, "fork") or threading.active_count() > 1:
            return
        read, write = os.pipe()
        parent = os.getpid()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        finally:
            if os.getpid() == parent:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if pid == 0:  # the child: signals stay blocked, the only way out is os._exit
            code = 1
            try:
                # Every other descriptor goes: a pipe to another subprocess held open here would
                # keep that subprocess from seeing the end of its input.
                os.closerange(3, write)
                os.closerange(write + 1, _max_fd())
                _yield_to_parent(nice)
                data = pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            except BaseException:  # the parent runs fn again and meets the error
                pass
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._read = pid, read

    @property
    def started(self) -> bool:
        """Whether a child runs it (else result() computes it here)."""
        return self._pid is not None

    def result(self) -> T:
        if self._read is None:
            return self._fn()
        read, self._read = self._read, None
        data = _read_all(read, self._timeout)
        if data is None and self._pid is not None:  # stuck (a lock held at fork time?): run it here
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
        if self._reap() == 0 and data is not None:
            try:
                result: T = pickle.loads(data)  # our own child's bytes
                return result
            except Exception:  # a truncated result: compute it here instead
                pass
        return self._fn()

    def close(self) -> None:
        if self._read is not None:
            os.close(self._read)
            self._read = None
            if self._pid is not None:
                with contextlib.suppress(OSError):  # already gone
                    os.kill(self._pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> int:
        if self._pid is None:
            return -1
        pid, self._pid = self._pid, None
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return -1
        return os.waitstatus_to_exitcode(status)


def _max_fd() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 65536)
    except (AttributeError, ValueError, OSError):
        return 4096


def _read_all(fd: int, timeout: float) -> bytes | None:
    """Everything up to end-of-file on `fd` (which is closed), or None past `timeout` seconds."""
    import select
    import time

    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _yield_to_parent(nice: int) -> None:
    """A child computes what the parent will wait for later; the parent's own work until then is the
    review's critical path. With more runnable children than free cores (compare, the checks that read
    no trace and the dataflow all run during the trace), equal shares slowed the parent's trace 2-3x;
    a lower priority lets it keep a core while the children share what is left (real port, staged one-file
    review, quiet machine: 1.61 -> 1.39 s wall, median of 3 interleaved). `nice` orders the children:
    the one waited for first gets the larger share."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(nice)

# Work moved off the critical path of a review: a stage run in a forked child on another core
# (forked.Forked), its result or its error handed back as if it had run in-process.
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from metax_audit.core.forked import Forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_forked_result_is_computed_in_the_child() -> None:
    job = Forked(lambda: (os.getpid(), [1, {"a": (2, 3)}]))
    pid, value = job.result()
    assert pid != os.getpid()  # it really ran elsewhere
    assert value == [1, {"a": (2, 3)}]
    job.close()  # harmless after result()


def test_a_child_yields_the_cores_to_the_parent() -> None:
    # the parent's own work is the review's critical path: children run at a lower priority, the one
    # waited for first (the smaller nice) above the others
    here = os.nice(0)
    assert Forked(lambda: os.nice(0)).result() == min(19, here + 5)
    assert Forked(lambda: os.nice(0), nice=10).result() == min(19, here + 10)
    assert os.nice(0) == here  # the parent keeps its own


def test_a_failing_child_raises_the_error_here() -> None:
    calls: list[int] = []

    def boom() -> int:
        calls.append(os.getpid())
        raise ValueError("no contracts")

    job = Forked(boom)
    with pytest.raises(ValueError, match="no contracts"):
        job.result()
    assert calls == [os.getpid()]  # the child's attempt left no trace here; the rerun raised


def test_an_unpicklable_result_is_computed_here() -> None:
    job = Forked(lambda: (lambda: 1) if os.getpid() else None)  # a lambda cannot be pickled
    assert job.result()() == 1


def test_close_stops_a_child_that_is_still_running() -> None:
    job = Forked(lambda: time.sleep(30))
    pid = job._pid
    assert pid is not None
    began = time.perf_counter()
    job.close()
    assert time.perf_counter() - began < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_the_child_does_not_hold_other_pipes_open(tmp_path: Path) -> None:
    import subprocess

    # A subprocess reading to the end of its stdin must see it end while the child is alive.
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print(len(sys.stdin.read()))"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    job = Forked(lambda: time.sleep(20))
    out, _ = proc.communicate("abc", timeout=10)
    assert out.strip() == "3"
    job.close()


def test_a_stuck_child_is_given_up_and_the_work_done_here() -> None:
    def work() -> int:
        if os.getpid() != parent:
            time.sleep(60)  # the child hangs
        return 7

    parent = os.getpid()
    job = Forked(work, timeout=1)
    began = time.perf_counter()
    assert job.result() == 7
    assert time.perf_counter() - began < 10


def test_no_fork_while_other_threads_run() -> None:
    import os
    import threading

    from metax_audit.core.forked import Forked

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        job = Forked(os.getpid)
        assert job.result() == os.getpid()  # ran here, not in a child
    finally:
        stop.set()
        t.join()

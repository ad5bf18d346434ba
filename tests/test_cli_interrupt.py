# A review interrupted mid-run (Ctrl-C or a cancelled CI job) removes its snapshot and leaves the
# user's repository byte-for-byte as it was.
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fingerprint

from metax_audit.demo import build_demo_repo


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_review_cleans_up(tmp_path: Path, sig: signal.Signals) -> None:
    proc, repo, private_tmp, before = _review_inside_snapshot(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    _assert_interrupted_cleanly(proc.returncode, err, private_tmp, repo, before)

# A Ctrl-C that lands while Python runs code compiled from a string (a @dataclass being created by
# a lazy import, a namedtuple) makes CPython flag the interrupt as unhandled; handled or not,
# `python -m` then killed itself with SIGINT at exit (-2) after printing our message. The signal is
# delivered here from inside such code, so the timing is exact.
_INTERRUPT_IN_EXEC = """
import os, signal, sys
import metax_audit.pipeline.review as pipeline
from metax_audit.cli import main

def stages(*args, **kwargs):
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(1000):\\n    pass")
    raise AssertionError("the interrupt was not delivered")

pipeline._audit_stages = stages
sys.argv = ["metax-audit", *sys.argv[1:]]
main()
"""


def test_interrupt_inside_exec_still_exits_130(tmp_path: Path) -> None:
    repo = build_demo_repo(tmp_path / "repo")
    before = fingerprint(repo)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    (tmp_path / "interrupt_in_exec.py").write_text(_INTERRUPT_IN_EXEC)
    env = {**os.environ, "TMPDIR": str(private_tmp), "CI": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(  # -m, as `python -m metax_audit` runs: a script or -c exits 130 regardless
        [sys.executable, "-m", "interrupt_in_exec", "review", "--staged", "--repo", str(repo), "--test", "true",
         "--output-dir", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.count("interrupted") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not list(private_tmp.glob("metax-audit-snap-*"))
    assert fingerprint(repo) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_repeated_signals_still_clean_up(tmp_path: Path, sig: signal.Signals) -> None:
    # Ctrl-C pressed again, or a CI runner signalling until the job is gone: the later signals
    # arrive during the snapshot's removal and the interpreter's exit, and change nothing.
    proc, repo, private_tmp, before = _review_inside_snapshot(tmp_path)
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline:
        proc.send_signal(sig)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=60)
    _assert_interrupted_cleanly(proc.returncode, err, private_tmp, repo, before)


def _review_inside_snapshot(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path, object]:
    """A `python -m metax_audit review` kept busy inside its snapshot (by --test), returned once the
    snapshot exists: the process, the repo, the private temp dir and the repo's fingerprint before."""
    repo = build_demo_repo(tmp_path / "repo")
    before = fingerprint(repo)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp), "CI": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "metax_audit", "review", "--staged", "--repo", str(repo), "--test", "sleep 30",
         "--output-dir", str(tmp_path / "out")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not list(private_tmp.glob("metax-audit-snap-*")):
        time.sleep(0.05)
    assert list(private_tmp.glob("metax-audit-snap-*")), "the snapshot never appeared"
    time.sleep(0.5)
    return proc, repo, private_tmp, before


def _assert_interrupted_cleanly(returncode: int, err: str, private_tmp: Path, repo: Path, before: object) -> None:
    assert returncode == 130, err
    assert err.count("interrupted") == 1 and "Traceback" not in err, err
    assert not list(private_tmp.glob("metax-audit-snap-*"))
    assert fingerprint(repo) == before

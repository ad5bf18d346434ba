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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_review_cleans_up(tmp_path: Path, sig: signal.Signals) -> None:
    repo = build_demo_repo(tmp_path / "repo")
    before = fingerprint(repo)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp), "CI": "1"}
    # --test keeps the review busy inside the snapshot long enough to interrupt it there
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
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not list(private_tmp.glob("metax-audit-snap-*"))
    assert fingerprint(repo) == before

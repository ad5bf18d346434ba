# The wall time a review states is the real one: from the process's start (interpreter start-up and
# imports included) to the last report rendered (report writing included), the same in every place.
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import report_factory as rf
from test_reliability import PROJECT, review_args

from metax_audit import demo
from metax_audit.core import clock
from metax_audit.report import json_report, sarif, write_reports_timed


def _stated(out: Path) -> tuple[float, float]:
    """(report.json's wall_seconds, the seconds on summary.md's summary line)."""
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    line = next(ln for ln in (out / "summary.md").read_text(encoding="utf-8").splitlines() if ln.startswith("**") and " files, " in ln)
    match = re.search(r", ([0-9.]+) s\*\*$", line)
    assert match, line
    return data["wall_seconds"], float(match.group(1))


def test_report_writing_is_inside_the_stated_time(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    slow_sarif = sarif.write_sarif

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return slow_sarif(*args, **kwargs)

    monkeypatch.setattr(sarif, "write_sarif", slow)
    started = time.perf_counter() - 5.0  # the process started 5 s ago
    report, written = write_reports_timed(rf.make_report(wall_seconds=0.5), tmp_path, ["md", "json", "sarif", "junit"], started)
    assert 6.0 <= report.wall_seconds < 60
    in_json, in_md = _stated(tmp_path)
    assert in_json == report.wall_seconds and in_md == round(report.wall_seconds, 1)
    # everything else is what write_reports would write
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert data == json.loads(json_report.dumps(report))
    assert {p.name for p in written} >= {"summary.md", "report.json", "report.sarif", "report.junit.xml"}


def test_without_a_start_the_reports_keep_the_reviews_time(tmp_path: Path) -> None:
    report, _ = write_reports_timed(rf.make_report(wall_seconds=3.44), tmp_path, ["md", "json"], None)
    assert report.wall_seconds == 3.44 and _stated(tmp_path) == (3.44, 3.4)


def test_the_process_age_is_read_from_the_kernel() -> None:
    age = clock.process_age()
    if age is None:  # not Linux: the fallback is this module's import
        assert clock.process_started() == clock._IMPORTED
        return
    assert 0.0 <= age < time.perf_counter() - clock._IMPORTED + 60
    assert clock.process_started() <= time.perf_counter() - age + 0.05


def test_start_up_is_inside_the_stated_time(tmp_path: Path) -> None:
    """A process that takes 2 s before the CLI starts states at least those 2 s (the review's own
    stages take well under that on the demo) and no more than was measured from outside."""
    repo = demo.build_demo_repo(tmp_path / "port")
    out = tmp_path / "out"
    slow_start = "import runpy, sys, time; time.sleep(2.0); sys.argv[0] = 'metax_audit'; runpy.run_module('metax_audit', run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1"}
    begun = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", slow_start, *review_args(out, "--fail-on", "never")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    outside = time.perf_counter() - begun
    assert done.returncode == 0, done.stderr
    in_json, in_md = _stated(out)
    assert 2.0 <= in_json <= outside
    assert in_md == round(in_json, 1)
    assert done.stderr.rstrip().endswith(f", {in_json:.1f} s")  # the terminal's summary line says the same

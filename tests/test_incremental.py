# The change-focused review's reuse (incremental.py) equals the same review computed afresh: on the
# demo port, a staged change in a leaf backend, in a module other files import, and in the platform.
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()

# (file, old text, new text): each edit changes what the review finds.
EDITS = {
    # a backend file nothing imports: a keyword upstream's kernel call does not take, an argument dropped
    "leaf": ("vllm_metax/v1/attention/backends/triton_attn.py",
             "            alibi_slopes=self.alibi_slopes,\n            # sinks=self.sinks,\n",
             "            sinks=self.sinks,\n"),
    # a module the flashinfer backend imports: a new required parameter its call does not pass
    "imported": ("vllm_metax/v1/attention/ops/merge_attn_states.py",
                 "suffix_lse, output_lse=None):", "suffix_lse, lse_base, output_lse=None):"),
    # the registration file: one backend out of the priority list
    "platform": ("vllm_metax/platform.py", "            AttentionBackendEnum.TRITON_ATTN,\n",
                 "            # AttentionBackendEnum.TRITON_ATTN,\n"),
}


@pytest.fixture
def committed_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo port with everything committed: HEAD is the baseline, nothing staged."""
    from metax_audit import demo as demo_mod

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(demo_mod.stack_root()), os.environ.get("PYTHONPATH", "")]))
    repo = demo_mod.build_demo_repo(tmp_path / "port")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"], cwd=repo, check=True)
    return repo


def _staged(repo: Path, out: Path, *extra: str) -> dict:
    from metax_audit import demo as demo_mod

    r = runner.invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", str(demo_mod.upstream_root()),
                            "--output-dir", str(out), "--format", "json", "--fail-on", "never", *extra])
    assert r.exit_code == 0, r.output
    data: dict = json.loads((out / "report.json").read_text())
    return data


def _as_compared(findings: list[dict]) -> list[tuple]:
    keys = ("id", "status", "rule", "severity", "path", "line", "symbol", "message", "evidence", "content", "waived")
    return [tuple(json.dumps(f.get(k), sort_keys=True) for k in keys) for f in findings]


@pytest.mark.parametrize("case", sorted(EDITS))
def test_incremental_review_equals_full_review(committed_demo: Path, tmp_path: Path, case: str) -> None:
    _staged(committed_demo, tmp_path / "warm")  # HEAD's review, its revision memo and reached files cached
    path, old, new = EDITS[case]
    text = (committed_demo / path).read_text()
    assert old in text
    (committed_demo / path).write_text(text.replace(old, new, 1))
    subprocess.run(["git", "add", path], cwd=committed_demo, check=True)

    fast = _staged(committed_demo, tmp_path / "fast")
    full = _staged(committed_demo, tmp_path / "full", "--no-cache")

    notes = {s["name"]: s["note"] for s in fast["stages"]}
    assert "served from the result cache without a snapshot" in notes["baseline"]
    assert "compared during the trace" in notes["compare"]
    # none of the edits adds a file or moves a registration: the compare child started before discover
    # on the discovery the last review ended with (incremental.start_compare_early)
    assert "started before discover" in notes["compare"], notes["compare"]
    # ... and the checks that read no trace and the dataflow ran during the trace, on that discovery
    assert "imports and attributes checked during the trace" in notes["checks"], notes["checks"]
    assert "followed during the trace" in notes["dataflow"], notes["dataflow"]
    assert "during the trace" not in {s["name"]: s["note"] for s in full["stages"]}["checks"]
    # of the files compared again, each function whose text and reads are unchanged is reused (compare/memo.py)
    units = re.search(r"of their functions (\d+) reused, (\d+) compared", notes["compare"])
    assert units is not None and int(units[1]) > 0, notes["compare"]
    assert "of their functions" not in {s["name"]: s["note"] for s in full["stages"]}["compare"]
    assert "without a snapshot" not in {s["name"]: s["note"] for s in full["stages"]}["baseline"]
    # the checks' per-file work (checks/memo.py): the edited file's recomputed, every other file's reused
    memo = re.search(r"per-file memo: (\d+) reused, (\d+) computed", notes["checks"])
    assert memo is not None and int(memo[1]) > 0 and int(memo[2]) > 0, notes["checks"]
    assert "per-file memo" not in {s["name"]: s["note"] for s in full["stages"]}["checks"]
    assert full["baseline"]["new"] + full["baseline"]["changed"] + full["baseline"]["fixed"] > 0  # the edit shows
    assert fast["baseline"] == full["baseline"]
    assert _as_compared(fast["findings"]) == _as_compared(full["findings"])
    assert _as_compared(fast["fixed"]) == _as_compared(full["fixed"])
    for section in ("files", "backends", "coverage", "dataflow"):
        assert fast[section] == full[section], section


def test_a_review_served_whole_hands_on_its_discovery(committed_demo: Path, tmp_path: Path) -> None:
    # HEAD reviewed in one clone; in another clone the same tree is served whole from the result cache,
    # and the first staged change there starts its compare before discover, as after a computed review.
    _staged(committed_demo, tmp_path / "first")
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(committed_demo), str(other)], check=True)
    served = _staged(other, tmp_path / "served")
    assert any(s["name"] == "result-cache" for s in served["stages"])
    path, old, new = EDITS["leaf"]
    (other / path).write_text((other / path).read_text().replace(old, new, 1))
    subprocess.run(["git", "add", path], cwd=other, check=True)
    fast = _staged(other, tmp_path / "fast")
    notes = {s["name"]: s["note"] for s in fast["stages"]}
    assert "started before discover" in notes["compare"], notes["compare"]
    full = _staged(other, tmp_path / "full", "--no-cache")
    assert _as_compared(fast["findings"]) == _as_compared(full["findings"])

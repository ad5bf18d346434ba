# The `probe` command end to end on CPU: the torch reference passes, a deliberately wrong kernel
# given as MOD:CALLABLE is caught (exit 1) and the reports name the hypothesis it matched.
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit.cli import app

pytest.importorskip("torch")
runner = CliRunner()


def test_reference_passes_and_wrong_lse_base_is_caught(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["probe", "--target", "torch-reference", "--family", "paged-decode", "--probes", "lse",
                             "--device", "cpu", "--output-dir", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(app, ["probe", "--target", "metax_audit.probes.wrong_variants:log2_lse_decode", "--family", "paged-decode",
                              "--probes", "lse", "--device", "cpu", "--output-dir", str(tmp_path / "bad")])
    assert bad.exit_code == 1, bad.output
    data = json.loads((tmp_path / "bad" / "probes.json").read_text())
    (result,) = [r for r in data["probes"] if r["probe"] == "lse"]
    assert result["verdict"] == "mismatch"
    assert "2" in (result["matched"] or "") and result["matched"] != result["expected"]
    assert (tmp_path / "bad" / "environment.json").is_file()


def test_probe_requests_render_the_command_that_reruns_them() -> None:
    from metax_audit.core.models import ProbeRequest

    request = ProbeRequest("flashinfer:BatchPrefillWithPagedKVCacheWrapper", "paged-prefill", ("lse", "dcp"))
    assert request.command == (
        "metax-audit probe --target flashinfer:BatchPrefillWithPagedKVCacheWrapper --family paged-prefill --probes lse,dcp")
    assert ProbeRequest("m:f", "merge-states").command == "metax-audit probe --target m:f --family merge-states"
    assert ProbeRequest("m:f", "merge-states", ("dcp",), (("merge", "base2"),)).command.endswith("  # options: merge=base2")


def test_review_with_probe_runs_the_probes_the_flows_name(tmp_path: Path) -> None:
    from metax_audit import demo

    repo = demo.build_demo_repo(tmp_path / "repo")
    r = runner.invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", str(demo.upstream_root()),
                            "--probe", "--format", "json", "--output-dir", str(tmp_path / "out"), "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    stage = next(s for s in data["stages"] if s["name"] == "probe")
    assert stage["ran"], stage
    # the demo's LSE flow names an lse probe on FlashInfer's prefill wrapper; without the real
    # kernel stack it cannot run, and the report must say so instead of passing it
    lse = [p for p in data["probes"] if p["probe"] == "lse" and "BatchPrefillWithPagedKVCacheWrapper" in p["target"]]
    assert lse and all(p["verdict"] in ("skipped", "error", "not-checkable") for p in lse), lse


def test_probe_reports_go_outside_the_checkout_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a review's: never a reports/ in the directory it was started from, unless --output-dir."""
    import os
    import subprocess

    checkout = tmp_path / "port"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    monkeypatch.chdir(checkout)
    r = runner.invoke(app, ["probe", "--target", "torch-reference", "--family", "paged-decode", "--probes", "lse",
                            "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert not (checkout / "reports").exists()
    out = Path(os.environ["METAX_AUDIT_CACHE"]) / "reports" / "probes" / "torch-reference"
    assert (out / "probes.json").is_file()
    assert f"reports: {out / 'probes.json'}" in " ".join(r.output.split()) or str(out) in r.output

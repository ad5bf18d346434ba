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
    bad = runner.invoke(app, ["probe", "--target", "probes.wrong_variants:log2_lse_decode", "--family", "paged-decode",
                              "--probes", "lse", "--device", "cpu", "--output-dir", str(tmp_path / "bad")])
    assert bad.exit_code == 1, bad.output
    data = json.loads((tmp_path / "bad" / "probes.json").read_text())
    (result,) = [r for r in data["probes"] if r["probe"] == "lse"]
    assert result["verdict"] == "mismatch"
    assert "2" in (result["matched"] or "") and result["matched"] != result["expected"]
    assert (tmp_path / "bad" / "environment.json").is_file()

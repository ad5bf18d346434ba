# `python -m metax_audit.probes` (the subprocess entry point and the "rerun one case" command): list and run
# print machine-readable output; the outcome record round-trips through JSON.
from __future__ import annotations

import json

import pytest

from metax_audit.probes.__main__ import MARKER, main
from metax_audit.probes.base import ProbeOutcome


def test_list_names_probes_families_and_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "paged-decode" in data["probes"]["lse"]["families"]
    assert "return_lse" in data["families"]["paged-decode"]["convention"]
    assert "flashinfer:BatchDecodeWithPagedKVCacheWrapper" in data["families"]["paged-decode"]["builtin_targets"]
    assert data["broken_modules"] == {}


def test_run_prints_one_outcome_line_that_round_trips(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("torch")
    out_file = tmp_path / "o.json"
    assert main(["run", "--probe", "lse", "--family", "merge-states", "--target", "torch-reference:base-2", "--device", "cpu",
                 "--json-out", str(out_file)]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(MARKER)]
    data = json.loads(line[len(MARKER):])
    assert data == json.loads(out_file.read_text())
    outcome = ProbeOutcome.from_json(data)
    assert outcome.verdict == "matched" and outcome.matched == "merge-base-2"
    assert outcome.cases[0].errors["merge-base-e"].abs > 0.1
    assert ProbeOutcome.from_json(outcome.to_json()) == outcome


def test_unknown_probe_and_inapplicable_family_are_results(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    main(["run", "--probe", "nope", "--family", "paged-decode", "--target", "torch-reference", "--device", "cpu"])
    main(["run", "--probe", "query-count", "--family", "paged-decode", "--target", "torch-reference", "--device", "cpu"])
    lines = [json.loads(ln[len(MARKER):]) for ln in capsys.readouterr().out.splitlines() if ln.startswith(MARKER)]
    assert [d["verdict"] for d in lines] == ["error", "skipped"]

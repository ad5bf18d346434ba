# The dcp probe across real ranks on CPU: 2 processes joined by torch.distributed (gloo), each with its
# interleaved KV shard, the reduction run with its collectives. The torch reference reduction is
# consistent; a base-2 LSE fed to a base-e reduction, the converse, an [H, B] LSE and per-rank lengths
# that ignore the interleave are each named; a crashed or hung rank is an error with its stderr tail and
# no rank process is left behind.
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from metax_audit.probes.base import ProbeContext  # noqa: E402
from metax_audit.probes.runner import run_one  # noqa: E402

WV = "metax_audit.probes.wrong_variants"
CASES = [
    ("torch-reference", {}, "consistent"),
    (f"{WV}:log2_lse_decode", {}, "producer-base-2/reduce-base-e"),
    ("torch-reference", {"reduction": "torch-reference:base-2"}, "producer-base-e/reduce-base-2"),
    (f"{WV}:transposed_lse_decode", {}, "lse-layout-mismatch"),
    ("torch-reference", {"local_lens": f"{WV}:interleave_ignored_local_lens"}, "interleave-mismatch"),
]


@pytest.mark.parametrize(("producer", "options", "hypothesis"), CASES)
def test_two_gloo_ranks_name_the_hypothesis(producer: str, options: dict, hypothesis: str) -> None:
    out = run_one("dcp", "paged-decode", producer, ProbeContext(device="cpu", options={"world_size": "2", **options}))
    assert out.matched == hypothesis, (out.verdict, out.skipped_reason, out.evidence, [(c.name, c.matched) for c in out.cases])
    assert out.verdict == ("matched" if hypothesis == "consistent" else "mismatch")
    assert out.details["ranks agree"] and out.details["backend"] == "gloo"
    assert {c.name.split(" lens")[0] for c in out.cases} == {"ranks=2 interleave=1", "ranks=2 interleave=8"}


@pytest.mark.parametrize(("env", "why"), [("PROBE_TEST_RANK_CRASH", "rank 0 exited with 9"), ("PROBE_TEST_RANK_HANG", "still running after 45s")])
def test_crashed_or_hung_rank_is_an_error_and_no_rank_is_left(env: str, why: str, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv(env, "1")
    seen: list[int] = []
    import subprocess

    real = subprocess.Popen

    def spy(*a: object, **k: object) -> subprocess.Popen:
        p = real(*a, **k)  # type: ignore[call-overload]
        seen.append(p.pid)
        return p

    monkeypatch.setattr(subprocess, "Popen", spy)
    out = run_one("dcp", "paged-decode", "torch-reference",
                  ProbeContext(device="cpu", options={"world_size": "2", "rank_timeout": "45"}))
    assert out.verdict == "error" and why in (out.skipped_reason or ""), out.skipped_reason
    if env == "PROBE_TEST_RANK_CRASH":
        assert any("dying on purpose" in e for e in out.evidence)
    assert len(seen) == 2
    for pid in seen:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_vllm_reductions_skip_on_cpu() -> None:
    out = run_one("dcp", "paged-decode", "torch-reference",
                  ProbeContext(device="cpu", options={"world_size": "2", "reduction": "vllm:cp_lse_ag_out_rs"}))
    assert out.verdict == "skipped" and "CUDA" in (out.skipped_reason or "")


def test_probe_command_world_size(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from metax_audit.cli import app

    r = CliRunner().invoke(app, ["probe", "--target", f"{WV}:log2_lse_decode", "--family", "paged-decode", "--probes", "dcp",
                                 "--world-size", "2", "--device", "cpu", "--output-dir", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert "mismatch probe=dcp family=paged-decode" in r.output and "matched=producer-base-2/reduce-base-e" in r.output
    assert "options=world_size=2" in r.output

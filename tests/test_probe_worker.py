# One worker process per target: a hang or crash is that probe's `error` (with the stderr tail), the
# worker restarts and the next probe runs; no process is left behind; targets that need a CUDA device
# are skipped on a machine without one before any process starts; an unloadable target is exit 2.
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from metax_audit.core.errors import ProbeError
from metax_audit.stages import probing


def test_hang_and_crash_are_errors_and_the_worker_carries_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("PROBE_TEST_PIDFILE", str(pidfile))
    rs = probing.run_probes(target="metax_audit.probes.wrong_variants:misbehaving_decode", family="paged-decode",
                            probes=("lse", "fp8-scale", "padding", "layout"), device="cpu", timeout=40)
    assert [r.verdict for r in rs] == ["matched", "error", "error", "matched"], [(r.verdict, r.skipped_reason) for r in rs]
    assert "timed out after 40s" in (rs[1].skipped_reason or "")
    assert "exited with 7" in (rs[2].skipped_reason or "")
    assert "dying on purpose" in rs[2].details["stderr_tail"]
    assert rs[2].details["rerun"].startswith("python -m metax_audit.probes run --probe padding")
    pids = {int(x) for x in pidfile.read_text().split()}
    assert len(pids) == 3  # first worker (hung), second (crashed), third (finished)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_unloadable_target_is_a_probe_error_in_the_probe_command_and_a_result_elsewhere() -> None:
    with pytest.raises(ProbeError, match="cannot be loaded: ModuleNotFoundError"):
        probing.run_targets([("no_such_module_for_probe_test:fn", "paged-decode")], probes=("lse",), device="cpu")
    rs = probing.run_probes(target="no_such_module_for_probe_test:fn", family="paged-decode", probes=("lse", "layout"), device="cpu")
    assert [r.verdict for r in rs] == ["error", "error"] and "cannot be loaded" in (rs[0].skipped_reason or "")


def test_no_cuda_device_skips_before_any_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spawn(*a: object, **k: object) -> None:
        raise AssertionError("a worker was started")

    monkeypatch.setattr("metax_audit.stages.probing.run.cuda_device_present", lambda: False)
    monkeypatch.setattr("metax_audit.core.subproc.spawn_python", no_spawn)
    rs = probing.run_targets(probing.backend_targets("flashinfer"), probes=(), device="auto")
    assert rs and all(r.verdict == "skipped" and r.details["no_device"] for r in rs)
    assert all(r.skipped_reason.startswith(probing.NO_DEVICE) for r in rs)


def test_cli_lines_outside_a_terminal_and_exit_2_for_an_unloadable_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from metax_audit.cli import app

    runner = CliRunner()
    monkeypatch.setattr("metax_audit.stages.probing.run.cuda_device_present", lambda: False)
    ok = runner.invoke(app, ["probe", "--target", "torch-reference", "--family", "paged-decode", "--probes", "lse,graph-capture",
                             "--output-dir", str(tmp_path / "o")])
    assert ok.exit_code == 0, ok.output
    lines = ok.output.splitlines()
    assert "matched probe=lse family=paged-decode target=torch-reference matched=base-e/[T,H] expected=base-e/[T,H] worst=" in ok.output
    assert sum(ln.startswith(probing.NO_DEVICE) for ln in lines) == 1
    bad = runner.invoke(app, ["probe", "--target", "no_such_module_for_probe_test:fn", "--family", "paged-decode", "--device", "cpu",
                              "--output-dir", str(tmp_path / "b")])
    assert bad.exit_code == 2
    assert len([ln for ln in bad.output.splitlines() if ln.strip()]) == 1 and "cannot be loaded" in bad.output

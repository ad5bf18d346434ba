# metax_audit.stages.probing.evidence: the environment record is collected in a subprocess with every fact
# guarded, round-trips through a file, and a changed stack is reported line by line.
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from metax_audit.core.errors import AuditError
from metax_audit.stages.probing.evidence import (
    _worker,
    collect_environment,
    diff_environment,
    load_environment,
    save_environment,
)


def test_collect_in_subprocess_has_guarded_facts(tmp_path: Path) -> None:
    env = collect_environment(python=sys.executable, packages=("pytest", "no-such-package-xyz"))
    assert env["schema"] == "metax-audit/environment/v1"
    assert env["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert "pytest" in env["packages"] and "no-such-package-xyz" not in env["packages"]
    for key in ("torch", "triton", "gpu", "driver", "maca_path", "os"):
        assert key in env  # present even when the fact is unavailable
    p = save_environment(env, tmp_path / "env" / "environment.json")
    assert load_environment(p) == env


def test_broken_interpreter_is_a_recorded_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    fake.chmod(0o755)
    env = collect_environment(python=str(fake))
    assert "error" in env and "boom" in env["stderr_tail"]


def test_maca_facts_read_from_maca_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "version.txt").write_text("MACA 3.0.0.8\n")
    monkeypatch.setenv("MACA_PATH", str(tmp_path))
    facts = _worker(())
    assert facts["maca_path"] == str(tmp_path) and facts["maca_version"] == "MACA 3.0.0.8"


def test_diff_reports_changed_stack() -> None:
    old = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "packages": {"flashinfer-python": {"version": "0.2.6.post1"}}}
    new = {"gpu": "MetaX C500", "torch": "2.10.0+metax3.2.1", "packages": {"flash_attn": {"version": "2.6.3+metax"}}}
    d = diff_environment(old, new)
    assert "gpu: 'NVIDIA H200' -> 'MetaX C500'" in d
    assert any(x.startswith("torch:") for x in d)
    assert "package flashinfer-python: 0.2.6.post1 -> absent" in d and "package flash_attn: absent -> 2.6.3+metax" in d
    assert diff_environment(old, dict(old)) == []


def test_load_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "e.json"
    bad.write_text("[1, 2]")
    with pytest.raises(AuditError):
        load_environment(bad)
    with pytest.raises(AuditError):
        load_environment(tmp_path / "missing.json")

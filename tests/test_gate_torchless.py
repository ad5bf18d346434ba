# The pre-commit gate where it really runs: a venv where `import torch` fails, a port pinning a vendor kernel
# build whose public base is an sdist (its setup.py imports torch) served from a local find-links folder.
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import git, write_tree

from metax_audit import demo

ROOT = Path(__file__).resolve().parents[1]
HOOK = ["review", "--staged", "--new-only", "--fail-on", "error"]  # the shipped hook's entry (.pre-commit-hooks.yaml)
PIN = "flashinfer==0.2.6+vendor1.2\n"
# The public base's decode run() takes no **kwargs: a keyword it lacks cannot bind.
RUN = "    def run(self, q, paged_kv_cache, *, return_lse=False, k_scale=None, v_scale=None, out=None, sinks=None):\n"


def _sdist(path: Path) -> Path:
    """flashinfer_python-0.2.6.tar.gz built from strings: the demo stub stack's sources, and a setup.py
    that imports torch (as the real one does), so that anything that builds it fails."""
    files = {"flashinfer_python-0.2.6/setup.py": "import torch  # the real sdist needs torch to build\n"}
    stub = demo.stack_root() / "flashinfer"
    for py in sorted(stub.glob("*.py")):
        text = py.read_text(encoding="utf-8")
        if py.name == "decode.py":
            text = "".join(RUN if "def run(self" in line else line for line in text.splitlines(keepends=True))
        files[f"flashinfer_python-0.2.6/flashinfer/{py.name}"] = text
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def port(tmp_path: Path) -> Path:
    """The demo port committed clean, pinning the vendor build; its config holds the gate's upstream."""
    repo = demo.build_demo_repo(tmp_path / "repo")
    pyproject = (repo / "pyproject.toml").read_text(encoding="utf-8")
    assert "[tool.metax-audit]" in pyproject
    pyproject = pyproject.replace("[tool.metax-audit]\n", f"[tool.metax-audit]\nupstream = {str(demo.upstream_root())!r}\n", 1)
    write_tree(repo, {"pyproject.toml": pyproject, "requirements/vendor.txt": PIN})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pin the vendor kernel build")
    return repo


def _stage_keyword(repo: Path) -> None:
    path = repo / "vllm_metax/v1/attention/backends/flashinfer.py"
    text = path.read_text(encoding="utf-8")
    assert text.count("                sinks=self.sinks,\n") == 1
    path.write_text(text.replace("                sinks=self.sinks,\n",
                                 "                sinks=self.sinks,\n                enable_pdl=True,\n"), encoding="utf-8")
    git(repo, "add", "-A")


def _hook(repo: Path, tmp_path: Path, links: Path, cache: str) -> subprocess.CompletedProcess[str]:
    no_torch = tmp_path / "no-torch"
    write_tree(no_torch, {"torch/__init__.py": "raise ImportError('No module named torch (this venv has none)')\n"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "METAX_AUDIT_", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join([str(no_torch), str(ROOT)]), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(links), METAX_AUDIT_CACHE=str(tmp_path / cache), CI="1")
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode == 1 and "this venv has none" in check.stderr  # the runner really has no torch
    return subprocess.run([sys.executable, "-m", "metax_audit", *HOOK, "--output-dir", str(tmp_path / f"out-{cache}")],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_the_hook_without_torch_binds_the_public_base_and_fails_on_a_staged_keyword(port: Path, tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    _sdist(links / "flashinfer_python-0.2.6.tar.gz")
    _stage_keyword(port)
    done = _hook(port, tmp_path, links, "cache")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("errors ("))
    first = " ".join(lines[at + 1:at + 4])  # new errors lead the first screen (a line may wrap)
    assert first.split()[:4] == ["NEW", "error", "MXA101", "vllm_metax/v1/attention/backends/flashinfer.py:267"], done.stdout
    assert "enable_pdl" in first, done.stdout


def test_the_hook_exits_2_with_one_line_when_the_public_base_cannot_be_had(port: Path, tmp_path: Path) -> None:
    links = tmp_path / "empty-links"
    links.mkdir()
    _stage_keyword(port)
    done = _hook(port, tmp_path, links, "cold-cache")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("metax-audit: error: ")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("metax-audit: error: flashinfer: the pinned flashinfer==0.2.6+vendor1.2 "
                               "(requirements/vendor.txt:1) cannot be bound")
    for way_out in ("--stack FILE", "--python PATH", "kernel-sources", "--allow-unbound flashinfer", str(links)):
        assert way_out in lines[0]

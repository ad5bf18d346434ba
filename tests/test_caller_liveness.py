# Caller liveness (compare/liveness.py): an override that renames a parameter upstream callers pass by keyword
# is an error only while one of those callers can run on the port. The shapes are those of vllm-ascend's
# get_kv_cache_shape(cache_type=) against upstream's cache_dtype_str=: a module function the port assigns
# over, a runner method every port runner overrides, a base-class method reached from a class the
# port's worker still builds through upstream's runner. Fixture: npu_port plus files written here.
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import UpstreamInfo
from metax_audit.stages.compare import compare
from metax_audit.stages.discover import discover

FIXTURE = Path(__file__).parent / "fixtures" / "npu_port"
CFG = AuditConfig(port_package="vllm_npu", scope=("{port}/attention/**/*.py", "{port}/platform.py"),
                  class_prefixes=("Npu",))

UP_FILES = {
    # a module function that reshapes through the backend (the port replaces it)
    "vllm/v1/worker/attn_utils.py": (
        "def reshape_kv(backend, n):\n"
        "    return backend.get_kv_cache_shape(n, 16, 8, 128, cache_dtype_str='auto')\n"),
    # the runner: a method the port overrides, and one reached from the base's own helper
    "vllm/v1/worker/runner.py": (
        "from vllm.v1.worker.zeroer import BlockZeroer\n\n\n"
        "class ModelRunner:\n"
        "    def reshape_tensors(self, backend):\n"
        "        return backend.get_kv_cache_shape(1, 16, 8, 128, cache_dtype_str='fp8')\n\n"
        "    def init_zeroer(self, backend):\n"
        "        self.zeroer = BlockZeroer(backend)\n"),
    "vllm/v1/worker/zeroer.py": (
        "class BlockZeroer:\n"
        "    def __init__(self, backend):\n"
        "        self.dim = backend.get_kv_cache_block_dim(16, 8, 128, cache_dtype_str='auto')\n"),
}
BASE_HELPER = (
    "\n    @classmethod\n"
    "    def get_kv_cache_block_dim(cls, block_size, num_kv_heads, head_size, cache_dtype_str='auto'):\n"
    "        return cls.get_kv_cache_shape(7, block_size, num_kv_heads, head_size, cache_dtype_str=cache_dtype_str)\n")
PORT_FILES = {
    "vllm_npu/patch/__init__.py": "",
    "vllm_npu/patch/patch_attn_utils.py": (
        "import vllm.v1.worker.attn_utils\n\n\n"
        "def reshape_kv_npu(backend, n):\n    return backend.get_kv_cache_shape(n, 16, 8, 128)\n\n\n"
        "vllm.v1.worker.attn_utils.reshape_kv = reshape_kv_npu\n"),
    "vllm_npu/worker/__init__.py": "",
    "vllm_npu/worker/runner.py": (
        "from vllm.v1.worker.runner import ModelRunner\n\n\n"
        "class NpuModelRunner(ModelRunner):\n"
        "    def reshape_tensors(self, backend):\n        return backend.get_kv_cache_shape(1, 16, 8, 128)\n\n"
        "    def init_zeroer(self, backend):\n        self.zeroer = None\n\n\n"
        "class NpuModelRunnerB(NpuModelRunner):\n    pass\n"),
}


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    port, up = tmp_path / "port", tmp_path / "upstream"
    shutil.copytree(FIXTURE / "port", port)
    shutil.copytree(FIXTURE / "upstream", up)
    for rel, text in UP_FILES.items():
        (up / rel).parent.mkdir(parents=True, exist_ok=True)
        (up / rel).write_text(text)
    (up / "vllm/v1/worker/__init__.py").write_text("")
    backend = up / "vllm/v1/attention/backend.py"
    backend.write_text(backend.read_text().replace(
        "class AttentionMetadataBuilder", BASE_HELPER.lstrip("\n") + "\n\nclass AttentionMetadataBuilder"))
    for rel, text in PORT_FILES.items():
        (port / rel).parent.mkdir(parents=True, exist_ok=True)
        (port / rel).write_text(text)
    att = port / "vllm_npu/attention/attention_v1.py"
    att.write_text(att.read_text().replace(
        "def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):",
        "def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_type=''):"))
    return port, up


def _shape_finding(port: Path, up: Path):
    d = discover(port, CFG)
    _, findings = compare(d, CFG, UpstreamInfo("vllm", "0.99.0", "directory:test", up))
    return next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape")


def test_callers_the_port_replaces_or_overrides_are_no_evidence(trees: tuple[Path, Path]) -> None:
    shape = _shape_finding(*trees)
    assert "renames `cache_dtype_str` to `cache_type`" in shape.message
    assert shape.severity.value == "warning"  # every upstream call passing cache_dtype_str= is dead on the port
    by_path = {c.path: c for c in shape.callers}
    assert {c.live for c in shape.callers} == {False}
    assert "the port replaces vllm.v1.worker.attn_utils.reshape_kv (vllm_npu/patch/patch_attn_utils.py:8)" \
        in by_path["vllm/v1/worker/attn_utils.py"].why
    runner = by_path["vllm/v1/worker/runner.py"].why
    assert "every port class derived from ModelRunner runs the port's own reshape_tensors" in runner
    assert "NpuModelRunner.reshape_tensors at vllm_npu/worker/runner.py:5, run by NpuModelRunnerB" in runner
    # the base's helper is reached only through BlockZeroer, which only the (overridden) init_zeroer builds
    helper = by_path["vllm/v1/attention/backend.py"].why
    assert "AttentionBackend.get_kv_cache_block_dim is called only from code the port replaces or overrides" in helper
    assert any(e.startswith("not evidence: upstream caller vllm/v1/worker/attn_utils.py:2 passes cache_dtype_str=")
               for e in shape.evidence)
    assert any(e.startswith("no live caller") for e in shape.evidence)


def test_a_caller_reached_from_code_the_port_runs_keeps_the_error_with_its_chain(trees: tuple[Path, Path]) -> None:
    port, up = trees
    # a second runner the port uses as upstream wrote it: its init_zeroer builds upstream's BlockZeroer
    (up / "vllm/v1/worker/runner_v2.py").write_text(
        "from vllm.v1.worker.zeroer import BlockZeroer\n\n\nclass ModelRunnerV2:\n"
        "    def init_zeroer_v2(self, backend):\n        self.zeroer = BlockZeroer(backend)\n")
    (port / "vllm_npu/worker/worker.py").write_text(
        "class NpuWorker:\n    def load(self):\n        self.model_runner.init_zeroer_v2(self.backend)\n")
    shape = _shape_finding(port, up)
    assert shape.severity.value == "error"
    live = [c for c in shape.callers if c.live]
    assert [c.path for c in live] == ["vllm/v1/attention/backend.py"]
    assert live[0].why == ("in AttentionBackend.get_kv_cache_block_dim, reached from vllm/v1/worker/zeroer.py:3 "
                           "BlockZeroer.__init__, from vllm/v1/worker/runner_v2.py:6 ModelRunnerV2.init_zeroer_v2, "
                           "which the port calls at vllm_npu/worker/worker.py:3")
    assert str(live[0]) in shape.evidence  # shown first, before the callers that are no evidence
    assert shape.evidence.index(str(live[0])) < min(
        i for i, e in enumerate(shape.evidence) if e.startswith("not evidence:"))


def test_an_override_that_calls_super_still_runs_upstreams_caller(trees: tuple[Path, Path]) -> None:
    port, up = trees
    runner = port / "vllm_npu/worker/runner.py"
    runner.write_text(runner.read_text().replace(
        "    def reshape_tensors(self, backend):\n        return backend.get_kv_cache_shape(1, 16, 8, 128)\n",
        "    def reshape_tensors(self, backend):\n        return super().reshape_tensors(backend)\n"))
    shape = _shape_finding(port, up)
    assert shape.severity.value == "error"
    assert next(c for c in shape.callers if c.path == "vllm/v1/worker/runner.py").live

# The MACA launch-option shim on CPU: with a stand-in for stock Triton's JITFunction (which rejects
# unknown launch keywords, as Triton 3.x does), the port's kernels launch with `scenario` removed and
# the removal is recorded as evidence; vLLM's kernels keep every keyword (and so still fail on one).
from __future__ import annotations

import sys
import types

import pytest

from metax_audit.probes.families import _maca_shim


class _FakeJIT:
    """Stock Triton's launch contract: an unknown keyword is a KeyError."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, *args, grid, warmup, **kwargs):
        for k in kwargs:
            if k not in ("num_warps", "num_stages", "BLOCK"):
                raise KeyError(f"Keyword argument {k} was specified but unrecognised")
        return ("launched", grid, sorted(kwargs))


@pytest.fixture
def fake_triton(monkeypatch: pytest.MonkeyPatch) -> type:
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = type("JITFunction", (_FakeJIT,), {})
    runtime = types.ModuleType("triton.runtime")
    runtime.jit = jit
    triton = types.ModuleType("triton")
    triton.runtime = runtime
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    _maca_shim.reset()
    return jit.JITFunction


def _kernel(module: str, name: str):
    def fn() -> None: ...

    fn.__module__, fn.__name__ = module, name
    return fn


def test_port_kernel_runs_with_scenario_removed_and_recorded(fake_triton: type) -> None:
    assert _maca_shim.install()
    assert _maca_shim.install()  # idempotent: wrapped once
    port = fake_triton(_kernel("_probe_op_port_triton_decode_attention", "_fwd_grouped_kernel_stage1"))
    assert port.run(1, grid=(1,), warmup=False, num_stages=1, scenario="mla") == ("launched", (1,), ["num_stages"])
    assert _maca_shim.evidence() == ("ran with MACA-only launch options removed: scenario='mla' (_fwd_grouped_kernel_stage1)",)
    _maca_shim.reset()
    assert _maca_shim.evidence() == ()


def test_vllm_kernels_are_never_altered(fake_triton: type) -> None:
    _maca_shim.install()
    vllm = fake_triton(_kernel("_probe_op_vllm_triton_decode_attention", "_fwd_grouped_kernel_stage1"))
    with pytest.raises(KeyError, match="scenario"):
        vllm.run(grid=(1,), warmup=False, scenario="mla")
    assert _maca_shim.evidence() == ()


def test_without_triton_install_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)
    assert _maca_shim.install() is False

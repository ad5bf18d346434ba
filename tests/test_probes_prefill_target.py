# The FlashInfer prefill adapters' controls come from the installed wrapper's signatures: a
# wrapper without scale arguments must not claim the fp8-scale control (the probe fails closed).
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from metax_audit.probes.families._flashinfer import prefill_target


class _RaggedLike:
    def __init__(self, workspace: Any, kv_layout: str = "NHD") -> None: ...

    def plan(self, qo_indptr: Any, kv_indptr: Any, *, causal: bool = False, sm_scale: float | None = None) -> None: ...

    def run(self, q: Any, k: Any, v: Any, *, return_lse: bool = False) -> Any: ...


class _Adapter:
    _backend = "fa2"
    __probe_declares__: dict[str, str] = {"lse_base": "2"}  # noqa: RUF012
    _fi = SimpleNamespace(RaggedLike=_RaggedLike)

    def __call__(self, q: Any, k: Any, v: Any, *, sm_scale: float, causal: bool = True, return_lse: bool = False) -> Any: ...


def test_controls_are_read_from_the_wrapper() -> None:
    target = prefill_target("flashinfer:RaggedLike", "ragged-prefill", _Adapter(), "RaggedLike", ("return_lse", "k_scale"))
    assert {"return_lse", "sm_scale", "causal", "kv_layout"} <= set(target.controls)
    assert "k_scale" not in target.controls and "v_scale" not in target.controls
    assert any("RaggedLike.run" in n for n in target.notes)

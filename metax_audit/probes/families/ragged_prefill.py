# The ragged-prefill family: ragged query tokens against ragged (non-paged) K/V, with its
# built-in targets (explicit torch reference, FlashInfer's BatchPrefill ragged wrapper).
from __future__ import annotations

from typing import Any

from metax_audit.probes.base import FamilySpec, ProbeContext, Target, inspect_controls
from metax_audit.probes.families._flashinfer import FlashInferPrefill

NAME = "ragged-prefill"
CONTROLS = ("sm_scale", "causal", "kv_layout", "k_scale", "v_scale", "return_lse")
CONVENTION = """\
ragged-prefill: target(q, k, v, qo_lens, kv_lens, *, sm_scale, causal=True, kv_layout="NHD",
                       k_scale=None, v_scale=None, return_lse=False) -> out | (out, lse)
  q            [sum(qo_lens), Hq, D]
  k, v         NHD: [sum(kv_lens), Hkv, D]; HND: [Hkv, sum(kv_lens), D]; requests concatenated in order
  qo_lens, kv_lens  int32 [B]; causal alignment bottom-right as in paged-prefill
  k_scale, v_scale  only when the target dequantises fp8 K/V (FlashInfer's ragged run has no scale
               arguments: the fp8-scale probe is then not checkable)
  lse          [sum(qo_lens), Hq] fp32; convention default natural log, [tokens, heads]"""


class TorchRaggedPrefill:
    def __call__(self, q: Any, k: Any, v: Any, qo_lens: Any, kv_lens: Any, *, sm_scale: float, causal: bool = True,
                 kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        from metax_audit.probes import reference

        ks = 1.0 if k_scale is None else float(k_scale)
        vs = 1.0 if v_scale is None else float(v_scale)
        out, lse = reference.ragged_prefill(q, k.float() * ks, v.float() * vs, qo_lens, kv_lens, sm_scale=sm_scale, causal=causal,
                                            kv_layout=kv_layout)
        out = out.to(q.dtype)
        return (out, lse.float()) if return_lse else out


class FlashInferRaggedPrefill(FlashInferPrefill):

    def __call__(self, q: Any, k: Any, v: Any, qo_lens: Any, kv_lens: Any, *, sm_scale: float, causal: bool = True,
                 kv_layout: str = "NHD", return_lse: bool = False) -> Any:
        import torch

        if kv_layout not in self._wrappers:
            ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=self._device)
            self._wrappers[kv_layout] = self._fi.BatchPrefillWithRaggedKVCacheWrapper(ws, kv_layout=kv_layout, backend=self._backend)
        w = self._wrappers[kv_layout]
        cum = lambda x: torch.tensor([0, *x.to("cpu").long().cumsum(0).tolist()], dtype=torch.int32, device=self._device)  # noqa: E731
        hkv = k.shape[1] if kv_layout == "NHD" else k.shape[0]
        w.plan(cum(qo_lens), cum(kv_lens), q.shape[1], hkv, q.shape[2], causal=causal, sm_scale=sm_scale,
               q_data_type=q.dtype, kv_data_type=k.dtype)
        return w.run(q, k, v, return_lse=return_lse)


BUILTIN = ("torch-reference", "flashinfer:BatchPrefillWithRaggedKVCacheWrapper")


def load(spec: str, ctx: ProbeContext) -> Target:
    if spec == "torch-reference":
        obj = TorchRaggedPrefill()
        sig, controls = inspect_controls(obj, CONTROLS)
        return Target(spec, NAME, obj, sig, controls)
    from metax_audit.probes.families._flashinfer import prefill_target, require_cuda

    require_cuda(ctx.device)
    fi_obj = FlashInferRaggedPrefill(ctx.device, ctx.options.get("fi_backend", "fa2"))
    return prefill_target(spec, NAME, fi_obj, "BatchPrefillWithRaggedKVCacheWrapper", CONTROLS)

FAMILIES = (FamilySpec(name=NAME, convention=CONVENTION, load=load, builtin_targets=BUILTIN, controls=CONTROLS),)

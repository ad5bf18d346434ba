# The paged-prefill family: ragged query tokens (prefill/append) against a paged KV cache, with
# its built-in targets (explicit torch reference, FlashInfer's BatchPrefill paged wrapper).
from __future__ import annotations

from typing import Any

from metax_audit.probes.base import FamilySpec, ProbeContext, Target, inspect_controls
from metax_audit.probes.families._flashinfer import FlashInferPrefill

NAME = "paged-prefill"
CONTROLS = ("sm_scale", "causal", "kv_layout", "k_scale", "v_scale", "return_lse")
CONVENTION = """\
paged-prefill: target(q, k_cache, v_cache, block_table, seq_lens, qo_lens, *, sm_scale, causal=True,
                      kv_layout="NHD", k_scale=None, v_scale=None, return_lse=False) -> out | (out, lse)
  q            [sum(qo_lens), Hq, D]: the query tokens of all requests, concatenated in request order
  k_cache, v_cache, block_table, kv_layout, k_scale, v_scale: as in paged-decode
  seq_lens     int32 [B]: KV length of each request, the new tokens included (seq_lens >= qo_lens)
  qo_lens      int32 [B]: query tokens per request (0 = a padded request with no rows)
  causal       query i of request r sits at position seq_lens[r] - qo_lens[r] + i and sees keys
               0..that position (bottom-right alignment)
  lse          [sum(qo_lens), Hq] fp32; convention default natural log, [tokens, heads]
  out          [sum(qo_lens), Hq, D], q's dtype"""


class TorchPagedPrefill:
    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, qo_lens: Any, *, sm_scale: float,
                 causal: bool = True, kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None,
                 return_lse: bool = False) -> Any:
        from metax_audit.probes import reference

        out, lse = reference.paged_prefill(q, k_cache, v_cache, block_table, seq_lens, qo_lens, sm_scale=sm_scale, causal=causal,
                                           kv_layout=kv_layout, k_scale=1.0 if k_scale is None else float(k_scale),
                                           v_scale=1.0 if v_scale is None else float(v_scale))
        out = out.to(q.dtype)
        return (out, lse.float()) if return_lse else out


class FlashInferPagedPrefill(FlashInferPrefill):

    def _wrapper(self, layout: str) -> Any:
        import torch

        if layout not in self._wrappers:
            ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=self._device)
            self._wrappers[layout] = self._fi.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=layout, backend=self._backend)
        return self._wrappers[layout]

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, qo_lens: Any, *, sm_scale: float,
                 causal: bool = True, kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None,
                 return_lse: bool = False) -> Any:
        import torch

        from metax_audit.probes.families._flashinfer import paged_metadata

        page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
        hkv = k_cache.shape[2] if kv_layout == "NHD" else k_cache.shape[1]
        indptr, indices, last = paged_metadata(block_table, seq_lens, page, self._device)
        qo_indptr = torch.tensor([0, *qo_lens.to("cpu").long().cumsum(0).tolist()], dtype=torch.int32, device=self._device)
        w = self._wrapper(kv_layout)
        w.plan(qo_indptr, indptr, indices, last, q.shape[1], hkv, q.shape[2], page, causal=causal, sm_scale=sm_scale,
               q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        return w.run(q, (k_cache, v_cache), k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


BUILTIN = ("torch-reference", "flashinfer:BatchPrefillWithPagedKVCacheWrapper")


def load(spec: str, ctx: ProbeContext) -> Target:
    if spec == "torch-reference":
        obj = TorchPagedPrefill()
        sig, controls = inspect_controls(obj, CONTROLS)
        return Target(spec, NAME, obj, sig, controls)
    from metax_audit.probes.families._flashinfer import prefill_target, require_cuda

    require_cuda(ctx.device)
    fi_obj = FlashInferPagedPrefill(ctx.device, ctx.options.get("fi_backend", "fa2"))
    return prefill_target(spec, NAME, fi_obj, "BatchPrefillWithPagedKVCacheWrapper", CONTROLS)

FAMILIES = (FamilySpec(name=NAME, convention=CONVENTION, load=load, builtin_targets=BUILTIN, controls=CONTROLS),)

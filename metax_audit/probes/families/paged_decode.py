# The paged-decode family: one query token per request against a paged KV cache, with its
# built-in targets (explicit torch reference, torch SDPA, FlashInfer's BatchDecode wrapper).
from __future__ import annotations

from typing import Any, ClassVar

from metax_audit.probes.base import FamilySpec, ProbeContext, Target, inspect_controls

NAME = "paged-decode"
CONTROLS = ("sm_scale", "kv_layout", "k_scale", "v_scale", "return_lse")
CONVENTION = """\
paged-decode: target(q, k_cache, v_cache, block_table, seq_lens, *, sm_scale, kv_layout="NHD",
                     k_scale=None, v_scale=None, return_lse=False) -> out | (out, lse)
  q            [B, Hq, D] fp16/bf16, one query token per request
  k_cache      NHD: [num_blocks, page_size, Hkv, D]; HND: [num_blocks, Hkv, page_size, D]
  v_cache      same shape as k_cache; either may be a strided view (e.g. of a joint [num_blocks, 2, ...]
               allocation) with a storage offset: the target must honour the given strides
  block_table  int32 [B, max_blocks_per_req]; entries past a request's pages may be -1
  seq_lens     int32 [B]; 0 means a padded request
  sm_scale     float multiplier of q.k
  kv_layout    "NHD" | "HND": how k_cache/v_cache are laid out
  k_scale      float or 0-dim tensor: dequantisation scale of an fp8 K cache (k = k_fp8 * k_scale)
  v_scale      float or 0-dim tensor: same for V
  return_lse   also return lse [B, Hq] fp32; the convention's default expectation is natural log
               (base e), laid out [tokens, heads]; a target may declare another via __probe_declares__
  out          [B, Hq, D], q's dtype
  empty/padded a request with seq_lens 0 (an empty sequence, or a padded row) holds out 0 and an LSE
               of -inf or any value <= -1e4 (no weight in a merge; FlashInfer writes -5e4). NaN/inf
               there is a mismatch (`nan-on-empty` in lse/dcp, `nan-in-padding` in padding), as is
               NaN/inf anywhere a hypothesis is finite (`non-finite`), unless the target declares
               it: __probe_declares__ = {"empty": "nan-on-empty", "padding": "nan-in-padding"}
  block_table  entries are a shuffled draw: none equals b * width + j, so a target that ignores the
               table (`block-table-ignored`) is named; the cache holds B * width blocks so that read
               stays in bounds
A control missing from the target's signature makes the probes that need it "not-checkable".
Optional two-phase entry points (used by graph-capture): plan(block_table, seq_lens, *, sm_scale,
kv_layout, num_qo_heads, num_kv_heads, head_dim, page_size, q_dtype, kv_dtype) and
run(q, k_cache, v_cache, *, k_scale=None, v_scale=None, return_lse=False); optional
for_cuda_graph(batch_size, max_pages) returning such an object whose plan writes fixed buffers.
Optional __probe_declares__ = {"lse": "base-2/[T,H]"} states documented semantics."""


class TorchPagedDecode:
    """The explicit fp64 paged reference: reads metadata tensors at run time (graph-safe in spirit)."""

    __probe_declares__: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        self.plan(block_table, seq_lens, sm_scale=sm_scale, kv_layout=kv_layout)
        return self.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)

    def plan(self, block_table: Any, seq_lens: Any, *, sm_scale: float, kv_layout: str = "NHD", **_: Any) -> None:
        # like a real plan(): metadata is read here, outside any graph capture (lengths on the
        # host, a private copy of the table), so run() never reads the caller's tensors on the host
        self._meta = {"block_table": block_table.clone(), "seq_lens": seq_lens.to("cpu", copy=True), "sm_scale": sm_scale,
                      "kv_layout": kv_layout}

    def run(self, q: Any, k_cache: Any, v_cache: Any, *, k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        from metax_audit.probes import reference

        m = self._meta
        out, lse = reference.paged_decode(
            q, k_cache, v_cache, m["block_table"], m["seq_lens"], sm_scale=m["sm_scale"], kv_layout=m["kv_layout"],
            k_scale=1.0 if k_scale is None else float(k_scale), v_scale=1.0 if v_scale is None else float(v_scale),
        )
        out = out.to(q.dtype)
        return (out, lse.float()) if return_lse else out


def sdpa_paged_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                      kv_layout: str = "NHD") -> Any:
    """torch SDPA over the gathered pages: no LSE, no fp8 scales (those probes are not checkable)."""
    import torch
    import torch.nn.functional as F

    from metax_audit.probes.reference import gather_pages

    outs = []
    for b, L in enumerate(seq_lens.tolist()):
        k = gather_pages(k_cache, block_table[b], L, kv_layout).to(q.dtype)
        v = gather_pages(v_cache, block_table[b], L, kv_layout).to(q.dtype)
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        if L == 0:
            outs.append(torch.zeros_like(q[b : b + 1]))
            continue
        o = F.scaled_dot_product_attention(q[b : b + 1].transpose(0, 1).unsqueeze(0).float(), k.transpose(0, 1).unsqueeze(0).float(),
                                           v.transpose(0, 1).unsqueeze(0).float(), scale=sm_scale)
        outs.append(o[0].transpose(0, 1).to(q.dtype))
    return torch.cat(outs)


class FlashInferPagedDecode:
    """FlashInfer 0.2.x BatchDecodeWithPagedKVCacheWrapper behind the paged-decode convention:
    one wrapper per kv_layout (the layout is fixed at construction), plan() from the block table."""

    __probe_declares__: ClassVar[dict[str, str]] = {"lse": "base-2/[T,H]", "lse_base": "2"}  # FlashInfer documents log2-domain LSE

    def __init__(self, device: str, *, graph: tuple[int, int] | None = None) -> None:
        from metax_audit.probes.families._flashinfer import import_flashinfer

        self._fi = import_flashinfer()
        self._device = device
        self._graph = graph
        self._wrappers: dict[str, Any] = {}
        self._w: Any = None
        self._page = 0

    def for_cuda_graph(self, batch_size: int, max_pages: int) -> FlashInferPagedDecode:
        return FlashInferPagedDecode(self._device, graph=(batch_size, max_pages))

    def _wrapper(self, layout: str) -> Any:
        import torch

        if layout not in self._wrappers:
            ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=self._device)
            if self._graph is None:
                self._wrappers[layout] = self._fi.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=layout)
            else:
                b, p = self._graph
                i32 = {"dtype": torch.int32, "device": self._device}
                self._wrappers[layout] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                    ws, kv_layout=layout, use_cuda_graph=True, paged_kv_indptr_buffer=torch.zeros(b + 1, **i32),
                    paged_kv_indices_buffer=torch.zeros(p, **i32), paged_kv_last_page_len_buffer=torch.zeros(b, **i32))
        return self._wrappers[layout]

    def plan(self, block_table: Any, seq_lens: Any, *, sm_scale: float, kv_layout: str = "NHD", num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, q_dtype: Any, kv_dtype: Any) -> None:
        from metax_audit.probes.families._flashinfer import paged_metadata

        indptr, indices, last = paged_metadata(block_table, seq_lens, page_size, self._device)
        self._w = self._wrapper(kv_layout)
        self._w.plan(indptr, indices, last, num_qo_heads, num_kv_heads, head_dim, page_size,
                     q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=sm_scale)

    def run(self, q: Any, k_cache: Any, v_cache: Any, *, k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        return self._w.run(q, (k_cache, v_cache), k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
        hkv = k_cache.shape[2] if kv_layout == "NHD" else k_cache.shape[1]
        self.plan(block_table, seq_lens, sm_scale=sm_scale, kv_layout=kv_layout, num_qo_heads=q.shape[1],
                  num_kv_heads=hkv, head_dim=q.shape[2], page_size=page, q_dtype=q.dtype, kv_dtype=k_cache.dtype)
        return self.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


def flashinfer_controls(fi: Any) -> tuple[frozenset[str], tuple[str, ...]]:
    """Controls the installed wrapper really has, with the inspected signatures as evidence."""
    from metax_audit.probes.families._flashinfer import accepts, signature_text

    w = fi.BatchDecodeWithPagedKVCacheWrapper
    have = {"sm_scale"} if accepts(w.plan, "sm_scale") else set()
    if accepts(w.__init__, "kv_layout"):
        have.add("kv_layout")
    for c in ("k_scale", "v_scale", "return_lse"):
        if accepts(w.run, c):
            have.add(c)
    notes = (f"inspected: {signature_text(w.run, 'BatchDecodeWithPagedKVCacheWrapper.run')}",
             f"inspected: {signature_text(w.plan, 'BatchDecodeWithPagedKVCacheWrapper.plan')}")
    return frozenset(have), notes


BUILTIN = ("torch-reference", "torch-sdpa", "flashinfer:BatchDecodeWithPagedKVCacheWrapper",
           "vllm-triton:decode_attention_fwd", "port-triton:decode_attention_fwd")


def load(spec: str, ctx: ProbeContext) -> Target:
    if spec == "torch-reference":
        obj = TorchPagedDecode()
        sig, controls = inspect_controls(obj, CONTROLS)
        return Target(spec, NAME, obj, sig, controls, plan=obj.plan, run=obj.run)
    if spec == "torch-sdpa":
        sig, controls = inspect_controls(sdpa_paged_decode, CONTROLS)
        return Target(spec, NAME, sdpa_paged_decode, sig, controls)
    if spec.endswith(":decode_attention_fwd"):
        from metax_audit.probes.families.vllm_ops import load_decode

        return load_decode(spec, ctx, CONTROLS, NAME)
    from metax_audit.probes.families._flashinfer import require_cuda

    require_cuda(ctx.device)
    fi_obj = FlashInferPagedDecode(ctx.device)
    controls, notes = flashinfer_controls(fi_obj._fi)
    sig, _ = inspect_controls(fi_obj, CONTROLS)
    return Target(spec, NAME, fi_obj, sig, controls, declares=dict(fi_obj.__probe_declares__), notes=notes,
                  plan=fi_obj.plan, run=fi_obj.run)


FAMILIES = (FamilySpec(name=NAME, convention=CONVENTION, load=load, builtin_targets=BUILTIN, controls=CONTROLS),)

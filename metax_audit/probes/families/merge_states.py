# The merge-states family (combining partial attention over KV segments) and the
# dcp-local-seq-lens family (per-rank KV lengths under decode context parallelism).
from __future__ import annotations

from typing import Any

from metax_audit.probes.base import FamilySpec, ProbeContext, Target, inspect_controls

NAME = "merge-states"
CONVENTION = """\
merge-states: target(v_a, s_a, v_b, s_b) -> (v, s)
  v_a, v_b     [T, H, D] partial attention outputs over two disjoint KV segments
  s_a, s_b     [T, H] fp32 LSE of each segment, in the base the merger assumes (declare it:
               __probe_declares__ = {"merge_base": "e" | "2"}; convention default e, vLLM's)
  v, s         the merged output and LSE (same base); a segment with s = -inf contributes nothing
  Adapters for other layouts (vLLM's merge_attn_states takes lse [H, T] and writes into out=) wrap
  the callable so that it follows this convention."""

LOCAL_LENS = "dcp-local-seq-lens"
LOCAL_LENS_CONVENTION = """\
dcp-local-seq-lens: target(seq_lens, dcp_size=1, dcp_rank=None, cp_kv_cache_interleave_size=1) -> Tensor
  KV tokens are dealt to dcp_size ranks in runs of cp_kv_cache_interleave_size: token t lives on rank
  (t // interleave) % dcp_size. Returns each request's local length on dcp_rank ([B]), or on every
  rank ([B, dcp_size]) when dcp_rank is None. vLLM's get_dcp_local_seq_lens follows this."""


def _merge(base: str) -> Any:
    def merge(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
        from metax_audit.probes.reference import merge_states

        v, s = merge_states(v_a, s_a, v_b, s_b, base=base)
        return v.to(v_a.dtype), s.float()

    merge.__probe_declares__ = {"merge_base": base}  # type: ignore[attr-defined]
    return merge


def reference_local_seq_lens(seq_lens: Any, dcp_size: int = 1, dcp_rank: int | None = None,
                             cp_kv_cache_interleave_size: int = 1) -> Any:
    """Counts tokens per rank one by one: slow on purpose, independent of any closed form."""
    import torch

    rows = []
    for L in seq_lens.tolist():
        owners = [(t // cp_kv_cache_interleave_size) % dcp_size for t in range(int(L))]
        rows.append([owners.count(r) for r in range(dcp_size)])
    full = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), dcp_size)
    return full if dcp_rank is None else full[:, dcp_rank]


BUILTIN = ("torch-reference:base-e", "torch-reference:base-2", "flashinfer:merge_state", "vllm-triton:merge_attn_states",
           "port-triton:merge_attn_states")


def load(spec: str, ctx: ProbeContext) -> Target:
    if spec.startswith("torch-reference"):
        fn = _merge("2" if spec.endswith("base-2") else "e")
        sig, controls = inspect_controls(fn, ())
        return Target(spec, NAME, fn, sig, controls, declares=dict(fn.__probe_declares__))
    if spec.endswith("-triton:merge_attn_states"):
        from metax_audit.probes.families.vllm_ops import load_merge

        return load_merge(spec, ctx, NAME)
    from metax_audit.probes.families._flashinfer import import_flashinfer, require_cuda, signature_text

    require_cuda(ctx.device)
    fi = import_flashinfer()
    sig, controls = inspect_controls(fi.merge_state, ())
    return Target(spec, NAME, fi.merge_state, sig, controls, declares={"merge_base": "2"},
                  notes=(f"inspected: {signature_text(fi.merge_state, 'flashinfer.merge_state')}",))


def load_local(spec: str, ctx: ProbeContext) -> Target:
    sig, controls = inspect_controls(reference_local_seq_lens, ())
    return Target(spec, LOCAL_LENS, reference_local_seq_lens, sig, controls)


FAMILIES = (
    FamilySpec(name=NAME, convention=CONVENTION, load=load, builtin_targets=BUILTIN),
    FamilySpec(name=LOCAL_LENS, convention=LOCAL_LENS_CONVENTION, load=load_local, builtin_targets=("torch-reference",)),
)

#!/bin/sh
# Second device command: vLLM's and the port's Triton decode/merge ops, loaded from carried source
# trees (.srcs, never committed), probed alone and paired with FlashInfer 0.2.6 for the DCP merge.
set -u
OUT=${OUT:-reports/probes/triton}
SITE=${SITE:-$HOME/site}
python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" .whl/flashinfer_python-0.2.6.post1.tar.gz || exit 3
export PYTHONPATH="$PWD:$SITE:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0 \
  PYTORCH_NVCC="$PWD/benchmarks/gpu/nvcc_wrap.sh" \
  METAX_AUDIT_VLLM_SOURCE="${METAX_AUDIT_VLLM_SOURCE:-$PWD/.srcs/vllm-0.26.0}" METAX_AUDIT_PORT_SOURCE="${METAX_AUDIT_PORT_SOURCE:-$PWD/.srcs/port}"
FI=flashinfer:BatchDecodeWithPagedKVCacheWrapper
start=$(date +%s)
timeout "${PROBE_BUDGET_S:-500}" python3 -m metax_audit.stages.probing --device cuda --timeout 240 --out "$OUT" \
  --target vllm-triton:decode_attention_fwd@paged-decode --target port-triton:decode_attention_fwd@paged-decode \
  --extra "vllm-triton:merge_attn_states|merge-states|lse" \
  --extra "vllm-triton:merge_attn_states|merge-states|dcp|producer=vllm-triton:decode_attention_fwd" \
  --extra "vllm-triton:merge_attn_states|merge-states|dcp|producer=$FI" \
  --extra "port-triton:decode_attention_fwd|paged-decode|dcp|merge=vllm-triton:merge_attn_states" \
  --extra "$FI|paged-decode|dcp|merge=vllm-triton:merge_attn_states" \
  "$@" 2>&1 | tee "$OUT/run.log"
echo "probe wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/run.log"

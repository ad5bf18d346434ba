#!/bin/sh
# One device call for issue #18: FlashInfer 0.2.6 from the carried sdist; `metax-audit probe --backend
# flashinfer` cold (empty JIT cache) and warm, timed; the port's and vLLM's Triton ops (port files through
# the MACA launch-option shim, sources carried in .srcs, never committed) and the GPU graph-capture
# host-sync checks; the GPU tests. Everything lands in one tarball under $OUT (the tool returns 8 files).
set -u
DEST=${OUT:-/tmp/out}
W=$HOME/work
SITE=$HOME/site
mkdir -p "$W" "$DEST"
t0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" .whl/flashinfer_python-0.2.6.post1.tar.gz >"$W/pip.log" 2>&1 \
  || { tail -5 "$W/pip.log"; exit 3; }
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0 \
  PYTORCH_NVCC="$PWD/benchmarks/gpu/nvcc_wrap.sh" METAX_AUDIT_VLLM_SOURCE="$PWD/.srcs/vllm-0.26.0" \
  METAX_AUDIT_PORT_SOURCE="$PWD/.srcs/port"
echo "install seconds: $(( $(date +%s) - t0 ))" | tee "$W/timing.txt"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv >"$W/nvidia-smi.txt" 2>&1
for phase in cold warm; do
  s=$(date +%s%N)
  timeout "${PHASE_S:-240}" python3 -m metax_audit probe --backend flashinfer --device cuda --output-dir "$W/$phase" >"$W/$phase.log" 2>&1
  rc=$?
  echo "probe --backend flashinfer $phase: rc=$rc wall=$(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a "$W/timing.txt"
  tail -3 "$W/$phase.log"
done
FI=flashinfer:BatchDecodeWithPagedKVCacheWrapper
WV=metax_audit.probes.wrong_variants
s=$(date +%s%N)
timeout "${TRITON_S:-200}" python3 -m metax_audit.stages.probing --device cuda --timeout 150 --out "$W/triton" \
  --target port-triton:decode_attention_fwd@paged-decode --target vllm-triton:decode_attention_fwd@paged-decode \
  --extra "port-triton:merge_attn_states|merge-states|lse" \
  --extra "port-triton:merge_attn_states|merge-states|dcp|producer=port-triton:decode_attention_fwd" \
  --extra "port-triton:merge_attn_states|merge-states|dcp|producer=$FI" \
  --extra "port-triton:decode_attention_fwd|paged-decode|dcp|merge=port-triton:merge_attn_states" \
  --extra "$WV:HostSyncDecode()|paged-decode|graph-capture" \
  --extra "$WV:h2d_scale_decode|paged-decode|graph-capture" >"$W/triton.log" 2>&1
echo "triton rc=$? wall=$(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a "$W/timing.txt"
timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -rs tests/test_probes_gpu.py >"$W/pytest-gpu.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$W/timing.txt"
tail -3 "$W/pytest-gpu.log"
tar czf "$DEST/results.tgz" -C "$W" . && cp "$W/timing.txt" "$DEST/"

#!/bin/sh
# The device command: install FlashInfer 0.2.6 from the carried sdist, point its JIT at the nvcc
# wrapper, run every probe of the flashinfer backend plus the DCP pairings, write MD + JSON to $OUT.
set -u
OUT=${OUT:-reports/probes}
SITE=${SITE:-$HOME/site}
python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" .whl/flashinfer_python-0.2.6.post1.tar.gz || exit 3
export PYTHONPATH="$PWD:$SITE:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0 \
  PYTORCH_NVCC="$PWD/benchmarks/gpu/nvcc_wrap.sh"
start=$(date +%s)
timeout "${PROBE_BUDGET_S:-520}" python3 -m metax_audit.stages.probing --backend flashinfer --device cuda --timeout 240 --out "$OUT" \
  --extra "flashinfer:BatchDecodeWithPagedKVCacheWrapper|paged-decode|dcp|merge=flashinfer:merge_state" \
  --extra "flashinfer:merge_state|merge-states|dcp|producer=flashinfer:BatchDecodeWithPagedKVCacheWrapper" \
  "$@" 2>&1 | tee "$OUT/run.log"
echo "probe wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/run.log"

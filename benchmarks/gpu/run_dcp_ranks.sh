#!/bin/sh
# Issue #21 device command: the dcp probe across real ranks, FlashInfer 0.2.6 decode as producer, each
# reduction (torch reference both bases, vLLM's cp_lse_ag_out_rs and dcp_a2a_lse_reduce both bases, the
# port's configured combine), interleave 1 and 8. WORLD ranks (default 2) with BACKEND (default nccl, one GPU
# per rank; on a one-GPU machine BACKEND=gloo runs the ranks over that GPU's tensors). Results in one tarball.
set -u
DEST=${OUT:-/tmp/out}
W=$HOME/work
SITE=$HOME/site
N=${WORLD:-2}
B=${BACKEND:-nccl}
mkdir -p "$W" "$DEST"
python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" .whl/flashinfer_python-0.2.6.post1.tar.gz >"$W/pip.log" 2>&1 \
  || { tail -5 "$W/pip.log"; exit 3; }
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0 \
  PYTORCH_NVCC="$PWD/benchmarks/gpu/nvcc_wrap.sh" METAX_AUDIT_VLLM_SOURCE="$PWD/.srcs/vllm-0.26.0" \
  METAX_AUDIT_PORT_SOURCE="$PWD/.srcs/port" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv >"$W/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >>"$W/nvidia-smi.txt" 2>&1
FI=flashinfer:BatchDecodeWithPagedKVCacheWrapper
O="world_size=$N;backend=$B"
s=$(date +%s%N)
timeout "${DCP_S:-400}" python3 -m metax_audit.stages.probing --device cuda --timeout 300 --out "$W/dcp-ranks" \
  --extra "torch-reference|paged-decode|dcp|$O;reduction=torch-reference:base-e" \
  --extra "$FI|paged-decode|dcp|$O;reduction=torch-reference:base-e" \
  --extra "$FI|paged-decode|dcp|$O;reduction=torch-reference:base-2" \
  --extra "$FI|paged-decode|dcp|$O;reduction=vllm:cp_lse_ag_out_rs" \
  --extra "$FI|paged-decode|dcp|$O;reduction=vllm:cp_lse_ag_out_rs:base-2" \
  --extra "$FI|paged-decode|dcp|$O;reduction=port:flashinfer-dcp-combine" \
  --extra "$FI|paged-decode|dcp|$O;reduction=vllm:dcp_a2a_lse_reduce" \
  --extra "$FI|paged-decode|dcp|$O;reduction=vllm:dcp_a2a_lse_reduce:base-2" >"$W/dcp-ranks.log" 2>&1
echo "dcp-ranks world=$N backend=$B rc=$? wall=$(( ($(date +%s%N) - s) / 1000000 )) ms" | tee "$W/timing.txt"
cut -c1-300 "$W/dcp-ranks.log"
tar czf "$DEST/results.tgz" -C "$W" . && cp "$W/timing.txt" "$DEST/"

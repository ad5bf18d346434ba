#!/bin/sh
# One device call for the H2O kernel: install FlashInfer 0.2.6 (carried sdist, JIT through the nvcc
# wrapper), the h2o tests (GPU ones included), then the correctness grid, the h2o probe and the
# benchmark; results land in $1 (or $OUT).
set -u
DEST=${1:-${OUT:-reports/h2o}}
mkdir -p "$DEST"
if [ -f .whl/flashinfer_python-0.2.6.post1.tar.gz ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --target "$HOME/site" .whl/flashinfer_python-0.2.6.post1.tar.gz \
    >"$DEST/pip.log" 2>&1 || echo "flashinfer install failed (see pip.log)"
fi
export PYTHONPATH="$HOME/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0 PYTORCH_NVCC="$PWD/benchmarks/gpu/nvcc_wrap.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${H2O_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider -rs tests/test_h2o_gpu.py tests/test_h2o_reference.py tests/test_h2o_probe.py \
    2>&1 | tee "$DEST/pytest.log" | tail -5
fi
python3 benchmarks/h2o_bench.py --out "$DEST" ${H2O_ARGS:---grid --probe --bench --tune} 2>&1 | tee "$DEST/run.log"

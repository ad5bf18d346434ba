#!/bin/sh
# CUDA 13 nvcc makes template kernel stubs static by default, which breaks FlashInfer 0.2.6 JIT
# links (undefined reference to ...Kernel); turn that off and pass everything else through.
exec /usr/local/cuda/bin/nvcc -static-global-template-stub=false "$@"

#!/usr/bin/env bash
# Builds benchmarks/cutlass/libdare_gemm.so (Hopper, sm_90a) on any x86-64 Linux machine, with or without a GPU.
#
#   bash benchmarks/cutlass/build.sh [TOOLS_DIR]
#
# The CUDA 13 compiler, runtime headers and CUTLASS's headers come from PyPI wheels (nvidia-cuda-nvcc,
# nvidia-cuda-crt, nvidia-nvvm, nvidia-cuda-runtime, nvidia-cuda-cccl, nvidia-cutlass), installed into TOOLS_DIR
# (default: build/cutlass-tools) unless already there. The library links the CUDA runtime statically and has a C
# interface, so it does not depend on the PyPI torch build. About a minute per variant on one core.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="${1:-$here/../../build/cutlass-tools}"
if [ ! -x "$tools/nvidia/cu13/bin/nvcc" ]; then
  python -m pip install -q --no-deps --target "$tools" "nvidia-cuda-nvcc>=13,<13.1" "nvidia-cuda-crt>=13,<13.1" \
    "nvidia-nvvm>=13,<13.1" "nvidia-cuda-runtime>=13,<13.1" "nvidia-cuda-cccl>=13,<13.1" "nvidia-cutlass==4.2.0.0"
fi
cuda="$tools/nvidia/cu13"
cutlass="$tools/cutlass_library/source"
export PATH="$cuda/bin:$PATH"
variants=$(grep -c '^DARE_VARIANT(' "$here/dare_gemm.cu")
objs="$here/../../build/cutlass-objs"
mkdir -p "$objs"
seq 0 $((variants - 1)) | xargs -P "$(nproc)" -I{} nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr \
  -DNDEBUG -DDARE_ONLY={} -Xcompiler -fPIC -c -I"$cutlass/include" -I"$cutlass/tools/util/include" \
  "$here/dare_gemm.cu" -o "$objs/variant{}.o"
# the objects of this source's variants only (a folder left from a longer list keeps more)
nvcc -shared -arch=sm_90a -cudart static -L"$cuda/lib" -o "$here/libdare_gemm.so" \
  $(seq -f "$objs/variant%g.o" 0 $((variants - 1)))
echo "built $here/libdare_gemm.so ($variants variants)"

#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-quantize (the benchmark's peer) from the llama.cpp
# tree vendored in the llama-cpp-python==0.3.36 sdist: CPU backend, -DGGML_NATIVE=ON.
# Usage: bash bench/peers/build_llama_cpp.sh [WORK_DIR]   (default: build-peers/, git-ignored)
# LLAMA_ISA=avx2: a second build for AVX2 only (-DGGML_NATIVE=OFF, AVX/AVX2/FMA/F16C on, AVX-512
# off) in WORK_DIR/build-avx2, the peer of Kiln's AVX2 build (KILN_CPU_ISA=avx2).
# Prints the bin folder at the end; nothing of llama.cpp is ever committed.
set -euo pipefail
VERSION=0.3.36
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-$ROOT/build-peers}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$WORK"
cd "$WORK"
SDIST="llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  # the sdist only (its build dependencies may come as wheels: nothing is built here by pip)
  "$PY" -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d .
fi
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar xzf "$SDIST"
JOBS="${JOBS:-$(nproc)}"
# On a CPU with AMX, -march=native compiles ggml's AMX matmul, which crashed llama-server
# (SIGSEGV in ggml_backend_amx_mul_mat, the first decode of the default model's Q4_1 and of
# Q4_K_M; BF16 ran) on a 2-core Xeon VM, 2026-12-02. There it is built without AMX, keeping the
# AVX-512 kernels and weight repacking (--no-repack also avoids the crash, but drops repacking
# too, a slower peer). LLAMA_AMX=1 keeps AMX.
NO_AMX=""
if [ "${LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
BUILD="$WORK/build"
ISA_FLAGS=(-DGGML_NATIVE=ON)
if [ "${LLAMA_ISA:-native}" = avx2 ]; then
  BUILD="$WORK/build-avx2"
  NO_AMX=""
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
             -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
             -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
             -DGGML_AMX_BF16=OFF -DGGML_BMI2=ON)
fi
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build "$BUILD" -j "$JOBS" --target llama-server llama-quantize
echo "$BUILD/bin"

#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-quantize (the benchmark's peer) from the llama.cpp
# tree vendored in the llama-cpp-python==0.3.36 sdist: CPU backend, -DGGML_NATIVE=ON.
# Usage: bash bench/peers/build_llama_cpp.sh [WORK_DIR]   (default: build-peers/, git-ignored)
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
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build "$WORK/build" -j "$JOBS" --target llama-server llama-quantize
echo "$WORK/build/bin"

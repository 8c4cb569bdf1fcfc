#!/usr/bin/env bash
# The default model (SmolLM2-135M-Instruct, its GGUF's Q4_1 weights) requantized by llama.cpp's
# llama-quantize (bench/peers/build_llama_cpp.sh) into build-peers/models/: Q4_K_M, Q5_K_M,
# Q6_K, Q8_0, F16, BF16, IQ4_XS, IQ4_NL (--allow-requantize: from the Q4_1 weights, the only ones the package
# ships). The BF16 file is also the source of the HF folder: python -m bench.peers.hf_folder.
# Usage: bash bench/peers/requantize.sh [TYPE ...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PEERS="${PEERS:-$ROOT/build-peers}"
QUANTIZE="${QUANTIZE:-$PEERS/build/bin/llama-quantize}"  # any build of it: the files are the same
PY="${PYTHON:-$ROOT/.venv/bin/python}"
SRC="$("$PY" -c 'from kiln.model.checkpoint.locate import default_model_path; print(default_model_path())')"
mkdir -p "$PEERS/models"
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_K_M Q5_K_M Q6_K Q8_0 F16 BF16 IQ4_XS IQ4_NL)
for t in "${TYPES[@]}"; do
  out="$PEERS/models/smollm2-135m-$t.gguf"
  [ -f "$out" ] || "$QUANTIZE" --allow-requantize "$SRC" "$out" "$t" "${JOBS:-2}"
  echo "$out"
done

#!/usr/bin/env bash
# One prepared GPU session (issue 8): build, check and time the Triton kernels natively.
# Run it on a lent CUDA machine from the repository root:  bash bench/device/run_gpu_checks.sh
# It writes everything under ${OUT:-bench/results/device}. Model weights never travel: the
# kernel benchmarks use random tensors of real shapes created here.
set -euo pipefail
OUT="${OUT:-bench/results/device}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q torch triton
  .venv/bin/python -m pip install -q --no-deps -e .
  .venv/bin/python -m pip install -q numpy msgspec pytest hypothesis
fi
.venv/bin/python - <<'PY' | tee "$OUT/device.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0))
PY
# native kernel tests (the gpu-marked ones run only here), then the timings
.venv/bin/python -m pytest -q tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/kernel_tests.txt"
.venv/bin/python -m bench.kernels.bench_kernels --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.txt"

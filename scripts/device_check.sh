#!/usr/bin/env bash
# One call on the GPU device machine: the gpu-marked tests, then the model benchmark.
# Usage there (from the repo root, .devcache carried):  bash scripts/device_check.sh MODELS PEERS
# Logs and the benchmark JSON go to $OUT (the device tool brings them back).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
source .devcache/activate.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "editable install failed"
export TILELANG_LOG_LEVEL=WARNING PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, tilelang; print('torch', torch.__version__, 'tilelang', tilelang.__version__)" | tee -a "$out/device.txt"
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -n 8 -rP -p no:cacheprovider -p no:logging > "$out/gpu_tests.log" 2>&1
grep -E "^\[|passed|failed|^FAILED|^ERROR" "$out/gpu_tests.log" | tail -40
timeout "${BENCH_S:-200}" python3 bench/bench_models.py --models "${1:-gpt2,mlp}" --peers "${2:-eager,default,reduce-overhead}" \
    --reps 30 --json "$out/bench.json" 2>&1 | grep -v "TileLang:" > "$out/bench.log"
tail -30 "$out/bench.log"

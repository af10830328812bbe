#!/usr/bin/env bash
# What is written and not yet measured, in one device call of under 10 minutes (the device README's limit):
#   part 1: the held-out Hugging Face models at default settings (the ws GEMM and causal pair_rows now default)
#           against Inductor default in the same process; then the 2:4 ws GEMM's wrong case taken apart
#           (diag_gemm_ws.py --sparse-probe: K, rounds and the epilogue varied one at a time).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 1   (logs and JSON under $OUT)
# (Session 22's earlier parts, now measured: bench/results/2026-12-03-h200-session22.)
set -u
part=${1:-1}
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT"
export TILEFUSE_QUIET=1
quiet() { grep -v "Warn\|__version__\|builder:WARN"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt"
python3 -c "import torch, tilelang, transformers; print(torch.__version__, tilelang.__version__, transformers.__version__)" \
    >> "$OUT/device.txt" 2>/dev/null
if [ "$part" = 1 ]; then
    timeout 200 python3 bench/bench_models.py --models hf-gpt2,hf-bert,hf-vit,hf-llama --peers default --no-warm \
        --reps 30 --json "$OUT/heldout_default.json" > "$OUT/heldout_default.log" 2>&1
    grep -hE "^model|^hf-" "$OUT/heldout_default.log" | head -20
    timeout 60 python3 bench/diag_gemm_ws.py --sparse-probe 2>&1 | quiet > "$OUT/sparse_probe.log"
    grep -v "^\s*$" "$OUT/sparse_probe.log" | cut -c1-230 | tail -12
fi

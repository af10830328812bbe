#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first (session 25's results: bench/results/2026-12-03-h200-session25):
#   part 1: where the cold lower step's seconds go on the device machine (bench/diag_lower.py: nvcc's phases, host
#           links, fsyncs; the MLP's lower took 7.3 s there against 4.0 s on the 2-core CPU machine), then every zoo
#           model with no options against Inductor default in the same process, kernel categories beside (#13's
#           default bar; MLP, LLaMA, ResNet and BERT last measured on 2026-12-01, before the ws GEMM default;
#           GPT-2 and ViT passed in session 22).
#   part 2: the 2:4 ws GEMM's speed with no product in flight (bench/proto_gemm_sp_ws.py, #20), then the default
#           compile against Inductor's for the MLP and GPT-2 (bench/compile_time.py).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 1|2   (logs and JSON under $OUT, tarred into one file)
set -u
part=${1:-1}
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT/logs"
export TILEFUSE_QUIET=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/logs/device.txt"
python3 -c "import torch, tilelang, transformers; print(torch.__version__, tilelang.__version__, transformers.__version__)" \
    >> "$OUT/logs/device.txt" 2>/dev/null
cat COMMIT >> "$OUT/logs/device.txt" 2>/dev/null  # (the snapshot's commit, written beside it)
compile_time() {  # models, timeout per child, whole timeout, name
    timeout "$3" python3 bench/compile_time.py --models "$1" --compilers tilefuse,inductor --timeout "$2" \
        --out "$OUT/logs/$4.json" > "$OUT/logs/$4.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/$4.log"; grep '^{' "$OUT/logs/$4.log" | cut -c1-260
}
zoo() {  # models, whole timeout, name
    timeout "$2" python3 bench/bench_models.py --models "$1" --peers default --no-warm --reps 30 \
        --json "$OUT/logs/$3.json" > "$OUT/logs/$3.log" 2>&1
    grep -E "^  [a-z0-9]+: |^model |^[a-z0-9]+ +[0-9t]" "$OUT/logs/$3.log" \
        | cut -c1-220 | head -60
}
if [ "$part" = 1 ]; then
    timeout 100 python3 bench/diag_lower.py --models mlp,gpt2 --timeout 45 --out "$OUT/logs" \
        > "$OUT/logs/diag_lower.log" 2>&1
    head -50 "$OUT/logs/diag_lower.log"
    zoo mlp,llama,resnet,bert 390 zoo_default_a
elif [ "$part" = 2 ]; then
    timeout 200 python3 bench/proto_gemm_sp_ws.py --json "$OUT/logs/gemm_sp_ws.json" > "$OUT/logs/gemm_sp_ws.log" 2>&1
    grep -v "Warn\|WARN\|warn" "$OUT/logs/gemm_sp_ws.log" | tail -40
    compile_time mlp,gpt2 120 260 compile_time_mlp_gpt2
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

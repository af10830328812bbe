#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 29's:
# bench/results/2026-12-04-h200-session29, parts 11-14).
#   part 13: the ws GEMM in 2-CTA clusters with B multicast (gemm(cluster=2), written in session 29, never run): its GPU
#            numerics, then at the zoo's GEMM-bound shapes against the plain schedule and cuBLAS (the MLP's fc2 runs
#            at 0.93-0.99x cuBLAS, which uses 1x2 clusters there). If a cluster's time doubles, suspect residency: the
#            persistent grid assumes 66 co-resident 2-CTA clusters (cudaOccupancyMaxActiveClusters may say fewer).
#   part 11: the GPU tests this session's fast forms touch beyond the ws GEMM's (the templates', Hugging Face models'),
#            then held-out Hugging Face models with no options (not sampled since the fast forms changed: session 29).
#   part 12: the 2:4 ws GEMM against cuSPARSELt (#20; unchanged since session 27, its epilogue still exact), and
#            LLaMA's and ResNet-50's compile time against Inductor's in fresh processes (#13's compile bar).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 13|11|12   (logs and JSON under $OUT, tarred into one file)
set -u
part=${1:-13}
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
if [ "$part" = 11 ]; then
    for t in tests/test_templates_gpu.py tests/test_hf_models.py; do
        name=$(basename $t .py | sed 's/^test_//')
        timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider $t > "$OUT/logs/gpu_tests_$name.log" 2>&1
        echo "$name: $(tail -1 "$OUT/logs/gpu_tests_$name.log")"
        grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_$name.log" | head -5
    done
    timeout 300 python3 bench/bench_models.py --models hf-gpt2,hf-bert,hf-vit,hf-llama --peers eager,default \
        --no-warm --reps 30 --json "$OUT/logs/heldout_default.json" > "$OUT/logs/heldout_default.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/heldout_default.log" | cut -c1-220 | head -40
elif [ "$part" = 12 ]; then
    timeout 140 python3 bench/proto_gemm_sp_ws.py --json "$OUT/logs/gemm_sp_ws.json" > "$OUT/logs/gemm_sp_ws.log" 2>&1
    grep -v "Warn\|WARN\|warn" "$OUT/logs/gemm_sp_ws.log" | tail -40
    compile_time llama,resnet 150 330 compile_time
elif [ "$part" = 13 ]; then
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k "clusters_gpu" \
        > "$OUT/logs/gpu_tests_gemm_ws_cluster.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_gemm_ws_cluster.log"
    for ep in residual:8192x4096x16384,8192x2048x8192 gelu:8192x16384x4096 silu_mul:8192x8192x2048; do
        timeout 110 python3 bench/proto_gemm_ws.py --ws-only --cluster --epilogue ${ep%%:*} --shapes ${ep#*:} \
            --json "$OUT/logs/gemm_ws_cluster_${ep%%:*}.json" > "$OUT/logs/gemm_ws_cluster_${ep%%:*}.log" 2>&1
        grep -v -i "warn" "$OUT/logs/gemm_ws_cluster_${ep%%:*}.log" | tail -18
    done
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

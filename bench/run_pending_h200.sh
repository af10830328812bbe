#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first:
#   part 1: the GPU tests of the unmeasured schedules (a turn, a Q buffer or a store that never comes would hang,
#           hence the timeouts): attention_ws's pingpong / pair_rows / late_store / double_q, gemm(ws=True) and
#           gemm_sp(ws=True); then bench_attention.py's variants sweep (each option alone and all together, cuDNN and
#           flash in the process).
#   part 2: the warp-specialized GEMM prototypes, dense (cooperative, ping-pong) and 2:4, against cuBLAS, torch 2:4
#           and the templates' leaders; zoo GPT-2 and ViT with and without TILEFUSE_EXPERIMENTAL (Inductor default in
#           the same process).
#   part 3: the 2:4 models (bench_sparse_models.py) with and without TILEFUSE_EXPERIMENTAL=gemm_sp_ws, and where a
#           cold default compile goes (profile_compile.py --cold, ViT).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 1|2|3   (logs and JSON under $OUT)
set -u
part=${1:-1}
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT"
export TILEFUSE_QUIET=1
quiet() { grep -v "Warn\|__version__\|builder:WARN"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt"
python3 -c "import torch, tilelang; print(torch.__version__, tilelang.__version__)" >> "$OUT/device.txt" 2>/dev/null
if [ "$part" = 4 ]; then  # session 22: the fixed GEMM references, pair_rows as the causal default, the prototypes
    timeout 200 python3 -m pytest -q -m gpu tests/test_gemm_ws.py tests/test_attention_ws.py tests/test_attention.py \
        -n 14 -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -15
    grep -E "^E  +(Mismatch|Greatest|AssertionError)|Error:|: Tensor" "$OUT/gpu_tests.txt" | head -30
    timeout 110 python3 bench/proto_gemm_ws.py --json "$OUT/gemm_ws.json" 2>&1 | quiet > "$OUT/gemm_ws.log"
    timeout 100 python3 bench/proto_gemm_sp_ws.py --json "$OUT/gemm_sp_ws.json" 2>&1 | quiet > "$OUT/gemm_sp_ws.log"
    grep -vE "^\s*$" "$OUT/gemm_ws.log" "$OUT/gemm_sp_ws.log" | cut -c1-200 | tail -60
elif [ "$part" = 5 ]; then  # session 22: every ws GEMM case's numerics; zoo models with the ws GEMM
    timeout 130 python3 bench/diag_gemm_ws.py 2>&1 | quiet > "$OUT/diag_gemm_ws.log"; grep -v "^\s*$" "$OUT/diag_gemm_ws.log" | cut -c1-230
    timeout 170 python3 bench/bench_models.py --models gpt2,vit --peers default --no-warm --reps 30 \
        --json "$OUT/models_default.json" > "$OUT/models_default.log" 2>&1
    TILEFUSE_EXPERIMENTAL=gemm_ws timeout 170 python3 bench/bench_models.py --models gpt2,vit --peers default \
        --no-warm --reps 30 --json "$OUT/models_gemm_ws.json" > "$OUT/models_gemm_ws.log" 2>&1
    grep -hE "^\||^model|^(gpt2|vit) " "$OUT/models_default.log" "$OUT/models_gemm_ws.log" | head -30
elif [ "$part" = 1 ]; then
    timeout 240 python3 -m pytest -q -m gpu tests/test_attention_ws.py tests/test_gemm_ws.py -n 14 \
        -p no:cacheprovider 2>&1 | tail -12 | tee "$OUT/gpu_tests_ws.txt"
    timeout 240 python3 bench/bench_attention.py --shapes sweep --configs variants --json "$OUT/attn_variants.json" \
        2>&1 | quiet > "$OUT/attn_variants.log"; grep "^|" "$OUT/attn_variants.log"
elif [ "$part" = 2 ]; then
    timeout 110 python3 bench/proto_gemm_ws.py --json "$OUT/gemm_ws.json" 2>&1 | quiet > "$OUT/gemm_ws.log"
    timeout 100 python3 bench/proto_gemm_sp_ws.py --json "$OUT/gemm_sp_ws.json" 2>&1 | quiet > "$OUT/gemm_sp_ws.log"
    grep -E "cuBLAS|x cuBLAS" "$OUT/gemm_ws.log" "$OUT/gemm_sp_ws.log" | cut -c1-170
    all=gemm_ws,attention_late_store,attention_pingpong,attention_double_q
    timeout 170 python3 bench/bench_models.py --models gpt2,vit --peers default --no-warm --reps 30 \
        --json "$OUT/models_default.json" > "$OUT/models_default.log" 2>&1
    TILEFUSE_EXPERIMENTAL=$all timeout 170 python3 bench/bench_models.py --models gpt2,vit --peers default \
        --no-warm --reps 30 --json "$OUT/models_experimental.json" > "$OUT/models_experimental.log" 2>&1
    grep -hE "^\|" "$OUT/models_default.log" "$OUT/models_experimental.log" | head -30
else
    timeout 200 python3 bench/bench_sparse_models.py --json "$OUT/sparse_models.json" > "$OUT/sparse_models.log" 2>&1
    TILEFUSE_EXPERIMENTAL=gemm_sp_ws timeout 200 python3 bench/bench_sparse_models.py \
        --json "$OUT/sparse_models_ws.json" > "$OUT/sparse_models_ws.log" 2>&1
    grep -hE "^\|" "$OUT/sparse_models.log" "$OUT/sparse_models_ws.log" | head -20
    timeout 120 python3 bench/profile_compile.py --model vit --tune none --cold --top 25 > "$OUT/compile_vit.log" 2>&1
    head -40 "$OUT/compile_vit.log"
fi

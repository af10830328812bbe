#!/usr/bin/env bash
# What is written and not yet measured, in one device call (about 8 minutes), as the device README asks:
#   1. the attention schedule options' GPU tests (pingpong, pair_rows, late_store: a turn, a Q buffer or a store that
#      never comes would hang, hence the timeout) and the ws suite;
#   2. bench_attention.py's variants sweep (each option alone and all together, cuDNN and flash in the process);
#   3. the warp-specialized GEMM prototypes, dense and 2:4 (bench/proto_gemm_ws.py, bench/proto_gemm_sp_ws.py);
#   4. where a cold default compile goes (bench/profile_compile.py --cold, ViT).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh   (logs and JSON under $OUT)
set -u
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT"
export TILEFUSE_QUIET=1
quiet() { grep -v "Warn\|__version__\|builder:WARN"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt"
python3 -c "import torch, tilelang; print(torch.__version__, tilelang.__version__)" >> "$OUT/device.txt" 2>/dev/null
timeout 150 python3 -m pytest -q -m gpu tests/test_attention_ws.py -n 14 -p no:cacheprovider 2>&1 | tail -5 \
    | tee "$OUT/gpu_tests_attention_ws.txt"
timeout 200 python3 bench/bench_attention.py --shapes sweep --configs variants --json "$OUT/attn_variants.json" 2>&1 \
    | quiet > "$OUT/attn_variants.log"; grep "^|" "$OUT/attn_variants.log"
timeout 100 python3 bench/proto_gemm_ws.py --json "$OUT/gemm_ws.json" 2>&1 | quiet > "$OUT/gemm_ws.log"
timeout 100 python3 bench/proto_gemm_sp_ws.py --json "$OUT/gemm_sp_ws.json" 2>&1 | quiet > "$OUT/gemm_sp_ws.log"
grep -E "cuBLAS|x cuBLAS" "$OUT/gemm_ws.log" "$OUT/gemm_sp_ws.log" | cut -c1-160
timeout 120 python3 bench/profile_compile.py --model vit --tune none --cold --top 25 > "$OUT/compile_vit.log" 2>&1
head -40 "$OUT/compile_vit.log"

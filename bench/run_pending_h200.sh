#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first (session 24's results: bench/results/2026-12-03-h200-session24):
#   part 1: correctness first: the attention GPU tests with pair_rows the causal default (session 22 made it so; not
#           yet run there), and the ws GEMM's GPU tests with the 2:4 schedule's no-product-in-flight default.
#   part 2: the default compile against Inductor default's, each compiler in a fresh process of its own, cold then
#           warm caches (bench/compile_time.py), with each kernel linked where it is compiled (lowering.compile.
#           link_now; before it, session 25 measured ResNet 47.7 s against 17.4, ViT 16.0 against 11.7, LLaMA 25.2
#           against 21.5, each timing's first call 22.4, 5.1 and 6.1 s of it): ResNet, ViT, GPT-2, MLP.
#   part 4: where the measured choice's first calls go (bench/diag_first_call.py) on ResNet-50 and ViT: part 2
#           found them 22.4 of ResNet's 47.7 s cold compile and 5.1 of ViT's 16.0 s.
#   part 3: the same for MLP, GPT-2 and BERT, then the tuned compile (tune="fast") against max-autotune on the MLP
#           (26.7 s against 19.0 in session 24).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 1|2|3|4   (logs and JSON under $OUT, tarred into one file)
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
if [ "$part" = 1 ]; then
    timeout 330 python3 -m pytest -q -m gpu tests/test_attention.py tests/test_attention_ws.py -n 8 \
        -p no:cacheprovider > "$OUT/logs/gpu_tests_attention.txt" 2>&1
    grep -E "^(FAILED|ERROR|XPASS)|passed|failed" "$OUT/logs/gpu_tests_attention.txt" | tail -12
    timeout 200 python3 -m pytest -q -m gpu tests/test_gemm_ws.py -n 8 -p no:cacheprovider \
        > "$OUT/logs/gpu_tests_gemm_ws.txt" 2>&1
    grep -E "^(FAILED|ERROR|XPASS)|passed|failed" "$OUT/logs/gpu_tests_gemm_ws.txt" | tail -12
elif [ "$part" = 4 ]; then
    timeout 400 python3 bench/diag_first_call.py --models resnet,vit --timeout 190 --out "$OUT/logs" \
        > "$OUT/logs/diag_first_call.log" 2>&1
    grep -v "Warn\|builder:WARN" "$OUT/logs/diag_first_call.log" | head -70
elif [ "$part" = 2 ]; then
    compile_time resnet,vit,gpt2,mlp 150 560 compile_time_resnet_vit_gpt2_mlp
else
    compile_time mlp,gpt2,bert 120 400 compile_time_mlp_gpt2_bert
    timeout 130 python3 bench/compile_time.py --models mlp --compilers tilefuse-tuned,inductor-max-autotune \
        --timeout 120 --out "$OUT/logs/compile_time_tuned.json" > "$OUT/logs/compile_time_tuned.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/compile_time_tuned.log"
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 29's:
# bench/results/2026-12-04-h200-session29, parts 11-14; session 30's: 2026-12-04-h200-session30, part 13).
#   part 15: the ws GEMM's sliced epilogue (gemm(slice_N=), session 30): the GPU numerics of the schedule's options
#            (2-CTA clusters, slices of 64 and 32 columns), then its configs (a 4th stage of 128 x 256, a 6th of
#            128 x 128) beside the seeds at the zoo's GEMM shapes, against cuBLAS.
#   part 16: the sliced seed at short K (gemm_ws.seeds: 128 x 256 x 4, slice_N 64, where K <= 1024 and no full-size
#            extra is staged; fitted to one shape, BERT's fc1): the sweep at the zoo's K <= 1024 shapes, GELU and bias
#            epilogues, then BERT, GPT-2 and ViT with no options against Inductor default.
#   part 17: the sliced seed narrowed to epilogues with a special function (GELU): BERT, GPT-2, ViT with no options
#            against Inductor default, then part 11's GPU tests (the templates', the Hugging Face models').
#   part 18: held-out Hugging Face models with no options against eager and Inductor default (part 11's second half),
#            then the 2:4 ws GEMM against cuSPARSELt (part 12's first half).
#   part 19: the zoo's other three models (MLP, LLaMA, ResNet-50) with no options against Inductor default, at the
#            sliced seed's commit (none of their GEMMs takes it: K > 1024 or a staged extra).
#   part 20: compile time of the MLP and ResNet-50 (in-process 8.2 against 2.8 s, and 26.0 against 11.3 s for Inductor
#            default in part 19, #13's bar is 2x) in fresh processes, cold and warm.
#   part 11: the GPU tests this session's fast forms touch beyond the ws GEMM's (the templates', Hugging Face models'),
#            then held-out Hugging Face models with no options (not sampled since the fast forms changed: session 29).
#   part 12: the 2:4 ws GEMM against cuSPARSELt (#20; unchanged since session 27, its epilogue still exact), and
#            LLaMA's and ResNet-50's compile time against Inductor's in fresh processes (#13's compile bar).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 20|11|12   (logs and JSON under $OUT, tarred into one file)
set -u
part=${1:-20}
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
gpu_tests() {
    for t in tests/test_templates_gpu.py tests/test_hf_models.py; do
        name=$(basename $t .py | sed 's/^test_//')
        timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider $t > "$OUT/logs/gpu_tests_$name.log" 2>&1
        echo "$name: $(tail -1 "$OUT/logs/gpu_tests_$name.log")"
        grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_$name.log" | head -5
    done
}
if [ "$part" = 17 ]; then
    zoo bert,gpt2,vit 300 zoo_default_sliced_gelu
    gpu_tests
elif [ "$part" = 18 ]; then
    timeout 300 python3 bench/bench_models.py --models hf-gpt2,hf-bert,hf-vit,hf-llama --peers eager,default \
        --no-warm --reps 30 --json "$OUT/logs/heldout_default.json" > "$OUT/logs/heldout_default.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/heldout_default.log" | cut -c1-220 | head -40
    timeout 140 python3 bench/proto_gemm_sp_ws.py --json "$OUT/logs/gemm_sp_ws.json" > "$OUT/logs/gemm_sp_ws.log" 2>&1
    grep -v "Warn\|WARN\|warn" "$OUT/logs/gemm_sp_ws.log" | tail -40
elif [ "$part" = 19 ]; then
    zoo mlp,llama,resnet 330 zoo_default_other3
elif [ "$part" = 20 ]; then
    compile_time mlp,resnet 100 280 compile_time_mlp_resnet
elif [ "$part" = 11 ]; then
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
elif [ "$part" = 15 ]; then
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k "options_gpu" \
        > "$OUT/logs/gpu_tests_gemm_ws_options.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_gemm_ws_options.log"; grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_gemm_ws_options.log" | head -5
    for ep in residual:8192x4096x16384,8192x2048x8192,16384x768x3072 gelu:8192x16384x4096,16384x3072x768 \
              silu_mul:8192x8192x2048 bias:8192x8192x8192,8192x2304x768; do
        timeout 100 python3 bench/proto_gemm_ws.py --ws-only --sliced --epilogue ${ep%%:*} --shapes ${ep#*:} \
            --json "$OUT/logs/gemm_ws_sliced_${ep%%:*}.json" > "$OUT/logs/gemm_ws_sliced_${ep%%:*}.log" 2>&1
        grep -v -i "warn" "$OUT/logs/gemm_ws_sliced_${ep%%:*}.log" | tail -27 | sed 's/"block_//g; s/  \+/ /g'
    done
elif [ "$part" = 16 ]; then
    for ep in gelu:8192x3072x768,12608x3072x768,16384x3072x768,8192x4096x1024 \
              bias:8192x3072x768,16384x2304x768,16384x768x768,8192x50264x768; do
        timeout 120 python3 bench/proto_gemm_ws.py --ws-only --sliced --epilogue ${ep%%:*} --shapes ${ep#*:} \
            --json "$OUT/logs/gemm_ws_sliced_k768_${ep%%:*}.json" > "$OUT/logs/gemm_ws_sliced_k768_${ep%%:*}.log" 2>&1
        grep -v -i "warn" "$OUT/logs/gemm_ws_sliced_k768_${ep%%:*}.log" | tail -36 | sed 's/"block_//g; s/  \+/ /g' \
            | sed 's/ x alone [0-9.]*//; s/ err .*//'
    done
    zoo bert,gpt2,vit 300 zoo_default_sliced
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 30's:
# bench/results/2026-12-04-h200-session30, parts 13 and 15-20).
#   part 21 (pytest-xdist is on the device: -n spreads the compiles over its 16 cores): the 2:4 GEMM's GPU tests (session 30 gave its epilogue the dense template's fast sigmoid: the silu * up
#            cases' numerics), the template GEMM's GPU tests whole (session 30's call ran out of time at 21 passed, no failure), then the
#            sliced epilogue with a residual read where it lies against the staged one at long K (one sample in
#            session 30: 8192x2048x8192 0.3837 against 0.4017 ms), at LLaMA's down projection and the MLP's fc2.
#   part 23: session 31's attention schedules, written without a GPU (both opt-in until measured): the ws attention's
#            GPU tests (every variant: chain, the padding mask, the zoo BERT end to end), then BERT's padding mask
#            (bench_attention.py --shapes masked): the ws schedule with the mask (Options.experimental
#            "attention_masked"), with and without bound_keys (each batch's keys walked up to its last kept one),
#            plain and chained, against the TileLang-scheduled template (what masked attention runs today) and SDPA's
#            cuDNN and efficient backends. If a test fails, the schedule stays out of every default.
#   part 24: the chained schedule (flash_attention(ws=True, chain=True)) and nvcc's fast math (fast_math: each
#            exponent one ex2.approx.ftz) over the sweep's 13 shapes: plain, fast math, chained (+ late store, + fast
#            math) on the ws seeds, a 192-key tile and, at ViT's 197 tokens, one key tile (bench_attention.py --configs
#            chain), cuDNN and flash in the same process. What wins goes into the seeds (attention_configs.get_configs).
#   part 25: the zoo's BERT (its padding mask: masked, bounded, chained, fast math), GPT-2 and ViT (chained, fast
#            math), then held-out HF BERT and GPT-2 (ids only, no mask), with no options but
#            TILEFUSE_EXPERIMENTAL=attention_masked,attention_chain,attention_fast_math, against Inductor default in
#            the same process (session 30 without them: BERT 1.07-1.08x, GPT-2 1.08-1.12x, ViT 1.16-1.26x; HF BERT 1.61x, GPT-2 1.40x
#            the best peer). The measured choice still picks kernel or torch per region.
#   part 22: session 32's GPU tests (the graph cache's warm compile of the zoo's ResNet and GPT-2 in fp16 with CUDA
#            graphs; elementwise expressions bound to locals, every op against the reference); then where the MLP's
#            cold compile goes on the device (session 30: "lower" 5.86 s for three kernels in a fresh
#            process; on the 2-core CPU three of its ws GEMMs compile cold in 4.7 s in parallel, 2.7 s each alone):
#            compile_time.py's cProfile of tilefuse's cold and warm compiles. Then ResNet-50's cold and warm compile
#            against Inductor's and dynamo's alone (session 31's load_func, session 32's graph cache: warm 1.29 -> 1.04 s
#            on the 2-core CPU, where dynamo alone takes 0.89 s and Inductor 2.01 s; 3.26 s here in session 30).
#   part 12: LLaMA's compile time against Inductor's in fresh processes (#13's compile bar; ResNet-50's and the MLP's
#            were measured in session 30).
#   Part 22 runs in pieces too: 22a its GPU tests, 22b the MLP's compile profile, 22c ResNet-50's compile times.
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh PART...   (PART: 21|23|24|25|22|22a|22b|22c|12; several run in order;
#                  logs and JSON under $OUT, tarred into one file)
set -u
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT/logs"
export TILEFUSE_QUIET=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/logs/device.txt"
python3 -c "import torch, tilelang, transformers; print(torch.__version__, tilelang.__version__, transformers.__version__)" \
    >> "$OUT/logs/device.txt" 2>/dev/null
cat COMMIT >> "$OUT/logs/device.txt" 2>/dev/null  # (the snapshot's commit, written beside it)
compile_time() {  # models, timeout per child, whole timeout, name[, compilers]
    timeout "$3" python3 bench/compile_time.py --models "$1" --compilers "${5:-tilefuse,inductor}" --timeout "$2" \
        --out "$OUT/logs/$4.json" > "$OUT/logs/$4.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/$4.log"; grep '^{' "$OUT/logs/$4.log" | cut -c1-260
}
zoo() {  # models, whole timeout, name
    timeout "$2" python3 bench/bench_models.py --models "$1" --peers default --no-warm --reps 30 \
        --json "$OUT/logs/$3.json" > "$OUT/logs/$3.log" 2>&1
    grep -E "^  [a-z0-9]+: |^model |^[a-z0-9]+ +[0-9t]" "$OUT/logs/$3.log" \
        | cut -c1-220 | head -60
}
for part in "${@:-21}"; do
echo "== part $part (at ${SECONDS} s)"
if [ "$part" = 21 ]; then
    timeout 200 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/test_sparse.py tests/test_gemm_ws.py -k \
        "sp_ or sparse or sparsity" > "$OUT/logs/gpu_tests_sparse.log" 2>&1
    echo "sparse: $(tail -1 "$OUT/logs/gpu_tests_sparse.log")"
    grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_sparse.log" | head -5
    timeout 230 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_templates_gpu.py \
        > "$OUT/logs/gpu_tests_templates_gpu.log" 2>&1
    echo "templates_gpu: $(tail -1 "$OUT/logs/gpu_tests_templates_gpu.log")"
    grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_templates_gpu.log" | head -5
    timeout 120 python3 bench/proto_gemm_ws.py --ws-only --sliced --epilogue residual \
        --shapes 8192x2048x5632,8192x2048x8192,8192x4096x16384 --json "$OUT/logs/gemm_ws_sliced_residual.json" \
        > "$OUT/logs/gemm_ws_sliced_residual.log" 2>&1
    grep -v -i "warn" "$OUT/logs/gemm_ws_sliced_residual.log" | tail -27 | sed 's/"block_//g; s/  \+/ /g'
elif [ "$part" = 23 ]; then
    timeout 220 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_attention_ws.py \
        > "$OUT/logs/gpu_tests_attention_ws.log" 2>&1
    echo "attention_ws: $(tail -1 "$OUT/logs/gpu_tests_attention_ws.log")"
    grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_attention_ws.log" | head -8
    timeout 200 python3 bench/bench_attention.py --shapes masked --configs chain --json "$OUT/logs/attn_masked.json" \
        > "$OUT/logs/attn_masked.log" 2>&1
    grep -E "^\|" "$OUT/logs/attn_masked.log"
    python3 bench/summarize_attention.py "$OUT/logs/attn_masked.json"
elif [ "$part" = 24 ]; then
    timeout 480 python3 bench/bench_attention.py --shapes sweep --configs chain --json "$OUT/logs/attn_chain.json" \
        > "$OUT/logs/attn_chain.log" 2>&1
    grep -E "^\|" "$OUT/logs/attn_chain.log"
    python3 bench/summarize_attention.py "$OUT/logs/attn_chain.json"
elif [ "$part" = 25 ]; then  # (after 23 and 24: the schedules, asked for, in whole models)
    TILEFUSE_EXPERIMENTAL=attention_masked,attention_chain,attention_fast_math zoo bert,gpt2,vit 330 zoo_masked_chain
    TILEFUSE_EXPERIMENTAL=attention_masked,attention_chain,attention_fast_math timeout 200 python3 bench/bench_models.py \
        --models hf-bert,hf-gpt2 --peers default --no-warm --reps 30 --json "$OUT/logs/heldout_masked_chain.json" \
        > "$OUT/logs/heldout_masked_chain.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/heldout_masked_chain.log" | cut -c1-220 | head -30
fi
if [ "$part" = 22 ] || [ "$part" = 22a ]; then
    timeout 120 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/test_graph_cache.py \
        tests/test_bound_expressions.py > "$OUT/logs/gpu_tests_graph_cache_bound.log" 2>&1
    echo "graph cache, bound expressions: $(tail -1 "$OUT/logs/gpu_tests_graph_cache_bound.log")"
    grep -E "^FAILED|Error" "$OUT/logs/gpu_tests_graph_cache_bound.log" | head -5
fi
if [ "$part" = 22 ] || [ "$part" = 22b ]; then
    timeout 150 python3 bench/compile_time.py --models mlp --compilers tilefuse --timeout 120 \
        --profile "$OUT/logs/compile_profile" --out "$OUT/logs/compile_time_mlp.json" > "$OUT/logs/compile_time_mlp.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/compile_time_mlp.log"
    head -45 "$OUT/logs/compile_profile/mlp-tilefuse-cold.prof.txt" | cut -c1-200
fi
if [ "$part" = 22 ] || [ "$part" = 22c ]; then
    # warm, after session 31's load_func and session 32's graph cache (3.26 s in session 30); dynamo alone: the floor
    compile_time resnet 100 240 compile_time_resnet tilefuse,inductor,dynamo
elif [ "$part" = 12 ]; then
    compile_time llama 150 330 compile_time_llama
fi
done
echo "== end (at ${SECONDS} s)"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

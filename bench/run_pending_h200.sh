#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 30's:
# bench/results/2026-12-04-h200-session30, parts 13 and 15-20; session 33's: bench/results/2026-12-05-h200-session33,
# parts 22 (but for 22b's profile) and 23-25).
#   part 21 (pytest-xdist is on the device: -n spreads the compiles over its 16 cores): the 2:4 GEMM's GPU tests (session 30 gave its epilogue the dense template's fast sigmoid: the silu * up
#            cases' numerics), the template GEMM's GPU tests whole (session 30's call ran out of time at 21 passed, no failure), then the
#            sliced epilogue with a residual read where it lies against the staged one at long K (one sample in
#            session 30: 8192x2048x8192 0.3837 against 0.4017 ms), at LLaMA's down projection and the MLP's fc2.
#   part 26: session 33's defaults (the ws attention with a padding mask, bounded, and fast math; measured opt-in in
#            bench/results/2026-12-05-h200-session33, parts 23-25 there): the bound-expression GPU test against torch
#            on the GPU (it failed on the CPU reference's gelu(+inf) = NaN) and the zoo BERT's masked ws schedule end to
#            end, session 33's grouped convolutions as elementwise kernels (fp16, against torch), then the zoo's BERT,
#            GPT-2 and ViT with no options against Inductor default (with the options on: 1.09x, 1.33x, 1.20x), then
#            HF BERT against eager (1.10x with them; #14 asks for 1.2x).
#   part 27 (~3 min): session 34's kernels on the GPU (bench/results/2026-12-05-cpu-session34): grouped convolutions
#            with many taps (a GEMM a group), 1-D and transposed convolutions and group norms against torch (fp16), then group norm +
#            SiLU at Stable Diffusion's shapes against eager and Inductor (bench_group_norm.py).
#   part 29 (~3 min): session 35's group norms: the fp16 block whose second norm ran through torch on the H100 (two
#            values after the norm), the split of few, long groups (planner/norm_split.py) against torch, then
#            bench_group_norm.py again (part 27's run, before the split: 0.05-0.22x Inductor at a VAE's shapes).
#   part 28 (~2 min): where HF BERT's 0.65 ms a call above its kernels goes (#14; session 33): profile_sequence.py
#            with the host's view (each call's host time, its start to its first kernel, host ops by self time).
#   part 22b: where the MLP's cold compile goes on the device (session 30: "lower" 5.86 s for three kernels in a fresh
#            process; on the 2-core CPU three of its ws GEMMs compile cold in 4.7 s in parallel, 2.7 s each alone):
#            compile_time.py's cProfile of tilefuse's cold and warm compiles; then ResNet-50's warm compile profiled
#            (3.39 s in session 33, where dynamo alone took 2.23 s and tilefuse's own phases 0.52 s: the rest unknown).
#   part 12: LLaMA's compile time against Inductor's in fresh processes (#13's compile bar; ResNet-50's and the MLP's
#            were measured in session 30).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh PART...   (PART: 21|26|27|28|29|22b|12; several run in order;
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
elif [ "$part" = 26 ]; then
    timeout 150 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider tests/test_bound_expressions.py \
        "tests/test_attention_ws.py::test_zoo_bert_with_the_masked_ws_schedule_matches_eager_gpu" \
        "tests/test_grouped_conv.py::test_grouped_convolutions_match_torch_on_the_gpu" \
        > "$OUT/logs/gpu_tests_defaults.log" 2>&1
    echo "bound expressions, masked BERT: $(tail -1 "$OUT/logs/gpu_tests_defaults.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_defaults.log" | head -8
    zoo bert,gpt2,vit 250 zoo_defaults
    timeout 150 python3 bench/bench_models.py --models hf-bert --peers eager,default --no-warm --reps 30 \
        --json "$OUT/logs/hf_bert_defaults.json" > "$OUT/logs/hf_bert_defaults.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/hf_bert_defaults.log" | cut -c1-220
fi
if [ "$part" = 27 ]; then
    timeout 200 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/test_grouped_conv.py tests/test_conv1d.py \
        tests/test_group_norm.py tests/test_conv_transpose.py > "$OUT/logs/gpu_tests_session34.log" 2>&1
    echo "grouped, 1-D and transposed convolutions, group norms: $(tail -1 "$OUT/logs/gpu_tests_session34.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_session34.log" | head -8
    timeout 200 python3 bench/bench_group_norm.py --json "$OUT/logs/group_norm.json" > "$OUT/logs/group_norm.log" 2>&1
    grep -v -i warn "$OUT/logs/group_norm.log" | tail -10
fi
if [ "$part" = 29 ]; then
    timeout 200 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/test_group_norm.py tests/test_norm_split.py \
        > "$OUT/logs/gpu_tests_norm_split.log" 2>&1
    echo "group norms, split group norms: $(tail -1 "$OUT/logs/gpu_tests_norm_split.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_norm_split.log" | head -8
    timeout 200 python3 bench/bench_group_norm.py --json "$OUT/logs/group_norm_split.json" \
        > "$OUT/logs/group_norm_split.log" 2>&1
    grep -v -i warn "$OUT/logs/group_norm_split.log" | tail -10
fi
if [ "$part" = 28 ]; then
    timeout 200 python3 bench/profile_sequence.py --model hf-bert --calls 4 --cpu-top 25 --top 12 \
        --json "$OUT/logs/hf_bert_sequence.json" > "$OUT/logs/hf_bert_sequence.log" 2>&1
    grep -v -i warn "$OUT/logs/hf_bert_sequence.log" | head -120
fi
if [ "$part" = 22b ]; then
    timeout 150 python3 bench/compile_time.py --models mlp --compilers tilefuse --timeout 120 \
        --profile "$OUT/logs/compile_profile" --out "$OUT/logs/compile_time_mlp.json" > "$OUT/logs/compile_time_mlp.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/compile_time_mlp.log"
    head -45 "$OUT/logs/compile_profile/mlp-tilefuse-cold.prof.txt" | cut -c1-200
    timeout 200 python3 bench/compile_time.py --models resnet --compilers tilefuse --timeout 150 \
        --profile "$OUT/logs/compile_profile" --out "$OUT/logs/compile_time_resnet_profiled.json" \
        > "$OUT/logs/compile_time_resnet_profiled.log" 2>&1
    sed -n '/^model /,$p' "$OUT/logs/compile_time_resnet_profiled.log"
    head -60 "$OUT/logs/compile_profile/resnet-tilefuse-warm.prof.txt" | cut -c1-200
fi
if [ "$part" = 12 ]; then
    compile_time llama 150 330 compile_time_llama
fi
done
echo "== end (at ${SECONDS} s)"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 28's:
# bench/results/2026-12-04-h200-session28, parts 6-10).
# Session 28 found the zoo LLaMA's call spending ~2 ms on the host before its first kernel (1.93 ms until it returns;
# kernels 29.98 ms with 0.22 ms idle between them; the call 32.59 ms), against 0.10 ms in the CPU emulation of the same
# runner (bench/host_overhead.py): part 11 says where, against Inductor's.
#   part 11: bench/diag_host_gpu.py on the zoo LLaMA under tilefuse: the graph's replay alone against its kernels, and
#            the widest gaps between them (session 29's second call: the graph took 31.3 ms of GPU time, its kernels
#            about 29); the ws GEMM's GPU numerics; LLaMA and the MLP with no options against Inductor default.
#   part 12: the ws GEMM's GPU numerics (their fp32-output residual case, added after session 28's last call), every
#            zoo model with no options against Inductor default (#13's default bar, another sample), then the 2:4 ws
#            GEMM against cuSPARSELt (#20), whose epilogue still has the exact sigmoid.
#   part 13: the exact GELU's fast form (session 29's fourth call: erff cost the MLP's fc1 0.11 ms over a bias
#            epilogue; the fifth: its reciprocal issued ten times an element, 2.2x slower, now bound once): the ws
#            GEMM's GPU numerics, the forms at the MLP's and BERT's fc1 and LLaMA's gate, the zoo with GELUs.
#   part 14: the TileLang-scheduled GEMM's fast GELU forms on the GPU; LLaMA with no options (its silu by __fdividef).
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh 11|12   (logs and JSON under $OUT, tarred into one file)
set -u
part=${1:-11}
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
    timeout 200 python3 bench/diag_host_gpu.py --model llama --compilers tilefuse > "$OUT/logs/diag_host_llama.log" 2>&1
    grep -v -i "warn" "$OUT/logs/diag_host_llama.log" | grep -v "^ *$" | head -45
    timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k "gemm_ws_gpu" \
        > "$OUT/logs/gpu_tests_gemm_ws.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_gemm_ws.log"
    zoo llama,mlp 200 zoo_default_llama_mlp
elif [ "$part" = 12 ]; then
    timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k "gemm_ws_gpu" \
        > "$OUT/logs/gpu_tests_gemm_ws.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_gemm_ws.log"
    zoo mlp,llama,bert,resnet,gpt2,vit 330 zoo_default
    timeout 140 python3 bench/proto_gemm_sp_ws.py --json "$OUT/logs/gemm_sp_ws.json" > "$OUT/logs/gemm_sp_ws.log" 2>&1
    grep -v "Warn\|WARN\|warn" "$OUT/logs/gemm_sp_ws.log" | tail -40
elif [ "$part" = 13 ]; then
    timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k "gemm_ws_gpu" \
        > "$OUT/logs/gpu_tests_gemm_ws.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_gemm_ws.log"
    timeout 120 python3 bench/proto_gemm_ws.py --ws-only --shapes 8192x16384x4096,16384x3072x768 --epilogue gelu \
        --gelu-forms --json "$OUT/logs/gemm_ws_gelu_forms.json" > "$OUT/logs/gemm_ws_gelu_forms.log" 2>&1
    grep -v -i "warn" "$OUT/logs/gemm_ws_gelu_forms.log" | tail -14
    timeout 90 python3 bench/proto_gemm_ws.py --ws-only --shapes 8192x8192x2048 --epilogue silu_mul \
        --silu-forms --json "$OUT/logs/gemm_ws_silu_forms.json" > "$OUT/logs/gemm_ws_silu_forms.log" 2>&1
    grep -v -i "warn" "$OUT/logs/gemm_ws_silu_forms.log" | tail -9
    zoo mlp,bert,gpt2,vit 200 zoo_default_gelu
elif [ "$part" = 14 ]; then
    timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_templates_gpu.py -k "gelu or elementwise" \
        > "$OUT/logs/gpu_tests_templates_gelu.log" 2>&1
    tail -3 "$OUT/logs/gpu_tests_templates_gelu.log"
    zoo llama 200 zoo_default_llama
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

#!/usr/bin/env bash
# What is written and not yet measured, in device calls of under 10 minutes each (the device README's limit), most
# important first. Parts measured before are in git history at the commits their results name (session 30's:
# bench/results/2026-12-04-h200-session30, parts 13 and 15-20; session 33's: bench/results/2026-12-05-h200-session33,
# parts 22 and 23-25; session 35's: bench/results/2026-12-05-h100-session35, parts 12, 21, 22b and 26-28; session
# 37's: bench/results/2026-12-05-h100-session37, parts 29-33, 35 and 36 (36 at commit 8d748c8)).
# Session 37 ran parts 29-33 and 35 on an H100 (no H200 was lent). Session 38 ran parts 30, 31 and 35 on the H200 and
# 37-39 on an H100 (bench/results/2026-12-05-h200-session38; 37-38, the overlapped epilogue, at commits 1a9899a-5684c11,
# since reverted). Session 40 ran parts 30, 31, 39, 43 and 45 on the H200 (bench/results/2026-12-05-h200-session40).
# Session 43 ran parts 55, 56, 31, 30 and 39 on an H100 (bench/results/2026-12-06-h100-session43).
# Session 44 ran parts 57, 58, 31 and 30 on an H100 (bench/results/2026-12-06-h100-session44).
# Session 45 ran parts 62, 61 and 63 on an H100 (bench/results/2026-12-06-h100-session45).
# Session 46 ran parts 65, 67, 68, 69, 30 and 34 on an H100 (bench/results/2026-12-06-h100-session46; 66 not needed:
# pin_softmax lost at every shape). Next, on an H200: the bars' parts 30, 31, 34, 64 and 39, and 69 (the short-key
# lead's sweep there); on either: 31 (zoo LLaMA, whose D-128 attention the short-key lead now takes).
# Session 47 ran parts 70 and 31 on an H100 (bench/results/2026-12-06-h100-session47; 71 not needed: lean_producer
# gained nowhere on the default pick). Part 72 (which ws seed leads past SHORT_KEYS at D 64) is ready, not run.
# Session 48 ran part 73 on an H100 (bench/results/2026-12-06-h100-session48); session 49 ran part 74 twice on an H100
# (bench/results/2026-12-06-h100-session49; part 72 is superseded by 73 and 74, which measured its long runs).
# Part 75 is ready, not run (no device time left). Session 50 got no machine (13 starts failed, 1,467 s of its
# 1,800): parts 75 and 76 are ready, not run. Session 51 ran parts 76 and 77 on an H100 (bench/results/
# 2026-12-07-h100-session51: extra_buffers=2 right; gemm_ws.MEMORY_DIM's seeds from 76's sweep, ResNet-50 1.20x
# Inductor with them); of its other starts, none came. Session 52 ran parts 78, 75, 79, 80 and 81 on an H100
# (bench/results/2026-12-07-h100-session52: ResNet-50 1.31x Inductor after the shortcut GEMMs, cuDNN's weights once, the
# pool's pixel tiles and views counted dense; the fp32 GEMM at 2 or 4 rows fixed). Next, on an H200: the bars' parts
# 30, 31, 34 and 39 (31 and 64 now with ResNet-50's changes), and 74 (the long-run lead there).
# Session 53 ran parts 82 and 31 on an H100 (bench/results/2026-12-07-h100-session53: a packed fp16 exponent is two MUFU
# ops, no gain; the zoo and HF models as session 52 left them); its fourteen other requests got no machine. Next: part 84
# (timm ConvNeXt-T, EfficientNet-B0, Swin-T: the permute, pad and roll changes), and on an H200 83 (#14's kernel bar),
# 30, 31, 34 and 39.
# Session 54 ran parts 85 and 84 on an H100 (bench/results/2026-12-07-h100-session54: GPT-Neo 2.49x, EfficientNet
# 2.09x, Swin 1.12x, ConvNeXt 1.01x the best peer); fourteen other requests got none. Next: on an H200 83, 30, 31, 34 and
# 39; on either, 85 again (the bool-store fix: its 12 buffer slices ran through torch).
# Session 55 ran parts 85, 86, 87 and 88 (its first form) on an H100 (bench/results/2026-12-07-h100-session55: GPT-Neo
# 2.50x with the bool-store fix; short norm rows sharing a program, ConvNeXt 1.26x and Swin 1.22x the best peer; the
# depthwise template's first form 0.53x cuDNN); four requests got none. Next: part 88 (the depthwise template's tiled
# form, behind Options.experimental "depthwise"; its GPU tests) and 89 (ConvNeXt and EfficientNet with
# TILEFUSE_EXPERIMENTAL=depthwise); on an H200 83, 30, 31, 34 and 39.
# Session 56 ran parts 88 (the tiled form), 30, 34, 31, 83, 39 and 89 on the H200 (bench/results/2026-12-07-h200-
# session56: the default bar holds, every zoo model 1.07-1.30x Inductor default; HF BERT 1.16-1.20x eager; D-64
# attention 0.92-1.09x cuDNN; the depthwise template 1.12-3.5x cuDNN, since then the default with new picks). Then the
# device was paused. Next: part 90 (the depthwise default's GPU tests and models), 91 (ConvNeXt's GEMMs at every ws
# width) and 92 (the global-pool schedule, experimental), on either GPU.
# Session 57 got no machine (its device time was what session 56 left, 520 s: three starts failed, then a fourth
# was refused): parts 90, 91 and 92 are still next, part 90 first (the depthwise default has not run its GPU tests).
# Session 58 got no machine (four starts failed or were refused, then no more were lent): parts 90, 91 and 92 are still
# next, part 90 first; part 93 (Gemma 2's softcapped attention, new this session) after them.
# Parts 30, 31, 35 and 39 stay: they are the bars' checks, to rerun after a change; part 46 is not yet run.
#   part 82 (~1 min): the MUFU probe (bench/probes/mufu_ex2.cu): fp32 against packed fp16 exponents, with SASS counts.
#   part 83 (~4 min): #14's kernel bar: bench_attention.py's default seeds over the sweep and the long runs vs cuDNN.
#   part 84 (~6 min): held-out timm ConvNeXt-T, EfficientNet-B0 and Swin-T, b64 at 224, no options, against eager and
#            Inductor default (ZOO84 picks models, ZOO84_LIMIT the time).
#   part 85 (~4 min): held-out HF GPT-Neo-125M shape, b8x1024 fp16, no options, against eager and Inductor default (its
#            where-hidden attention, global and 256-key local layers, as one sdpa a layer).
#   part 86 (~6 min): row-reduction configs at ConvNeXt's, Swin's and the zoo's norm and softmax shapes against eager and
#            Inductor (sweep_norm.py: is reduction.default_config, short rows sharing a program, the best?), then the
#            reduction GPU tests (the short-row picks with NaN/inf rows included).
#   part 87 (~6 min): held-out timm ConvNeXt-T and Swin-T again, no options, with the short-row picks (ZOO87 picks models).
#   part 88 (~5 min): the depthwise template (lowering/templates/depthwise.py) at ConvNeXt-T's and EfficientNet-B0's
#            shapes, a grid of configs against cuDNN and Inductor (sweep_depthwise.py; PART88_ONLY: labels containing
#            it), then its GPU tests.
#   part 89 (~6 min): held-out timm ConvNeXt-T and EfficientNet-B0 with it (session 56 ran it with
#            TILEFUSE_EXPERIMENTAL=depthwise, since then the default; ZOO89 picks models).
#   part 90 (~5 min): session 56's default: the depthwise template on CUDA with the H200's picks (depthwise.default_config
#            by stride and channels): its GPU tests, grouped convolutions' and the layout pass's, then ConvNeXt-T and
#            EfficientNet-B0 (ZOO90 picks models).
#   part 91 (~4 min): ConvNeXt-T's GEMMs (N or K 96-768 at 200704-12544 rows, their epilogues; Inductor's GEMMs 1.23x
#            faster in the model) with ws tiles 64-256 wide added to the seeds (sweep_gemm.py --widths; PART91_MODELS).
#   part 92 (~4 min): the pool template's whole-plane schedule (Options.experimental "global_pool": EfficientNet's
#            squeeze pools ran 0.815 ms in the per-output schedule against torch's 0.031 on the H200): its GPU tests,
#            then EfficientNet-B0 with it (ZOO92 picks models). If its pools beat torch's, make it the default
#            (lowering/templates/pool.py default_config).
#   part 93 (~5 min): Gemma 2's logit softcapping (session 58: one sdpa a layer with a ``softcap``, the non-ws
#            flash template capping each score; its CUDA sources compiled for sm_90a, never run): the softcap GPU tests
#            (fp16/bf16, head dims 64-256, causal and not), then HF Gemma-2-2B's shape (8 layers, b4x2048, bf16, eager
#            only) against eager and Inductor default (PART93_LIMIT the time).
#   part 29 (~3 min): session 35's group norms: the fp16 block whose second norm ran through torch on the H100 (two
#            values after the norm), the split of few, long groups (planner/norm_split.py) against torch, then
#            bench_group_norm.py again (session 35's run, before the split: 0.05-0.22x Inductor at a VAE's shapes).
#   part 30 (~5 min): #13's default bar on the H200: zoo BERT, GPT-2 and ViT, no options, against Inductor default,
#            with kernel categories (session 35 measured them on an H100 only).
#   part 31 (~6 min): the rest of the zoo (MLP, LLaMA, ResNet-50) the same way; HF BERT and HF GPT-2 against eager
#            and Inductor default (#14's 1.2x eager and GPT-2's attention time, on the H200).
#   part 32 (~6 min): zoo BERT's and GPT-2's GEMM specs (epilogues included), 16 configs each, against cuBLAS
#            (sweep_gemm.py): which of them holds the GEMM category 5-8% behind Inductor's.
#   part 33 (~7 min): exp_poly (a share of the softmax's exponents on the FMA units): its GPU numerics, then the
#            attention sweep's 13 shapes, the ws seeds with every 8th and 4th column block so, against cuDNN (#14's
#            kernel bar: D 64 at 0.90-0.96x cuDNN where MUFU's exponents take as long as the tensor cores' products).
#   part 34 (~2 min): HF BERT b32x512 (its attention: 32x12x512x64, no mask) against eager (#14's 1.2x eager).
#   part 35 (~4 min): #13's tuned bar for zoo BERT: untuned and tune=fast (an empty tuning database) against eager,
#            Inductor default and reduce-overhead, with kernel categories.
#   part 39 (~3 min): #13's tuned bar with the untuned pick kept unless a candidate runs 5% faster (tune.py's
#            KEEP_PICK_MARGIN; session 38's H200 run had tune=fast slower than untuned: BERT's GEMMs 4.67 -> 5.07 ms):
#            zoo BERT and GPT-2, untuned and tune=fast (an empty tuning database), against Inductor default and
#            reduce-overhead, with kernel categories.
#   part 40 (~6 min): 256 x 128 tiles in the ws GEMM (gemm_ws: each consumer group 128 rows; cuBLAS's coopA tile,
#            its pick for most zoo GEMMs), readied in session 38 and not yet run: the ws GPU numerics (every case,
#            fp16 and bf16, now with that tile), then sweeps against the seeds: LLaMA's MLP GEMMs (gate under silu *
#            up, down with its residual; our 49 ws GEMMs there 23.0 ms against cuBLAS's ~20.6), fc1's GELU, and
#            bias-only shapes (#13's GEMM bar).
#   part 41 (~6 min): session 39's H100 run of part 40 had 256 x 128 x 4 (32-column slices) fastest under fc1's GELU
#            (16384x3072x768 0.1599 ms against the sliced seed's 0.1771 and 128 x 192's 0.1623), where the H200 had
#            ranked the sliced seed first: the GELU shapes again with every sliced and tall config, then
#            bench/tuned_order.py (zoo BERT's and GPT-2's untuned and tune=fast plans measured in turns, with the
#            GPU's clock, temperature and power: session 38's tuned plan profiled 6% slower with the same configs).
#   part 42 (~5 min): the MLP's cold compile with its kernels' steps by thread (compile_time.py --timeline: #13's
#            compile bar, 9.7 s against Inductor's 3.6 s on the H200), as by default (each kernel's host module linked
#            twice) and then with TILEFUSE_LINK_FROM_CACHE=1 (lowering/compile.py: the kernel cache's library loaded,
#            not yet run on a GPU), then #13's tuned bar for ViT and the MLP with every contender timed in turns (--rounds 3).
#   part 43 (~4 min): part 42's two compile timelines alone, then the GPU tests of tests/test_dynamo_e2e.py and
#            tests/test_artifact.py with TILEFUSE_LINK_FROM_CACHE=1 and an empty TileLang cache (every kernel compiled,
#            its module the cache's library). If they pass and the timeline gains, turn it on by default.
#   part 44 (~2 min): what fc1's GELU epilogue costs (the whole of #13's GEMM gap in BERT, GPT-2 and ViT): the seed's
#            and 128 x 192's configs with the GELU replaced by probes (proto_gemm_ws.py --gelu-probes: x alone, 8, 16
#            and 32 dependent FMAs, one MUFU ex2, ex2 and rcp) and by the erfc fit, against erff. Which of FMA count
#            and MUFU count the time follows says what a cheaper exact GELU must save. With them "gelu=logpoly", a
#            candidate exact GELU for fp16 outputs (exp of a degree-7 polynomial: some 15 instructions an element
#            over the bias epilogue's in SASS, erff's 28; relative error 6.7e-6): if it runs faster and its numerics
#            hold, it becomes the GELU of lowering.emitters.FAST_EMITTERS for fp16 outputs (a bf16 fit to t <= 13.5).
#   part 45 (~5 min): part 44 with the logpoly GELU made the default of an epilogue rounded straight to fp16
#            (lowering.emitters.ROUNDED_EMITTERS, session 40): the ws GPU numerics (every case, fp16 and bf16; the
#            options' cases), the e2e GPU tests, then part 44's probes ("gelu=erff" the exact form it replaced).
#   part 46 (~4 min): where #13's compile bar goes (the MLP 2.1x Inductor's cold, ResNet-50 2.7x, session 40): the
#            MLP's cold compile under cProfile with its timeline (its ws GEMMs lowered in 2.1-2.3 s each on the H200's
#            machine, 0.6-0.8 s on a 2-core CPU machine), then ResNet-50's timeline summed by step, against Inductor.
#            First (session 41) bench/compile_scaling.py: 1, 3 and 6 ws GEMMs compiled at once, in threads and in
#            processes, with the machine's CPU facts: whether the interpreter or the CPUs make the steps 2-3x slower.
#   part 47 (~2 min): the bf16 output's logpoly GELU (lowering.emitters.LOGPHI_BF16, degree 9 to t = 13.5; session
#            40, not yet a default): the ws GEMM's GELU cases in bf16 with it, every schedule, NaN/Inf rows, on the
#            GPU. If they pass, ROUNDED_EMITTERS["bfloat16"] = {"gelu": rounded_gelu(LOGPHI_BF16)} (its time is
#            fp16's logpoly's and two FMAs: part 45's table).
#   part 49 (~6 min): CUDA kernels compiled by NVRTC with shared precompiled headers (lowering/nvrtc.py,
#            TILEFUSE_NVRTC=1; session 41: ResNet-50's 28 kernels for sm_90a took 48 s of nvcc, 26 s of NVRTC on a
#            2-core CPU machine): the GPU tests with every kernel compiled afresh by it (they time the measured choice
#            too: part 48's change). Part 50 (~5 min): the ws GEMM seeds' times by both compilers, then the MLP's and
#            ResNet-50's cold compiles with it against Inductor's, a header set's sources waiting for its PCH where
#            every CPU compiles (the default: ResNet-50's 28 kernels on 16 CPUs wait, the MLP's 3 do not) and never.
#   Session 42 ran parts 47, 49, 50, 52 and 53 on an H100 (bench/results/2026-12-06-h100-session42).
#   part 54 (~2 min): the split tails compiled in the plan's own batch (pipeline.lower_step's prefetch, session 42)
#            and convolutions compiled first (lower.compile_rank): ResNet-50's and the MLP's cold compiles against
#            Inductor with the timeline (its longest kernel compiles named); ResNet-50's "splits" phase took 2.8 s of
#            23.6 on the H100's machine before, its kernels 3.1-18.4 s.
#   part 55 (~6 min): each CUDA kernel's host library built through the assembler and the C compiler (session 43,
#            lowering/host_lib.py: 0.30 -> 0.06 s a kernel on the 2-core machine): the e2e and artifact GPU tests with
#            every kernel compiled afresh, then the MLP's and ResNet-50's cold compiles with it off and on.
#   part 56 (~2 min): ResNet-50's convolutions (channels last, BN and ReLU as the epilogue) through conv2d's seeds
#            and 7 configs more against cuDNN alone and with eager BN and ReLU (bench/bench_conv.py, session 43).
#   part 57 (~2 min): ResNet-50's 3x3 convolutions with A loaded by TMA in im2col mode (bench/proto_conv_tma.py,
#            session 43: 26 kernels compiled for sm_90a on the CPU, never run) against conv2d's default and cuDNN;
#            cuDNN also with the model's OIHW weight (what converting it to channels last costs each split head).
#   part 58 (~3 min): HF BERT's cold compile under cProfile (58-91 s on the device machine in sessions 35-43, its
#            tilefuse phases ~10 s; not reproduced on the CPU: bench/profile_compile.py --model hf-bert --cold).
#   part 59 (~6 min): convolutions the library leads get no kernel built (lower.library_first, session 44: ResNet-50's
#            16 3x3 regions, which the measured choice split anyway after compiling 7 conv2d kernels of ~7 s each): the
#            GPU tests of the measured choice, e2e and artifacts; ResNet-50's cold compile against Inductor with the
#            timeline; zoo ResNet-50 and timm's against Inductor default.
#   part 60 (~8 min): real models not measured before: HF BERT and GPT-2 built with attn_implementation="eager"
#            (#14's arithmetic attention), HF ViT and HF LLaMA, against eager and Inductor default.
#   part 61 (~3 min): HF GPT-2 (SDPA)'s cold compile under cProfile (18.1 s against Inductor's 13.5, session 44).
#   part 62 (~8 min): every kernel a programmatic dependent (pdl_all, session 45): its GPU tests, then zoo GPT-2 and
#            BERT without and with it against Inductor default, in turns.
#   part 63 (~3 min): PDL for the GEMMs and the ws attention alone (pdl_tma): zoo GPT-2 and BERT without and with it.
#   part 64 (~4 min): #13's compile bar on the H200 where it failed (MLP 2.7x, ResNet-50 2.7x Inductor's in session
#            40), with the default ratio beside.
#   part 65 (~6 min): the ws attention with its exponents pinned before the wait for the previous P V (pin_softmax,
#            session 45: ptxas put that wait ahead of the softmax): GPU tests, then #14's sweep at D 64 (PIN_SHAPES=sweep:
#            all of it) with and without it.
#   part 66 (~5 min): pin_softmax in whole models: zoo BERT and GPT-2 without and with attention_pin_softmax.
#   part 67 (~3 min): Nsight Compute (--set full) on the ws attention's default pick and cuDNN at BERT's shape
#            (32x12x512x64, 0.92x cuDNN on the H100) and at 2x32/8x8192x64 (NCU_SHAPES; bench/ncu_attention.py):
#            details and raw metrics (tensor pipe, issue stalls) of both, for #14's D-64 gap.
#   part 68 (~6 min): part 67's report's SASS page (stall samples by instruction; the report carried as ncu/), then the
#            default ws pick at D 64 alone and with pingpong, 3 stages, both, late_store, double_q and both (all last
#            measured before fast math) against cuDNN (bench_attention.py --configs recheck; RECHECK_LIMIT).
#   part 69 (~8 min): the late store and two Q buffers leading at D 64 up to 2048 keys (attention_configs.SHORT_KEYS,
#            from part 68): their GPU tests, then each ws seed without and with them over the sweep (D 64 and 128) and
#            the masked shapes (bench_attention.py --configs short; SHORT_SHAPES, SHORT_LIMIT).
#   part 70 (~7 min): one producer warp (flash_attention(ws=True, lean_producer=True), session 47, from part 67's
#            profile: all four producer warps spin on the "empty" barriers, cuDNN keeps one): its GPU tests, then the
#            ws seeds as the default orders them, without and with it, over the sweep and the masked shapes
#            (bench_attention.py --configs lean; LEAN_SHAPES, LEAN_LIMIT).
#   part 71 (~5 min): part 70's lean producer in whole models: zoo BERT and GPT-2 without and with
#            attention_lean_producer (TILEFUSE_EXPERIMENTAL), no options otherwise, against Inductor default.
#   part 72 (~3 min): past SHORT_KEYS at D 64 (bench_attention.py --shapes long: 3072-16384 keys, SDXL's 4096):
#            each ws seed without and with the short options, whether the 192-row seed should lead non-causal long
#            runs (it led at 8192 keys in sessions 45-47, 1.04-1.08x cuDNN against 0.96-0.97x for 128 rows).
#   part 73 (~9 min): wider key tiles (bench_attention.py --configs wide: 160 and 192 keys at D 64, 160 and 176 at
#            D 128, FlashAttention-3's non-causal picks, on the 128-row ws seeds) against the default's seeds over the
#            sweep, the long runs (part 72's shapes) and the padding masks, x cuDNN.
#   part 74 (~8 min): part 73's long runs, D 64 again (a second run) and D 128 (its sweep stopped at a launch the device refused: 128 x 160 at
#            D 128 with two Q buffers, 256 KB of shared memory, now refused when built).
#   part 75 (~3 min): the late store and two Q buffers (SHORT_OPTIONS) on each ws seed over the long runs and the D 64
#            sweep (--configs short): whether the 192-row seed, which leads past SHORT_KEYS at D 64 where
#            long_rows_lead says, gains from them as the 128-row seed does up to SHORT_KEYS.
#   part 76 (~6 min): ResNet-50's 1x1 convolutions (session 50: our ws GEMMs with their BN, ReLU and residual
#            epilogues took 1.155 ms against cuBLAS's 0.79 of bare products in session 47's profile: 25 kernels, by
#            my count the 16 residual conv3s and 9 conv1s, 2.36 GB, about 2.0 TB/s where a copy reaches some 3): each
#            region's kernel, config and M x N x K against its ops through torch
#            (judge_regions.py), then the ws GEMM at their shapes, each seed and the narrow and two-stage tiles
#            (proto_gemm_ws.py --narrow, TB/s beside each), bias epilogues at the conv1 and downsample shapes and
#            residual ones at the conv3 shapes, against cuBLAS; first the GPU numerics of extra_buffers=2 (two output
#            tiles taking turns: the next tile's residual loaded during this one's epilogue), also in the residual sweep.
#   part 77 (~6 min): memory-bound shapes' seeds (gemm_ws.MEMORY_DIM, session 51, from part 76's H100 sweep): the ws
#            GPU numerics with the 128 x 64 x 6 tile (fp16 every case, turns fp16/bf16), then zoo ResNet-50 default
#            against Inductor default with kernel categories (its 33 1x1-conv GEMMs: 1.197 -> 1.073 ms summed alone).
#   part 78 (~5 min): judge_regions.py's conv rows rerun (session 51's fix), then ResNet-50's kernels in launch order,
#            tilefuse and Inductor (profile_sequence.py): where the 0.1 ms of the ws GEMMs in the model went.
#   part 79 (~3 min): session 52's ResNet-50 changes (a strided 1x1 as slice + GEMM, cuDNN's weights channels last once,
#            pool2d's pixel tiles): their GPU tests, bench_pool.py, zoo ResNet-50 default and its kernel sequence.
#   part 80 (~4 min): part 79 with pixel tiles leading and views counted dense (pipeline.Dense): the e2e GPU tests, zoo
#            ResNet-50, BERT and GPT-2 default against Inductor. Part 81 (~5 min): zoo ViT and LLaMA the same way.
#   part 48 (~2 min): the measured choice's timing graphs of at most ~5 ms (lowering.timing.calls_per_graph, session
#            41: the MLP's choice replayed 20 one-ms GEMMs 4 times a timing): the e2e and CUDA graph runner GPU tests.
# Usage (device):  source .devcache/activate.sh && pip install -q --no-deps --no-build-isolation --no-index -e . &&
#                  bash bench/run_pending_h200.sh PART...   (PART: 29-35, 39-60; several run in order;
#                  logs and JSON under $OUT, tarred into one file)
set -u
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT/logs"
export TILEFUSE_QUIET=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/logs/device.txt"
python3 -c "import torch, tilelang, transformers; print(torch.__version__, tilelang.__version__, transformers.__version__)" \
    >> "$OUT/logs/device.txt" 2>/dev/null
cat COMMIT >> "$OUT/logs/device.txt" 2>/dev/null  # (the snapshot's commit, written beside it)
zoo() {  # models, whole timeout, name, [peers]
    timeout "$2" python3 bench/bench_models.py --models "$1" --peers "${4:-default}" --no-warm --reps 30 \
        --json "$OUT/logs/$3.json" > "$OUT/logs/$3.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/$3.log" | cut -c1-220 | head -60
}
GEMM_WS_GPU="tests/test_gemm_ws.py::test_gemm_ws_gpu_matches_the_reference"
nvrtc_tests() {  # timeout, workers, tests...: the GPU tests with every kernel compiled afresh by NVRTC
    local limit=$1 workers=$2; shift 2
    python3 -c "from tilefuse.lowering import nvrtc; print('NVRTC', nvrtc.library() is not None, nvrtc._version)"
    TILEFUSE_NVRTC=1 TILELANG_CACHE_DIR=$(mktemp -d) TILEFUSE_FUNC_CACHE_DIR=$(mktemp -d) timeout "$limit" \
        python3 -m pytest -q -n "$workers" -m gpu -p no:cacheprovider "$@" > "$OUT/logs/gpu_tests_nvrtc.log" 2>&1
    echo "GPU tests, kernels compiled afresh by NVRTC: $(tail -1 "$OUT/logs/gpu_tests_nvrtc.log")"
    grep -E "^FAILED|^E  |NVRTC did not" "$OUT/logs/gpu_tests_nvrtc.log" | cut -c1-200 | sort | uniq -c | head -8
}
nvrtc_gemms() {  # timeout, shapes, lines: the ws GEMM seeds (GELU epilogue) compiled by nvcc, then by NVRTC
    for nv in 0 1; do
        TILEFUSE_NVRTC=$nv TILELANG_CACHE_DIR=$(mktemp -d) timeout "$1" python3 bench/proto_gemm_ws.py --ws-only \
            --epilogue gelu --shapes "$2" --json "$OUT/logs/nvrtc${nv}_gemm.json" > "$OUT/logs/nvrtc${nv}_gemm.log" 2>&1
        echo "ws GEMMs compiled by $([ $nv = 1 ] && echo NVRTC || echo nvcc):"
        grep -v -i warn "$OUT/logs/nvrtc${nv}_gemm.log" | sed -e 's/"block_K": 64, //' | cut -c1-150 | tail -"$3"
    done
}
nvrtc_compile() {  # timeout, models, compilers, name, [--timeline]: cold and warm compiles with NVRTC
    TILEFUSE_NVRTC=1 timeout "$1" python3 bench/compile_time.py --models "$2" --compilers "$3" ${5:-} \
        --out "$OUT/logs/$4.json" > "$OUT/logs/$4.log" 2>&1
    grep -E "^(mlp|resnet|model)" "$OUT/logs/$4.log"
}
attn_variants() {  # configs, tests' -k, their timeout, each sweep's timeout, shapes...: GPU tests, then the sweeps
    local name=$1 tests=$2 tlimit=$3 limit=$4; shift 4
    TILELANG_CACHE_DIR=$(mktemp -d) timeout "$tlimit" python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider \
        tests/test_attention_ws.py -k "$tests" > "$OUT/logs/gpu_tests_$name.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_$name.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_$name.log" | cut -c1-200 | head -8
    for shapes in "$@"; do
        timeout "$limit" python3 bench/bench_attention.py --shapes "$shapes" --configs "$name" \
            --json "$OUT/logs/attn_${name}_$shapes.json" > "$OUT/logs/attn_${name}_$shapes.log" 2>&1
        grep -v -i warn "$OUT/logs/attn_${name}_$shapes.log" | cut -c1-200 | tail -70
    done
}
for part in "${@:-29}"; do
echo "== part $part (at ${SECONDS} s)"
if [ "$part" = 29 ]; then
    timeout 200 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/test_group_norm.py tests/test_norm_split.py \
        > "$OUT/logs/gpu_tests_norm_split.log" 2>&1
    echo "group norms, split group norms: $(tail -1 "$OUT/logs/gpu_tests_norm_split.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_norm_split.log" | head -8
    timeout 200 python3 bench/bench_group_norm.py --json "$OUT/logs/group_norm_split.json" \
        > "$OUT/logs/group_norm_split.log" 2>&1
    grep -v -i warn "$OUT/logs/group_norm_split.log" | tail -10
elif [ "$part" = 30 ]; then
    zoo bert,gpt2,vit 320 zoo_default_bgv
elif [ "$part" = 31 ]; then
    zoo mlp,llama,resnet 340 zoo_default_mlr  # (timed in turns since session 39: a little longer)
    zoo hf-bert,hf-gpt2 220 hf_bert_gpt2 eager,default
elif [ "$part" = 32 ]; then
    timeout 420 python3 bench/sweep_gemm.py --models bert,gpt2 --budget 16 --json "$OUT/logs/gemm_sweep_bert_gpt2.json" \
        > "$OUT/logs/gemm_sweep_bert_gpt2.log" 2>&1
    grep -v -i warn "$OUT/logs/gemm_sweep_bert_gpt2.log" | cut -c1-260 | tail -50
elif [ "$part" = 33 ]; then
    timeout 150 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider \
        "tests/test_attention_ws.py::test_schedule_variants_gpu_match_sdpa[exp_poly]" \
        "tests/test_attention_ws.py::test_schedule_variants_gpu_match_sdpa[exp_poly_half]" \
        "tests/test_attention_ws.py::test_ws_gpu_padding_mask_matches_sdpa[variant4]" \
        > "$OUT/logs/gpu_tests_exp_poly.log" 2>&1
    echo "exp_poly numerics: $(tail -1 "$OUT/logs/gpu_tests_exp_poly.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_exp_poly.log" | head -8
    timeout 280 python3 bench/bench_attention.py --shapes sweep --configs poly --json "$OUT/logs/attn_exp_poly.json" \
        > "$OUT/logs/attn_exp_poly.log" 2>&1
    grep -E "^\||x cuDNN" "$OUT/logs/attn_exp_poly.log" | cut -c1-200 | tail -130
elif [ "$part" = 35 ]; then
    TILEFUSE_TUNING_DB="$OUT/tuning_bert.json" timeout 270 python3 bench/bench_models.py --models bert \
        --peers eager,default,reduce-overhead --tune none,fast --no-warm --reps 30 --json "$OUT/logs/zoo_tuned_bert.json" \
        > "$OUT/logs/zoo_tuned_bert.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_tuned_bert.log" | cut -c1-220 | head -40
elif [ "$part" = 39 ]; then
    TILEFUSE_TUNING_DB="$OUT/tuning_bg.json" timeout 400 python3 bench/bench_models.py --models bert,gpt2 \
        --peers default,reduce-overhead --tune none,fast --no-warm --reps 30 --json "$OUT/logs/zoo_tuned_bg.json" \
        > "$OUT/logs/zoo_tuned_bg.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_tuned_bg.log" | cut -c1-220 | head -40
    cp "$OUT/tuning_bg.json" "$OUT/logs/" 2>/dev/null
elif [ "$part" = 40 ]; then
    timeout 240 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider \
        "tests/test_gemm_ws.py::test_gemm_ws_gpu_matches_the_reference" > "$OUT/logs/gpu_tests_tall.log" 2>&1
    echo "ws numerics with 256 x 128: $(tail -1 "$OUT/logs/gpu_tests_tall.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_tall.log" | head -8
    sweep() {  # name, epilogue, shapes, [more flags]
        timeout 150 python3 bench/proto_gemm_ws.py --ws-only --tall --epilogue "$2" --shapes "$3" ${4:-} \
            --json "$OUT/logs/tall_$1.json" > "$OUT/logs/tall_$1.log" 2>&1
        grep -v -i warn "$OUT/logs/tall_$1.log" | sed -e 's/"block_K": 64, //' | cut -c1-150 | tail -24
    }
    sweep silu_mul silu_mul 8192x5632x2048
    sweep residual residual 8192x2048x5632,16384x768x3072
    sweep gelu gelu 16384x3072x768,8192x3072x768 --sliced
    sweep bias bias 8192x2304x768,8192x5632x2048,8192x8192x8192
elif [ "$part" = 41 ]; then
    timeout 200 python3 bench/proto_gemm_ws.py --ws-only --tall --sliced --epilogue gelu \
        --shapes 16384x3072x768,8192x3072x768,12608x3072x768,8192x4096x1024 --json "$OUT/logs/tall_gelu4.json" \
        > "$OUT/logs/tall_gelu4.log" 2>&1
    grep -v -i warn "$OUT/logs/tall_gelu4.log" | sed -e 's/"block_K": 64, //' | cut -c1-150 | tail -48
    TILEFUSE_TUNING_DB="$OUT/tuning_order.json" timeout 330 python3 bench/tuned_order.py --models bert,gpt2 \
        --rounds 2 --json "$OUT/logs/tuned_order.json" > "$OUT/logs/tuned_order.log" 2>&1
    grep -v -i warn "$OUT/logs/tuned_order.log" | cut -c1-260 | tail -30
elif [ "$part" = 42 ] || [ "$part" = 43 ]; then
    TILEFUSE_LINK_FROM_CACHE=0 timeout 120 python3 bench/compile_time.py --models mlp --compilers tilefuse,inductor \
        --timeline --out "$OUT/logs/compile_mlp_timeline.json" > "$OUT/logs/compile_mlp_timeline.log" 2>&1
    grep -v -i warn "$OUT/logs/compile_mlp_timeline.log" | grep -v '^{' | cut -c1-200 | tail -40
    TILEFUSE_LINK_FROM_CACHE=1 timeout 90 python3 bench/compile_time.py --models mlp --compilers tilefuse --timeline \
        --out "$OUT/logs/compile_mlp_timeline_linked.json" > "$OUT/logs/compile_mlp_timeline_linked.log" 2>&1
    grep -v -i warn "$OUT/logs/compile_mlp_timeline_linked.log" | grep -v '^{' | cut -c1-200 | tail -20
    [ "$part" = 43 ] && { TILEFUSE_LINK_FROM_CACHE=1 TILELANG_CACHE_DIR=$(mktemp -d) timeout 130 \
        python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_dynamo_e2e.py tests/test_artifact.py \
        > "$OUT/logs/gpu_tests_linked.log" 2>&1
        echo "e2e and artifact GPU tests, kernels compiled afresh: $(tail -1 "$OUT/logs/gpu_tests_linked.log")"
        grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_linked.log" | head -8; continue; }
    TILEFUSE_TUNING_DB="$OUT/tuning_vm.json" timeout 300 python3 bench/bench_models.py --models vit,mlp \
        --peers eager,default,reduce-overhead --tune none,fast --no-warm --reps 30 --json "$OUT/logs/zoo_tuned_vm.json" \
        > "$OUT/logs/zoo_tuned_vm.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_tuned_vm.log" | cut -c1-220 | head -40
elif [ "$part" = 44 ] || [ "$part" = 45 ]; then
    [ "$part" = 45 ] && { timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider "tests/test_gemm_ws.py::test_gemm_ws_gpu_matches_the_reference" \
        "tests/test_gemm_ws.py::test_gemm_ws_options_gpu_match_the_reference" tests/test_dynamo_e2e.py \
        > "$OUT/logs/gpu_tests_logpoly.log" 2>&1
    echo "ws numerics and e2e with the logpoly GELU: $(tail -1 "$OUT/logs/gpu_tests_logpoly.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_logpoly.log" | head -8; }
    timeout 240 python3 bench/proto_gemm_ws.py --ws-only --epilogue gelu --gelu-probes --sliced \
        --shapes 16384x3072x768,8192x3072x768 --json "$OUT/logs/gelu_probes.json" > "$OUT/logs/gelu_probes.log" 2>&1
    grep -v -i warn "$OUT/logs/gelu_probes.log" | sed -e 's/"block_K": 64, //' | cut -c1-150 | tail -60
elif [ "$part" = 46 ]; then
    timeout 150 python3 bench/compile_scaling.py --counts 1,3,6 --json "$OUT/logs/compile_scaling.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/logs/compile_scaling.log"
    timeout 200 python3 bench/compile_time.py --models mlp --compilers tilefuse,inductor --timeline --profile "$OUT/logs/prof" \
        --out "$OUT/logs/compile_mlp_profiled.json" > "$OUT/logs/compile_mlp_profiled.log" 2>&1
    grep -v -i warn "$OUT/logs/compile_mlp_profiled.log" | grep -v '^{' | cut -c1-200 | tail -24
    grep -A 40 "Ordered by: internal time" "$OUT/logs/prof/mlp-tilefuse-cold.prof.txt" | cut -c1-160 | head -45
    timeout 200 python3 bench/compile_time.py --models resnet --compilers tilefuse,inductor --timeline \
        --out "$OUT/logs/compile_resnet_timeline.json" > "$OUT/logs/compile_resnet_timeline.log" 2>&1
    grep -E "^resnet|^model" "$OUT/logs/compile_resnet_timeline.log"
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_resnet_timeline.json" 2>&1 | tail -30
elif [ "$part" = 47 ]; then
    timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider \
        "tests/test_gemm_ws.py::test_gemm_ws_gpu_bf16_logpoly_gelu_matches_the_reference" \
        > "$OUT/logs/gpu_tests_logpoly_bf16.log" 2>&1
    echo "bf16 logpoly GELU numerics: $(tail -1 "$OUT/logs/gpu_tests_logpoly_bf16.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_logpoly_bf16.log" | head -8
elif [ "$part" = 48 ]; then
    timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_dynamo_e2e.py \
        tests/test_cuda_graph_runner.py tests/test_measure_cpu.py > "$OUT/logs/gpu_tests_timing.log" 2>&1
    echo "e2e and CUDA graph runner GPU tests, shorter timing graphs: $(tail -1 "$OUT/logs/gpu_tests_timing.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_timing.log" | head -8
elif [ "$part" = 49 ]; then
    nvrtc_tests 200 8 tests/test_dynamo_e2e.py tests/test_attention_ws.py "$GEMM_WS_GPU" tests/test_nvrtc.py
elif [ "$part" = 50 ]; then
    nvrtc_gemms 80 16384x3072x768,8192x2304x768 8
    nvrtc_compile 150 mlp,resnet tilefuse,inductor compile_nvrtc --timeline
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_nvrtc.json" 2>&1 | tail -20
    TILEFUSE_NVRTC_WAIT=0 nvrtc_compile 90 mlp,resnet tilefuse compile_nvrtc_nowait
elif [ "$part" = 51 ]; then  # (parts 49 and 50 in under 7 minutes, for a short device budget)
    nvrtc_tests 150 12 tests/test_dynamo_e2e.py tests/test_attention_ws.py "$GEMM_WS_GPU"
    nvrtc_gemms 60 16384x3072x768 5
    nvrtc_compile 170 mlp,resnet tilefuse,inductor compile_nvrtc --timeline
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_nvrtc.json" 2>&1 | tail -20
elif [ "$part" = 52 ]; then  # (part 51 in about 3 minutes: its numerics, and ResNet-50's cold compile with NVRTC)
    nvrtc_tests 110 14 tests/test_dynamo_e2e.py "$GEMM_WS_GPU"
    nvrtc_compile 75 resnet tilefuse compile_nvrtc_resnet
elif [ "$part" = 53 ]; then  # (the device machine's CPUs: one kernel alone against 3 and 6; the MLP's cold compile
    # with nvcc and with NVRTC not waiting, beside Inductor's, in one call)
    timeout 150 python3 bench/compile_scaling.py --counts 1,3,6 --json "$OUT/logs/compile_scaling.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/logs/compile_scaling.log" | tail -20
    nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; grep -m1 "model name" /proc/cpuinfo
    TILEFUSE_NVRTC=0 timeout 90 python3 bench/compile_time.py --models mlp --compilers tilefuse,inductor --timeline \
        --out "$OUT/logs/compile_mlp_nvcc.json" > "$OUT/logs/compile_mlp_nvcc.log" 2>&1
    grep -E "^(mlp|model)" "$OUT/logs/compile_mlp_nvcc.log"
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_mlp_nvcc.json" 2>&1 | tail -12
    TILEFUSE_NVRTC_WAIT=0 nvrtc_compile 60 mlp tilefuse compile_mlp_nvrtc_nowait --timeline
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_mlp_nvrtc_nowait.json" 2>&1 | tail -12
elif [ "$part" = 54 ]; then  # (session 42: the split tails compiled in the plan's batch; ResNet-50 and the MLP's
    # cold compiles against Inductor's, with the timeline: the "splits" phase should be ~0 s, 2.8 s before on the H100)
    timeout 200 python3 bench/compile_time.py --models resnet,mlp --compilers tilefuse,inductor --timeline \
        --out "$OUT/logs/compile_prefetch.json" > "$OUT/logs/compile_prefetch.log" 2>&1
    grep -E "^(resnet|mlp|model)" "$OUT/logs/compile_prefetch.log"
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_prefetch.json" 2>&1 | tail -24
elif [ "$part" = 55 ]; then  # (session 43: each CUDA kernel's host library built through the assembler and the C
    # compiler, lowering/host_lib.py: the e2e and artifact GPU tests with every kernel compiled afresh, then the MLP's
    # and ResNet-50's cold compiles with it off and on, in turns, with the timeline ("cache write" per kernel))
    TILELANG_CACHE_DIR=$(mktemp -d) TILEFUSE_FUNC_CACHE_DIR=$(mktemp -d) timeout 170 python3 -m pytest -q -n 8 -m gpu \
        -p no:cacheprovider tests/test_dynamo_e2e.py tests/test_artifact.py > "$OUT/logs/gpu_tests_host_lib.log" 2>&1
    echo "e2e and artifact GPU tests, kernels compiled afresh: $(tail -1 "$OUT/logs/gpu_tests_host_lib.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_host_lib.log" | head -8
    echo "host_lib's own tests: $(timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_host_lib.py 2>&1 | tail -1)"
    for run in a b; do for fast in 0 1; do
        TILEFUSE_FAST_HOST_LIB=$fast timeout 60 python3 bench/compile_time.py --models mlp --compilers tilefuse \
            --timeline --out "$OUT/logs/compile_mlp_host$fast$run.json" > "$OUT/logs/compile_mlp_host$fast$run.log" 2>&1
        echo "FAST_HOST_LIB=$fast: $(grep -E "^mlp" "$OUT/logs/compile_mlp_host$fast$run.log" | head -2 | tr '\n' ' ')"
    done; done
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_mlp_host1b.json" 2>&1 | tail -8
    TILEFUSE_FAST_HOST_LIB=1 timeout 200 python3 bench/compile_time.py --models resnet,mlp --compilers tilefuse,inductor \
        --timeline --out "$OUT/logs/compile_host1.json" > "$OUT/logs/compile_host1.log" 2>&1
    grep -E "^(resnet|mlp|model)" "$OUT/logs/compile_host1.log"
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_host1.json" 2>&1 | tail -24
    TILEFUSE_FAST_HOST_LIB=0 timeout 100 python3 bench/compile_time.py --models resnet --compilers tilefuse --timeline \
        --out "$OUT/logs/compile_resnet_host0.json" > "$OUT/logs/compile_resnet_host0.log" 2>&1
    grep -E "^(resnet|model)" "$OUT/logs/compile_resnet_host0.log"
elif [ "$part" = 56 ]; then  # (session 43: ResNet-50's convolutions through conv2d's configs against cuDNN; the
    # default takes the first seed, 128 columns wide, for the 64-channel ones too)
    timeout 240 python3 bench/bench_conv.py --json "$OUT/logs/bench_conv.json" > "$OUT/logs/bench_conv.log" 2>&1
    grep -v -i warn "$OUT/logs/bench_conv.log" | cut -c1-160 | tail -110
elif [ "$part" = 57 ]; then  # (session 43: ResNet-50's 3x3 convolutions with A loaded by TMA in im2col mode,
    # bench/proto_conv_tma.py, against conv2d's default and cuDNN; compiled on the CPU, never run)
    timeout 240 python3 bench/bench_conv.py --tma --no-seeds --json "$OUT/logs/bench_conv_tma.json" \
        > "$OUT/logs/bench_conv_tma.log" 2>&1
    grep -v -i warn "$OUT/logs/bench_conv_tma.log" | cut -c1-160 | tail -60
elif [ "$part" = 58 ]; then  # (session 43: HF BERT's cold compile took 58-91 s in sessions 35-43, its tilefuse phases
    # ~10 s, Inductor's 12.8 s; on the CPU full BERT-base compiles in 14.4 s: where do the other ~60 s go?)
    timeout 300 python3 bench/profile_compile.py --model hf-bert --tune none --cold --top 30 \
        > "$OUT/logs/profile_compile_hf_bert.log" 2>&1
    grep -v -i warn "$OUT/logs/profile_compile_hf_bert.log" | cut -c1-200 | head -150
elif [ "$part" = 59 ]; then  # (session 44: no kernel built where the library leads: ResNet-50's 3x3 convolutions)
    TILELANG_CACHE_DIR=$(mktemp -d) TILEFUSE_FUNC_CACHE_DIR=$(mktemp -d) timeout 200 python3 -m pytest -q -n 8 -m gpu \
        -p no:cacheprovider tests/test_library_first.py tests/test_tune.py tests/test_dynamo_e2e.py tests/test_artifact.py \
        > "$OUT/logs/gpu_tests_library_first.log" 2>&1
    echo "measured choice, e2e and artifact GPU tests: $(tail -1 "$OUT/logs/gpu_tests_library_first.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_library_first.log" | cut -c1-200 | head -8
    timeout 150 python3 bench/compile_time.py --models resnet --compilers tilefuse,inductor --timeline \
        --out "$OUT/logs/compile_library_first.json" > "$OUT/logs/compile_library_first.log" 2>&1
    grep -E "^(resnet|model)" "$OUT/logs/compile_library_first.log"
    python3 bench/compile_time.py --summarize "$OUT/logs/compile_library_first.json" 2>&1 | head -12
    zoo resnet,timm-resnet50 200 zoo_resnets_library_first
elif [ "$part" = 60 ]; then  # (session 44: held-out models in forms not measured before)
    zoo hf-bert-eager,hf-gpt2-eager,hf-vit 250 hf_eager_vit eager,default
    zoo hf-llama 230 hf_llama eager,default
elif [ "$part" = 61 ]; then  # (session 45: HF GPT-2 with SDPA compiled in 18.1 s against Inductor's 13.5 in session 44,
    # where every other held-out model compiles faster than Inductor: where does the time go?)
    timeout 300 python3 bench/profile_compile.py --model hf-gpt2 --tune none --cold --top 30 \
        > "$OUT/logs/profile_compile_hf_gpt2.log" 2>&1
    grep -v -i warn "$OUT/logs/profile_compile_hf_gpt2.log" | cut -c1-200 | head -150
elif [ "$part" = 62 ]; then  # (session 45: every kernel a programmatic dependent, TILEFUSE_EXPERIMENTAL=pdl_all)
    TILELANG_CACHE_DIR=$(mktemp -d) timeout 200 python3 -m pytest -q -n 6 -m gpu -p no:cacheprovider tests/test_pdl.py \
        > "$OUT/logs/gpu_tests_pdl_all.log" 2>&1
    echo "PDL GPU tests: $(tail -1 "$OUT/logs/gpu_tests_pdl_all.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_pdl_all.log" | cut -c1-200 | head -8
    timeout 330 python3 bench/bench_models.py --models gpt2,bert --peers default --tune none,none+pdl_all --no-warm \
        --reps 30 --json "$OUT/logs/zoo_pdl_all.json" > "$OUT/logs/zoo_pdl_all.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_pdl_all.log" | grep -v "regions as chosen\|launching" \
        | cut -c1-220 | head -40
elif [ "$part" = 63 ]; then  # (session 45: PDL for the TMA-fed GEMMs and attention alone, TILEFUSE_EXPERIMENTAL=pdl_tma)
    timeout 330 python3 bench/bench_models.py --models gpt2,bert --peers default --tune none,none+pdl_tma --no-warm \
        --reps 30 --json "$OUT/logs/zoo_pdl_tma.json" > "$OUT/logs/zoo_pdl_tma.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_pdl_tma.log" | grep -v "regions as chosen\|launching" \
        | cut -c1-220 | head -40
elif [ "$part" = 64 ]; then  # (session 45: #13's compile bar where it failed on the H200, MLP and ResNet-50, after
    # sessions 41-44's compile work; their default ratio beside)
    zoo mlp,resnet 330 zoo_default_mr
elif [ "$part" = 65 ]; then  # (session 45: the ws attention's exponents pinned before the wait for P V, pin_softmax)
    [ "${PIN_TESTS:-1}" = 1 ] && { TILELANG_CACHE_DIR=$(mktemp -d) timeout 120 python3 -m pytest -q -n 8 -m gpu \
        -p no:cacheprovider tests/test_attention_ws.py -k "pin_softmax or (padding_mask and variant4)" \
        > "$OUT/logs/gpu_tests_pin.log" 2>&1
    echo "pin_softmax GPU tests: $(tail -1 "$OUT/logs/gpu_tests_pin.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_pin.log" | cut -c1-200 | head -8; }
    timeout "${PIN_LIMIT:-230}" python3 bench/bench_attention.py --shapes "${PIN_SHAPES:-d64}" --configs pin --json "$OUT/logs/attn_pin.json" \
        > "$OUT/logs/attn_pin.log" 2>&1
    grep -v -i warn "$OUT/logs/attn_pin.log" | cut -c1-170 | tail -60
elif [ "$part" = 66 ]; then  # (session 45: pin_softmax in whole models, TILEFUSE_EXPERIMENTAL=attention_pin_softmax)
    timeout 330 python3 bench/bench_models.py --models bert,gpt2 --peers default --no-warm --reps 30 \
        --tune none,none+attention_pin_softmax --json "$OUT/logs/zoo_pin.json" > "$OUT/logs/zoo_pin.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_pin.log" | grep -v "regions as chosen\|launching" \
        | cut -c1-220 | head -40
elif [ "$part" = 67 ]; then  # (session 46: Nsight Compute on the ws attention and cuDNN, #14's D-64 gap)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    echo "ncu: $NCU"
    for shape in ${NCU_SHAPES:-bert long}; do
        rep="$OUT/logs/ncu_$shape"
        timeout 240 "$NCU" --profile-from-start off --clock-control none --set full -f -o "$rep" \
            python3 bench/ncu_attention.py --shape "$shape" > "$rep.log" 2>&1
        echo "== $shape: ncu exit $?"; grep -v "^==PROF==" "$rep.log" | grep -v -i warn | tail -4 | cut -c1-200
        "$NCU" --import "$rep.ncu-rep" --page details > "${rep}_details.txt" 2>&1
        "$NCU" --import "$rep.ncu-rep" --page raw --csv > "${rep}_raw.csv" 2>&1
        grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Dynamic Shared" \
            "${rep}_details.txt" | cut -c1-160 | head -40
    done
elif [ "$part" = 68 ]; then  # (session 46: where the ws attention's warps stall, by SASS line; the options rechecked)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for rep in ${NCU_REPS:-ncu/ncu_bert.ncu-rep}; do  # (a report of part 67's, carried in the working tree)
        [ -f "$rep" ] || { echo "no report $rep"; continue; }
        "$NCU" --import "$rep" --page source --csv --print-source sass > "$OUT/logs/$(basename "$rep" .ncu-rep)_sass.csv" \
            2> "$OUT/logs/ncu_source.err"
        echo "source page: exit $?, $(wc -l < "$OUT/logs/$(basename "$rep" .ncu-rep)_sass.csv") lines"; tail -3 "$OUT/logs/ncu_source.err"
    done
    timeout "${RECHECK_LIMIT:-330}" python3 bench/bench_attention.py --shapes d64 --configs recheck \
        --json "$OUT/logs/attn_recheck.json" > "$OUT/logs/attn_recheck.log" 2>&1
    grep -v -i warn "$OUT/logs/attn_recheck.log" | cut -c1-200 | tail -80
elif [ "$part" = 69 ]; then  # (session 46: the late store and two Q buffers leading at D 64 up to 2048 keys)
    attn_variants short "short_keys or variant6 or zoo_bert" "${SHORT_TEST_LIMIT:-150}" "${SHORT_LIMIT:-240}" \
        ${SHORT_SHAPES:-sweep masked}
elif [ "$part" = 70 ]; then  # (session 47: one producer warp)
    attn_variants lean "lean or (padding and variant7)" "${LEAN_TEST_LIMIT:-150}" "${LEAN_LIMIT:-240}" \
        ${LEAN_SHAPES:-sweep masked}
elif [ "$part" = 71 ]; then  # (session 47: the lean producer in whole models)
    timeout "${LEAN_ZOO_LIMIT:-330}" python3 bench/bench_models.py --models "${LEAN_MODELS:-bert,gpt2}" --peers default \
        --no-warm --reps 30 --tune none,none+attention_lean_producer --json "$OUT/logs/zoo_lean.json" \
        > "$OUT/logs/zoo_lean.log" 2>&1
    grep -E "^  [a-z0-9-]+: |^model |^[a-z0-9-]+ +[0-9t]" "$OUT/logs/zoo_lean.log" | grep -v "regions as chosen\|launching" \
        | cut -c1-220 | head -40
elif [ "$part" = 72 ]; then  # (session 47: which ws seed leads past SHORT_KEYS at D 64)
    timeout "${LONG_LIMIT:-300}" python3 bench/bench_attention.py --shapes long --configs short \
        --json "$OUT/logs/attn_long.json" > "$OUT/logs/attn_long.log" 2>&1
    grep -v -i warn "$OUT/logs/attn_long.log" | cut -c1-200 | tail -60
elif [ "$part" = 73 ]; then  # (session 48: wider key tiles for the 128-row ws seeds, and part 72's long runs)
    for shapes in sweep long masked; do
        timeout "$(case $shapes in sweep) echo 250;; long) echo 200;; *) echo 100;; esac)" python3 bench/bench_attention.py \
            --shapes "$shapes" --configs wide --json "$OUT/logs/attn_wide_$shapes.json" > "$OUT/logs/attn_wide_$shapes.log" 2>&1
        grep -v -i warn "$OUT/logs/attn_wide_$shapes.log" | cut -c1-160 | tail -80
    done
elif [ "$part" = 74 ]; then  # (session 48: part 73's long runs and D 128, which a refused launch cut short)
    for shapes in ${PART74_SHAPES:-long d64 d128}; do
        timeout "$(case $shapes in long) echo 220;; *) echo 150;; esac)" python3 bench/bench_attention.py --shapes "$shapes" --configs wide \
            --json "$OUT/logs/attn_wide_$shapes.json" > "$OUT/logs/attn_wide_$shapes.log" 2>&1
        grep "^|\|error\|Error" "$OUT/logs/attn_wide_$shapes.log" | cut -c1-160 | tail -40
    done
elif [ "$part" = 75 ]; then  # (session 49: the short-key options on the 192-row seed past SHORT_KEYS)
    for shapes in long d64; do
        timeout "$(case $shapes in long) echo 100;; *) echo 90;; esac)" python3 bench/bench_attention.py \
            --shapes "$shapes" --configs short --json "$OUT/logs/attn_short_$shapes.json" > "$OUT/logs/attn_short_$shapes.log" 2>&1
        grep "^|\|rror" "$OUT/logs/attn_short_$shapes.log" | cut -c1-160 | tail -40
    done
elif [ "$part" = 76 ]; then  # (session 50: ResNet-50's 1x1 convolutions as ws GEMMs)
    timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py -k taking_turns \
        > "$OUT/logs/gpu_tests_turned.log" 2>&1
    echo "GPU tests, extra_buffers=2: $(tail -1 "$OUT/logs/gpu_tests_turned.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_turned.log" | cut -c1-200 | head -8
    R1=200704x64x64,200704x64x256,200704x128x256,50176x128x512,50176x256x512,12544x256x1024,12544x512x1024
    R1=$R1,3136x512x2048,200704x256x64,50176x512x256,12544x1024x512,3136x2048x1024
    for ep in residual bias; do
        shapes=$R1 more=""; [ $ep = residual ] && shapes=200704x256x64,50176x512x128,12544x1024x256,3136x2048x512 more=--turned
        timeout "$(case $ep in residual) echo 120;; *) echo 130;; esac)" python3 bench/proto_gemm_ws.py --ws-only --narrow \
            $more --epilogue $ep --shapes "$shapes" --json "$OUT/logs/resnet_gemm_$ep.json" > "$OUT/logs/resnet_gemm_$ep.log" 2>&1
        grep -v "^ *$" "$OUT/logs/resnet_gemm_$ep.log" | sed 's/{"block_M": 128, "block_N": /n/; s/"block_K": 64, "stages": /st /' \
            | cut -c1-150 | tail -45
    done
    timeout 150 python3 bench/judge_regions.py --models resnet --out "$OUT/logs/judge_resnet.json" \
        > "$OUT/logs/judge_resnet.log" 2>&1
    grep "resnet" "$OUT/logs/judge_resnet.log" | cut -c1-330 | tail -45
elif [ "$part" = 77 ]; then  # (session 51: memory-bound shapes' seeds, 128 x 64 / 128 x 128 and turns for a residual)
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_ws.py \
        -k "taking_turns or (gpu_matches_the_reference and float16)" > "$OUT/logs/gpu_tests_ws.log" 2>&1
    echo "GPU tests, ws GEMM (fp16 every case and tile, turns fp16/bf16): $(tail -1 "$OUT/logs/gpu_tests_ws.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_ws.log" | cut -c1-200 | head -8
    zoo resnet 260 zoo_resnet_default
elif [ "$part" = 78 ]; then  # (session 52: judge_regions' conv fix, and where ResNet-50's ws GEMMs lose 0.1 ms in the model)
    timeout 150 python3 bench/judge_regions.py --models resnet --out "$OUT/logs/judge_resnet.json" \
        > "$OUT/logs/judge_resnet.log" 2>&1
    grep "resnet" "$OUT/logs/judge_resnet.log" | cut -c1-330 | tail -45
    timeout 200 python3 bench/profile_sequence.py --model resnet --calls 4 --top 40 --json "$OUT/logs/seq_resnet.json" \
        > "$OUT/logs/seq_resnet.log" 2>&1
    grep -v -i warn "$OUT/logs/seq_resnet.log" | cut -c1-170 | head -110
elif [ "$part" = 79 ]; then  # (session 52: the strided 1x1 as slice + GEMM, cuDNN's weights channels last once, pool tiles)
    TILELANG_CACHE_DIR=$(mktemp -d) timeout 150 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider \
        tests/test_templates_gpu.py -k pool tests/test_library_first.py tests/test_layout.py \
        > "$OUT/logs/gpu_tests_79.log" 2>&1
    echo "GPU tests, pools (pixel tiles), library-first convolutions: $(tail -1 "$OUT/logs/gpu_tests_79.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_79.log" | cut -c1-200 | head -8
    timeout 100 python3 bench/bench_pool.py --json "$OUT/logs/pool.json" > "$OUT/logs/pool.log" 2>&1
    grep -v -i warn "$OUT/logs/pool.log" | cut -c1-200 | tail -16
    TILEFUSE_TUNING_DB="$OUT/logs/tuning_resnet.json" zoo resnet 260 zoo_resnet_default
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); [print(k.split('|')[0][:60], v) for k, v in d.items() if k.endswith('|choice') and ('conv2d' in k or 'pool' in k)]" "$OUT/logs/tuning_resnet.json" 2>&1 | cut -c1-260 | head -12
    TILEFUSE_TUNING_DB="$OUT/logs/tuning_resnet.json" timeout 120 python3 bench/profile_sequence.py --model resnet \
        --only tilefuse --calls 4 --top 30 --json "$OUT/logs/seq_resnet.json" > "$OUT/logs/seq_resnet.log" 2>&1
    grep -v -i warn "$OUT/logs/seq_resnet.log" | cut -c1-170 | head -45
elif [ "$part" = 80 ]; then  # (session 52: part 79's changes, the pool's pixel tiles as the CUDA lead, views counted dense)
    TILELANG_CACHE_DIR=$(mktemp -d) timeout 150 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider \
        tests/test_dynamo_e2e.py tests/test_library_first.py tests/test_straight_line.py > "$OUT/logs/gpu_tests_80.log" 2>&1
    echo "GPU tests, e2e, library-first, straight line: $(tail -1 "$OUT/logs/gpu_tests_80.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_80.log" | cut -c1-200 | head -8
    TILEFUSE_TUNING_DB="$OUT/logs/tuning_resnet.json" zoo resnet 200 zoo_resnet_default
    TILEFUSE_TUNING_DB="$OUT/logs/tuning_resnet.json" timeout 80 python3 bench/profile_sequence.py --model resnet \
        --only tilefuse --calls 4 --top 30 --json "$OUT/logs/seq_resnet.json" > "$OUT/logs/seq_resnet.log" 2>&1
    grep -v -i warn "$OUT/logs/seq_resnet.log" | cut -c1-170 | sed -n 11,30p
    zoo bert,gpt2 230 zoo_default_bg
elif [ "$part" = 81 ]; then  # (session 52: views counted dense in the measured choice: ViT and LLaMA unchanged?)
    zoo "${ZOO81:-vit,llama}" 290 zoo_default_vl
elif [ "$part" = 82 ]; then  # (session 53: is a packed fp16 exponent one MUFU op for two scores?)
    nvcc -arch=sm_90a -O3 -o /tmp/mufu bench/probes/mufu_ex2.cu -cubin -o /tmp/mufu.cubin 2>&1 | tail -3
    nvcc -arch=sm_90a -O3 -o /tmp/mufu bench/probes/mufu_ex2.cu 2>&1 | tail -3
    timeout 60 /tmp/mufu | tee "$OUT/logs/mufu.log"
    cuobjdump -sass /tmp/mufu.cubin > "$OUT/logs/mufu.sass" 2>&1
    awk '/Function :/{f=$3} /MUFU|F2FP|HADD2.F32/{split($0,a,";"); n[f" "$2]++} END{for(k in n) print n[k], k}' \
        "$OUT/logs/mufu.sass" | sort -k2 | head -30
elif [ "$part" = 83 ]; then  # (session 53: #14's kernel bar: the default's seeds against cuDNN, sweep and long runs)
    for shapes in ${PART83_SHAPES:-sweep long}; do
        timeout "$(case $shapes in sweep) echo 250;; *) echo 200;; esac)" python3 bench/bench_attention.py \
            --shapes "$shapes" --configs seeds --json "$OUT/logs/attn_seeds_$shapes.json" > "$OUT/logs/attn_seeds_$shapes.log" 2>&1
        grep -E "^\|" "$OUT/logs/attn_seeds_$shapes.log" | cut -c1-200 | tail -40
    done
elif [ "$part" = 84 ]; then  # (session 53: held-out vision models never measured: ConvNeXt-T, EfficientNet-B0, Swin-T)
    zoo "${ZOO84:-timm-convnext,timm-efficientnet,timm-swin}" "${ZOO84_LIMIT:-540}" heldout_vision eager,default
elif [ "$part" = 85 ]; then  # (session 54: GPT-Neo's where-hidden attention as one sdpa a layer)
    zoo hf-gpt-neo "${PART85_LIMIT:-300}" heldout_neo eager,default
elif [ "$part" = 86 ]; then  # (session 55: short rows share a program, reduction.default_config)
    timeout 330 python3 bench/sweep_norm.py --json "$OUT/logs/sweep_norm.json" > "$OUT/logs/sweep_norm.log" 2>&1
    grep -v -i warn "$OUT/logs/sweep_norm.log" | cut -c1-220 | head -50
    timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_templates_gpu.py \
        -k "row_reduction or residual_norm" > "$OUT/logs/gpu_tests_86.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_86.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_86.log" | cut -c1-200 | head -8
elif [ "$part" = 87 ]; then  # (session 55: ConvNeXt and Swin with reduction.default_config)
    zoo "${ZOO87:-timm-convnext,timm-swin}" "${ZOO87_LIMIT:-540}" heldout_norms eager,default
elif [ "$part" = 88 ]; then  # (session 55: the depthwise template against cuDNN; its GPU tests)
    timeout 330 python3 bench/sweep_depthwise.py --only "${PART88_ONLY:-}" --json "$OUT/logs/sweep_dw.json" \
        > "$OUT/logs/sweep_dw.log" 2>&1
    grep -v -i warn "$OUT/logs/sweep_dw.log" | cut -c1-220 | head -50
    timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_depthwise.py \
        > "$OUT/logs/gpu_tests_88.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_88.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_88.log" | cut -c1-200 | head -8
elif [ "$part" = 89 ]; then  # (session 55: ConvNeXt and EfficientNet with the depthwise template, then experimental)
    zoo "${ZOO89:-timm-convnext,timm-efficientnet}" "${ZOO89_LIMIT:-540}" heldout_dw eager,default
elif [ "$part" = 90 ]; then  # (session 56: the depthwise template by default on CUDA, the H200's picks)
    timeout 240 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_depthwise.py tests/test_grouped_conv.py \
        tests/test_layout.py > "$OUT/logs/gpu_tests_90.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_90.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_90.log" | cut -c1-200 | head -8
    zoo "${ZOO90:-timm-convnext,timm-efficientnet}" "${ZOO90_LIMIT:-330}" heldout_dw_default eager,default
elif [ "$part" = 91 ]; then  # (session 56: ConvNeXt-T's GEMMs, N or K 96: ws tiles of every width)
    timeout 300 python3 bench/sweep_gemm.py --models "${PART91_MODELS:-timm-convnext}" --budget 4 \
        --widths 64,96,128,192,256 --json "$OUT/logs/sweep_gemm_widths.json" > "$OUT/logs/sweep_gemm_widths.log" 2>&1
    grep -v -i warn "$OUT/logs/sweep_gemm_widths.log" | cut -c1-230 | head -60
elif [ "$part" = 92 ]; then  # (session 56: the pool template's whole-plane schedule, experimental)
    timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_pool_global.py \
        > "$OUT/logs/gpu_tests_92.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_92.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_92.log" | cut -c1-200 | head -8
    TILEFUSE_EXPERIMENTAL=global_pool zoo "${ZOO92:-timm-efficientnet}" "${ZOO92_LIMIT:-240}" heldout_global_pool \
        eager,default
elif [ "$part" = 93 ]; then  # (session 58: Gemma 2's softcapped attention)
    timeout 150 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/test_softcap.py \
        > "$OUT/logs/gpu_tests_93.log" 2>&1
    echo "GPU tests: $(tail -1 "$OUT/logs/gpu_tests_93.log")"
    grep -E "^FAILED|^E  " "$OUT/logs/gpu_tests_93.log" | cut -c1-200 | head -8
    zoo hf-gemma2 "${PART93_LIMIT:-360}" heldout_gemma2 eager,default
elif [ "$part" = 34 ]; then
    zoo hf-bert 140 hf_bert_default eager
fi
done
echo "== end (at ${SECONDS} s)"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

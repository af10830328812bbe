#!/usr/bin/env bash
# One call on a several-GPU device machine: independent jobs, one GPU each, run side by side.
# Usage there (repo root, .devcache carried):  bash scripts/device_parallel.sh DEADLINE_S "JOB0" "JOB1" ...
# JOBi is a shell command run with CUDA_VISIBLE_DEVICES=i, its output in jobi.log; every job is cut at
# DEADLINE_S seconds after the start (the benchmarks write their JSON after every measurement). Jobs see
# OUT as a work folder; everything in it comes back as one $OUT/results.tgz (the tool returns 8 files at most).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
source .devcache/activate.sh >/dev/null 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "editable install failed"
export TILELANG_LOG_LEVEL=WARNING PYTHONUNBUFFERED=1 TILEFUSE_QUIET=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, tilelang; print('torch', torch.__version__, 'tilelang', tilelang.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$out/device.txt"
deadline=$1; shift
work="$out/work"; mkdir -p "$work"
start=$SECONDS
i=0
for job in "$@"; do
    left=$((deadline - (SECONDS - start)))
    OUT="$work" CUDA_VISIBLE_DEVICES=$i timeout "$left" bash -c "$job" > "$work/job$i.log" 2>&1 &
    i=$((i + 1))
done
wait
echo "all jobs done after $((SECONDS - start)) s"
cp "$out/device.txt" "$work/"
for f in "$work"/job*.log; do echo "== $f"; grep -v "TileLang:" "$f" | tail -"${TAIL:-15}"; done
tar czf "$out/results.tgz" -C "$work" . && rm -rf "$work"

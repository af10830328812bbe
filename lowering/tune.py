"""Measured tile configs: tune a ``KernelSpec`` once per target and TileLang version, remember the winner.

Note: candidates are the template's ``get_configs`` seeds, the default pick first (so tuning never
loses to the untuned build on the same inputs), plus Carver's hints for GEMMs on CUDA (Carver needs
a GPU to describe the device; the H200's numbers are filled in by hand, see TILELANG.md). Every
candidate compiles in parallel, runs once as warm-up (its output checked against the first
candidate's within the dtype's tolerance), then is timed: ``time.perf_counter`` on ``c``, CUDA
events on ``cuda``. The fastest correct one goes to a JSON database keyed by template, a digest of
the spec, the target and the TileLang version, so identical specs (and a second compile of the same
model) measure nothing. ``make_prim_func`` reads the winner through ``best_config`` only inside
``applying(db)`` (``build_runner`` enters it when ``Options.tune`` is not ``"none"``), so untuned
compiles never depend on what a database holds.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilefuse.fileio import write_atomic

_log = logging.getLogger("tilefuse")
DB_ENV = "TILEFUSE_TUNING_DB"
# Candidates per spec: "fast" measures a few seeds, "max" everything (seeds and Carver hints) up to this.
BUDGETS = {"none": 0, "fast": 4, "max": 16}
WARMUP, REPS = {"c": 2, "cuda": 5}, {"c": 5, "cuda": 20}
# Outputs of two configs differ only by summation order: relative to the output's magnitude.
TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}


class TuningDBError(RuntimeError):
    """The tuning database file cannot be read or written."""


def default_db_path() -> Path:
    return Path(os.environ.get(DB_ENV) or Path.home() / ".cache" / "tilefuse" / "tuning.json")


def spec_digest(spec) -> str:
    """What a kernel is built from, as ``runtime.artifact`` digests it (its tile config aside)."""
    return hashlib.sha256(repr((spec.template, spec.params, spec.out_idx)).encode()).hexdigest()


def db_key(spec, target: dict) -> str:
    import tilelang

    return "|".join((spec.template, spec_digest(spec)[:32], json.dumps(target, sort_keys=True),
                     f"tilelang-{tilelang.__version__}"))


class TuningDB:
    """A JSON file of ``db_key -> {"config", "seconds", "candidates", "template", "tuned_at"}`` (and of
    ``db_key|choice -> {"torch", "kernel_ms", "torch_ms"}``, see ``choose_backends``).

    Writes go through a temporary file and ``os.replace`` (a reader never sees half a file) and merge
    with what is on disk under a lock file (two processes tuning at once both keep their entries).
    A file that is not a tuning database is moved aside to ``<name>.corrupt`` with a warning."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_db_path()
        self._entries: dict | None = None

    def entries(self) -> dict:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def get(self, spec, target: dict, what: str = "") -> dict | None:
        """The entry of ``spec`` on ``target``: its tuned config, or with ``what="choice"`` the measured
        choice between its kernel and the region's torch ops (``choose_backends``)."""
        return self.entries().get(db_key(spec, target) + (f"|{what}" if what else ""))

    def put(self, spec, target: dict, entry: dict, what: str = "") -> None:
        key = db_key(spec, target) + (f"|{what}" if what else "")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                entries = {**self._read(), key: entry}
                write_atomic(self.path, json.dumps(entries, indent=1, sort_keys=True))
        except OSError as e:
            raise TuningDBError(f"tuning database {self.path}: cannot write it ({e}); set {DB_ENV} to a "
                                "writable file") from e
        self._entries = entries

    def _read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise TuningDBError(f"tuning database {self.path}: cannot read it ({e})") from e
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not all(
                    isinstance(v, dict) and (isinstance(v.get("config"), dict) if not k.endswith("|choice")
                                             else isinstance(v.get("torch"), bool)) for k, v in data.items()):
                raise ValueError("not an object of {key: {'config': {...}, ...}} (choices: {'torch': bool, ...})")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            aside = self.path.with_name(self.path.name + ".corrupt")
            _log.warning("tuning database %s is not valid (%s); moved to %s, starting empty", self.path, e, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return {}
        return data

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # not POSIX: atomic replace still holds, concurrent merges may drop an entry
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class TuneResult:
    """The config chosen for one spec; ``source`` is ``"db"`` (nothing measured) or ``"measured"``."""

    config: dict
    seconds: float | None
    source: str
    measured: int = 0  # candidates timed in this call
    failed: dict = field(default_factory=dict)  # candidate index -> why it was dropped


# ---- candidates ---------------------------------------------------------------------------------------------

def candidates(spec, target: dict, limit: int = BUDGETS["max"]) -> list[dict]:
    """Configs to measure for ``spec``: the template's config space with the default pick first (for GEMMs on
    CUDA, ordered by wasted waves, which puts the pick first), then Carver's hints for GEMMs on CUDA; at most
    ``limit``, no duplicates."""
    from tilefuse.lowering.registry import config_space, gemm_wave_cost, kernel_key

    kw = spec.factory_kwargs()
    seeds = config_space(spec, target)
    if spec.template in ("gemm", "gemm_sp") and target.get("kind") == "cuda":
        leaders = seeds[:2]  # the space lists the measured leaders first
        seeds.sort(key=lambda c: gemm_wave_cost(c, kw))  # stable: ties keep the template's order
        if spec.template == "gemm":
            # the untuned pick, then the measured leaders, then the rest of the space by waves
            pick = kernel_key(spec, target, None, tuned=False)[0]
            seeds = [pick, *leaders, *seeds, *carver_gemm_configs(kw, target)]
    out, seen = [], set()
    for c in seeds:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(c))
    return out[:limit]


def carver_gemm_configs(kw: dict, target: dict, topk: int = 10) -> list[dict]:
    """Carver's GEMM hints as ``gemm`` configs; [] where Carver cannot answer (it models sm_90 like sm_80:
    seeds, not final configs)."""
    from tilefuse.lowering.templates.gemm_configs import SMEM_LIMIT, shared_memory_bytes

    dtype = kw.get("B_dtype") or kw.get("A_dtype") or "float16"
    arch = target.get("arch", "sm_90a")
    try:
        from unittest import mock

        from tilelang import carver
        from tilelang.carver import matmul_analysis

        device = _carver_arch(arch)
        with mock.patch.object(matmul_analysis, "get_arch", lambda _target: device):
            tmpl = carver.MatmulTemplate(M=kw["M"], N=kw["N"], K=kw["K"], in_dtype=dtype,
                                         out_dtype=kw.get("out_dtype") or dtype, accum_dtype="float32")
            hints = tmpl.with_arch(device).recommend_hints(topk=topk)
    except Exception as e:  # noqa: BLE001 -- Carver is an optional source of seeds
        _log.info("carver gave no GEMM hints for %s (%s: %s)", arch, type(e).__name__, e)
        return []
    limit = SMEM_LIMIT.get(arch.rstrip("a")[:5], 99 * 1024)
    out = []
    for h in hints:
        (bm, bn), (wm, wn), bk = h.block, h.warp, h.rstep[0]
        threads = (bm // wm) * (bn // wn) * 32
        stages = max(int(h.pipeline_stage), 1)
        if threads <= 1024 and shared_memory_bytes(bm, bn, bk, stages, dtype) <= limit:
            out.append({"block_M": bm, "block_N": bn, "block_K": bk, "num_stages": stages, "threads": threads,
                        "enable_rasterization": "NoRaster" not in type(h.rasterization_plan).__name__})
    return out


def _carver_arch(arch: str):
    """A Carver CUDA device described by hand (``carver.arch.CUDA`` queries a GPU): the H200's numbers
    for sm_90, an A100's for sm_80, else the sm_80 numbers with that arch's shared memory."""
    from tilelang.backend.target import determine_target
    from tilelang.carver.arch.cuda import CUDA

    from tilefuse.lowering.templates.gemm_configs import SMEM_LIMIT

    sm = int("".join(ch for ch in arch if ch.isdigit()) or 80)
    d = object.__new__(CUDA)
    d.target = determine_target({"kind": "cuda", "arch": arch}, return_object=True)
    d.sm_version, d.compute_capability = sm, str(sm)
    d.name, d.device, d.platform = f"offline {arch}", None, "CUDA"
    d.smem_cap = SMEM_LIMIT.get(arch.rstrip("a")[:5], 99 * 1024)
    d.compute_max_core = 132 if sm >= 90 else 108
    d.warp_size, d.reg_cap, d.sm_partition = 32, 65536, 4
    d.max_smem_usage = 2 * d.smem_cap
    d.l2_cache_size_bytes = (50 if sm >= 90 else 40) * 1024 * 1024
    d.transaction_size, d.bandwidth = [32, 128], [750, 12080]
    d.available_tensor_instructions = None
    return d


# ---- measuring ----------------------------------------------------------------------------------------------

def _inputs(func, out_idx, device: str, seed: int = 0) -> list:
    """Random tensors for ``func``'s input parameters (integers are zeros: always valid indices)."""
    import torch

    params = list(func.params)
    outs = {i % len(params) for i in out_idx}
    g = torch.Generator().manual_seed(seed)
    args = []
    for i, p in enumerate(params):
        if i in outs:
            continue
        if p not in func.buffer_map:
            raise TypeError(f"parameter {p} is not a buffer; tuning needs static tensor parameters")
        buf = func.buffer_map[p]
        shape = [int(s) for s in buf.shape]
        dt = getattr(torch, str(buf.dtype))
        t = torch.randn(shape, generator=g) if dt.is_floating_point else torch.zeros(shape)
        args.append(t.to(dtype=dt, device=device))
    return args


def _outputs(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _measure(kernel, args, kind: str) -> float:
    """Seconds per call of ``kernel(*args)``: the median of ``REPS`` after ``WARMUP`` calls."""
    reps = REPS.get(kind, 3)
    for _ in range(WARMUP.get(kind, 1)):
        kernel(*args)
    if kind == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            kernel(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    return _cpu_time(kernel, args, reps)


# On the CPU a timing shares the cores with everything else running (on a loaded 2-core machine one call in
# several is slowed by a neighbour): calls are timed one by one, enough of them to fill CPU_TIME_BUDGET_S (at least
# the kind's REPS, at most CPU_MAX_REPS), and the median decides.
CPU_TIME_BUDGET_S = 0.02
CPU_MAX_REPS = 25


def _cpu_time(fn, args, reps: int) -> float:
    """Median seconds of ``fn(*args)`` over at least ``reps`` calls, more for short ones (see CPU_TIME_BUDGET_S)."""
    times: list[float] = []
    want = reps
    while len(times) < want:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
        if len(times) == reps:  # short calls: more of them, as many as the median so far fits in the budget
            want = max(reps, min(CPU_MAX_REPS, math.ceil(CPU_TIME_BUDGET_S / max(sorted(times)[reps // 2], 1e-7))))
    return sorted(times)[len(times) // 2]


# Timings that decide must see the operands where the model has them: in HBM, not in the 50 MB L2 that a kernel
# called again on the same inputs finds them in (a 25 MB layer norm "ran" at 3 TB/s so). Each timed call reads its
# own copy of the operands, enough copies to span this many bytes.
ROTATE_BYTES = 256 * 2**20
ROTATE_MAX_COPIES = 32


def _nbytes(args) -> int:
    import torch

    if isinstance(args, torch.Tensor):
        return args.numel() * args.element_size()
    if isinstance(args, (list, tuple)):
        return sum(_nbytes(a) for a in args)
    return 0


def _copy(args):
    import torch

    if isinstance(args, torch.Tensor):
        return args.clone()
    if isinstance(args, (list, tuple)):
        return type(args)(_copy(a) for a in args)
    return args


def rotations(args, span: int = ROTATE_BYTES, most: int = ROTATE_MAX_COPIES) -> list:
    """``args`` and enough copies of it that calls cycling through them read ``span`` bytes of distinct
    operands (at most ``most`` sets; one where the operands alone span it)."""
    size = _nbytes(args)
    n = 1 if size >= span or size == 0 else min(most, math.ceil(span / size))
    return [args] + [_copy(args) for _ in range(n - 1)]


def _device_time(fn, args, kind: str) -> float:
    """Seconds of device time per ``fn(*args)`` with cold caches: on CUDA, replays of a CUDA graph of ``REPS``
    calls (what the runtime replays, free of Python's launch cost, which would otherwise favour one kernel over
    several torch ops), each call on its own copy of the operands (``rotations``) so that none finds them in
    L2; ``_measure`` where capture fails (a region reading values on the host) or off CUDA."""
    if kind != "cuda":
        return _measure(fn, args, kind)
    import torch

    sets = rotations(args)
    try:
        reps = max(REPS["cuda"], len(sets))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args)  # warm-up outside the graph (lazy initialisation must not be captured)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for r in range(reps):
                fn(*sets[r % len(sets)])
        return _measure(lambda: graph.replay(), (), kind) / reps
    except Exception:  # noqa: BLE001 -- not capturable: time it plainly
        torch.cuda.synchronize()
        return _measure(lambda: [fn(*a) for a in sets], (), kind) / len(sets)


def _close(got: list, want: list) -> bool:
    import torch

    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        if not g.dtype.is_floating_point:
            if not torch.equal(g, w):
                return False
            continue
        tol = TOLERANCE.get(str(w.dtype).removeprefix("torch."), 1e-3)
        g32, w32 = g.float(), w.float()
        scale = max(1.0, float(w32.nan_to_num(0, 0, 0).abs().max())) if w32.numel() else 1.0
        if not torch.allclose(g32, w32, rtol=tol, atol=tol * scale, equal_nan=True):
            return False
    return True


def tune_spec(spec, target: dict, budget: str | int = "fast", db: TuningDB | None = None,
              deadline: float | None = None) -> TuneResult:
    """The fastest correct config of ``spec`` on ``target`` (this machine's device), from ``db`` when it
    has one; otherwise measured over ``budget`` candidates (``"fast"``, ``"max"`` or a count) and stored.
    Past ``deadline`` (``time.monotonic()``) no further candidate is timed."""
    db = db if db is not None else TuningDB()
    hit = db.get(spec, target)
    if hit is not None:
        return TuneResult(dict(hit["config"]), hit.get("seconds"), "db")
    (job,) = compile_jobs(candidate_jobs([spec], target, budget), target)
    return _finish(job, target, db, deadline)


@dataclass
class _Job:
    """One spec's candidates: their prim funcs (or why a template refused), then their kernels."""

    spec: Any
    configs: list[dict]
    idx: list[int] = field(default_factory=list)  # candidates with a prim func, in order
    funcs: list[tuple] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    kernels: list = field(default_factory=list)


def candidate_jobs(specs, target: dict, budget) -> list[_Job]:
    """Each spec's candidates and their prim funcs (a template refusing a config drops that candidate)."""
    from tilefuse.lowering.registry import make_prim_func

    limit = BUDGETS[budget] if isinstance(budget, str) else int(budget)
    jobs = []
    for spec in specs:
        job = _Job(spec, candidates(spec, target, max(limit, 1)))
        if len(job.configs) > 1:  # one candidate needs no measuring
            for i, c in enumerate(job.configs):
                try:
                    job.funcs.append((make_prim_func(spec, target, c), list(spec.out_idx)))
                    job.idx.append(i)
                except Exception as e:  # noqa: BLE001 -- this candidate is dropped, the others go on
                    job.failed[i] = f"template: {type(e).__name__}: {e}"
        jobs.append(job)
    return jobs


def compile_jobs(jobs: list[_Job], target: dict, on_done: Callable[[], None] | None = None) -> list[_Job]:
    """Every job's candidates compiled together in one parallel batch (the slow part: nvcc), so that a
    model's kernels tune in about the time of its largest batch of compiles, not one spec after another."""
    from tilefuse.lowering.compile import compile_many

    funcs = [f for j in jobs for f in j.funcs]
    kernels = compile_many(funcs, target, return_exceptions=True, on_done=on_done) if funcs else []
    for j in jobs:
        j.kernels, kernels = kernels[:len(j.funcs)], kernels[len(j.funcs):]
    return jobs


def _finish(job: _Job, target: dict, db: TuningDB, deadline) -> TuneResult:
    """Time ``job``'s compiled candidates, store the winner in ``db``."""
    result = TuneResult(job.configs[0] if job.configs else {}, None, "measured")
    if job.funcs:
        result = _race(job, target, deadline)
    db.put(job.spec, target, {"template": job.spec.template, "config": result.config, "seconds": result.seconds,
                              "candidates": len(job.configs), "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return result


def _race(job: _Job, target: dict, deadline) -> TuneResult:
    timed, failed = time_candidates(job, target, deadline)
    if not timed:
        _log.warning("tuning %s: no candidate ran (%s); keeping the default config", job.spec.template, failed)
        return TuneResult(job.configs[0], None, "measured", 0, failed)
    seconds, best = min(timed)
    return TuneResult(job.configs[best], seconds, "measured", len(timed), failed)


def time_candidates(job: _Job, target: dict, deadline: float | None = None) -> tuple[list[tuple[float, int]], dict]:
    """Each compiled candidate of ``job`` run on the same random inputs (its output checked against the first
    candidate's) and timed with cold caches: ``[(seconds, candidate index)]`` and ``{index: why it was dropped}``.
    Past ``deadline`` no further candidate is timed."""
    kind = target.get("kind", "c")
    failed = dict(job.failed)
    device = "cuda" if kind == "cuda" else "cpu"
    args = _inputs(job.funcs[0][0], job.spec.out_idx, device)
    reference, timed = None, []
    for i, k in zip(job.idx, job.kernels):
        if isinstance(k, BaseException):
            failed[i] = f"compile: {str(k).strip().splitlines()[0][:200] if str(k).strip() else type(k).__name__}"
            continue
        if deadline is not None and time.monotonic() > deadline and timed:
            failed[i] = "not timed: the model's tuning time is spent"
            continue
        try:
            out = [o.clone() for o in _outputs(k(*args))]
            if reference is None:
                reference = out
            elif not _close(out, reference):
                failed[i] = "wrong output (differs from the first candidate's)"
                continue
            timed.append((_device_time(k, args, kind), i))
        except Exception as e:  # noqa: BLE001 -- a candidate that fails to run is dropped, never fatal
            failed[i] = f"run: {type(e).__name__}: {e}"
    return timed, failed


# ---- plans and the lookup make_prim_func consults ----------------------------------------------------------

def tune_plan(plan, target: dict, budget: str | int = "fast", db: TuningDB | None = None,
              seconds: float = math.inf, log: Callable[[str], None] | None = None,
              progress: bool = False) -> TuningDB:
    """Tune every distinct spec of ``plan``'s TileLang regions (at most ``seconds`` of timing in all; specs
    left over keep their default config); returns the database holding the winners. Every candidate of
    every spec compiles in one parallel batch, then the specs are timed one by one. With ``progress``, the
    compiles and the specs timed are reported on stderr (``tilefuse.progress``)."""
    from tilefuse.lowering.registry import region_specs
    from tilefuse.progress import Progress

    db = db if db is not None else TuningDB()
    graph, t0 = plan.graph, time.monotonic()
    distinct = list({(s.template, s.params, s.out_idx): s for s in region_specs(plan, target).values()}.values())
    todo = [s for s in distinct if db.get(s, target) is None]
    measured = 0
    if todo:
        try:
            jobs = candidate_jobs(todo, target, budget)
            n = sum(len(j.funcs) for j in jobs)
            with Progress(f"tuning {graph.name}: compiling candidates", n, "kernels", enabled=progress) as bar:
                jobs = compile_jobs(jobs, target, on_done=bar.tick)
        except Exception as e:  # noqa: BLE001 -- tuning failing never fails the compile
            _log.warning("%s: compiling tuning candidates failed (%s: %s); default configs are kept",
                         graph.name, type(e).__name__, e)
            jobs = []
        left = seconds - (time.monotonic() - t0)
        with Progress(f"tuning {graph.name}: timing", len(jobs), "kernels", enabled=progress, limit_s=left) as bar:
            for job in jobs:
                measured += _tune_one(job, graph.name, target, db, t0, seconds) is not None
                bar.tick()
    if log is not None:
        log(f"tuned {len(distinct)} distinct kernels ({len(distinct) - len(todo)} from {db.path}, {measured} "
            f"measured) in {time.monotonic() - t0:.1f} s")
    return db


def _tune_one(job: _Job, name: str, target: dict, db: TuningDB, t0: float, seconds: float) -> TuneResult | None:
    """Time one of ``tune_plan``'s compiled jobs: None when the time is spent or timing failed (logged; the
    spec keeps its default config)."""
    if time.monotonic() - t0 > seconds:
        return None
    try:
        return _finish(job, target, db, deadline=t0 + seconds)
    except TuningDBError:
        raise
    except Exception as e:  # noqa: BLE001 -- tuning failing never fails the compile: the default is kept
        _log.warning("%s: tuning a %s kernel failed (%s: %s); it keeps its default config", name,
                     job.spec.template, type(e).__name__, e)
        return None


_ACTIVE: contextvars.ContextVar[tuple[TuningDB, dict] | None] = contextvars.ContextVar("tilefuse_tuning", default=None)


@contextlib.contextmanager
def applying(db: TuningDB, target: dict | None = None) -> Iterator[TuningDB]:
    """Within this block ``best_config`` answers from ``db`` (for ``target``, or any target asked)."""
    token = _ACTIVE.set((db, target))
    try:
        yield db
    finally:
        _ACTIVE.reset(token)


def best_config(spec, target: dict) -> dict | None:
    """The tuned config of ``spec`` on ``target`` inside ``applying(db)``; None outside it or if untuned."""
    active = _ACTIVE.get()
    if active is None or (active[1] is not None and active[1] != target):
        return None
    entry = active[0].get(spec, target)
    return dict(entry["config"]) if entry else None


@contextlib.contextmanager
def tuned(plan, options) -> Iterator[TuningDB | None]:
    """``build_runner``'s hook: tune ``plan`` per ``options.tune`` and apply the winners while lowering;
    a no-op for ``"none"``."""
    if options.tune == "none":
        yield None
        return
    if options.tune not in BUDGETS:
        raise ValueError(f"unknown tune mode {options.tune!r}; use one of {', '.join(BUDGETS)} (TILEFUSE_TUNE)")
    from tilefuse.progress import wanted

    log = (lambda m: _log.info("%s: %s", plan.graph.name, m)) if options.verbose else None
    db = tune_plan(plan, options.target, options.tune, seconds=options.tune_seconds, log=log,
                   progress=wanted(options.quiet))
    with applying(db, options.target):
        yield db


def stored_choices(plan, target: dict, db: TuningDB | None = None) -> dict[str, dict]:
    """What the tuning database holds for each lowerable region of ``plan`` on ``target``, measuring nothing:
    its tuned config and how the measured choice runs it (``"kernel"``, ``"torch"`` or ``"split"``, with the
    times it was chosen on). ``tilefuse explain`` shows it; regions the database does not know are left out."""
    from tilefuse.lowering.registry import region_specs

    db = db if db is not None else TuningDB()
    out = {}
    for name, spec in region_specs(plan, target).items():
        entry, config, choice = {}, db.get(spec, target), db.get(spec, target, "choice")
        if config is not None:
            entry["config"] = config.get("config")
        if choice is not None:
            entry["runs"] = "split" if choice.get("split") else "torch" if choice.get("torch") else "kernel"
            entry.update({k: choice[k] for k in ("kernel_ms", "torch_ms", "split_ms") if choice.get(k) is not None})
        if entry:
            out[name] = entry
    return out


# ---- kernel or torch: the measured choice per region ---------------------------------------------------------

# A kernel is kept unless the region's torch ops are this much faster (timing noise must not flip choices).
KEEP_KERNEL_MARGIN = 0.97


def choose_backends(runner, args, db: TuningDB, target: dict, log: Callable[[str], None] | None = None) -> list[str]:
    """Run ``runner``'s plan once on ``args``, region by region; for each region with a kernel, time the kernel,
    the region's own ops through torch and, for a GEMM region with an epilogue of several ops, its split
    (``lowering/split.py``: the GEMM through torch, the epilogue as one elementwise kernel) on the same inputs
    (answers come from ``db`` when it has them), and keep the fastest; the fused kernel stays unless another
    way is ``KEEP_KERNEL_MARGIN`` faster. Returns one line per region not run as its fused kernel (also in
    the plan's notes), e.g. ``"fused_sdpa_3: torch 0.096 ms < kernel 0.197 ms"``."""
    import dataclasses

    from tilefuse.lowering.split import lower_splits
    from tilefuse.runtime.plan_runner import reference_region

    plan, kind = runner.plan, target.get("kind", "c")
    lines, regions = [], list(plan.regions)
    # splits are compiled (one batch) only where no stored choice rules them out
    wanted = [r for r in plan.regions if r.name in runner.kernels
              and (db.get(runner.kernels[r.name].spec, target, "choice") or {}).get("split", True) is not False]
    splits = lower_splits(plan, wanted, target)

    def choose(k, region, ins):
        kernel = runner.kernels.get(region.name)
        spec = getattr(kernel, "spec", None)
        if spec is None:
            return
        split = splits.get(region.name)
        choice = db.get(spec, target, "choice")
        if choice is None or ("split_ms" not in choice and split is not None):
            ref = reference_region(plan, region)
            choice = {"kernel_ms": _device_time(kernel, (ins,), kind) * 1e3,
                      "torch_ms": _device_time(ref, (ins,), kind) * 1e3,
                      "split_ms": _device_time(split, (ins,), kind) * 1e3 if split is not None else None}
            other = min(("torch", "split"), key=lambda w: choice[f"{w}_ms"] or float("inf"))
            beaten = choice[f"{other}_ms"] < KEEP_KERNEL_MARGIN * choice["kernel_ms"]
            choice.update({"torch": beaten and other == "torch", "split": beaten and other == "split"})
            db.put(spec, target, choice, "choice")
        if choice.get("split") and split is not None:
            runner.fns[k] = runner.kernels[region.name] = split
            regions[k] = dataclasses.replace(region, backend="split")
            lines.append(f"{region.name}: split {choice['split_ms']:.3f} ms (torch GEMM + TileLang epilogue) < "
                         f"kernel {choice['kernel_ms']:.3f} ms, torch {choice['torch_ms']:.3f} ms")
        elif choice["torch"] or choice.get("split"):  # a stored split whose tail does not lower here: torch
            runner.fns[k] = reference_region(plan, region)
            del runner.kernels[region.name]
            regions[k] = dataclasses.replace(region, backend="torch")
            lines.append(f"{region.name}: torch {choice['torch_ms']:.3f} ms < kernel {choice['kernel_ms']:.3f} ms")

    runner.run(*args, before_region=choose)
    if lines:
        runner.plan = dataclasses.replace(plan, regions=tuple(regions), notes=plan.notes + tuple(
            f"{x} (measured: " + ("its GEMM runs through torch, its epilogue as a TileLang kernel)" if ": split " in x
                                  else "the region runs through torch)") for x in lines))
        if log is not None:
            log(f"{len(lines)} regions run through torch, measured faster than their kernels: " + "; ".join(lines))
    return lines

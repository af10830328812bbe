"""The ``tilefuse`` command line: demo, compile, explain."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import tilefuse
from tilefuse import draw, models
from tilefuse.capture import capture_graphs
from tilefuse.config import Options, default_target, parse_target
from tilefuse.frontends.onnx import import_onnx
from tilefuse.lowering import vendor
from tilefuse.pipeline import plan_step, stored
from tilefuse.planner.sparsity import prune_module
from tilefuse.runtime import artifact


def _time_ms(fn, *args, reps: int = 10) -> float:
    """Median wall time of ``fn(*args)`` in ms after one warm-up (CUDA-synchronized where needed)."""
    fn(*args)
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _quiet(args) -> bool:
    """``--quiet``, else ``TILEFUSE_QUIET``; unlike the Python API, a command shows progress even into a log."""
    return bool(args.quiet or Options(target={"kind": "c"}).quiet)


def _max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def cmd_demo(args) -> int:
    """Compile a zoo model for the local target, run it, compare with eager, print plan and timings."""
    target = default_target()
    device = "cuda" if target["kind"] == "cuda" else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model, inputs = models.build(args.model, args.size, dtype=dtype, device=device)
    print(f"tilefuse {tilefuse.__version__}: model {args.model} ({args.size}), target {target}, {dtype}")
    runners = []
    t0 = time.perf_counter()
    compiled = tilefuse.compile(model, target=target, observer=runners.append, sparsity=args.sparsity,
                                quiet=_quiet(args))
    if args.sparsity:  # the compiled model is the pruned one: compare with that in eager
        model = prune_module(model)
    with torch.no_grad():
        out = compiled(*inputs)
        compile_s = time.perf_counter() - t0
        ref = model(*inputs)
        err = _max_rel_err(out, ref)
        for r in runners:
            print(r.plan.to_text(reasons=False) if args.verbose else r.plan.summary())
        eager_ms, tf_ms = _time_ms(model, *inputs), _time_ms(compiled, *inputs)
    if args.sparsity:
        print(compiled.sparsity_report.summary())
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    kernels, regions = _kernel_share(runners)
    print(f"TileLang kernels: {kernels} of {regions} regions ({100 * kernels / max(regions, 1):.0f}%); the others run "
          "through torch" + (", measured faster there on the first call" if kernels < regions else ""))
    whole = [r for r in runners if r.graph_backend == "torch"]
    if whole:
        print(f"{len(whole)} of {len(runners)} graphs measured faster whole as traced, through torch, than as planned: "
              "they run so")
    speed = eager_ms / tf_ms if tf_ms > 0 else float("inf")
    print(f"compile (first call) {compile_s:.2f} s; eager {eager_ms:.2f} ms; tilefuse {tf_ms:.2f} ms "
          f"(median of 10): {speed:.2f}x eager's speed ({'faster' if speed >= 1 else 'slower'})")
    print(f"max relative error vs eager: {err:.2e} ({'OK' if err <= tol else 'MISMATCH'}, tolerance {tol:g})")
    return 0 if err <= tol else 1


def _kernel_share(runners) -> tuple[int, int]:
    """(regions run as TileLang kernels, whole or split, regions that launch anything) over the compiled graphs."""
    regions = [(r, runner) for runner in runners for r in runner.plan.regions if r.launches]
    return sum(r.backend in ("tilelang", "split") and runner.graph_backend != "torch" for r, runner in regions), \
        len(regions)


def _load_graph(spec: str, size: str, sparsity: str | None = None, dtype: str = "float32"):
    """An ONNX file path or a zoo model name (built in ``dtype``) -> tilefuse Graph (the largest captured graph;
    with ``sparsity`` its linear weights are frozen into constants, as compiling with it does)."""
    if spec.endswith(".onnx") or Path(spec).is_file():
        return import_onnx(spec)
    if spec not in models.ZOO:
        raise SystemExit(f"tilefuse: {spec!r} is neither an ONNX file nor a zoo model ({', '.join(models.ZOO)})")
    model, inputs = models.build(spec, size, dtype=getattr(torch, dtype))
    graphs = capture_graphs(model, inputs, lower=False, sparsity=sparsity)  # planning needs no kernels
    return max(graphs, key=lambda g: len(g.nodes))


def cmd_explain(args) -> int:
    target = parse_target(args.target)
    graph = _load_graph(args.model, args.size, args.sparsity, args.dtype)
    if vendor.is_source_target(target):  # planned for the vendor's source, as ``compile --target`` builds it
        p, measured = vendor.source_plan(graph, vendor.check_target(target), sparsity=args.sparsity)[0], {}
    else:
        planned = plan_step(graph, Options(target=target, sparsity=args.sparsity))
        p, measured = planned.plan, stored(planned, target)
    if args.json:
        doc = {"nodes": p.source_nodes, "kernels": p.kernels,
               "regions": [{**{k: r.to_json()[k] for k in ("name", "kind", "pattern", "ops", "inputs", "outputs",
                                                            "backend")},
                            **({"measured": measured[r.name]} if r.name in measured else {})}
                           for r in p.regions if r.kind != "view"]}
        if p.notes:
            doc["notes"] = list(p.notes)
        if p.sparsity is not None:
            doc["sparsity"] = p.sparsity.to_json()
        print(json.dumps(doc, indent=2))
    else:
        print(p.to_text())
        if p.sparsity is not None:
            print(p.sparsity.summary())
        if measured:
            runs = [m.get("runs") for m in measured.values() if m.get("runs")]
            share = (f"; {sum(r != 'torch' for r in runs)} of {len(runs)} measured regions run as TileLang kernels"
                     if runs else "")
            print(f"measured on {target} (tuning database; the first call of a compiled model chooses{share}):")
            for name, m in measured.items():
                times = ", ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in m.items() if k.endswith("_ms"))
                print(f"  {name:<40} runs as {m.get('runs', 'kernel')}" + (f" ({times})" if times else "")
                      + (f"; config {m['config']}" if m.get("config") else ""))
    if args.svg:
        Path(args.svg).write_text(draw.to_svg(p))
        print(f"wrote {args.svg}", file=sys.stderr)
    if args.html:
        Path(args.html).write_text(draw.to_html(p))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _vendor_build(args, target: dict):
    """The model planned for a vendor target's source and each kernel produced (``lowering/vendor.py``)."""
    graph = _load_graph(args.model, args.size, args.sparsity, args.dtype)
    p, specs = vendor.source_plan(graph, target, sparsity=args.sparsity)
    return graph, vendor.emit(p, specs, target)


def cmd_compile_vendor(args, target: dict) -> int:
    """``compile --target hip|metal|ascend``: source per kernel (hip: code objects where clang-19 is set up), the
    summary table, ``--emit-dir`` files and the ``-o`` artifact."""
    t0 = time.perf_counter()
    graph, b = _vendor_build(args, target)
    print(b.plan.summary())
    for why in b.plan.refusals:
        if " runs through torch: " in why:
            print(f"  {why}")
    print(b.table())
    print(f"{target['kind']} build products: {b.toolchain}")
    if args.emit_dir:
        out = Path(args.emit_dir)
        out.mkdir(parents=True, exist_ok=True)
        for k in b.kernels:
            (out / f"{k.region}.{k.ext}").write_text(k.source)
            if k.product is not None:
                (out / f"{k.region}.{k.product_ext}").write_bytes(k.product)
        (out / "summary.txt").write_text(f"{b.plan.summary()}\ntarget {target}\n{b.table()}\n"
                                         f"build products: {b.toolchain}\n")
        print(f"wrote {len(b.kernels)} kernels and summary.txt to {out}")
    print(f"compiled {args.model} for {target} in {time.perf_counter() - t0:.2f} s")
    if args.output:
        path = artifact.save_vendor(b, graph, Options(target=target, sparsity=args.sparsity), args.output)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): the plan and each kernel for {target['kind']}")
    return 0


def cmd_compile(args) -> int:
    target = parse_target(args.target)
    if vendor.is_source_target(target):
        return cmd_compile_vendor(args, vendor.check_target(target))
    if args.emit_dir:
        raise ValueError(f"--emit-dir writes kernels for a vendor toolchain (--target hip|metal|ascend), not {target}")
    t0, source = time.perf_counter(), args.model
    if not Path(args.model).is_file() and args.model in models.ZOO:  # a zoo model goes through its ONNX export
        tmp = tempfile.TemporaryDirectory(prefix="tilefuse-compile-")
        source = models.export_onnx(args.model, Path(tmp.name) / f"{args.model}.onnx", args.size)
    compiled = tilefuse.compile_onnx(source, target=args.target, sparsity=args.sparsity, quiet=_quiet(args))
    print(compiled.summary())
    if compiled.sparsity_report is not None:
        print(compiled.sparsity_report.summary())
    print(f"compiled {args.model} for {compiled.options.target} in {time.perf_counter() - t0:.2f} s")
    if args.output:
        path = tilefuse.save(compiled, args.output)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB); load it with tilefuse.load")
    return 0


def cmd_serve(args) -> int:
    """Serve a .tfz artifact or an .onnx file over the Open Inference Protocol (KServe v2 REST)."""
    from tilefuse.serve import load_model, serve  # (FastAPI and uvicorn: only when serving)

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(args.model, target=args.target, quiet=_quiet(args))  # an artifact loads without compiling
    print(f"loaded {args.model} in {time.perf_counter() - t0:.2f} s", flush=True)
    serve(model, name=args.name or Path(args.model).stem, host=args.host, port=args.port,
          max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms, max_queue=args.max_queue,
          pad_batch=args.pad_batch, access_log=args.access_log, max_request_bytes=int(args.max_request_mb * (1 << 20)),
          batch_buckets=[int(b) for b in args.batch_buckets.split(",")] if args.batch_buckets else None)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tilefuse", description="graph-level fusion compiler on TileLang")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a zoo model for the local target, run it, compare with eager")
    d.add_argument("--model", default="gpt2")
    d.add_argument("--size", default="tiny")
    d.add_argument("-v", "--verbose", action="store_true", help="print every region")
    sparsity_help = "2:4: prune linear weights to 2:4 sparsity (2 of every 4 along K; gemm_sp on CUDA)"
    d.add_argument("--sparsity", choices=["2:4"], help=sparsity_help + "; compares with the pruned model")
    quiet_help = "no progress lines on stderr while tuning and compiling kernels (also TILEFUSE_QUIET=1)"
    d.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    d.set_defaults(fn=cmd_demo)
    e = sub.add_parser("explain", help="print the fusion plan of an ONNX file or a zoo model")
    e.add_argument("model", help="path to an .onnx file, or a zoo model name")
    e.add_argument("--size", default="tiny")
    e.add_argument("--target", default=None)
    e.add_argument("--json", action="store_true")
    e.add_argument("--svg", metavar="FILE")
    e.add_argument("--html", metavar="FILE")
    e.add_argument("--sparsity", choices=["2:4"], help=sparsity_help)
    e.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="zoo models: build them in this dtype (the tuning database's entries are per dtype)")
    e.set_defaults(fn=cmd_explain)
    c = sub.add_parser("compile", help="compile an ONNX file or a zoo model (for a vendor: --target hip|metal|ascend)")
    c.add_argument("model", help="path to an .onnx file, or a zoo model name")
    c.add_argument("-o", "--output", help="write the compiled model to this artifact (.tfz)")
    c.add_argument("--target", default=None, help="cuda[:sm_XX], c, hip[:gfx942|gfx90a|...], metal, ascend "
                                                    "(default: this machine's)")
    c.add_argument("--emit-dir", metavar="DIR", help="vendor targets: write each kernel's source (hip: and .hsaco) "
                                                     "and summary.txt here")
    c.add_argument("--size", default="tiny", help="zoo models: their size")
    c.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"],
                   help="zoo models for a vendor target: build them in this dtype")
    c.add_argument("--sparsity", choices=["2:4"], help=sparsity_help + "; prints how much the outputs changed")
    c.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    c.set_defaults(fn=cmd_compile)
    s = sub.add_parser("serve", help="serve a .tfz artifact or an .onnx file over KServe v2 REST (HTTP)")
    s.add_argument("model", help="path to a .tfz artifact or an .onnx file")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0: a free port the system picks, named in the start line")
    s.add_argument("--name", help="model name in URLs (default: the file name without extension)")
    s.add_argument("--max-batch-size", type=int, default=8, help="rows per model run (1 turns batching off)")
    s.add_argument("--max-delay-ms", type=float, default=5.0, help="how long a batch may wait to fill")
    s.add_argument("--max-queue", type=int, default=256, help="queued requests before answering 503")
    s.add_argument("--pad-batch", action="store_true",
                   help="the model has a static dim 0: pad batches to it and accept 1..B rows per request")
    s.add_argument("--batch-buckets", metavar="1,2,4,8",
                   help="batch sizes the model runs at (batches are padded up to one); default: powers of two")
    s.add_argument("--max-request-mb", type=float, default=64,
                   help="largest request body in MiB, as sent and after gzip/deflate decoding (413 past it)")
    s.add_argument("--target", default=None, help="compile target for an .onnx file (default: local)")
    s.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    s.add_argument("--access-log", action="store_true", help="log every HTTP request")
    s.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr while compiling an .onnx file (also TILEFUSE_QUIET=1)")
    s.set_defaults(fn=cmd_serve)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, NotImplementedError, FileNotFoundError) as e:
        print(f"tilefuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

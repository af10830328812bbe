"""The ``tilefuse`` command line: demo, compile, explain."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


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


def _max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def cmd_demo(args) -> int:
    """Compile a zoo model for the local target, run it, compare with eager, print plan and timings."""
    import tilefuse
    from tilefuse import models
    from tilefuse.config import default_target

    target = default_target()
    device = "cuda" if target["kind"] == "cuda" else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model, inputs = models.build(args.model, args.size, dtype=dtype, device=device)
    print(f"tilefuse {tilefuse.__version__}: model {args.model} ({args.size}), target {target}, {dtype}")
    runners = []
    t0 = time.perf_counter()
    compiled = tilefuse.compile(model, target=target, observer=runners.append)
    with torch.no_grad():
        out = compiled(*inputs)
        compile_s = time.perf_counter() - t0
        ref = model(*inputs)
        err = _max_rel_err(out, ref)
        for r in runners:
            print(r.plan.to_text(reasons=False) if args.verbose else r.plan.summary())
        eager_ms, tf_ms = _time_ms(model, *inputs), _time_ms(compiled, *inputs)
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    print(f"compile (first call) {compile_s:.2f} s; eager {eager_ms:.2f} ms; tilefuse {tf_ms:.2f} ms "
          f"(median of 10)")
    print(f"max relative error vs eager: {err:.2e} ({'OK' if err <= tol else 'MISMATCH'}, tolerance {tol:g})")
    return 0 if err <= tol else 1


def _load_graph(spec: str, size: str):
    """An ONNX file path or a zoo model name -> tilefuse Graph (the largest captured graph)."""
    if spec.endswith(".onnx") or Path(spec).is_file():
        from tilefuse.frontends.onnx import import_onnx

        return import_onnx(spec)
    from tilefuse import models

    if spec not in models.ZOO:
        raise SystemExit(f"tilefuse: {spec!r} is neither an ONNX file nor a zoo model ({', '.join(models.ZOO)})")
    from tilefuse.frontends.capture import capture_graphs

    model, inputs = models.build(spec, size)
    graphs = capture_graphs(model, inputs, lower=False)  # planning needs no kernels
    return max(graphs, key=lambda g: len(g.nodes))


def cmd_explain(args) -> int:
    from tilefuse.config import parse_target
    from tilefuse.planner import plan

    graph = _load_graph(args.model, args.size)
    p = plan(graph, parse_target(args.target))
    if args.json:
        doc = {"nodes": p.source_nodes, "kernels": p.kernels,
               "regions": [{k: r.to_json()[k] for k in ("name", "kind", "ops", "inputs", "outputs", "backend")}
                           for r in p.regions if r.kind != "view"]}
        print(json.dumps(doc, indent=2))
    else:
        print(p.to_text())
    from tilefuse import draw

    if args.svg:
        Path(args.svg).write_text(draw.to_svg(p))
        print(f"wrote {args.svg}", file=sys.stderr)
    if args.html:
        Path(args.html).write_text(draw.to_html(p))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def cmd_compile(args) -> int:
    import tilefuse

    t0 = time.perf_counter()
    compiled = tilefuse.compile_onnx(args.model, target=args.target)
    print(compiled.summary())
    print(f"compiled {args.model} for {compiled.options.target} in {time.perf_counter() - t0:.2f} s")
    if args.output:
        raise SystemExit("tilefuse: saving artifacts (-o) is not implemented yet")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tilefuse", description="graph-level fusion compiler on TileLang")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a zoo model for the local target, run it, compare with eager")
    d.add_argument("--model", default="gpt2")
    d.add_argument("--size", default="tiny")
    d.add_argument("-v", "--verbose", action="store_true", help="print every region")
    d.set_defaults(fn=cmd_demo)
    e = sub.add_parser("explain", help="print the fusion plan of an ONNX file or a zoo model")
    e.add_argument("model", help="path to an .onnx file, or a zoo model name")
    e.add_argument("--size", default="tiny")
    e.add_argument("--target", default=None)
    e.add_argument("--json", action="store_true")
    e.add_argument("--svg", metavar="FILE")
    e.add_argument("--html", metavar="FILE")
    e.set_defaults(fn=cmd_explain)
    c = sub.add_parser("compile", help="compile an ONNX model")
    c.add_argument("model")
    c.add_argument("-o", "--output")
    c.add_argument("--target", default=None)
    c.set_defaults(fn=cmd_compile)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, NotImplementedError, FileNotFoundError) as e:
        print(f"tilefuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

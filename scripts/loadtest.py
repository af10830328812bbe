"""Load test for `tilefuse serve`: N concurrent clients for T seconds against a server on loopback.

    tilefuse serve model.onnx --port 8000 --max-batch-size 16 &
    python scripts/loadtest.py --url 127.0.0.1:8000 --model model --clients 64 --duration 30

Each client (a coroutine of one tritonclient.http.aio client, so 64 clients cost one process) sends
infer requests back to back with random inputs shaped from the model's metadata (``-1`` in dim 0
becomes ``--rows``). Prints throughput, latency percentiles and failures, and the server's own batch
statistics from ``/metrics``. Stops by itself after ``--duration`` seconds; loopback addresses only.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import re
import socket
import sys
import time
import urllib.request
from collections import Counter

import numpy as np

NUMPY = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
         "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


def loopback(url: str) -> str:
    """``url`` (host:port) if its host resolves to a loopback address; raise SystemExit otherwise."""
    host = url.rsplit(":", 1)[0].strip("[]")
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except socket.gaierror as e:
        raise SystemExit(f"loadtest: cannot resolve {host!r}: {e}") from None
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise SystemExit(f"loadtest: {host!r} is not a loopback address; this script only targets this machine")
    return url


def scrape(url: str) -> dict[str, float]:
    """The server's Prometheus metrics, summed over labels: name -> value."""
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for name, value in re.findall(r"^([a-z_]+)(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def make_inputs(meta: dict, rows: int, variants: int, int_high: int, seed: int = 0) -> list[list]:
    """``variants`` sets of random numpy inputs for the model described by ``meta``."""
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(variants):
        arrays = []
        for i in meta["inputs"]:
            shape = [rows if k == 0 and d == -1 else d for k, d in enumerate(i["shape"])]
            if any(d < 0 for d in shape):
                raise SystemExit(f"loadtest: input {i['name']} has symbolic dims {i['shape']} besides dim 0")
            dt = NUMPY[i["datatype"]]
            if np.issubdtype(dt, np.floating):
                a = rng.standard_normal(shape).astype(dt)
            elif dt is np.bool_:
                a = rng.random(shape) < 0.5
            else:
                a = rng.integers(0, int_high, shape).astype(dt)
            arrays.append((i["name"], i["datatype"], a))
        sets.append(arrays)
    return sets


async def client_loop(client, http, model: str, inputs: list, deadline: float, binary: bool, lat: list,
                      fails: Counter) -> None:
    k = 0
    while time.perf_counter() < deadline:
        ins = []
        for name, dt, a in inputs[k % len(inputs)]:
            x = http.InferInput(name, list(a.shape), dt)
            x.set_data_from_numpy(a, binary_data=binary)
            ins.append(x)
        k += 1
        t0 = time.perf_counter()
        try:
            await client.infer(model, ins)
            lat.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - count and go on: the point is to see failures
            status = e.status() if callable(getattr(e, "status", None)) else None
            fails[f"{status or type(e).__name__}: {str(e)[:80]}"] += 1


async def run(args) -> int:
    from tritonclient import http
    from tritonclient.http import aio

    client = aio.InferenceServerClient(args.url, conn_limit=args.clients, conn_timeout=args.timeout)
    try:
        meta = await client.get_model_metadata(args.model)
        inputs = make_inputs(meta, args.rows, 8, args.int_high)
        before = scrape(args.url)
        lat: list[float] = []
        fails: Counter = Counter()
        t0 = time.perf_counter()
        deadline = t0 + args.duration
        await asyncio.gather(*[client_loop(client, http, args.model, inputs, deadline, not args.json, lat, fails)
                               for _ in range(args.clients)])
        wall = time.perf_counter() - t0
    finally:
        await client.close()
    after = scrape(args.url)
    report(args, lat, fails, wall, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after})
    return 1 if fails else 0


def report(args, lat: list[float], fails: Counter, wall: float, server: dict[str, float]) -> None:
    ms = np.array(lat) * 1e3 if lat else np.array([float("nan")])
    n_fail = sum(fails.values())
    print(f"model {args.model} at {args.url}: {args.clients} clients, {args.duration:g} s, {args.rows} row(s) a "
          f"request, {'JSON' if args.json else 'binary'} tensors")
    print(f"  requests   {len(lat)} ok, {n_fail} failed in {wall:.1f} s")
    print(f"  throughput {len(lat) / wall:.1f} req/s ({len(lat) * args.rows / wall:.1f} rows/s)")
    print(f"  latency    p50 {np.percentile(ms, 50):.2f} ms  p90 {np.percentile(ms, 90):.2f} ms  "
          f"p99 {np.percentile(ms, 99):.2f} ms  max {ms.max():.2f} ms")
    runs = server.get("tilefuse_batch_requests_count", 0.0)
    if runs:
        print(f"  server     {runs:.0f} model runs, {server.get('tilefuse_batch_requests_sum', 0) / runs:.2f} requests "
              f"and {server.get('tilefuse_batch_size_sum', 0) / runs:.2f} rows a run (+{server.get('tilefuse_padding_rows_total', 0):.0f} "
              f"padding rows), model time {server.get('tilefuse_model_run_seconds_sum', 0) / runs * 1e3:.2f} ms a run")
    for what, n in fails.most_common(5):
        print(f"  failure    {n} x {what}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8000", help="host:port of the server (loopback only)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds")
    ap.add_argument("--rows", type=int, default=1, help="rows (dim 0) per request")
    ap.add_argument("--json", action="store_true", help="send and receive JSON tensors instead of binary")
    ap.add_argument("--int-high", type=int, default=64, help="integer inputs are drawn from [0, int-high)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a connection may take")
    args = ap.parse_args(argv)
    loopback(args.url)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

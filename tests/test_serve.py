"""Serving over the Open Inference Protocol: tritonclient.http against `tilefuse serve`, on loopback only.

Servers run in a background thread on a free port of 127.0.0.1 (port 0); one CLI test runs the real
command in a subprocess and stops it with SIGTERM. Every loop here is bounded in count and time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
import torch

import tilefuse
from tilefuse import models
from tilefuse.runtime.batching import Batcher, QueueFullError, batch_mode, default_buckets
from tilefuse.serve import ModelSpec, ProtocolError, create_app, decode_request, load_model

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

class Server:
    """``create_app(...)`` served by uvicorn in a thread on 127.0.0.1 at a free port."""

    def __init__(self, model, name, **kw):
        config = uvicorn.Config(create_app(model, name, **kw), host="127.0.0.1", port=0, log_level="warning",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        # A bound on a hang, not a timing check: the warm-up compiles every bucket, which takes a minute or
        # more on two CPUs that other work keeps busy.
        deadline = time.monotonic() + 300
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()

    def client(self):
        return httpclient.InferenceServerClient(self.url, network_timeout=60)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://{self.url}/metrics", timeout=10).read().decode()
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://{self.url}{path}", data=body, headers=headers or {}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


class Broken:
    """A model that fails on every run, as one whose kernels cannot run on this machine does."""

    def __init__(self, model):
        self.model, self.graph = model, model.graph

    def __call__(self, *args):
        raise RuntimeError("gemm_kernel: allocator anchor has the wrong device type")


class Slow:
    """A model that sleeps before each run: makes queues fill and requests stay in flight."""

    def __init__(self, model, seconds: float):
        self.model, self.graph, self.seconds = model, model.graph, seconds

    def __call__(self, *args):
        time.sleep(self.seconds)
        return self.model(*args)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Note: on a small shared CPU, torch's intra-op threads wait on each other at every op (gpt2
    # tiny: ~250 ms a run with 2 threads under load, ~1 ms with 1); serving uses one worker anyway.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Dynamic-batch ONNX files of mlp and gpt2 (tiny) and their compiled models for the `c` target."""
    d = tmp_path_factory.mktemp("serve")
    paths = {n: models.export_onnx(n, d / f"{n}.onnx", dynamic_batch=True) for n in ("mlp", "gpt2")}
    # Note: gpt2 compiles with lower=False: lowering its dynamic-batch graph fails in the elementwise
    # template (fused eq+where: 'EqualOp' has no dtype), and symbolic-shape regions run through torch anyway.
    compiled = {"mlp": tilefuse.compile_onnx(paths["mlp"], target="c"),
                "gpt2": tilefuse.compile_onnx(paths["gpt2"], target="c", lower=False)}
    return paths, compiled


@pytest.fixture(scope="module")
def mlp_server(zoo):
    with Server(zoo[1]["mlp"], "mlp", max_batch_size=8, max_delay_ms=20) as s:
        yield s


def _infer(client, name, arrays: dict, binary: bool = True, outputs=None):
    inputs = []
    for n, a in arrays.items():
        i = httpclient.InferInput(n, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs] if outputs else None
    return client.infer(name, inputs, outputs=outs)


def test_health_and_metadata(zoo, mlp_server):
    c = mlp_server.client()
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("mlp")
    assert not c.is_model_ready("nope")
    assert c.get_server_metadata()["name"] == "tilefuse"
    meta = c.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 64]}]
    with Server(zoo[1]["gpt2"], "gpt2") as s:
        meta = s.client().get_model_metadata("gpt2")
    assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 17]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 17, 128]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_mlp_infer_matches_direct_run(zoo, mlp_server, binary):
    m = zoo[1]["mlp"]
    x = torch.randn(3, 64)
    r = _infer(mlp_server.client(), "mlp", {"x": x.numpy()}, binary=binary, outputs=["y"] if not binary else None)
    torch.testing.assert_close(torch.from_numpy(r.as_numpy("y")), m(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_gpt2_infer_matches_direct_run(zoo, binary):
    g, ids = zoo[1]["gpt2"], models.example_inputs("gpt2")[0]
    want = g(ids)[0]
    with Server(g, "gpt2", max_batch_size=2) as s:
        r = _infer(s.client(), "gpt2", {"input_ids": ids.numpy()}, binary=binary, outputs=["logits"])
    torch.testing.assert_close(torch.from_numpy(r.as_numpy("logits")), want, rtol=1e-5, atol=1e-5)


def test_gpt2_static_batch_padded(tmp_path):
    # INT64 inputs and a 3-d output through the server whatever the state of symbolic-dim compiles: gpt2
    # exported with a static batch B, served with pad_batch (requests of 1..B rows padded to B).
    g = tilefuse.compile_onnx(models.export_onnx("gpt2", tmp_path / "gpt2.onnx"), target="c", lower=False)
    ids = models.example_inputs("gpt2")[0]
    b = ids.shape[0]
    with Server(g, "gpt2", pad_batch=True) as s:
        assert s.client().get_model_metadata("gpt2")["inputs"][0]["shape"] == [-1, 17]
        for rows in range(1, b + 1):
            r = _infer(s.client(), "gpt2", {"input_ids": ids[:rows].numpy()}, binary=rows % 2 == 0, outputs=["logits"])
            padded = torch.cat([ids[:rows], torch.zeros(b - rows, *ids.shape[1:], dtype=ids.dtype)])
            torch.testing.assert_close(torch.from_numpy(r.as_numpy("logits")), g(padded)[0][:rows])


def test_concurrent_requests_are_batched(zoo, mlp_server):
    m, n_threads = zoo[1]["mlp"], 16
    before = mlp_server.metric("tilefuse_batch_requests_count")
    start = threading.Barrier(n_threads, timeout=30)

    def client(k: int) -> None:
        c = mlp_server.client()
        start.wait()
        for rows in (1, 2, 3):
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(k * 10 + rows))
            y = torch.from_numpy(_infer(c, "mlp", {"x": x.numpy()}).as_numpy("y"))
            torch.testing.assert_close(y, m(x)[0], rtol=1e-5, atol=1e-5)

    with concurrent.futures.ThreadPoolExecutor(n_threads) as pool:
        for f in [pool.submit(client, k) for k in range(n_threads)]:
            f.result(timeout=60)
    runs = mlp_server.metric("tilefuse_batch_requests_count") - before
    singles = mlp_server.metric('tilefuse_batch_requests_bucket{le="1.0",model="mlp"}')
    assert 0 < runs < 3 * n_threads, "concurrent requests should share model runs"
    assert mlp_server.metric("tilefuse_batch_requests_count") > singles  # some batch held > 1 request
    assert mlp_server.metric('tilefuse_requests_total{model="mlp",status="200"}') >= 3 * n_threads


def test_bad_requests_get_4xx_and_the_server_keeps_serving(mlp_server):
    c, x = mlp_server.client(), np.ones((1, 64), np.float32)
    cases = [("nope", {"x": x}, "404", "unknown model 'nope'"),
             ("mlp", {"x": np.ones((1, 63), np.float32)}, "400", "dim 1 must be 64"),
             ("mlp", {"x": x.astype(np.int64)}, "400", "datatype INT64; the model expects FP32"),
             ("mlp", {"z": x}, "400", "unknown input 'z'"),
             ("mlp", {"x": np.ones((9, 64), np.float32)}, "400", "runs at most 8 rows")]
    for name, arrays, status, msg in cases:
        with pytest.raises(InferenceServerException) as e:
            _infer(c, name, arrays)
        assert e.value.status() == status and msg in e.value.message(), e.value
    raw = [(b'{"inputs": [', "malformed JSON"),
           (b'{"inputs": []}', "missing input(s) 'x'"),
           (b'{"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FLOAT", "data": [0]}]}', "unknown datatype"),
           (b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [[1], [2, 3]]}]}', "not a regular"),
           (b'{"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ["a"]}]}', "values, which are not"),
           (b'{"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [1, 2]}]}', "needs 64")]
    for body, msg in raw:
        status, doc = mlp_server.post("/v2/models/mlp/infer", body)
        assert status == 400 and msg in doc["error"], (body, doc)
    head = b'{"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}]}'
    status, doc = mlp_server.post("/v2/models/mlp/infer", head + b"\0" * 10,
                                  {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "binary_data_size" in doc["error"]
    status, doc = mlp_server.post("/v2/models/mlp/infer", head + np.ones(64, np.float32).tobytes(),
                                  {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200 and doc["outputs"][0]["shape"] == [1, 64]
    assert c.is_server_live() and _infer(c, "mlp", {"x": x}).as_numpy("y").shape == (1, 64)


def test_overload_answers_503_without_crashing(zoo):
    slow, n = Slow(zoo[1]["mlp"], 0.5), 12
    with Server(slow, "mlp", max_batch_size=1, max_queue=2, warm_up=False) as s:
        start = threading.Barrier(n, timeout=30)

        def one(k: int) -> str:
            c = s.client()
            start.wait()
            try:
                _infer(c, "mlp", {"x": np.full((1, 64), k, np.float32)})
                return "200"
            except InferenceServerException as e:
                assert e.status() != "503" or "queue is full" in e.message(), e
                return e.status()

        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            statuses = list(pool.map(one, range(n), timeout=60))
        assert statuses.count("503") > 0 and statuses.count("200") >= 2 and set(statuses) <= {"200", "503"}
        assert s.client().is_server_live()
        assert s.metric('tilefuse_requests_total{model="mlp",status="503"}') == statuses.count("503")


def test_shutdown_finishes_requests_in_flight(zoo):
    slow = Slow(zoo[1]["mlp"], 0.5)
    server = Server(slow, "mlp", max_batch_size=1, warm_up=False).__enter__()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(lambda k=k: _infer(server.client(), "mlp", {"x": np.full((1, 64), k, np.float32)}))
                   for k in range(4)]
        deadline = time.monotonic() + 10
        while server.metric("tilefuse_queue_depth") < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.__exit__(None, None, None)  # asks uvicorn to stop while requests wait in the queue
        for f in futures:
            assert f.result(timeout=30).as_numpy("y").shape == (1, 64)


def test_batcher_pads_to_buckets_splits_and_isolates_failures():
    seen = []

    def ref(x):
        if torch.isnan(x).any():
            raise ValueError("NaN input")
        return (x * 2 + x.sum(1, keepdim=True), x[:, :1])

    def model(x):
        seen.append(x.shape[0])
        return ref(x)

    b = Batcher(model, buckets=[1, 2, 4], max_delay_s=0.05)
    b.warm_up([torch.zeros(1, 3)])
    assert seen == [1, 2, 4]
    # The first three share a batch of 4 rows; it fails on the NaN row and is retried request by request.
    xs = [torch.randn(1, 3), torch.full((1, 3), float("nan")), torch.randn(2, 3), torch.randn(1, 3)]
    futures = [b.submit([x]) for x in xs]
    with pytest.raises(ValueError, match="at most 4 rows"):
        b.submit([torch.randn(5, 3)])
    for k in (0, 2, 3):
        for got, want in zip(futures[k].result(10), ref(xs[k])):
            torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="NaN"):
        futures[1].result(10)
    b.close()
    assert 4 in seen[3:] and set(seen) <= {1, 2, 4}  # batched, and only ever at bucket sizes
    seen.clear()
    b = Batcher(model, buckets=None)
    assert all(f.result(10)[0].shape == (3, 3) for f in [b.submit([torch.randn(3, 3)]) for _ in range(3)])
    assert seen == [3, 3, 3]  # no batching: each request alone at its own shape
    b.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        b.submit([torch.randn(1, 3)])
    b = Batcher(lambda x: (time.sleep(0.2) or x,), buckets=[1], max_queue=1)
    b.submit([torch.randn(1, 3)])
    time.sleep(0.05)  # the first request is running; one more fills the queue
    b.submit([torch.randn(1, 3)])
    with pytest.raises(QueueFullError):
        b.submit([torch.randn(1, 3)])
    b.close()


def test_static_artifact_with_pad_batch(tmp_path, zoo):
    if not hasattr(tilefuse, "save"):
        pytest.skip("tilefuse.save is not there yet")
    static = tilefuse.compile_onnx(models.export_onnx("mlp", tmp_path / "mlp.onnx"), target="c")
    b = static.graph.inputs[0].type.shape[0]
    tilefuse.save(static, tmp_path / "mlp.tfz")
    with Server(load_model(tmp_path / "mlp.tfz"), "mlp", pad_batch=True) as s:
        c = s.client()
        assert c.get_model_metadata("mlp")["inputs"][0]["shape"] == [-1, 64]
        x = torch.randn(3, 64)
        y = torch.from_numpy(_infer(c, "mlp", {"x": x.numpy()}).as_numpy("y"))
        torch.testing.assert_close(y, zoo[1]["mlp"](x)[0], rtol=1e-5, atol=1e-5)
        with pytest.raises(InferenceServerException, match=f"at most {b} rows"):
            _infer(c, "mlp", {"x": np.ones((b + 1, 64), np.float32)})
        assert s.metric("tilefuse_padding_rows_total") == b - 3


def test_batch_mode_follows_dim0():
    from tilefuse.ir import TensorType

    dyn, static = TensorType(("batch", 4), "float32"), TensorType((8, 4), "float32")
    assert batch_mode([dyn], [dyn]) == ("dynamic", None)
    assert batch_mode([static], [static]) == ("none", None)
    assert batch_mode([static], [static], pad_batch=True) == ("pad", 8)
    assert batch_mode([dyn], [TensorType((4,), "float32")]) == ("none", None)
    assert default_buckets(8) == [1, 2, 4, 8] and default_buckets(12) == [1, 2, 4, 8, 12] and default_buckets(1) == [1]


def test_cli_serve_subprocess_stops_on_sigterm(zoo):
    """``tilefuse serve --port 0`` listens on a port the system picks and names it (uvicorn's start line): no port is
    found free here and bound later, when another process could have taken it. It answers, then stops on SIGTERM."""
    cmd = [sys.executable, "-m", "tilefuse.cli", "serve", zoo[0]["mlp"], "--port", "0", "--target", "c",
           "--threads", "1", "--name", "m"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    seen = []
    try:
        deadline, port = time.monotonic() + 300, None  # a hang bound
        while port is None:
            assert proc.poll() is None and time.monotonic() < deadline, f"tilefuse serve did not start: {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=0.2))
                m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", seen[-1])
                port = int(m.group(1)) if m else None
        assert port > 0, seen
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        while not c.is_server_ready():
            assert time.monotonic() < deadline, "tilefuse serve is listening but not ready"
            time.sleep(0.2)
        x = torch.randn(2, 64)
        y = _infer(c, "m", {"x": x.numpy()}).as_numpy("y")
        torch.testing.assert_close(torch.from_numpy(y), zoo[1]["mlp"](x)[0])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    assert proc.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises SIGTERM once it has shut down
    assert "Application shutdown complete" in out


def test_batcher_records_a_run_before_answering_it():
    """The metrics of a run are recorded before any of its requests is answered: a client that has its answer
    reads them (under CPU load the worker thread could otherwise record them after the client looked)."""
    answered_when_observed = []
    futures = []
    b = Batcher(lambda x: (x + 1,), buckets=[4], max_delay_s=0.05,
                observe=lambda rows, padded, n, s: answered_when_observed.append([f.done() for f in futures]))
    futures += [b.submit([torch.randn(1, 3)]), b.submit([torch.randn(2, 3)])]
    for f in futures:
        f.result(10)
    b.close()
    assert answered_when_observed and all(not any(done) for done in answered_when_observed), answered_when_observed


def test_failed_warm_up_is_never_ready(zoo):
    with Server(Broken(zoo[1]["mlp"]), "mlp", max_batch_size=2) as s:
        c = s.client()
        assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready("mlp")
        for path in ("/v2/health/ready", "/v2/models/mlp/ready"):
            status, doc = s.get(path)
            assert status == 503 and doc["ready"] is False, doc
            assert "model 'mlp' failed its warm-up, so it is not served: RuntimeError: gemm_kernel" in doc["error"]
        with pytest.raises(InferenceServerException) as e:
            _infer(c, "mlp", {"x": np.ones((1, 64), np.float32)})
        assert e.value.status() == "503" and "failed its warm-up" in e.value.message()


def test_model_this_machine_cannot_run_is_not_served(tmp_path, monkeypatch):
    path = models.export_onnx("mlp", tmp_path / "mlp.onnx")
    cuda = tilefuse.compile_onnx(path, target="cuda:sm_90a", lower=False)  # planned only: no nvcc needed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"model 'm' cannot be served here: target \{'kind': 'cuda', 'arch': "
                                         r"'sm_90a'\} needs an NVIDIA GPU .* this machine has none"):
        create_app(cuda, "m")


def _head(shape, size=None, datatype="FP32") -> bytes:
    params = {"binary_data_size": size} if size is not None else None
    entry = {"name": "x", "shape": shape, "datatype": datatype, **({"parameters": params} if params else {})}
    return json.dumps({"inputs": [entry]}).encode()


def test_hostile_bodies_are_refused_with_their_status(mlp_server):
    x = np.random.default_rng().standard_normal((1, 64), dtype=np.float32)
    head = _head([1, 64], 256)
    binary = {"Inference-Header-Content-Length": str(len(head))}
    status, doc = mlp_server.post("/v2/models/mlp/infer", head + x.tobytes() + b"\0", binary)
    assert status == 400 and "1 bytes after the binary data its inputs declare" in doc["error"], doc
    for data in ([True] * 64, [1.0] * 63 + [True], [[0.5] * 63 + [False]]):
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": data}]}).encode()
        status, doc = mlp_server.post("/v2/models/mlp/infer", body)
        assert status == 400, doc
        assert "holds true/false values, which are not FP32" in doc["error"] or "holds bool values" in doc["error"]
    status, doc = mlp_server.post("/v2/models/mlp/infer", head + x.tobytes(), {**binary, "Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding 'br' is not supported" in doc["error"], doc
    squeezed = zlib.compress(head + x.tobytes())
    status, doc = mlp_server.post("/v2/models/mlp/infer", squeezed[:-4], {**binary, "Content-Encoding": "deflate"})
    assert status == 400 and "not valid deflate data" in doc["error"], doc
    want = zoo_run(mlp_server, x)
    for encoding, blob in (("gzip", gzip.compress(head + x.tobytes())), ("deflate", squeezed),
                           ("gzip", gzip.compress(head) + gzip.compress(x.tobytes()))):  # two gzip members
        status, doc = mlp_server.post("/v2/models/mlp/infer", blob, {**binary, "Content-Encoding": encoding})
        assert status == 200, doc
        torch.testing.assert_close(torch.tensor(doc["outputs"][0]["data"]).reshape(1, 64), want, rtol=1e-5, atol=1e-5)


def zoo_run(server, x):
    status, doc = server.post("/v2/models/mlp/infer", json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}).encode())
    assert status == 200, doc
    return torch.tensor(doc["outputs"][0]["data"]).reshape(1, 64)


def test_request_size_is_bounded_as_sent_and_as_inflated(zoo):
    limit = 8192
    x = np.ones((1, 64), np.float32)
    head = _head([1, 64], 256)
    binary = {"Inference-Header-Content-Length": str(len(head))}
    with Server(zoo[1]["mlp"], "mlp", warm_up=False, max_request_bytes=limit) as s:
        status, _ = s.post("/v2/models/mlp/infer", head + x.tobytes(), binary)
        assert status == 200
        status, doc = s.post("/v2/models/mlp/infer", head + x.tobytes() + b" " * limit, binary)
        assert status == 413 and f"more than {limit} bytes" in doc["error"], doc
        # A chunked body (no Content-Length): refused as it arrives.
        conn = http.client.HTTPConnection(*s.url.split(":"), timeout=30)
        conn.request("POST", "/v2/models/mlp/infer", body=iter([b" " * 4096] * 4), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        assert r.status == 413 and "the body has more than" in json.loads(r.read())["error"]
        conn.close()
        bomb = gzip.compress(head + x.tobytes() + b" " * (4 << 20), compresslevel=9)  # 4 MiB of JSON whitespace
        assert len(bomb) < limit
        status, doc = s.post("/v2/models/mlp/infer", bomb, {**binary, "Content-Encoding": "gzip"})
        assert status == 413 and f"the gzip body inflates to more than {limit} bytes" in doc["error"], doc
        assert s.client().is_server_ready() and s.metric('tilefuse_requests_total{model="mlp",status="413"}') == 3


def test_a_compression_bomb_is_never_inflated_whole(zoo):
    spec = ModelSpec.of(zoo[1]["mlp"], "mlp")
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)  # 256 MiB of zeros in ~250 KB
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as e:
            decode_request(bomb, {"content-encoding": "gzip"}, spec, max_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.status == 413 and peak < 4 << 20, (e.value.status, peak)  # at most the 1 MiB cap, and change


def test_unbatched_model_is_warmed_up_too(tmp_path):
    """A static dim 0 served without --pad-batch runs each request alone; its warm-up runs it once at its shapes."""
    from tilefuse.frontends.onnx import import_onnx

    class Static:
        graph = import_onnx(models.export_onnx("mlp", tmp_path / "mlp.onnx"))

    with Server(Broken(Static()), "mlp") as s:
        assert s.client().is_server_live() and not s.client().is_server_ready()
        assert "failed its warm-up" in s.get("/v2/health/ready")[1]["error"]

"""Serve a compiled model over the Open Inference Protocol (KServe v2 REST) with FastAPI and uvicorn.

Note: the protocol is the one KServe and Triton speak, so ``tritonclient.http`` and KServe
InferenceServices work unchanged: health (``/v2/health/live|ready``), server and model metadata
(``/v2``, ``/v2/models/{name}``), readiness and ``POST /v2/models/{name}/infer`` with JSON tensors or
the binary tensor data extension (``Inference-Header-Content-Length``: a JSON header, then the raw
tensors). Errors answer ``{"error": message}``: 400 for a bad request, 404 for an unknown model,
413 for a body (or its gzip/deflate decoding) over ``max_request_bytes``, 415 for another
Content-Encoding, 503 when the bounded queue is full, the server is shutting down or the model failed
its warm-up (the server then never reports ready), 500 when the model failed on a request.
Requests are batched along dim 0 by ``runtime.batching.Batcher``; Prometheus metrics are at
``GET /metrics``. Scale-out is KServe replicas of this server (docs/serving.md), not a cluster here.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route functions' annotations
# (``request: Request``) at run time, and Request is imported inside create_app.
import asyncio
import contextlib
import json
import logging
import math
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefuse import api
from tilefuse.config import VERSION
from tilefuse.ir import TensorType, torch_dtype
from tilefuse.runtime.batching import Batcher, QueueFullError, ShuttingDownError, batch_mode, default_buckets
from tilefuse.runtime.machine import target_problem

# v2 datatype names <-> tilefuse (torch) dtype names.
DATATYPES: dict[str, str] = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "BF16": "bfloat16", "FP32": "float32", "FP64": "float64",
}
V2_NAMES: dict[str, str] = {v: k for k, v in DATATYPES.items()}
# numpy kinds that JSON data may have for each tensor dtype kind (no silent float -> int truncation, no
# true/false as numbers: ``_has_bool`` also finds booleans that numpy would fold into a numeric array).
_JSON_KINDS = {"b": "b", "u": "u", "i": "ui", "f": "uif"}
HEADER_LENGTH = "Inference-Header-Content-Length"
# The largest request body, as sent and after decoding gzip/deflate: 64 MiB holds a batch of 64 fp32
# 3x224x224 images in binary (37 MiB) or a few million JSON numbers.
MAX_REQUEST_BYTES = 64 << 20


class ProtocolError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, the message says what is wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelSpec:
    """What the server knows of a model: name, version, input/output types and its batching mode."""

    name: str
    version: str
    inputs: tuple[tuple[str, TensorType], ...]
    outputs: tuple[tuple[str, TensorType], ...]
    mode: str
    static_batch: int | None = None

    @classmethod
    def of(cls, model: Any, name: str, pad_batch: bool = False, version: str = "1") -> "ModelSpec":
        """Describe a CompiledModel (``graph.inputs`` values, ``graph.output_values()``)."""
        ins = tuple((v.name, v.type) for v in model.graph.inputs)
        outs = tuple((v.name, v.type) for v in model.graph.output_values())
        mode, static = batch_mode([t for _, t in ins], [t for _, t in outs], pad_batch)
        return cls(name, version, ins, outs, mode, static)

    def v2_shape(self, t: TensorType) -> list[int]:
        """The shape as metadata shows it: -1 for symbolic dims and for a padded batch dim."""
        return [-1 if isinstance(d, str) or (k == 0 and self.mode == "pad") else d
                for k, d in enumerate(t.shape or ())]

    def metadata(self) -> dict:
        """The v2 model metadata document."""
        def tensors(vals):
            return [{"name": n, "datatype": V2_NAMES.get(t.dtype, t.dtype.upper()), "shape": self.v2_shape(t)}
                    for n, t in vals]

        return {"name": self.name, "versions": [self.version], "platform": "tilefuse",
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}

    def buckets(self, max_batch_size: int, sizes: Sequence[int] | None = None) -> list[int] | None:
        """The batch sizes the model runs at: ``sizes`` or powers of two up to ``max_batch_size``
        (a symbolic batch dim), the static dim 0 (``pad``), or None (no batching)."""
        if self.mode == "dynamic":
            return sorted(set(sizes)) if sizes else default_buckets(max_batch_size)
        return [self.static_batch] if self.mode == "pad" else None

    def example(self) -> list[torch.Tensor] | None:
        """Zeros per input for warm-up: one row when batching (the batcher sizes dim 0), the declared shape
        when not; None when a dim it needs is symbolic or unknown."""
        first = 0 if self.mode == "none" else 1
        if any(t.shape is None or not all(isinstance(d, int) for d in t.shape[first:]) for _, t in self.inputs):
            return None
        return [torch.zeros((1, *t.shape[1:]) if first else t.shape, dtype=torch_dtype(t.dtype))
                for _, t in self.inputs]


@dataclass
class InferRequest:
    """A decoded infer request: input tensors in graph order and the outputs asked for."""

    id: str | None
    inputs: tuple[torch.Tensor, ...]
    outputs: list[tuple[str, bool]]  # (name, as binary)


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message)


def _too_large(what: str, limit: int) -> ProtocolError:
    return ProtocolError(413, f"{what} more than {limit} bytes, the most this server takes (max_request_bytes; "
                              f"tilefuse serve --max-request-mb); send fewer rows per request")


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from gzip (all its members) or deflate (zlib) without ever holding more than
    ``limit`` + 1 decoded bytes: ``ProtocolError`` 413 past ``limit``, 400 for bad or trailing data."""
    out, total, data = [], 0, body
    while True:
        d = zlib.decompressobj(31 if encoding == "gzip" else 15)
        try:
            chunk = d.decompress(data, limit - total + 1)
            total += len(chunk)
            out.append(chunk)
            if total > limit or d.unconsumed_tail:
                raise _too_large(f"the {encoding} body inflates to", limit)
            chunk = d.flush()
        except zlib.error as e:
            raise _bad(f"the body is not valid {encoding} data: {e}") from None
        total += len(chunk)
        out.append(chunk)
        if total > limit:
            raise _too_large(f"the {encoding} body inflates to", limit)
        if not d.eof:
            raise _bad(f"the body is not valid {encoding} data: it ends before the compressed stream does")
        data = d.unused_data
        if not data:
            return b"".join(out)
        if encoding != "gzip":  # gzip may hold several members; a zlib stream is one
            raise _bad(f"the body has {len(data)} bytes after the end of its {encoding} data")


def _decode_content(body: bytes, headers: Any, limit: int) -> bytes:
    """The body as the client meant it: Content-Encoding identity, gzip or deflate (else 415)."""
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(415, f"Content-Encoding {encoding!r} is not supported; send the body as is, or "
                                 "with Content-Encoding gzip or deflate")
    return _inflate(body, encoding, limit)


async def read_body(request: Any, limit: int = MAX_REQUEST_BYTES) -> bytes:
    """The request's body, refused with 413 as soon as it passes ``limit`` bytes (the declared
    Content-Length is checked before anything is read; a chunked body as it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(f"the body has {int(declared)} bytes,", limit)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large("the body has", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _split_body(body: bytes, headers: Any, limit: int = MAX_REQUEST_BYTES) -> tuple[dict, bytes]:
    body = _decode_content(body, headers, limit)
    size = headers.get(HEADER_LENGTH.lower())
    if size is not None:
        if not size.isdigit() or int(size) > len(body):
            raise _bad(f"{HEADER_LENGTH} is {size!r}; the body has {len(body)} bytes")
        head, rest = body[:int(size)], body[int(size):]
    else:
        head, rest = body, b""
    try:
        doc = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad(f"malformed JSON in the request: {e}") from None
    if not isinstance(doc, dict):
        raise _bad("the request must be a JSON object with an 'inputs' list")
    return doc, rest


def _tensor(entry: dict, want: TensorType, binary: memoryview, offset: int) -> tuple[torch.Tensor, int]:
    """Decode one input entry (JSON data or a slice of the binary section); returns (tensor, new offset)."""
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise _bad(f"input {name!r}: unknown datatype {datatype!r}; known: {', '.join(DATATYPES)}")
    expect = V2_NAMES.get(want.dtype, want.dtype)
    if DATATYPES[datatype] != want.dtype:
        raise _bad(f"input {name!r} has datatype {datatype}; the model expects {expect}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise _bad(f"input {name!r}: 'shape' must be a list of non-negative ints, got {shape!r}")
    dtype, numel = torch_dtype(want.dtype), math.prod(shape)
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise _bad(f"input {name!r}: 'parameters' must be an object")
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        nbytes = numel * dtype.itemsize
        if not isinstance(size, int) or size != nbytes or offset + size > len(binary):
            raise _bad(f"input {name!r}: binary_data_size {size!r} does not match shape {shape} of {datatype} "
                       f"({nbytes} bytes) or the {len(binary) - offset} bytes left in the body")
        raw = bytearray(binary[offset:offset + size])
        t = torch.frombuffer(raw, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        return t.reshape(shape), offset + size
    if "data" not in entry:
        raise _bad(f"input {name!r} has neither 'data' nor a binary_data_size parameter")
    try:
        arr = np.asarray(entry["data"])
    except ValueError as e:  # ragged nesting
        raise _bad(f"input {name!r}: 'data' is not a regular array: {e}") from None
    kind = "f" if dtype.is_floating_point else ("b" if dtype == torch.bool else ("u" if "uint" in want.dtype else "i"))
    if kind != "b" and arr.dtype.kind in "iuf" and _has_bool(entry["data"]):
        raise _bad(f"input {name!r}: 'data' holds true/false values, which are not {datatype}")
    if arr.size and arr.dtype.kind not in _JSON_KINDS[kind]:
        raise _bad(f"input {name!r}: 'data' holds {arr.dtype.name} values, which are not {datatype}")
    if arr.size != numel:
        raise _bad(f"input {name!r}: 'data' has {arr.size} elements; shape {shape} needs {numel}")
    t = torch.from_numpy(np.ascontiguousarray(arr.astype(np.float64 if kind == "f" else arr.dtype)).reshape(shape))
    return t.to(dtype), offset


def _has_bool(data: Any) -> bool:
    """Whether nested lists ``data`` hold a JSON true/false anywhere (an explicit stack: no recursion limit)."""
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, bool):
            return True
    return False


def _check_shapes(spec: ModelSpec, tensors: Sequence[torch.Tensor]) -> None:
    bound: dict[str, tuple[int, str]] = {}
    for (name, t), a in zip(spec.inputs, tensors):
        if t.shape is None:
            continue
        if a.dim() != len(t.shape):
            raise _bad(f"input {name!r} has shape {list(a.shape)} (rank {a.dim()}); the model expects rank "
                       f"{len(t.shape)}: {spec.v2_shape(t)}")
        for k, (d, s) in enumerate(zip(t.shape, a.shape)):
            if k == 0 and spec.mode != "none" and s == 0:
                raise _bad(f"input {name!r} has 0 rows in dim 0 (the batch dim)")
            if k == 0 and spec.mode == "pad":
                continue
            if isinstance(d, int) and d != s:
                raise _bad(f"input {name!r} has shape {list(a.shape)}; the model expects {spec.v2_shape(t)} "
                           f"(dim {k} must be {d})")
            if isinstance(d, str):
                first = bound.setdefault(d, (s, name))
                if first[0] != s:
                    raise _bad(f"input {name!r} has {d}={s} in dim {k} but input {first[1]!r} has {d}={first[0]}")


def decode_request(body: bytes, headers: Any, spec: ModelSpec, max_bytes: int = MAX_REQUEST_BYTES) -> InferRequest:
    """Parse and validate an infer request body against ``spec``; raise ``ProtocolError`` on any fault
    (400; 413 when the decoded body passes ``max_bytes``; 415 for an unknown Content-Encoding)."""
    doc, binary = _split_body(body, headers, max_bytes)
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _bad("the request needs an 'inputs' list of tensor objects")
    by_name: dict[str, dict] = {}
    for e in entries:
        if not isinstance(e.get("name"), str):
            raise _bad(f"every input needs a 'name' string; got {e.get('name')!r}")
        if e.get("name") in by_name:
            raise _bad(f"input {e.get('name')!r} appears twice")
        by_name[e.get("name")] = e
    known = [n for n, _ in spec.inputs]
    for n in by_name:
        if n not in known:
            raise _bad(f"unknown input {n!r}; model {spec.name!r} has inputs {', '.join(known)}")
    missing = [n for n in known if n not in by_name]
    if missing:
        raise _bad(f"missing input(s) {', '.join(map(repr, missing))}; model {spec.name!r} has inputs "
                   f"{', '.join(known)}")
    # Binary chunks follow the JSON header in the order the inputs were listed in the request.
    view, offset, decoded = memoryview(binary), 0, {}
    types = dict(spec.inputs)
    for e in entries:
        decoded[e["name"]], offset = _tensor(e, types[e["name"]], view, offset)
    if offset != len(binary):
        raise _bad(f"the body has {len(binary) - offset} bytes after the binary data its inputs declare "
                   f"({offset} bytes in binary_data_size parameters)")
    tensors = tuple(decoded[n] for n in known)
    _check_shapes(spec, tensors)
    params = doc.get("parameters") or {}
    default_binary = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    asked = doc.get("outputs")
    out_names = [n for n, _ in spec.outputs]
    if asked is None:
        outputs = [(n, default_binary) for n in out_names]
    else:
        if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
            raise _bad("'outputs' must be a list of objects with a 'name'")
        outputs = []
        for o in asked:
            if o.get("name") not in out_names:
                raise _bad(f"unknown output {o.get('name')!r}; model {spec.name!r} has outputs {', '.join(out_names)}")
            p = o.get("parameters") or {}
            if not isinstance(p, dict):
                raise _bad(f"output {o['name']!r}: 'parameters' must be an object")
            if "classification" in p:
                raise _bad("the classification extension is not supported")
            outputs.append((o["name"], bool(p.get("binary_data", default_binary))))
    rid = doc.get("id")
    return InferRequest(rid if isinstance(rid, str) else None, tensors, outputs)


def encode_response(spec: ModelSpec, req: InferRequest, outs: Sequence[torch.Tensor]) -> tuple[bytes, dict]:
    """The response body and headers: JSON, plus the binary section when any output is asked as binary."""
    values = dict(zip([n for n, _ in spec.outputs], outs))
    doc: dict[str, Any] = {"model_name": spec.name, "model_version": spec.version, "outputs": []}
    if req.id is not None:
        doc["id"] = req.id
    blobs = []
    for name, binary in req.outputs:
        t = values[name].contiguous()
        entry = {"name": name, "datatype": V2_NAMES.get(str(t.dtype).removeprefix("torch."), "BYTES"),
                 "shape": list(t.shape)}
        if binary:
            blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            flat = t.reshape(-1)
            entry["data"] = (flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat).tolist()
        doc["outputs"].append(entry)
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return b"".join([head, *blobs]), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def load_model(path: str | Path, target: str | dict | None = None, **options: Any) -> Any:
    """A CompiledModel from a saved ``.tfz`` artifact (``tilefuse.load``) or an ``.onnx`` file (compiled)."""
    p = str(path)
    if Path(p).is_dir():
        raise ValueError(f"{p} is a directory; give the path of a .tfz artifact or an .onnx file")
    if not Path(p).exists():
        raise FileNotFoundError(f"no model file {p!r}")
    if p.endswith(".tfz"):
        return api.load(p, target=target)  # (target None: the artifact's own)
    if p.endswith(".onnx"):
        return api.compile_onnx(p, target=target, **options)
    raise ValueError(f"{p}: expected a .tfz artifact or an .onnx file")


def model_device(model: Any) -> torch.device:
    """Where the model's inputs must live: the GPU for a ``cuda`` target, else the CPU."""
    target = getattr(getattr(model, "options", None), "target", None) or {}
    return torch.device("cuda" if target.get("kind") == "cuda" else "cpu")



def _require_serve_extra() -> None:
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise NotImplementedError(f"serving needs {', '.join(missing)}: pip install 'tilefuse[serve]'")


class Metrics:
    """Prometheus metrics of one server, in their own registry (no process-global state)."""

    def __init__(self, model: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.model = model
        self.requests = Counter("tilefuse_requests", "Infer requests answered, by HTTP status",
                                ["model", "status"], registry=self.registry)
        self.latency = Histogram("tilefuse_request_latency_seconds", "Infer request latency inside the server",
                                 ["model"], registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256)
        self.batch_rows = Histogram("tilefuse_batch_size", "Rows (dim 0) per model run", ["model"],
                                    registry=self.registry, buckets=sizes)
        self.batch_requests = Histogram("tilefuse_batch_requests", "Requests per model run", ["model"],
                                        registry=self.registry, buckets=sizes)
        self.run_seconds = Histogram("tilefuse_model_run_seconds", "Model run time per batch", ["model"],
                                     registry=self.registry,
                                     buckets=(.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))
        self.padding = Counter("tilefuse_padding_rows", "Zero rows added to fill batches to a bucket size",
                               ["model"], registry=self.registry)
        self.queue = Gauge("tilefuse_queue_depth", "Requests waiting for a batch", ["model"], registry=self.registry)

    def observe_batch(self, rows: int, padded: int, requests: int, seconds: float) -> None:
        """Record one model run (called by the batcher's worker thread)."""
        self.batch_rows.labels(self.model).observe(rows)
        self.padding.labels(self.model).inc(padded - rows)
        self.batch_requests.labels(self.model).observe(requests)
        self.run_seconds.labels(self.model).observe(seconds)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(model: Any, name: str, *, max_batch_size: int = 8, max_delay_ms: float = 5.0, max_queue: int = 256,
               pad_batch: bool = False, batch_buckets: Sequence[int] | None = None, warm_up: bool = True,
               device: torch.device | str | None = None, max_request_bytes: int = MAX_REQUEST_BYTES):
    """A FastAPI app serving ``model`` (a CompiledModel or anything with its ``graph`` and ``__call__``) as ``name``.

    The batcher starts with the app's lifespan, first running the model once at every bucket size
    (``warm_up``: compiles each specialization before the server reports ready), and drains its queue
    when the app shuts down. A model whose target this machine cannot run raises ``ValueError`` here; one
    that fails its warm-up is served as not ready (503) with the failure as the reason.
    """
    _require_serve_extra()
    target = getattr(getattr(model, "options", None), "target", None)
    problem = target_problem(target) if target and device is None else None
    if problem is not None:
        raise ValueError(f"model {name!r} cannot be served here: {problem}")
    from fastapi import FastAPI, Request, Response
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    spec = ModelSpec.of(model, name, pad_batch)
    buckets = spec.buckets(max_batch_size, batch_buckets)
    metrics = Metrics(name)
    log = logging.getLogger("uvicorn.error")
    cache = getattr(getattr(model, "options", None), "max_specializations", None)
    if spec.mode == "dynamic" and cache and len(buckets) > cache:
        log.warning("%d batch sizes %s but the model keeps %d compiled shapes: batches will recompile",
                    len(buckets), buckets, cache)
    state: dict[str, Any] = {"batcher": None, "failed": None}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher = Batcher(model, buckets=buckets, max_delay_s=max_delay_ms / 1e3, max_queue=max_queue,
                          device=device if device is not None else model_device(model), observe=metrics.observe_batch)
        example = spec.example()
        if warm_up and example is not None:
            t0 = time.perf_counter()
            try:
                await asyncio.to_thread(batcher.warm_up, example)
                log.info("warmed up %s at batch sizes %s in %.2f s", name, buckets or "as declared",
                         time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - a model that cannot run is never ready
                state["failed"] = f"model {name!r} failed its warm-up, so it is not served: {type(e).__name__}: {e}"
                log.error("%s", state["failed"])
        if state["failed"] is None:
            state["batcher"] = batcher
        metrics.queue.labels(name).set_function(lambda: batcher.depth)
        try:
            yield
        finally:
            state["batcher"] = None  # readiness turns false; requests still in flight finish below
            await asyncio.to_thread(batcher.close, True)

    app = FastAPI(title="tilefuse", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.spec, app.state.metrics, app.state.buckets = spec, metrics, buckets

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # v2 errors are {"error": ...}, not FastAPI's {"detail": ...}
        return error(exc.status_code, str(exc.detail))

    def check(model_name: str, version: str | None) -> None:
        if model_name != spec.name:
            raise ProtocolError(404, f"unknown model {model_name!r}; this server serves {spec.name!r}")
        if version not in (None, "", spec.version):
            raise ProtocolError(404, f"model {spec.name!r} has no version {version!r}; it has {spec.version!r}")

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    def readiness(doc: dict) -> JSONResponse:
        ok = state["batcher"] is not None
        if state["failed"] is not None:
            doc["error"] = state["failed"]
        return JSONResponse({**doc, "ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2/health/ready")
    async def ready():
        return readiness({})

    @app.get("/v2")
    async def server_metadata():
        return {"name": "tilefuse", "version": VERSION, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/models/{model_name}")
    @app.get("/v2/models/{model_name}/versions/{version}")
    async def model_metadata(model_name: str, version: str | None = None):
        try:
            check(model_name, version)
        except ProtocolError as e:
            return error(e.status, str(e))
        return spec.metadata()

    @app.get("/v2/models/{model_name}/ready")
    @app.get("/v2/models/{model_name}/versions/{version}/ready")
    async def model_ready(model_name: str, version: str | None = None):
        try:
            check(model_name, version)
        except ProtocolError as e:
            return error(e.status, str(e))
        return readiness({"name": spec.name})

    @app.post("/v2/models/{model_name}/infer")
    @app.post("/v2/models/{model_name}/versions/{version}/infer")
    async def infer(model_name: str, request: Request, version: str | None = None):
        t0, status = time.perf_counter(), 200
        try:
            check(model_name, version)
            batcher = state["batcher"]
            if batcher is None:
                raise ShuttingDownError(state["failed"] or "the server is not serving (starting or shutting down)")
            body = await read_body(request, max_request_bytes)
            req = decode_request(body, request.headers, spec, max_request_bytes)
            try:
                future = batcher.submit(req.inputs)
            except ValueError as e:  # more rows than the largest batch
                raise ProtocolError(400, str(e)) from None
            outs = await asyncio.wrap_future(future)
            body, headers = encode_response(spec, req, outs)
            return Response(body, headers=headers)
        except ProtocolError as e:
            status = e.status
            return error(status, str(e))
        except (QueueFullError, ShuttingDownError) as e:
            status = 503
            return error(status, str(e))
        except asyncio.CancelledError:  # the client went away; its request is dropped if not yet run
            status = 499
            raise
        except Exception as e:  # noqa: BLE001 - the model failed on this request: say how, keep serving
            status = 500
            return error(status, f"model {spec.name!r} failed: {type(e).__name__}: {e}")
        finally:
            metrics.requests.labels(name, str(status)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - t0)

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), headers={"content-type": CONTENT_TYPE_LATEST})

    return app


def serve(model: Any, *, name: str, host: str = "127.0.0.1", port: int = 8000, max_batch_size: int = 8,
          max_delay_ms: float = 5.0, max_queue: int = 256, pad_batch: bool = False,
          batch_buckets: Sequence[int] | None = None, access_log: bool = False,
          graceful_timeout_s: float | None = 30.0, log_level: str = "info",
          max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
    """Serve ``model`` until SIGINT/SIGTERM; then finish the requests in flight and drain the queue."""
    _require_serve_extra()
    import uvicorn

    app = create_app(model, name, max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, max_queue=max_queue,
                     pad_batch=pad_batch, batch_buckets=batch_buckets, max_request_bytes=max_request_bytes)
    print(f"tilefuse serve: model {name!r} ({app.state.spec.mode} batching, batch sizes {app.state.buckets or [1]}, "
          f"max delay {max_delay_ms:g} ms, queue {max_queue}) on http://{host}:{port}", flush=True)
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_level=log_level,
                            timeout_graceful_shutdown=graceful_timeout_s)
    try:
        uvicorn.Server(config).run()  # re-raises SIGTERM after the graceful shutdown (exit status 143)
    except KeyboardInterrupt:  # SIGINT, re-raised the same way: the shutdown is done, exit quietly
        pass

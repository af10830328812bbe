"""Dynamic batching for serving: a bounded queue of requests and one worker thread that runs the model.

Note: requests are concatenated along dim 0 (the batch dimension), padded with zero rows up to the
next *bucket* size, run through the model in one call, and the outputs are split back by each
request's row count. Buckets exist because a CompiledModel with a symbolic batch dim plans and
compiles one specialization per input shape and keeps a bounded number of them (LRU): running every
batch size from 1 to 16 would recompile on most calls (about 100 ms each for mlp tiny on the CPU,
against 0.2 ms a run), while a few fixed sizes compile once each and are warmed up before the server
says it is ready. The batching mode follows from the graph's types (``batch_mode``):

- ``"dynamic"``: dim 0 of every input and output is the same symbolic dim (``"batch"``); the
  buckets default to the powers of two up to ``max_batch_size``, plus ``max_batch_size``.
- ``"pad"``: dim 0 is the same static int ``B`` everywhere and the caller asked for padding; the
  one bucket is ``B``, so a model compiled for static shapes serves requests of 1..B rows.
- ``"none"``: anything else; every request runs alone at the shapes it brought.

Only requests whose other dims and dtypes agree share a batch (their *signature*); others wait for
the next one, in arrival order. A batch that fails is retried request by request, so one bad request
fails alone. The worker waits at most ``max_delay_s`` after the oldest queued request for the batch
to fill, like Triton's ``max_queue_delay``.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

_log = logging.getLogger("tilefuse.serve")


class QueueFullError(RuntimeError):
    """The request queue holds ``max_queue`` requests already (the server answers 503)."""


class ShuttingDownError(RuntimeError):
    """The batcher is closing and takes no new requests (the server answers 503)."""


def batch_mode(input_types: Sequence, output_types: Sequence, pad_batch: bool = False) -> tuple[str, int | None]:
    """``("dynamic", None)``, ``("pad", B)`` or ``("none", None)`` for a graph with these value types."""
    types = list(input_types) + list(output_types)
    if not types or any(t.shape is None or len(t.shape) == 0 for t in types):
        return "none", None
    dims = {t.shape[0] for t in types}
    if len(dims) != 1:
        return "none", None
    (d,) = dims
    if isinstance(d, str):
        return "dynamic", None
    return ("pad", d) if pad_batch and d > 0 else ("none", None)


def default_buckets(max_batch_size: int) -> list[int]:
    """Powers of two below ``max_batch_size``, then ``max_batch_size`` itself: 8 -> [1, 2, 4, 8]."""
    return sorted({1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size} | {max_batch_size})


@dataclasses.dataclass
class Pending:
    """One queued request: its input tensors (CPU), row count, signature and the future to answer."""

    inputs: tuple[torch.Tensor, ...]
    rows: int
    signature: tuple
    future: concurrent.futures.Future
    enqueued: float = dataclasses.field(default_factory=time.monotonic)


def signature(inputs: Sequence[torch.Tensor]) -> tuple:
    """What must agree for requests to share a batch: every input's dims after dim 0 and dtype."""
    return tuple((tuple(t.shape[1:]), t.dtype) for t in inputs)


class Batcher:
    """Queues requests, runs them in batches on one worker thread, answers each through a future.

    ``model(*tensors) -> tuple of tensors``. ``buckets``: the batch sizes (rows) the model runs at,
    ascending; a batch is padded up to the smallest that holds it; ``None`` runs each request alone.
    ``observe(rows, padded_rows, requests, seconds)`` is called after every model run, before its requests
    are answered (metrics);
    ``device`` is where inputs go before the run.
    """

    def __init__(self, model: Callable[..., Sequence[torch.Tensor]], *, buckets: Sequence[int] | None = (1,),
                 max_delay_s: float = 0.005, max_queue: int = 256, device: torch.device | str = "cpu",
                 observe: Callable[[int, int, int, float], None] | None = None):
        if buckets is not None and (not buckets or min(buckets) < 1):
            raise ValueError(f"batch buckets must be positive sizes, got {buckets!r}")
        if max_queue < 1 or max_delay_s < 0:
            raise ValueError("max_queue must be >= 1 and max_delay_s >= 0")
        self.model = model
        self.buckets = sorted(set(buckets)) if buckets is not None else None
        self.max_rows = self.buckets[-1] if self.buckets else 1
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.device = torch.device(device)
        self.observe = observe
        self._queue: collections.deque[Pending] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="tilefuse-batcher", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests waiting in the queue (not counting the batch being run)."""
        return len(self._queue)

    def warm_up(self, example: Sequence[torch.Tensor]) -> None:
        """Run the model once at every bucket size on zeros shaped like ``example`` (compiles them all now);
        without buckets, once on zeros of ``example``'s own shapes."""
        sizes = self.buckets or [None]
        for b in sizes:
            args = [torch.zeros((t.shape[0] if b is None else b, *t.shape[1:]), dtype=t.dtype, device=self.device)
                    for t in example]
            with torch.inference_mode():
                self.model(*args)

    def submit(self, inputs: Sequence[torch.Tensor]) -> concurrent.futures.Future:
        """Queue one request; the future resolves to its output tensors (CPU) or to the model's error.

        Raises ``QueueFullError`` when ``max_queue`` requests wait, ``ShuttingDownError`` after ``close``
        and ``ValueError`` when the request has more rows than the largest batch.
        """
        inputs = tuple(inputs)
        rows = int(inputs[0].shape[0]) if self.buckets else 1
        if rows > self.max_rows:
            raise ValueError(f"the request has {rows} rows in dim 0 (the batch dim); this server runs at most "
                             f"{self.max_rows} rows at once (its max batch size): split the request")
        item = Pending(inputs, rows, signature(inputs), concurrent.futures.Future())
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} requests waiting); retry later")
            self._queue.append(item)
            self._cond.notify()
        return item.future

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; with ``drain`` finish every queued one, else fail them; join the worker."""
        with self._cond:
            self._closing = True
            if not drain:
                while self._queue:
                    self._queue.popleft().future.set_exception(ShuttingDownError("the server is shutting down"))
            self._cond.notify_all()
        self._thread.join(timeout)

    def _take(self) -> list[Pending] | None:
        """Block until a batch is due; return it (oldest request first), or None when closed and empty."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            deadline = self._queue[0].enqueued + self.max_delay_s
            while not self._closing and self._rows_ready() < self.max_rows:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            first = self._queue[0]
            batch, rows, rest = [], 0, collections.deque()
            while self._queue:
                p = self._queue.popleft()
                if p.signature == first.signature and rows + p.rows <= self.max_rows:
                    batch.append(p)
                    rows += p.rows
                    if rows >= self.max_rows:
                        break
                else:
                    rest.append(p)
            self._queue.extendleft(reversed(rest))
            return batch

    def _rows_ready(self) -> int:
        sig = self._queue[0].signature
        return sum(p.rows for p in self._queue if p.signature == sig)

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            batch = [p for p in batch if p.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                self._run(batch)
            except Exception as e:  # noqa: BLE001 - a failed batch is retried alone, then reported
                if len(batch) == 1:
                    batch[0].future.set_exception(e)
                    continue
                for p in batch:
                    try:
                        self._run([p])
                    except Exception as e1:  # noqa: BLE001
                        p.future.set_exception(e1)

    def _run(self, batch: list[Pending]) -> None:
        t0 = time.perf_counter()
        rows = sum(p.rows for p in batch)
        if self.buckets is None:
            args, padded = list(batch[0].inputs), rows
        else:
            padded = self.buckets[bisect.bisect_left(self.buckets, rows)]
            args = [torch.cat([p.inputs[i] for p in batch]) if len(batch) > 1 else batch[0].inputs[i]
                    for i in range(len(batch[0].inputs))]
            if padded > rows:
                args = [torch.cat([a, a.new_zeros((padded - rows, *a.shape[1:]))]) for a in args]
        with torch.inference_mode():
            outs = tuple(o.cpu() for o in self.model(*[a.to(self.device) for a in args]))
        if self.buckets is not None:
            for o in outs:
                if o.dim() == 0 or o.shape[0] != padded:
                    raise RuntimeError(f"an output has shape {tuple(o.shape)}; expected dim 0 = {padded} "
                                       f"(the batch) to split it between requests")
        # Recorded before any future resolves: a client that has its answer sees the run in the metrics.
        if self.observe is not None:
            try:
                self.observe(rows, padded, len(batch), time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - metrics must never fail a request
                _log.exception("batch observer failed")
        if self.buckets is None:
            batch[0].future.set_result(outs)
            return
        start = 0
        for p in batch:
            p.future.set_result(tuple(o[start:start + p.rows] for o in outs))
            start += p.rows

"""A disk cache of built ``T.prim_func``s, so a warm compile does not rebuild templates.

Note: building a template's PrimFunc (tracing the TileLang DSL) costs 0.05-0.2 s per kernel and was most
of a warm compile once TileLang's kernel cache answers the compile itself (gpt2 small on ``c``: 0.96 of
2.5 s). The PrimFunc is stored as TVM JSON (``tvm.ir.save_json``, as artifacts store them; it hashes to
the same TileLang cache key as a freshly built one) and read back by TVM's loader directly (``load_func``).
The key covers everything the function is built from: the template, its parameters and tile config, the
target, the TileLang version and a digest of the lowering package's own source, so editing a template never
reuses a stale function. Writes are atomic
(temporary file, ``os.replace``); an unreadable entry is rebuilt. ``TILEFUSE_FUNC_CACHE=0`` turns the
cache off, ``TILEFUSE_FUNC_CACHE_DIR`` moves it (default ``~/.cache/tilefuse/funcs``); its size is bounded
(``tilefuse/disk_cache.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from tilefuse import disk_cache

_log = logging.getLogger("tilefuse")
CACHE = disk_cache.DiskCache("FUNC_CACHE", "funcs")


def source_digest() -> str:
    """sha256 of every ``.py`` file of the lowering package (templates, expressions, index maps, builders)."""
    return disk_cache.source_digest(Path(__file__).resolve().parent)


def key(template: str, params, out_idx, config: dict, target: dict) -> str:
    import tilelang

    what = repr((template, params, out_idx, sorted(config.items()), json.dumps(target, sort_keys=True),
                 tilelang.__version__, source_digest()))
    return hashlib.sha256(what.encode()).hexdigest()


def load_func(text: str):
    """A TVM object (a PrimFunc) from the JSON ``tvm.ir.save_json`` wrote. ``tvm.ir.load_json`` first passes the text
    through its upgrader for older TVM versions' files, a ``json.loads`` and ``json.dumps`` of the whole function:
    8.6 ms a kernel, 0.33 s of ResNet-50's 0.51 s in tilefuse's own warm compile (2-core CPU, 2026-12-04). A file this
    TVM wrote needs no upgrade (the cache's key holds TileLang's version), so TVM's loader reads it directly; the
    upgrader runs only where that fails (another version's file)."""
    import tvm
    from tvm.runtime import _ffi_node_api

    try:
        return _ffi_node_api.LoadJSON(text)
    except Exception:  # noqa: BLE001 -- an older format: TVM's own upgrade path, which raises on a damaged file
        return tvm.ir.load_json(text)


def cached(k: str, build: Callable[[], object]):
    """The PrimFunc stored under ``k``, or ``build()`` stored there."""
    if not CACHE.enabled():
        return build()
    import tvm

    text = CACHE.read(k)
    if text is not None:
        try:
            return load_func(text)
        except Exception as e:  # noqa: BLE001 -- a damaged entry is rebuilt and rewritten
            _log.warning("prim func cache entry %s is unreadable (%s); rebuilding it", CACHE.path(k),
                         type(e).__name__)
    func = build()
    try:
        CACHE.write(k, tvm.ir.save_json(func))
    except OSError as e:  # a read-only home must not fail the compile
        _log.debug("prim func cache %s: not written (%s)", CACHE.path(k), e)
    return func

"""The tuning database: measured winners (tile configs, and the kernel-or-torch choice per region) kept on disk.

Note: keys are the template, a digest of the spec, the target and the TileLang version, so identical specs (and a
second compile of the same model) measure nothing. Its path is ``TILEFUSE_TUNING_DB`` (``config.setting``), by
default ``~/.cache/tilefuse/tuning.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import tilelang

from tilefuse.config import setting
from tilefuse.fileio import write_atomic

_log = logging.getLogger("tilefuse")
DB_ENV = "TILEFUSE_TUNING_DB"


def default_db_path() -> Path:
    return Path(setting("TUNING_DB") or Path.home() / ".cache" / "tilefuse" / "tuning.json")


def spec_digest(spec) -> str:
    """What a kernel is built from (its tile config aside)."""
    return hashlib.sha256(repr((spec.template, spec.params, spec.out_idx)).encode()).hexdigest()


def db_key(spec, target: dict) -> str:
    return "|".join((spec.template, spec_digest(spec)[:32], json.dumps(target, sort_keys=True),
                     f"tilelang-{tilelang.__version__}"))


def _valid(key: str, entry: dict) -> bool:
    """An entry of its kind: a tuned config, a region's measured choice (``|choice``) or a whole graph's (``|whole``,
    ``backend._WholeGraphChoice``)."""
    if key.endswith("|choice"):
        return isinstance(entry.get("torch"), bool)
    if key.endswith("|whole"):
        return entry.get("runs") in ("tilefuse", "torch")
    return isinstance(entry.get("config"), dict)


class TuningDBError(RuntimeError):
    """The tuning database file cannot be read or written."""


class TuningDB:
    """A JSON file of ``db_key -> {"config", "seconds", "candidates", "template", "tuned_at"}`` (and of
    ``db_key|choice -> {"torch", "kernel_ms", "torch_ms"}``, see ``pipeline.decide``, and of
    ``graph|...|whole -> {"runs", "tilefuse_ms", "torch_ms"}``, see ``backend._WholeGraphChoice``).

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
        choice between its kernel and the region's torch ops (``pipeline.decide``)."""
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
            if not isinstance(data, dict) or not all(isinstance(v, dict) and _valid(k, v) for k, v in data.items()):
                raise ValueError("not an object of {key: {'config': {...}, ...}} (choices: {'torch': bool, ...}; "
                                 "whole graphs: {'runs': 'tilefuse' or 'torch', ...})")
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

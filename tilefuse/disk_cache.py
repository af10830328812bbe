"""Folders of cache entries (``~/.cache/tilefuse/<folder>``): where each lives, whether it is on, the digest of the
source whose output it keeps, and a bound on its size.

Note: the bound. Every compile of a new shape adds entries (a PrimFunc a kernel, an imported program a graph), and a
user's disk is not ours to fill. ``TILEFUSE_CACHE_MAX_MB`` (default 2048) bounds each folder. A process that writes
an entry checks its folder's total at its first write and then after every tenth of the bound it has written. When
the total is over the bound, it removes the least recently used entries until the total is at most
``KEEP`` (0.8) of the bound. A hit touches its entry, so a file's mtime is its last use. Another process that
reads an entry just removed sees a miss and builds it again. Files that are not entries (another writer's
temporary file) are never counted or removed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from tilefuse.config import setting
from tilefuse.fileio import write_atomic

KEEP = 0.8
SUFFIX = ".json"


def max_bytes() -> int:
    """Each folder's bound, from ``TILEFUSE_CACHE_MAX_MB``."""
    text = setting("CACHE_MAX_MB", "2048")
    try:
        mb = float(text)
    except ValueError:
        raise ValueError(f"TILEFUSE_CACHE_MAX_MB={text!r}: expected a number of megabytes") from None
    if mb <= 0:
        raise ValueError(f"TILEFUSE_CACHE_MAX_MB={text!r}: expected a positive number of megabytes")
    return int(mb * (1 << 20))


@dataclass
class DiskCache:
    """A folder of entries, one file each. ``TILEFUSE_<name>=0`` turns it off, ``TILEFUSE_<name>_DIR`` moves it
    (default ``~/.cache/tilefuse/<folder>``)."""

    name: str
    folder: str
    _written: int = field(default=0, repr=False)  # bytes written since the last check of the folder's total
    _checked: bool = field(default=False, repr=False)

    def enabled(self) -> bool:
        return setting(self.name, "1") != "0"

    def directory(self) -> Path:
        return Path(setting(f"{self.name}_DIR") or Path.home() / ".cache" / "tilefuse" / self.folder)

    def path(self, key: str) -> Path:
        return self.directory() / f"{key}{SUFFIX}"

    def read(self, key: str) -> str | None:
        """The text kept under ``key`` (touched: used now), or None where there is none or it cannot be read."""
        path = self.path(key)
        try:
            text = path.read_text()
        except OSError:
            return None
        with contextlib.suppress(OSError):  # (a read-only folder keeps its order)
            os.utime(path)
        return text

    def write(self, key: str, text: str) -> None:
        """Keep ``text`` under ``key`` (atomically), then hold the folder to its bound. ``OSError`` propagates."""
        write_atomic(self.path(key), text)
        self._written += len(text)
        bound = max_bytes()
        if not self._checked or self._written * 10 >= bound:
            self._checked, self._written = True, 0
            prune(self.directory(), bound)


def prune(directory: Path, bound: int) -> int:
    """Remove ``directory``'s least recently used entries while their total is over ``bound``, down to ``KEEP`` of
    it; returns how many were removed. Entries that vanish meanwhile (another process pruning) are skipped."""
    entries = []
    with contextlib.suppress(OSError):
        for p in directory.iterdir():
            if p.suffix != SUFFIX:
                continue
            with contextlib.suppress(OSError):
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    if total <= bound:
        return 0
    removed = 0
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= bound * KEEP:
            break
        with contextlib.suppress(OSError):
            p.unlink()
            removed += 1
        total -= size
    return removed


@functools.cache
def source_digest(*roots: Path) -> str:
    """sha256 of every ``.py`` file under ``roots`` (each named by its path from its root's parent)."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            h.update(p.relative_to(root.parent).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()

"""A one-line progress report on stderr for the slow steps of a compile (tuning, compiling kernels).

Note: on a terminal the line is redrawn in place (``\\r``) as items finish:
``compiling gpt2: 12/40 kernels, ~8 s left``. Into a file or a CI log a redraw would be one endless
line, so there a plain line is printed at most every ``interval`` seconds, plus one when the step ends
(``compiling gpt2: 40/40 kernels in 31.2 s``): a short step prints one line, a long one a few. The
time left is the mean time per finished item times the items left, and never more than a cap (the
tuning time limit) allows. ``Options.quiet`` decides whether a report is shown at all; see
``wanted``. A tiny own class rather than tqdm: tqdm is only here through other packages, and its
non-terminal output is the endless ``\\r`` line this avoids.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

# Seconds between redraws on a terminal, and between plain lines elsewhere.
TTY_INTERVAL, LOG_INTERVAL = 0.1, 10.0


def wanted(quiet: bool | None, stream: TextIO | None = None) -> bool:
    """Whether to show progress: never when ``quiet``, always when ``quiet is False`` (the command line's
    default), and when ``quiet is None`` (the Python API's default) only if ``stream`` (stderr) is a
    terminal, so library use and test logs stay clean."""
    if quiet is not None:
        return not quiet
    return _isatty(stream if stream is not None else sys.stderr)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def format_seconds(s: float) -> str:
    """``8 s``, ``2 min 5 s``, ``1 h 3 min``: a human-sized duration."""
    s = max(0, math.ceil(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Progress:
    """Counts ``total`` items of one step (``label``, e.g. ``"compiling gpt2"``) and reports on ``stream``.

    ``tick()`` may be called from any thread. ``limit_s`` bounds the time left shown (the step stops by
    then). A disabled report (``enabled=False``) or one of zero items prints nothing. Use it as a
    context manager, or call ``close()`` for the final line."""

    def __init__(self, label: str, total: int, unit: str = "kernels", *, enabled: bool = True,
                 stream: TextIO | None = None, limit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None,
                 interval: float | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.tty = _isatty(self.stream) if tty is None else tty
        self.interval = interval if interval is not None else (TTY_INTERVAL if self.tty else LOG_INTERVAL)
        self.limit_s, self.clock = limit_s, clock
        self.done, self.closed = 0, False
        self.start = self.last_draw = clock()
        self._width = 0  # of the line drawn last on a terminal (a shorter one must blank it out)
        self._lock = threading.Lock()
        if self.enabled and self.tty:
            self._draw(self.line())

    def seconds_left(self) -> float | None:
        """The estimate shown: None before the first item finishes (and no cap says otherwise)."""
        elapsed = self.clock() - self.start
        cap = None if self.limit_s is None or math.isinf(self.limit_s) else max(self.limit_s - elapsed, 0.0)
        if self.done == 0:
            return cap
        guess = elapsed / self.done * (self.total - self.done)
        return guess if cap is None else min(guess, cap)

    def line(self) -> str:
        text = f"{self.label}: {self.done}/{self.total} {self.unit}"
        if self.closed:
            return f"{text} in {self.clock() - self.start:.1f} s"
        left = self.seconds_left()
        if left is None:
            return text
        return f"{text}, {'at most ' if self.done == 0 else '~'}{format_seconds(left)} left"  # no pace yet: the cap

    def tick(self, n: int = 1) -> None:
        """``n`` more items finished."""
        with self._lock:
            self.done = min(self.done + n, self.total)
            if not self.enabled or self.closed or self.done == self.total:
                return  # the last item's line is close()'s
            now = self.clock()
            if now - self.last_draw >= self.interval:
                self.last_draw = now
                self._draw(self.line())

    def close(self) -> None:
        """The final line (``label: done/total unit in N s``), once."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.enabled:
                self._draw(self.line(), end="\n")

    def _draw(self, text: str, end: str = "") -> None:
        if self.tty:
            pad = " " * max(self._width - len(text), 0)
            self._width = 0 if end else len(text)
            self.stream.write(f"\r{text}{pad}{end}")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

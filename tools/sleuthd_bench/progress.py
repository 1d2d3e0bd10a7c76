"""A small progress bar for long benchmark steps, written to stderr (no dependencies).

On a terminal the bar is redrawn in place; when stderr is a file or a pipe (CI logs) it prints a
plain line every few seconds instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_BAR_WIDTH = 24


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``"1m15s"``; ``3725`` -> ``"1h02m"``; below a minute ``"42s"``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """Counts finished items out of ``total`` and shows done/total, rate and ETA.

    ``min_interval_s`` bounds how often a terminal bar is redrawn; ``log_interval_s`` how often a
    line is printed when the stream is not a terminal. ``close()`` always prints the final state.
    """

    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        min_interval_s: float = 0.2,
        log_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(0, total)
        self.label = label
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._interval = min_interval_s if self._tty else log_interval_s
        self._clock = clock
        self._start = clock()
        self._last_draw = -float("inf")
        self._closed = False

    def line(self) -> str:
        """The current state as one line of text."""
        elapsed = max(self._clock() - self._start, 1e-9)
        rate = self.done / elapsed
        frac = self.done / self.total if self.total else 1.0
        filled = round(_BAR_WIDTH * frac)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        if self.done >= self.total:
            tail = f"in {format_duration(elapsed)}"
        elif self.done:
            tail = f"ETA {format_duration((self.total - self.done) / rate)}"
        else:
            tail = "ETA ?"
        return f"{self.label} [{bar}] {self.done}/{self.total} {100 * frac:5.1f}% {rate:6.1f}/s {tail}"

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self._clock()
        if now - self._last_draw >= self._interval:
            self._last_draw = now
            self._draw()

    def update_to(self, done: int, total: int | None = None) -> None:
        """Set the absolute count (for callbacks that report ``(done, total)``)."""
        if total is not None:
            self.total = total
        self.advance(done - self.done)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._draw()
        if self._enabled and self._tty:
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self) -> None:
        if not self._enabled:
            return
        if self._tty:
            self._stream.write("\r" + self.line() + "\x1b[K")
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

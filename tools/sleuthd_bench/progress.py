"""Progress bars for long benchmark steps, on stderr (tqdm).

On a terminal the bar is redrawn in place; when stderr is a file or a pipe (CI logs) a plain line is
printed every few seconds instead, so logs stay readable.
"""

from __future__ import annotations

import sys
from types import TracebackType

from tqdm import tqdm

_LOG_INTERVAL_S = 10.0  # seconds between lines when stderr is not a terminal


class Progress:
    """Counts finished items out of ``total`` and shows done/total, rate and ETA; ``enabled=False``
    shows nothing (``--quiet``)."""

    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        tty = sys.stderr.isatty()
        self._bar = tqdm(
            total=max(0, total),
            desc=label,
            disable=not enabled,
            file=sys.stderr,
            mininterval=0.2 if tty else _LOG_INTERVAL_S,
            ascii=not tty,
            dynamic_ncols=tty,
        )

    @property
    def done(self) -> int:
        return int(self._bar.n)

    @property
    def total(self) -> int:
        return int(self._bar.total or 0)

    def advance(self, n: int = 1) -> None:
        self._bar.update(n)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Set the absolute count (for callbacks that report ``(done, total)``)."""
        if total is not None and total != self._bar.total:
            self._bar.total = total
            self._bar.refresh()
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

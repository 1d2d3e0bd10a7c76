"""Memory outside admission: what the C allocator keeps once requests are done, and what streams keep between
turns.

Admission (sleuthd.engine.admission) bounds what is held while work runs; this module returns what stays
resident after it: :func:`limit_malloc_arenas` (one allocator arena per core, set once at start-up) and
:class:`HeapTrimmer` (cycles collected, the encoders' ONNX Runtime arenas shrunk and ``malloc_trim`` when
the server goes idle; glibc only, elsewhere both do nothing); and bounds the passive memory streams keep for band
matching (:class:`KeptAudio`). Standard library only.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # glibc's mallopt parameter


class KeptAudio:
    """Turn audio that streams keep between turns for channel matching (sleuthd.judgment.channel_matching), all streams
    together. It is passive memory, not decoding work, so it is bounded apart from the admission's AudioBudget; a
    stream that finds no room keeps nothing more and narrows its turns as they arrive instead (more work, no
    refusal). Used from the event loop only."""

    def __init__(self, limit_bytes: int, report: Callable[[int], None] | None = None) -> None:
        """``report``: told the bytes held after each change (the sleuthd_band_match_kept_bytes gauge)."""
        self.limit = limit_bytes
        self.held = 0
        self._report = report or (lambda held: None)

    def hold(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        self._report(self.held)
        return True

    def release(self, n: int) -> None:
        self.held = max(0, self.held - n)
        self._report(self.held)


def limit_malloc_arenas(arenas: int) -> bool:
    """Let glibc's allocator use at most ``arenas`` arenas (its default is 8 per core; glibc only, call it
    before threads start). Each thread that allocates (gRPC's, the decode and model threads, ONNX Runtime's)
    otherwise takes an arena of its own, whose freed pages between live blocks stay resident: after the
    fuzz run, thread arenas held 34-41 MB, against 11 MB with one arena per core. Whether it was set."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, max(1, arenas)))
    except (OSError, AttributeError):  # not glibc
        return False


class HeapTrimmer:
    """Hands freed memory back to the system after work. After an overload the C allocator keeps the pages
    of every freed request, decoded clip and window array: RSS stayed near its peak for good (about a
    gigabyte after 64 clients). ``malloc_trim`` returns them (from every arena; glibc only); it runs on a
    timer thread, at most once per ``min_interval_s`` (a call in between schedules one trim for the end of
    the interval, so the last burst is always trimmed). The RPC gate calls it whenever a work RPC ends.

    When the server has gone idle it first collects Python's reference cycles (``gc.collect``): an
    exception raised through a request's frames keeps them, and the request's audio, alive until a full
    collection, which under a light allocation rate may not come for minutes (after 64 clients x 3.66 MiB,
    a collection and a trim took a server from 995 to 585 MB), then runs ``when_idle`` (the server shrinks
    its encoders' ONNX Runtime arenas: about 100 MB after a burst). A collection holds the interpreter for a
    few tens of milliseconds, so all this runs only when no work RPC is in flight."""

    def __init__(self, min_interval_s: float = 10.0, when_idle: Sequence[Callable[[], None]] = ()) -> None:
        """``when_idle``: more to hand back when the server is idle, before the trim (the encoders' ONNX
        Runtime arenas); run on the trimmer's thread, each failure logged and skipped."""
        self.min_interval_s = min_interval_s
        self.when_idle = tuple(when_idle)
        self._last = -min_interval_s
        self._pending = False
        self._collect = False
        self._closed = False
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._trim: Callable[[int], int] | None = None
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            self._trim = None

    def __call__(self, idle: bool = False) -> None:
        """Trim now or at the end of the interval (``idle``: collect cycles first); never blocks (safe to
        call from the event loop)."""
        with self._lock:
            self._collect = self._collect or idle
            if self._pending or self._closed:
                return
            self._pending = True
            delay = max(0.0, self._last + self.min_interval_s - time.monotonic())
            self._timer = threading.Timer(delay, self._run)
            self._timer.daemon = True
            self._timer.start()

    def close(self, timeout: float = 10.0) -> None:
        """No more trims; waits (up to ``timeout``) for one that is running. Called before the engine and the
        interpreter go: a trimmer thread still inside an ONNX Runtime call (shrinking an arena) when the
        process exits aborts it ("terminate called without an active exception", exit status -6)."""
        with self._lock:
            self._closed = True
            timer = self._timer
        if timer is not None:
            timer.cancel()  # a timer still waiting never runs
            if timer is not threading.current_thread():
                timer.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    self._pending = False
                    return
                collect, self._collect = self._collect, False
            try:
                if collect:
                    gc.collect()
                    for hand_back in self.when_idle:
                        try:
                            hand_back()
                        except Exception:
                            logger.exception("handing memory back when idle failed")
                if self._trim is not None:
                    self._trim(0)
            finally:
                with self._lock:
                    self._last = time.monotonic()
                    again = self._collect  # the server went idle while this ran
                    self._pending = again
            if not again:
                return

"""Admission control: the process takes on only as much work as it can hold, and says "busy" at once.

Without a bound, a server offered more than it can do keeps accepting: every request's audio, its
decoded samples and its windows wait in memory until the request's deadline passes, and memory grows
with the offered load instead of with the work done. Here each kind of waiting work has a bound that
is checked before the work starts, and going over it raises :class:`~sleuthd.errors.Overloaded`
("busy, retry later": RESOURCE_EXHAUSTED) without doing anything:

- :class:`AudioBudget`: request audio bytes held across all RPCs, from before decoding until the
  verdict (unary requests whole, streams per buffered chunk);
- :class:`Slots`: concurrent calls of one kind (StreamDialogue);
- :class:`BoundedThreadPool`: the decode pool's queue of jobs not yet started.

Each admits work larger than its whole bound when nothing else holds it (a request larger than the
budget is legitimate and would otherwise be told to retry for ever). Standard library only.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sleuthd.errors import Overloaded

logger = logging.getLogger(__name__)

T = TypeVar("T")
_MIN_SHED_SECONDS = 1.0  # refuse on the pace only when at least this much work is ahead


class AudioBudget:
    """Bytes of request audio held at once by the whole process. Used from the event loop only.

    It also learns the pace at which held audio gets done (bytes per second of time with work in hand,
    weighted to the last ``half_life_s``), so a request whose deadline is shorter than the work already
    ahead of it is refused at once instead of failing with DEADLINE_EXCEEDED after taking its share of
    the work. A request that finds nothing held is always let in (that is how the pace is learnt).
    """

    def __init__(
        self,
        limit_bytes: int,
        half_life_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.limit = limit_bytes
        self.on_idle = on_idle  # called when the last held byte is released
        self.held = 0
        self.refused = 0  # acquisitions refused since the start
        self._half_life = half_life_s
        self._clock = clock
        self._marked = clock()
        self._busy_s = 0.0  # decayed seconds during which something was held
        self._done = 0.0  # decayed bytes of work that finished

    @property
    def pace(self) -> float | None:
        """Bytes of held audio done per second of busy time lately; None until a second of evidence."""
        self._mark()
        if self._busy_s < 1.0 or self._done <= 0:
            return None
        return self._done / self._busy_s

    def _mark(self) -> None:
        now = self._clock()
        dt = now - self._marked
        if dt > 0:
            decay = 0.5 ** (dt / self._half_life)
            self._busy_s = self._busy_s * decay + (dt if self.held > 0 else 0.0)
            self._done *= decay
            self._marked = now

    def refusal(self, n: int, what: str = "this request", seconds_left: float | None = None) -> Overloaded | None:
        """Why ``n`` more bytes would be refused now (counted in ``refused``), or None: when something is
        held and they would pass the limit, or when something is held and, at the recent pace, the work
        with them would outlast ``seconds_left``."""
        if n <= 0 or self.held == 0:
            return None
        if self.held + n > self.limit:
            self.refused += 1
            return Overloaded(
                f"the server is busy: {self.held} bytes of audio are in flight and {what} would add {n}, "
                f"over the limit of {self.limit}; retry with backoff"
            )
        pace = self.pace
        ahead = None if pace is None else (self.held + n) / pace
        # Below a second of work ahead the estimate is within its own noise (batching waits, the pace's
        # granularity): such a request is let in and its deadline, if too short, ends it as usual.
        if seconds_left is not None and ahead is not None and ahead > max(seconds_left, _MIN_SHED_SECONDS):
            self.refused += 1
            return Overloaded(
                f"the server is busy: the audio in flight with {what} takes about {ahead:.1f} s "
                f"at the recent pace, and its deadline leaves {seconds_left:.1f} s; retry with backoff or a "
                "longer deadline"
            )
        return None

    def acquire(self, n: int, what: str = "this request", seconds_left: float | None = None) -> None:
        """Hold ``n`` more bytes, or raise the :meth:`refusal`."""
        refused = self.refusal(n, what, seconds_left)
        if refused is not None:
            raise refused
        if n > 0:
            self._mark()
            self.held += n

    def release(self, n: int, done: bool = False) -> None:
        """Let go of ``n`` bytes; ``done``: their work was finished (it counts towards the pace)."""
        if n > 0:
            self._mark()
            if done:
                self._done += n
            self.held -= n
            if self.held < 0:  # a bookkeeping bug must not turn into a server that refuses everything
                logger.error("audio budget released %d bytes more than it held", -self.held)
                self.held = 0
            if self.held == 0 and self.on_idle is not None:
                self.on_idle()

    @contextmanager
    def hold(self, n: int, what: str = "this request", seconds_left: float | None = None) -> Iterator[None]:
        """``n`` bytes held for the duration of the block (released however it ends; counted as done
        when the block ends without an exception)."""
        self.acquire(n, what, seconds_left)
        done = False
        try:
            yield
            done = True
        finally:
            self.release(n, done)


class HeapTrimmer:
    """Hands freed heap memory back to the system once a burst of work is over (glibc only; elsewhere a
    no-op). After an overload the C allocator keeps the pages of every freed request, decoded clip and
    window array: RSS stayed near its peak for good (about a gigabyte after 64 clients). ``malloc_trim``
    returns them; it runs on a timer thread, at most once per ``min_interval_s`` (a call in between
    schedules one trim for the end of the interval, so the last burst is always trimmed)."""

    def __init__(self, min_interval_s: float = 10.0) -> None:
        self.min_interval_s = min_interval_s
        self._last = -min_interval_s
        self._pending = False
        self._trim: Callable[[int], int] | None = None
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            self._trim = None

    def __call__(self) -> None:
        """Trim now or at the end of the interval; never blocks (safe to call from the event loop)."""
        if self._trim is None or self._pending:
            return
        self._pending = True
        delay = max(0.0, self._last + self.min_interval_s - time.monotonic())
        timer = threading.Timer(delay, self._run)
        timer.daemon = True
        timer.start()

    def _run(self) -> None:
        try:
            assert self._trim is not None
            self._trim(0)
        finally:
            self._last = time.monotonic()
            self._pending = False


class Slots:
    """At most ``limit`` holders at once (e.g. open streams). Used from the event loop only."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.taken = 0

    @property
    def full(self) -> bool:
        return self.taken >= self.limit

    def busy(self) -> Overloaded:
        return Overloaded(f"the server is busy: {self.taken} {self.what} are open, the limit; retry with backoff")

    @contextmanager
    def take(self) -> Iterator[None]:
        if self.full:
            raise self.busy()
        self.taken += 1
        try:
            yield
        finally:
            self.taken -= 1


class BoundedThreadPool(ThreadPoolExecutor):
    """A thread pool whose queue of jobs not yet started holds at most ``max_queued``; :meth:`submit`
    raises Overloaded beyond that instead of queueing without end. Thread-safe."""

    def __init__(self, max_workers: int, max_queued: int, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.max_queued = max_queued
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs submitted and not yet started (nor cancelled)."""
        return self._waiting

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._waiting >= self.max_queued:
                raise Overloaded(
                    f"the server is busy: {self._waiting} clips are waiting to be decoded, the limit; "
                    "retry with backoff"
                )
            self._waiting += 1
        left = [False]  # whether this job stopped counting as waiting (started, cancelled or refused)

        def leave() -> None:
            with self._lock:
                if not left[0]:
                    left[0] = True
                    self._waiting -= 1

        def run() -> T:
            leave()
            return fn(*args, **kwargs)

        try:
            future = super().submit(run)
        except BaseException:
            leave()
            raise
        # A job cancelled before it started never runs ``run``: it leaves the queue here.
        future.add_done_callback(lambda _: leave())
        return future

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

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sleuthd.errors import Overloaded

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AudioBudget:
    """Bytes of request audio held at once by the whole process. Used from the event loop only."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.held = 0
        self.refused = 0  # acquisitions refused since the start

    def acquire(self, n: int, what: str = "this request") -> None:
        """Hold ``n`` more bytes, or raise Overloaded when that would pass the limit and something is held."""
        if n <= 0:
            return
        if self.held + n > self.limit and self.held > 0:
            self.refused += 1
            raise Overloaded(
                f"the server is busy: {self.held} bytes of audio are in flight and {what} would add {n}, "
                f"over the limit of {self.limit}; retry with backoff"
            )
        self.held += n

    def release(self, n: int) -> None:
        if n > 0:
            self.held -= n
            if self.held < 0:  # a bookkeeping bug must not turn into a server that refuses everything
                logger.error("audio budget released %d bytes more than it held", -self.held)
                self.held = 0

    @contextmanager
    def hold(self, n: int, what: str = "this request") -> Iterator[None]:
        """``n`` bytes held for the duration of the block (released however it ends)."""
        self.acquire(n, what)
        try:
            yield
        finally:
            self.release(n)


class Slots:
    """At most ``limit`` holders at once (e.g. open streams). Used from the event loop only."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.taken = 0

    @contextmanager
    def take(self) -> Iterator[None]:
        if self.taken >= self.limit:
            raise Overloaded(f"the server is busy: {self.taken} {self.what} are open, the limit; retry with backoff")
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

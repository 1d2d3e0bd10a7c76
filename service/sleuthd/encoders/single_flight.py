"""Single flight: concurrent requests for the same work share one computation.

Two requests that need the same clip's embedding at the same time (one reference clip in a burst of
checks of the same voice, the shared turns of a dialogue checked under several scenarios, a retried
request) would each decode and encode it: the embedding cache only helps once the first has finished.
Here the first caller starts the work and later callers wait for it.

The work runs as a task of its own, so a caller that goes away (its RPC cancelled, its own deadline
passed) does not take the result from the others. It is cancelled when nobody waits for it any more,
so abandoned work still leaves the batcher's queue as it did before sharing.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class _Flight(Generic[T]):
    task: asyncio.Future[T]
    waiters: int = 0


class SingleFlight(Generic[K, T]):
    """Runs at most one computation per key at a time; see the module docstring."""

    def __init__(self) -> None:
        self._flights: dict[K, _Flight[T]] = {}

    def __len__(self) -> int:
        """Computations in flight."""
        return len(self._flights)

    async def run(self, key: K, start: Callable[[], Awaitable[T]], timeout: float | None = None) -> tuple[T, bool]:
        """(result, joined): the result of the computation for ``key``, started with ``start()``
        unless one is already in flight (then ``joined`` is True).

        Raises what the computation raises, and TimeoutError when ``timeout`` seconds pass first
        (the computation goes on for the other callers, if any)."""
        flight = self._flights.get(key)
        if flight is not None and flight.task.cancelled():
            flight = None  # abandoned by its last waiter and cancelled: never hand its CancelledError on
        joined = flight is not None
        if flight is None:
            flight = _Flight(asyncio.ensure_future(start()))
            self._flights[key] = flight
            flight.task.add_done_callback(functools.partial(self._land, key, flight))
        flight.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(flight.task), timeout), joined
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody wants it any more
                # Forget it now, not when the cancellation lands: a caller arriving in between must
                # start afresh rather than join a computation that can only end in CancelledError.
                if self._flights.get(key) is flight:
                    del self._flights[key]

    def _land(self, key: K, flight: _Flight[T], _task: asyncio.Future[T]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]

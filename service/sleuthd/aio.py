"""asyncio helpers that every layer uses (a leaf: imports only the standard library)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def gather_or_cancel(work: Iterable[Awaitable[T]]) -> list[T]:
    """Run ``work`` concurrently, results in order. The first failure (or the caller's cancellation)
    cancels the rest, which are awaited, so none keeps decoding or holding batcher rows for a request
    that has already failed, and none is left with an exception nobody retrieved."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

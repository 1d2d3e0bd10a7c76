"""Micro-batching of judge prompts from concurrent callers into few model calls.

The contract (the encoder batcher's, adapted to prompts, which cannot be split across calls):

- each prompt waits on its own future; results go back by position and are counted;
- a batch is cut, oldest prompts first, when the head of the queue fills a model call — ``max_batch_prompts``
  prompts, or ``max_batch_tokens`` padded tokens (prompts × the longest prompt; a prompt larger than the
  budget runs alone) — or when the oldest prompt has waited ``max_wait_ms``;
- the queue is bounded in prompts and rejects at once with :class:`~sleuthd.errors.Overloaded`;
- a prompt whose caller was cancelled, or whose deadline passed, before its batch runs never reaches the
  model (:class:`~sleuthd.errors.DeadlineExceeded` for the latter);
- one model call at a time (one accelerator); while it runs, the next batch fills;
- a call that runs out of memory (:class:`~sleuthd.lalm.types.BatchTooLarge`) is split in halves and each
  half retried (cancelled and expired prompts dropped first); a single prompt that does not fit fails with
  :class:`~sleuthd.errors.LimitExceeded`; any other exception fails every prompt of that call and no other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

from sleuthd.config import JudgeConfig
from sleuthd.errors import DeadlineExceeded, EngineFailure, LimitExceeded, Overloaded
from sleuthd.lalm.types import BatchTooLarge
from sleuthd.ops.observe import JudgeObserver, NullObserver

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class PromptBatcherConfig:
    """How prompts are grouped into model calls: the batcher's view of :class:`~sleuthd.config.JudgeConfig`'s
    ``judge_max_*`` options, whose defaults (written once, there) and bounds it shares."""

    max_batch_tokens: int = JudgeConfig.judge_max_batch_tokens  # padded tokens per call: prompts × longest
    max_batch_prompts: int = JudgeConfig.judge_max_batch_prompts
    max_wait_ms: float = JudgeConfig.judge_max_wait_ms  # longest wait of the oldest queued prompt, ms
    max_queue_prompts: int = JudgeConfig.judge_max_queue_prompts  # more waiting are refused with Overloaded

    def __post_init__(self) -> None:
        # The same bounds, and the same error (ConfigError, a ValueError), as the options they come from.
        JudgeConfig(
            judge_max_batch_tokens=self.max_batch_tokens,
            judge_max_batch_prompts=self.max_batch_prompts,
            judge_max_wait_ms=self.max_wait_ms,
            judge_max_queue_prompts=self.max_queue_prompts,
        )

    @classmethod
    def from_config(cls, config: JudgeConfig) -> PromptBatcherConfig:
        return cls(
            max_batch_tokens=config.judge_max_batch_tokens,
            max_batch_prompts=config.judge_max_batch_prompts,
            max_wait_ms=config.judge_max_wait_ms,
            max_queue_prompts=config.judge_max_queue_prompts,
        )


@dataclass
class PromptBatcherStats:
    """Counts since the batcher was made; :meth:`PromptBatcher.stats` returns a copy."""

    calls: int = 0  # model calls made, including ones that raised
    prompts: int = 0  # prompts answered
    padded_tokens: int = 0  # tokens sent to the model, padding included
    splits: int = 0  # calls split in halves after running out of memory
    rejected: int = 0  # prompts refused because the queue was full
    cancelled: int = 0  # prompts whose caller cancelled before the answer
    expired: int = 0  # prompts that failed with DeadlineExceeded
    failed: int = 0  # prompts failed by a model error or shutdown
    largest_call: int = 0  # most prompts in one call


@dataclass(eq=False)
class _Item(Generic[T, R]):
    payload: T
    cost: int  # tokens
    future: asyncio.Future[R]
    enqueued_at: float
    deadline: float | None

    @property
    def live(self) -> bool:
        return not self.future.done()


class PromptBatcher(Generic[T, R]):
    """Batches ``run(list of T) -> list of R`` calls; ``cost(T)`` is a prompt's token count."""

    def __init__(
        self,
        run: Callable[[Sequence[T]], Sequence[R]],
        cost: Callable[[T], int],
        executor: Executor,
        config: PromptBatcherConfig | None = None,
        observer: JudgeObserver | None = None,
        name: str = "judge",
    ) -> None:
        self.config = config or PromptBatcherConfig()
        self.name = name
        self._run = run
        self._cost = cost
        self._executor = executor
        self._observer: JudgeObserver = observer or NullObserver()
        self._queue: deque[_Item[T, R]] = deque()
        self._stats = PromptBatcherStats()
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._closed = False
        self._broken: str | None = None

    def stats(self) -> PromptBatcherStats:
        return dataclasses.replace(self._stats)

    @property
    def queued(self) -> int:
        """Live prompts waiting for a model call."""
        return sum(1 for item in self._queue if item.live)

    async def submit(self, payload: T, deadline: float | None = None) -> R:
        """Queue one prompt and wait for its answer. ``deadline`` is on ``loop.time()``'s clock."""
        if self._broken is not None:
            raise EngineFailure(self._broken)
        if self._closed:
            raise EngineFailure("the judge is shutting down")
        loop = asyncio.get_running_loop()
        now = loop.time()
        if deadline is not None and deadline <= now:
            self._stats.expired += 1
            raise DeadlineExceeded("the request's deadline had passed before its judge prompt was queued")
        if self.queued >= self.config.max_queue_prompts:
            self._stats.rejected += 1
            self._observer.rejected()
            raise Overloaded(
                f"the {self.name} queue is full ({self.config.max_queue_prompts} prompts waiting); retry with backoff"
            )
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._loop(), name=f"batcher-{self.name}")
        assert self._wakeup is not None
        item: _Item[T, R] = _Item(payload, self._cost(payload), loop.create_future(), now, deadline)
        self._queue.append(item)
        self._observer.queue_depth(self.queued)
        self._wakeup.set()
        timer = loop.call_at(deadline, self._expire, item) if deadline is not None else None
        try:
            return await item.future
        except asyncio.CancelledError:
            # Awaiting the future and being cancelled cancels the future: the loop skips the item.
            self._stats.cancelled += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def close(self) -> None:
        """Fail queued prompts with EngineFailure("shutting down") and stop; a running call finishes and
        its prompts are answered."""
        self._closed = True
        for item in self._queue:
            if item.live:
                item.future.set_exception(EngineFailure("the judge is shutting down"))
                self._stats.failed += 1
        self._queue.clear()
        if self._task is not None:
            assert self._wakeup is not None
            self._wakeup.set()
            await asyncio.wait([self._task])

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        try:
            while not self._closed:
                batch = await self._next_batch()
                if batch:
                    await self._execute(batch)
        except Exception as exc:
            # A bug here would leave every waiting caller hanging: fail them and refuse new prompts.
            logger.exception("the %s batcher stopped", self.name)
            self._broken = f"the {self.name} batcher stopped: {exc}"
            for item in self._queue:
                if item.live:
                    item.future.set_exception(EngineFailure(self._broken))
            self._queue.clear()

    async def _next_batch(self) -> list[_Item[T, R]]:
        """Wait until a batch should be cut, then cut it; empty when the batcher is closing."""
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            while self._queue and not self._queue[0].live:
                self._queue.popleft()
            wait: float | None = None
            if self._queue:
                wait = self._queue[0].enqueued_at + self.config.max_wait_ms / 1000 - loop.time()
                batch, full = self._plan()
                if full or wait <= 0:
                    return self._take(batch)
            self._wakeup.clear()  # no await between looking and clearing: a wake-up cannot be lost
            try:
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
        return []

    def _plan(self) -> tuple[list[_Item[T, R]], bool]:
        """The head of the queue that fits one call, and whether it is full (a budget stopped it)."""
        now = asyncio.get_running_loop().time()
        batch: list[_Item[T, R]] = []
        width = 0
        for item in self._queue:
            if not item.live:
                continue
            if item.deadline is not None and item.deadline <= now:
                self._expire(item)  # its timer has not fired yet; do its job
                continue
            if len(batch) == self.config.max_batch_prompts:
                return batch, True
            if batch and (len(batch) + 1) * max(width, item.cost) > self.config.max_batch_tokens:
                return batch, True
            batch.append(item)
            width = max(width, item.cost)
        return batch, False

    def _take(self, batch: list[_Item[T, R]]) -> list[_Item[T, R]]:
        taken = set(map(id, batch))
        self._queue = deque(item for item in self._queue if id(item) not in taken and item.live)
        now = asyncio.get_running_loop().time()
        for item in batch:
            self._observer.queue_wait(now - item.enqueued_at)
        self._observer.queue_depth(self.queued)
        return batch

    async def _execute(self, batch: list[_Item[T, R]]) -> None:
        now = asyncio.get_running_loop().time()
        for item in batch:  # honour deadlines and cancellations once more, right before the call
            if item.live and item.deadline is not None and item.deadline <= now:
                self._expire(item)
        batch = [item for item in batch if item.live]
        if not batch:
            return
        width = max(item.cost for item in batch)
        started = time.perf_counter()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run, [item.payload for item in batch]
            )
        except BatchTooLarge as exc:
            self._record(batch, width, started)
            if len(batch) == 1:
                self._fail(
                    batch,
                    LimitExceeded(
                        f"one judge prompt of {width} tokens does not fit in the judge's memory ({exc}); "
                        "send shorter clips or fewer context turns"
                    ),
                )
                return
            self._stats.splits += 1
            self._observer.batch_split(len(batch))
            logger.warning(
                "%s: %s; retrying as two calls of %d and %d prompts",
                self.name,
                exc,
                len(batch) // 2,
                len(batch) - len(batch) // 2,
            )
            half = len(batch) // 2
            await self._execute(batch[:half])
            await self._execute(batch[half:])
            return
        except Exception as exc:
            self._record(batch, width, started)
            logger.error("%s: a model call of %d prompts failed: %s", self.name, len(batch), exc)
            self._fail(batch, exc)
            return
        self._record(batch, width, started)
        if len(results) != len(batch):
            self._fail(batch, EngineFailure(f"{self.name} returned {len(results)} answers for {len(batch)} prompts"))
            return
        for item, result in zip(batch, results, strict=True):
            if item.live:  # cancelled while the call ran: the answer is dropped
                item.future.set_result(result)
                self._stats.prompts += 1

    def _record(self, batch: list[_Item[T, R]], width: int, started: float) -> None:
        self._stats.calls += 1
        self._stats.padded_tokens += len(batch) * width
        self._stats.largest_call = max(self._stats.largest_call, len(batch))
        self._observer.batch_executed(len(batch), len(batch) * width, time.perf_counter() - started)

    def _fail(self, batch: list[_Item[T, R]], exc: BaseException) -> None:
        self._observer.batch_failed(len(batch))
        for item in batch:
            if item.live:
                item.future.set_exception(exc)
                self._stats.failed += 1

    def _expire(self, item: _Item[T, R]) -> None:
        if item.live:
            item.future.set_exception(DeadlineExceeded("the request's deadline passed while its judge prompt waited"))
            self._stats.expired += 1

"""Micro-batching of encoder calls across the concurrent requests of one process.

Every RPC asks for embeddings of its own small stack of windows. Run one by one, that is many small model
calls, each paying the fixed per-call cost. :class:`MicroBatcher` queues the requests and lets one
background task pack them, oldest first, into model calls of up to ``max_batch_windows`` windows.

The contract (Triton's and Ray Serve's dynamic batchers, vLLM's engine loop):

- each request waits on its own future; results go back by row offset and are counted, so a request
  split across several model calls is stitched back in order;
- a batch is cut when it is full, when the oldest queued request has waited ``max_wait_ms``, or at once
  while no model call is running (an idle model gains nothing from waiting; under load the model is
  busy, requests pile up meanwhile and batches come out as full as before);
- an exception from a model call fails every request in that batch and nothing else;
- the queue is bounded in windows and rejects at once with :class:`~sleuthd.errors.Overloaded`;
- a request cancelled, or past its deadline, before its windows are batched leaves the queue and its
  windows never reach the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from sleuthd.config import BatcherConfig
from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded
from sleuthd.ops.observe import BatchObserver, NullObserver

logger = logging.getLogger(__name__)


class EmbeddingModel(Protocol):
    """What the batcher wraps: a synchronous, thread-safe model call (an
    :class:`~sleuthd.encoders.runner.OnnxEncoder`)."""

    manifest: EncoderManifest
    provider: str

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(batch, window_samples) float32 -> (batch, embedding_size) float32."""
        ...


@dataclass
class BatcherStats:
    """Counts since the batcher was made; :meth:`MicroBatcher.stats` returns a copy."""

    batches: int = 0  # model calls made (including ones that raised)
    windows: int = 0  # windows sent to the model
    requests: int = 0  # requests answered with embeddings
    rejected: int = 0  # requests refused because the queue was full
    cancelled: int = 0  # requests whose caller cancelled before the answer
    expired: int = 0  # requests that failed with DeadlineExceeded
    failed: int = 0  # requests failed by a model error or by shutdown


@dataclass(eq=False)
class _Request:
    windows: np.ndarray  # (n, window_samples) float32
    future: asyncio.Future[np.ndarray]
    enqueued_at: float  # loop.time()
    deadline: float | None  # loop.time(); None = no deadline
    # Rows [0, taken) have been put in batches; the rest wait in the queue. Batches take rows in order.
    taken: int = 0
    delivered: int = 0  # rows whose embeddings came back; the request is answered when this reaches n
    result: np.ndarray | None = None  # (n, embedding_size), filled by row offset as batches return
    queued: bool = True  # still has rows counted in the queue

    @property
    def waiting(self) -> int:
        return len(self.windows) - self.taken


class _Slice(NamedTuple):
    """Rows [start, stop) of one request, as placed in a batch."""

    request: _Request
    start: int
    stop: int


class MicroBatcher:
    """A :class:`~sleuthd.encoders.runner.WindowEncoder` that merges concurrent requests into few model calls.

    One instance per encoder, shared by every RPC of the process and bound to the event loop that first
    uses it. Model calls run on ``executor`` so the event loop never blocks on them.
    """

    def __init__(
        self,
        model: EmbeddingModel,
        executor: Executor,
        config: BatcherConfig | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.manifest = model.manifest
        self.provider = model.provider
        self.config = config or BatcherConfig()
        self._embed = model.embed
        self._executor = executor
        self._observer: BatchObserver = observer or NullObserver()
        # Requests in arrival order. Withdrawn requests (cancelled, expired, failed) are marked
        # ``queued=False``, drop their windows and are left in place until they reach the head: removal stays O(1).
        self._queue: deque[_Request] = deque()
        self._queued_windows = 0  # rows of live requests not yet in a batch; what the bound applies to
        self._stats = BatcherStats()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._closed = False
        self._broken: str | None = None  # why the loop died, if it did
        # Made in start(), inside the running loop that will own them.
        self._wakeup: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ public

    @property
    def running(self) -> bool:
        """Whether the background batching task is alive."""
        return self._task is not None and not self._task.done()

    @property
    def queued_windows(self) -> int:
        """Windows waiting in the queue now (those already in a model call are not counted)."""
        return self._queued_windows

    def stats(self) -> BatcherStats:
        return dataclasses.replace(self._stats)

    def start(self) -> None:
        """Start the background task on the running loop; :meth:`encode` does this on first use."""
        if self._closed:
            raise EngineFailure("encoder batcher is shut down")
        if self._task is not None:
            return
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self.config.max_concurrent_batches)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.manifest.name}")

    async def close(self) -> None:
        """Stop batching: queued requests fail with EngineFailure("shutting down"); model calls already
        running are waited for and their requests answered."""
        self._closed = True
        self._fail_queued(EngineFailure("shutting down"))
        # A task already done (its event loop ended, as after asyncio.run) needs no waiting, and cannot be
        # awaited from another loop.
        if self._task is not None and not self._task.done():
            self._task.cancel()
            # asyncio.wait, not await: it neither re-raises the task's CancelledError nor swallows our own.
            await asyncio.wait([self._task])
        running = [t for t in self._inflight if not t.done()]
        if running:
            await asyncio.wait(running)

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """(n, window_samples) windows -> (n, embedding_size) float32 embeddings, row for row.

        ``deadline`` is on ``loop.time()``'s clock: once it passes, the call raises
        :class:`DeadlineExceeded` and rows not yet sent to the model never are. Raises
        :class:`~sleuthd.errors.Overloaded` at once when the queue is full, and whatever the model
        raised when a batch holding these windows failed.
        """
        windows = np.asarray(windows, dtype=np.float32)  # one odd dtype must not upcast a shared batch
        width = self.manifest.window.window_samples
        if windows.ndim != 2 or windows.shape[1] != width:
            # Checked here, not in the model call, so one malformed request cannot fail a shared batch.
            raise ValueError(f"expected (n, {width}) windows, got {windows.shape}")
        n = len(windows)
        if n == 0:
            return np.zeros((0, self.manifest.embedding_size), np.float32)
        if self._broken is not None:
            raise EngineFailure(self._broken)
        if self._closed:
            raise EngineFailure("shutting down")
        loop = asyncio.get_running_loop()
        now = loop.time()
        if deadline is not None and deadline <= now:
            self._stats.expired += 1
            raise DeadlineExceeded("the request's deadline had passed before its windows were queued")
        # A request larger than the whole queue is let into an empty queue: refusing it for ever and
        # telling the client to retry would be a lie (long dialogues legitimately have thousands of windows).
        if self._queued_windows + n > self.config.max_queue_windows and self._queued_windows > 0:
            self._stats.rejected += 1
            self._observer.rejected()
            raise Overloaded(
                f"encoder {self.manifest.name} queue is full ({self._queued_windows} windows waiting, "
                f"limit {self.config.max_queue_windows}); retry with backoff"
            )
        self.start()
        assert self._wakeup is not None
        req = _Request(windows, loop.create_future(), now, deadline)
        # Only the request holds the windows from here, so a withdrawn one lets go of them at once (this
        # frame can outlive the call, kept by the traceback of the cancellation).
        del windows
        if self._queued_windows == 0 or self._queued_windows + n >= self.config.max_batch_windows:
            # The loop's decision changes only when work appears or a full batch is ready; otherwise it
            # is already waiting for the oldest request's max_wait to run out.
            self._wakeup.set()
        self._queue.append(req)
        self._queued_windows += n
        self._observer.queue_depth(self._queued_windows)
        timer = loop.call_at(deadline, self._expire, req) if deadline is not None else None
        try:
            return await req.future
        except asyncio.CancelledError:
            self._stats.cancelled += 1
            raise
        finally:
            # Cancelled or failed: whatever is still queued leaves now, so it stops counting against the
            # bound at once and is never batched. (No-op when every row was already taken.)
            self._withdraw(req)
            if timer is not None:
                timer.cancel()

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        assert self._slots is not None
        try:
            while True:
                # Take a model slot before cutting: while every slot is busy, requests keep arriving and
                # the next batch comes out fuller.
                await self._slots.acquire()
                batch = await self._next_batch()
                task = asyncio.get_running_loop().create_task(self._execute(batch))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
                # A loop holding another slot may be waiting out max_wait: the model going idle ends that.
                task.add_done_callback(lambda _: self._wakeup.set() if self._wakeup is not None else None)
        except Exception as exc:
            # A bug here would otherwise leave every waiting RPC hanging: fail them and refuse new ones.
            logger.exception("encoder batcher for %s stopped", self.manifest.name)
            self._broken = f"encoder batcher stopped: {exc}"
            self._fail_queued(EngineFailure(self._broken))

    def _model_idle(self) -> bool:
        """No model call is running (a finished call's task is done before its slot is taken again)."""
        return all(t.done() for t in self._inflight)

    async def _next_batch(self) -> list[_Slice]:
        """Wait until a batch should be cut, then cut it: at once while no model call is running (waiting
        would leave the model idle for nothing: work that arrives meanwhile joins the next batch), else
        when full or when the oldest request has waited max_wait."""
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        max_wait = self.config.max_wait_ms / 1000.0
        while True:
            self._drop_withdrawn_head()
            wait_left: float | None = None
            if self._queue:
                wait_left = self._queue[0].enqueued_at + max_wait - loop.time()
                full = self._queued_windows >= self.config.max_batch_windows
                if full or wait_left <= 0 or self._model_idle():
                    batch = self._cut()
                    if batch:
                        return batch
                    continue  # everything at the head had expired; look again
            # No await between checking and clearing, so a wake-up cannot be lost.
            self._wakeup.clear()
            if wait_left is None:
                await self._wakeup.wait()
            else:
                try:
                    async with asyncio.timeout(wait_left):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass

    def _cut(self) -> list[_Slice]:
        """Take up to max_batch_windows rows from the head of the queue, in order."""
        now = asyncio.get_running_loop().time()
        room = self.config.max_batch_windows
        batch: list[_Slice] = []
        while room and self._queue:
            req = self._queue[0]
            if not req.queued or req.future.done():
                # Cancelled (its task may not have run its cleanup yet), expired or failed: never batch it.
                self._withdraw(req)
                self._queue.popleft()
                continue
            if req.deadline is not None and req.deadline <= now:
                self._expire(req)  # its timer has not fired yet; do its job
                continue
            if req.taken == 0:
                self._observer.queue_wait(now - req.enqueued_at)
            take = min(room, req.waiting)
            batch.append(_Slice(req, req.taken, req.taken + take))
            req.taken += take
            self._queued_windows -= take
            room -= take
            if req.waiting == 0:
                req.queued = False
                self._queue.popleft()
        self._observer.queue_depth(self._queued_windows)
        return batch

    async def _execute(self, batch: list[_Slice]) -> None:
        assert self._slots is not None
        try:
            rows = sum(s.stop - s.start for s in batch)
            parts = [s.request.windows[s.start : s.stop] for s in batch]
            windows = parts[0] if len(parts) == 1 else np.concatenate(parts)
            started = time.perf_counter()
            try:
                out = await asyncio.get_running_loop().run_in_executor(self._executor, self._embed, windows)
            except Exception as exc:
                self._record_call(rows, len(batch), time.perf_counter() - started)
                self._fail_batch(batch, exc)
                return
            self._record_call(rows, len(batch), time.perf_counter() - started)
            expected = (rows, self.manifest.embedding_size)
            shape = getattr(out, "shape", None)
            if shape != expected:
                self._fail_batch(
                    batch,
                    EngineFailure(
                        f"encoder {self.manifest.name} returned an array of shape {shape} "
                        f"for {rows} windows; expected {expected}"
                    ),
                )
                return
            offset = 0
            for s in batch:
                n = s.stop - s.start
                self._deliver(s, out[offset : offset + n])
                offset += n
        finally:
            self._slots.release()

    # ------------------------------------------------------------------ bookkeeping

    def _record_call(self, rows: int, requests: int, seconds: float) -> None:
        self._stats.batches += 1
        self._stats.windows += rows
        self._observer.batch_executed(rows, requests, seconds)

    def _deliver(self, s: _Slice, embeddings: np.ndarray) -> None:
        req = s.request
        if req.future.done():
            return  # cancelled, expired or failed while this batch ran: the result is discarded
        if req.result is None:
            req.result = np.empty((len(req.windows), embeddings.shape[1]), np.float32)
        req.result[s.start : s.stop] = embeddings
        req.delivered += s.stop - s.start
        if req.delivered == len(req.windows):
            req.future.set_result(req.result)
            self._stats.requests += 1

    def _fail_batch(self, batch: list[_Slice], exc: BaseException) -> None:
        logger.error("encoder %s failed a batch of %d requests: %s", self.manifest.name, len(batch), exc)
        self._observer.batch_failed(sum(s.stop - s.start for s in batch), len(batch))
        for s in batch:
            if not s.request.future.done():
                # A request split across batches fails as a whole; its rows still queued are dropped.
                self._withdraw(s.request)
                s.request.future.set_exception(exc)
                self._stats.failed += 1

    def _fail_queued(self, exc: BaseException) -> None:
        for req in self._queue:
            if req.queued and not req.future.done():
                self._withdraw(req)
                req.future.set_exception(exc)
                self._stats.failed += 1
        self._queue.clear()
        self._queued_windows = 0
        self._observer.queue_depth(0)

    def _expire(self, req: _Request) -> None:
        if req.future.done():
            return
        self._withdraw(req)
        req.future.set_exception(DeadlineExceeded("the request's deadline passed while waiting for the encoder"))
        self._stats.expired += 1

    def _withdraw(self, req: _Request) -> None:
        """Stop counting ``req``'s untaken rows and let go of its windows at once; the loop skips the
        (now small) entry when it reaches the head. A request none of whose rows were batched gives up
        its array here: left in place, the windows of cancelled requests piled up behind the head
        (gigabytes under overload) while the counted queue stayed under its bound. Rows already in a
        batch are kept: that batch reads them."""
        if req.queued:
            req.queued = False
            self._queued_windows -= req.waiting
            self._observer.queue_depth(self._queued_windows)
            if req.taken == 0:
                req.windows = np.empty((0, req.windows.shape[1]), np.float32)

    def _drop_withdrawn_head(self) -> None:
        while self._queue and (not self._queue[0].queued or self._queue[0].future.done()):
            self._withdraw(self._queue.popleft())

"""Tests for sleuthd.encoders.batcher with a fake model that records every call it gets.

Every window row is filled with one id number, so a batch's recorded rows say exactly which requests
were in it, and the fake's answer (the first D columns, doubled) says whether each row came back to
the request it belongs to, in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from sleuthd.encoders.batcher import BatcherConfig, MicroBatcher
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded

W = 8  # window_samples of the fake model
D = 4  # embedding_size of the fake model
HANG = 5.0  # generous bound on any wait, only there so a broken batcher fails instead of hanging


class FakeModel:
    """Synchronous stand-in for OnnxEncoder: records each batch, optionally blocks on a gate or fails."""

    def __init__(self, gate: threading.Event | None = None, poison: float | None = None, short: bool = False):
        self.manifest = SimpleNamespace(name="fake", embedding_size=D, window=SimpleNamespace(window_samples=W))
        self.provider = "fake"
        self.batches: list[np.ndarray] = []
        self.entered = threading.Event()  # set once a call has started
        self._lock = threading.Lock()
        self._gate = gate
        self._poison = poison
        self._short = short

    def embed(self, windows: np.ndarray) -> np.ndarray:
        with self._lock:
            self.batches.append(windows.copy())
        self.entered.set()
        if self._gate is not None:
            self._gate.wait(HANG)
        ids = windows[:, 0]
        if self._poison is not None and self._poison in ids:
            raise RuntimeError("poisoned row")
        out = windows[:, :D] * 2
        return out[:-1] if self._short else out

    def batch_ids(self) -> list[list[float]]:
        return [b[:, 0].tolist() for b in self.batches]

    def all_ids(self) -> set[float]:
        return {i for b in self.batch_ids() for i in b}


def rows(*ids: float) -> np.ndarray:
    """One window per id, every sample equal to the id."""
    return np.repeat(np.asarray(ids, np.float32)[:, None], W, axis=1)


def expected(windows: np.ndarray) -> np.ndarray:
    return windows[:, :D] * 2


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., MicroBatcher]]:
    """Builds batchers over a shared thread pool and closes them after the test."""
    executor = ThreadPoolExecutor(max_workers=4)
    made: list[MicroBatcher] = []

    def factory(model: FakeModel, **config: float) -> MicroBatcher:
        b = MicroBatcher(model, executor, BatcherConfig(**config))  # type: ignore[arg-type]
        made.append(b)
        return b

    yield factory
    for b in made:
        await b.close()
    executor.shutdown(wait=True)


async def wait_entered(model: FakeModel) -> None:
    assert await asyncio.to_thread(model.entered.wait, HANG), "the model was never called"


async def settle() -> None:
    """Let freshly created tasks run up to their first real wait (enqueue)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_each_request_gets_its_own_rows_in_order(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    b = make(model, max_batch_windows=16, max_wait_ms=5)
    rng = np.random.default_rng(7)
    requests = [rows(*(r * 100 + i for i in range(int(rng.integers(1, 8))))) for r in range(20)]
    results = await asyncio.wait_for(asyncio.gather(*(b.encode(x) for x in requests)), HANG)
    for x, y in zip(requests, results, strict=True):
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, expected(x))
    # Every row went to the model exactly once.
    sent = sorted(i for batch in model.batch_ids() for i in batch)
    assert sent == sorted(float(i) for x in requests for i in x[:, 0])


async def test_concurrent_requests_share_model_calls(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    b = make(model, max_batch_windows=16, max_wait_ms=20)
    requests = [rows(r) for r in range(32)]
    results = await asyncio.wait_for(asyncio.gather(*(b.encode(x) for x in requests)), HANG)
    for x, y in zip(requests, results, strict=True):
        np.testing.assert_array_equal(y, expected(x))
    assert len(model.batches) < 32
    assert len(model.batches) <= 4
    assert all(len(batch) <= 16 for batch in model.batches)
    stats = b.stats()
    assert (stats.batches, stats.windows, stats.requests) == (len(model.batches), 32, 32)


async def test_large_request_is_split_and_stitched(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    b = make(model, max_batch_windows=64, max_wait_ms=5)
    big = rows(*range(150))
    small = rows(*range(1000, 1005))
    got_big, got_small = await asyncio.wait_for(asyncio.gather(b.encode(big), b.encode(small)), HANG)
    np.testing.assert_array_equal(got_big, expected(big))
    np.testing.assert_array_equal(got_small, expected(small))
    # FIFO packing: the big request fills two calls, its last 22 rows share the third with the small one.
    assert [len(batch) for batch in model.batches] == [64, 64, 27]


async def test_model_error_fails_only_its_batch(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel(poison=20.0)
    b = make(model, max_batch_windows=4, max_wait_ms=5)
    # All six are queued in one loop turn, so batches are exactly [A B] [C D] [E F] (two rows each).
    ids = {name: (k * 10.0, k * 10.0 + 1) for k, name in enumerate("ABCDEF")}
    results = await asyncio.wait_for(
        asyncio.gather(*(b.encode(rows(*v)) for v in ids.values()), return_exceptions=True), HANG
    )
    outcome = dict(zip(ids, results, strict=True))
    assert model.batch_ids() == [[0, 1, 10, 11], [20, 21, 30, 31], [40, 41, 50, 51]]
    for name in "CD":
        assert isinstance(outcome[name], RuntimeError) and str(outcome[name]) == "poisoned row"
    for name in "ABEF":
        np.testing.assert_array_equal(outcome[name], expected(rows(*ids[name])))
    assert b.stats().failed == 2


async def test_wrong_row_count_fails_the_batch_with_engine_failure(make: Callable[..., MicroBatcher]) -> None:
    b = make(FakeModel(short=True), max_batch_windows=8, max_wait_ms=5)
    results = await asyncio.wait_for(
        asyncio.gather(b.encode(rows(1, 2)), b.encode(rows(3)), return_exceptions=True), HANG
    )
    for r in results:
        assert isinstance(r, EngineFailure)
        assert "(2, 4)" in str(r) and "3 windows" in str(r) and "(3, 4)" in str(r)


async def test_cancelled_before_batching_never_reaches_model(make: Callable[..., MicroBatcher]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=4, max_wait_ms=1)
    try:
        first = asyncio.create_task(b.encode(rows(1, 2, 3, 4)))
        await wait_entered(model)  # the first batch is now in flight, holding the only model slot
        keep1 = asyncio.create_task(b.encode(rows(10, 11)))
        victim = asyncio.create_task(b.encode(rows(20, 21)))
        keep2 = asyncio.create_task(b.encode(rows(30, 31)))
        await settle()
        assert b.queued_windows == 6
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        assert b.queued_windows == 4  # its windows stopped counting against the bound at once
    finally:
        gate.set()
    done = await asyncio.wait_for(asyncio.gather(first, keep1, keep2), HANG)
    np.testing.assert_array_equal(done[1], expected(rows(10, 11)))
    np.testing.assert_array_equal(done[2], expected(rows(30, 31)))
    assert model.batch_ids() == [[1, 2, 3, 4], [10, 11, 30, 31]]
    assert {20.0, 21.0}.isdisjoint(model.all_ids())
    assert b.stats().cancelled == 1


async def test_cancelled_while_batch_runs_discards_only_that_result(make: Callable[..., MicroBatcher]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=8, max_wait_ms=1)
    try:
        victim = asyncio.create_task(b.encode(rows(1, 2)))
        other = asyncio.create_task(b.encode(rows(3, 4)))
        await wait_entered(model)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
    finally:
        gate.set()
    np.testing.assert_array_equal(await asyncio.wait_for(other, HANG), expected(rows(3, 4)))
    assert model.batch_ids() == [[1, 2, 3, 4]]
    stats = b.stats()
    assert (stats.requests, stats.cancelled) == (1, 1)


async def test_full_queue_rejects_at_once_then_recovers(make: Callable[..., MicroBatcher]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=4, max_wait_ms=1, max_queue_windows=8)
    try:
        first = asyncio.create_task(b.encode(rows(1, 2, 3, 4)))
        await wait_entered(model)  # in flight: its windows have left the queue
        queued = [asyncio.create_task(b.encode(rows(10 + i, 20 + i, 30 + i, 40 + i))) for i in range(2)]
        await settle()
        assert b.queued_windows == 8
        # Raises without waiting for the blocked model; the wait_for only guards against a hang.
        with pytest.raises(Overloaded, match=r"queue is full.*retry with backoff"):
            await asyncio.wait_for(b.encode(rows(99)), HANG)
        assert b.stats().rejected == 1
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), HANG)
    np.testing.assert_array_equal(await asyncio.wait_for(b.encode(rows(77)), HANG), expected(rows(77)))
    assert 99.0 not in model.all_ids()


async def test_request_larger_than_queue_is_admitted_only_into_empty_queue(
    make: Callable[..., MicroBatcher],
) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=4, max_wait_ms=1, max_queue_windows=8)
    huge = rows(*range(100, 120))
    try:
        first = asyncio.create_task(b.encode(rows(1, 2, 3, 4)))
        await wait_entered(model)
        waiting = asyncio.create_task(b.encode(rows(5)))
        await settle()
        with pytest.raises(Overloaded):
            await asyncio.wait_for(b.encode(huge), HANG)
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, waiting), HANG)
    np.testing.assert_array_equal(await asyncio.wait_for(b.encode(huge), HANG), expected(huge))


async def test_deadline_passed_before_batching(make: Callable[..., MicroBatcher]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=4, max_wait_ms=1)
    loop = asyncio.get_running_loop()
    try:
        first = asyncio.create_task(b.encode(rows(1, 2, 3, 4)))
        await wait_entered(model)
        late = asyncio.create_task(b.encode(rows(50, 51), deadline=loop.time() + 0.05))
        patient = asyncio.create_task(b.encode(rows(60, 61)))
        # The model is still blocked: the deadline alone must end the wait.
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(late, HANG)
        assert b.queued_windows == 2
        with pytest.raises(TimeoutError):  # already past: refused without queueing
            await b.encode(rows(70), deadline=loop.time() - 1)
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, patient), HANG)
    assert {50.0, 51.0, 70.0}.isdisjoint(model.all_ids())
    assert b.stats().expired == 2


async def test_lone_request_is_served_after_max_wait(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    b = make(model, max_batch_windows=64, max_wait_ms=30)
    got = await asyncio.wait_for(b.encode(rows(5, 6)), HANG)
    np.testing.assert_array_equal(got, expected(rows(5, 6)))
    assert model.batch_ids() == [[5, 6]]


async def test_empty_and_malformed_input_never_touch_the_queue(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    b = make(model)
    out = await b.encode(np.zeros((0, W), np.float32))
    assert out.shape == (0, D) and out.dtype == np.float32
    with pytest.raises(ValueError, match=f"expected \\(n, {W}\\) windows"):
        await b.encode(np.zeros((2, W + 1), np.float32))
    assert not b.running and model.batches == []


async def test_close_fails_queued_requests_and_stops_the_loop(make: Callable[..., MicroBatcher]) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=4, max_wait_ms=1)
    try:
        first = asyncio.create_task(b.encode(rows(1, 2, 3, 4)))
        await wait_entered(model)
        queued = asyncio.create_task(b.encode(rows(10, 11)))
        await settle()
        assert b.running
        closing = asyncio.create_task(b.close())
        with pytest.raises(EngineFailure, match="shutting down"):
            await asyncio.wait_for(queued, HANG)
    finally:
        gate.set()
    await asyncio.wait_for(closing, HANG)
    # The batch already running was drained, not dropped.
    np.testing.assert_array_equal(await first, expected(rows(1, 2, 3, 4)))
    assert not b.running
    assert model.batch_ids() == [[1, 2, 3, 4]]
    with pytest.raises(EngineFailure, match="shutting down"):
        await b.encode(rows(5))


async def test_idle_model_runs_a_lone_request_without_waiting_max_wait(make: Callable[..., MicroBatcher]) -> None:
    model = FakeModel()
    # max_wait far beyond the test's bound: only the idle fast path can answer in time.
    b = make(model, max_batch_windows=64, max_wait_ms=600_000)
    got = await asyncio.wait_for(b.encode(rows(5, 6)), HANG)
    np.testing.assert_array_equal(got, expected(rows(5, 6)))
    got = await asyncio.wait_for(b.encode(rows(7)), HANG)
    np.testing.assert_array_equal(got, expected(rows(7)))
    assert model.batch_ids() == [[5, 6], [7]]


@pytest.mark.parametrize("slots", [1, 2])
async def test_work_queued_behind_a_busy_model_runs_together_when_it_frees(
    make: Callable[..., MicroBatcher], slots: int
) -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    b = make(model, max_batch_windows=64, max_wait_ms=600_000, max_concurrent_batches=slots)
    try:
        first = asyncio.create_task(b.encode(rows(1)))
        await wait_entered(model)  # busy: what arrives now waits for it, and is batched together
        later = [asyncio.create_task(b.encode(rows(10 + i))) for i in range(3)]
        await settle()
        assert b.queued_windows == 3
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), HANG)
    assert model.batch_ids() == [[1], [10, 11, 12]]

"""The judge's prompt batcher around the real tiny Qwen2-Audio model: batching, budgets, the bounded
queue, cancellation and deadlines before a call runs, and splitting a call that runs out of memory."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from sleuthd.errors import DeadlineExceeded, EngineFailure, LimitExceeded, Overloaded
from sleuthd.lalm import prompts
from sleuthd.lalm.batcher import PromptBatcher, PromptBatcherConfig
from sleuthd.lalm.local import Prepared
from sleuthd.lalm.types import AnswerScores, BatchTooLarge, Clip
from sleuthd.ops.observe import NullObserver

from tests.support import VOICE_A, VOICE_B, VOICE_F


@pytest.fixture(scope="module")
def model(models: dict[str, Any]) -> Any:
    return models["qwen2-audio"]


@pytest.fixture(scope="module")
def prepared(model: Any, voices: dict[str, list[np.ndarray]]) -> list[Prepared]:
    a, b, f = ([Clip.of(w) for w in voices[v]] for v in (VOICE_A, VOICE_B, VOICE_F))
    batch = [
        prompts.detection(a[1], a[0]),
        prompts.detection(b[1], a[0], [a[2]]),
        prompts.detection(f[0], a[0], [a[1], a[2]]),
        prompts.detection(a[3], a[0]),
        prompts.discrimination([a[1], b[0]], a[0]),
        prompts.detection(b[2], None, [a[1], a[3]]),
    ]
    return [model.prepare(p) for p in batch]


@pytest.fixture(scope="module")
def alone(model: Any, prepared: list[Prepared]) -> list[AnswerScores]:
    return [model.run([p])[0] for p in prepared]


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (prompts, padded tokens)
        self.splits = 0

    def batch_executed(self, prompts: int, padded_tokens: int, seconds: float) -> None:
        self.calls.append((prompts, padded_tokens))

    def batch_split(self, prompts: int) -> None:
        self.splits += 1


class Gate:
    """Wraps a runner so a test can hold the model thread inside a call and see what reached the model."""

    def __init__(self, run: Callable[[Sequence[Prepared]], list[AnswerScores]]) -> None:
        self.run = run
        self.seen: list[list[Prepared]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, batch: Sequence[Prepared]) -> list[AnswerScores]:
        self.seen.append(list(batch))
        self.entered.set()
        self.release.wait(timeout=60)
        return self.run(batch)

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.wait, 60)


def _batcher(run: Any, **config: Any) -> tuple[PromptBatcher[Prepared, AnswerScores], Recorder, ThreadPoolExecutor]:
    rec = Recorder()
    pool = ThreadPoolExecutor(1)
    return PromptBatcher(run, lambda p: p.tokens, pool, PromptBatcherConfig(**config), rec), rec, pool


def _same(results: Sequence[AnswerScores], expected: Sequence[AnswerScores]) -> None:
    for r, e in zip(results, expected, strict=True):
        np.testing.assert_allclose(r.log_probs, e.log_probs, atol=1e-5)


async def test_concurrent_prompts_share_one_call(model: Any, prepared: list[Prepared], alone: list[Any]) -> None:
    batcher, rec, pool = _batcher(model.run, max_wait_ms=0)
    results = await asyncio.gather(*(batcher.submit(p) for p in prepared))
    _same(results, alone)
    assert rec.calls == [(len(prepared), len(prepared) * max(p.tokens for p in prepared))]
    await batcher.close()
    pool.shutdown()


async def test_calls_respect_the_token_and_prompt_budgets(
    model: Any, prepared: list[Prepared], alone: list[Any]
) -> None:
    budget = 2 * max(p.tokens for p in prepared)
    batcher, rec, pool = _batcher(model.run, max_wait_ms=0, max_batch_tokens=budget, max_batch_prompts=3)
    _same(await asyncio.gather(*(batcher.submit(p) for p in prepared)), alone)
    assert len(rec.calls) >= math.ceil(len(prepared) / 3)
    assert all(n <= 3 and (tokens <= budget or n == 1) for n, tokens in rec.calls)
    assert sum(n for n, _ in rec.calls) == len(prepared)
    # A prompt over the whole budget is not refused: it runs alone.
    tight, rec2, pool2 = _batcher(model.run, max_wait_ms=0, max_batch_tokens=10)
    _same(await asyncio.gather(*(tight.submit(p) for p in prepared[:2])), alone[:2])
    assert [n for n, _ in rec2.calls] == [1, 1]
    for b, p in ((batcher, pool), (tight, pool2)):
        await b.close()
        p.shutdown()


async def test_a_full_queue_refuses_at_once(model: Any, prepared: list[Prepared]) -> None:
    gate = Gate(model.run)
    batcher, _, pool = _batcher(gate, max_wait_ms=0, max_queue_prompts=2)
    running = asyncio.ensure_future(batcher.submit(prepared[0]))
    await gate.wait_entered()  # prompt 0 is inside the model call; the queue is empty
    queued = [asyncio.ensure_future(batcher.submit(p)) for p in prepared[1:3]]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="queue is full"):
        await batcher.submit(prepared[3])
    gate.release.set()
    await asyncio.gather(running, *queued)
    assert batcher.stats().rejected == 1 and batcher.stats().prompts == 3
    await batcher.close()
    pool.shutdown()


async def test_a_cancelled_prompt_never_reaches_the_model(model: Any, prepared: list[Prepared]) -> None:
    gate = Gate(model.run)
    batcher, _, pool = _batcher(gate, max_wait_ms=0)
    running = asyncio.ensure_future(batcher.submit(prepared[0]))
    await gate.wait_entered()
    doomed = asyncio.ensure_future(batcher.submit(prepared[1]))
    kept = asyncio.ensure_future(batcher.submit(prepared[2]))
    await asyncio.sleep(0)
    doomed.cancel()
    gate.release.set()
    await asyncio.gather(running, kept)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert [[p.input_ids for p in call] for call in gate.seen] == [[prepared[0].input_ids], [prepared[2].input_ids]]
    assert batcher.stats().cancelled == 1
    await batcher.close()
    pool.shutdown()


async def test_deadlines_are_honoured_before_the_call(model: Any, prepared: list[Prepared]) -> None:
    gate = Gate(model.run)
    batcher, _, pool = _batcher(gate, max_wait_ms=0)
    loop = asyncio.get_running_loop()
    with pytest.raises(DeadlineExceeded, match="had passed before"):
        await batcher.submit(prepared[0], deadline=loop.time() - 1)
    running = asyncio.ensure_future(batcher.submit(prepared[0]))
    await gate.wait_entered()
    with pytest.raises(DeadlineExceeded, match="passed while its judge prompt waited"):
        await batcher.submit(prepared[1], deadline=loop.time() + 0.05)
    gate.release.set()
    await running
    assert len(gate.seen) == 1  # the expired prompt never reached the model
    assert batcher.stats().expired == 2
    await batcher.close()
    pool.shutdown()


async def test_out_of_memory_splits_the_call_and_retries_halves(
    model: Any, prepared: list[Prepared], alone: list[Any]
) -> None:
    def small_memory(batch: Sequence[Prepared]) -> list[AnswerScores]:
        if len(batch) > 2:
            raise BatchTooLarge(f"out of memory for {len(batch)} prompts")
        return model.run(batch)

    batcher, rec, pool = _batcher(small_memory, max_wait_ms=0)
    _same(await asyncio.gather(*(batcher.submit(p) for p in prepared)), alone)
    # 6 fails → 3 fails → 1, 2 answered; the other 3 fails → 1, 2 answered.
    assert [n for n, _ in rec.calls] == [6, 3, 1, 2, 3, 1, 2]
    assert rec.splits == batcher.stats().splits == 3

    def no_memory(batch: Sequence[Prepared]) -> list[AnswerScores]:
        raise BatchTooLarge("out of memory")

    hopeless, _, pool2 = _batcher(no_memory, max_wait_ms=0)
    with pytest.raises(LimitExceeded, match=f"one judge prompt of {prepared[0].tokens} tokens does not fit"):
        await hopeless.submit(prepared[0])
    for b, p in ((batcher, pool), (hopeless, pool2)):
        await b.close()
        p.shutdown()


async def test_a_model_error_fails_its_call_and_nothing_else(
    model: Any, prepared: list[Prepared], alone: list[Any]
) -> None:
    poisoned = prepared[0]

    def run(batch: Sequence[Prepared]) -> list[AnswerScores]:
        if any(p is poisoned for p in batch):
            raise RuntimeError("kernel failure")
        return model.run(batch)

    batcher, _, pool = _batcher(run, max_wait_ms=0, max_batch_prompts=2)
    results = await asyncio.gather(*(batcher.submit(p) for p in prepared[:4]), return_exceptions=True)
    assert [type(r) for r in results[:2]] == [RuntimeError, RuntimeError]
    _same(results[2:], alone[2:4])  # type: ignore[arg-type]
    assert batcher.stats().failed == 2
    await batcher.close()
    pool.shutdown()


async def test_close_fails_queued_prompts(model: Any, prepared: list[Prepared]) -> None:
    gate = Gate(model.run)
    batcher, _, pool = _batcher(gate, max_wait_ms=0)
    running = asyncio.ensure_future(batcher.submit(prepared[0]))
    await gate.wait_entered()
    queued = asyncio.ensure_future(batcher.submit(prepared[1]))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0)
    gate.release.set()
    await closing
    with pytest.raises(EngineFailure, match="shutting down"):
        await queued
    assert (await running).answer_mass > 0  # the call already running finished and was answered
    with pytest.raises(EngineFailure, match="shutting down"):
        await batcher.submit(prepared[2])
    pool.shutdown()

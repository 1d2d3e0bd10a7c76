"""Single flight: concurrent requests for the same clip share one computation (sleuthd.encoders.single_flight),
first on plain coroutines, then in the real engine and server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from sleuthd.encoders.batcher import MicroBatcher
from sleuthd.encoders.single_flight import SingleFlight
from sleuthd.engine.facade import Engine
from sleuthd.rpc.convert import audio_from_pb
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, VOICE_B, VOICE_C, Speech
from .test_serving import fresh_pcm


class Work:
    """A computation that waits for ``release`` and records how it was started and how it ended."""

    def __init__(self, result: str = "done", error: Exception | None = None) -> None:
        self.release = asyncio.Event()
        self.starts = 0
        self.cancelled = False
        self.result, self.error = result, error

    async def __call__(self) -> str:
        self.starts += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        return self.result


async def test_concurrent_callers_share_one_computation() -> None:
    flights: SingleFlight[str, str] = SingleFlight()
    work = Work()
    callers = [asyncio.ensure_future(flights.run("k", work)) for _ in range(3)]
    await asyncio.sleep(0)
    assert len(flights) == 1
    work.release.set()
    results = await asyncio.gather(*callers)
    assert work.starts == 1
    assert [r for r, _ in results] == ["done"] * 3
    assert [joined for _, joined in results] == [False, True, True]
    assert len(flights) == 0  # landed: the next caller starts afresh
    again = Work("again")
    again.release.set()
    assert await flights.run("k", again) == ("again", False)


async def test_a_caller_that_leaves_does_not_take_the_result_from_the_others() -> None:
    flights: SingleFlight[str, str] = SingleFlight()
    work = Work()
    leaving = asyncio.ensure_future(flights.run("k", work))
    staying = asyncio.ensure_future(flights.run("k", work))
    impatient = asyncio.ensure_future(flights.run("k", work, timeout=0.01))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(TimeoutError):
        await impatient
    work.release.set()
    assert await staying == ("done", True)
    assert leaving.cancelled() and not work.cancelled and work.starts == 1


async def test_work_nobody_waits_for_is_cancelled() -> None:
    flights: SingleFlight[str, str] = SingleFlight()
    work = Work()
    callers = [asyncio.ensure_future(flights.run("k", work)) for _ in range(2)]
    await asyncio.sleep(0)
    for c in callers:
        c.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await asyncio.sleep(0)
    assert work.cancelled and len(flights) == 0


async def test_a_failure_reaches_every_caller_and_is_not_kept() -> None:
    flights: SingleFlight[str, str] = SingleFlight()
    work = Work(error=ValueError("not audio"))
    callers = [asyncio.ensure_future(flights.run("k", work)) for _ in range(2)]
    await asyncio.sleep(0)
    work.release.set()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert [str(o) for o in outcomes] == ["not audio", "not audio"] and work.starts == 1
    assert len(flights) == 0


# ---------------------------------------------------------------------------------------------- in the engine


async def test_identical_concurrent_requests_are_embedded_once(
    stub: pb_grpc.SleuthStub, engine: Engine, speech: Speech
) -> None:
    batcher = engine.encoders["ge2e"]
    assert isinstance(batcher, MicroBatcher)
    req = pb.CheckDialogueRequest(dialogue_id="same")
    for k, voice in enumerate((VOICE_A, VOICE_B, VOICE_C)):
        req.turns.add(turn_id=f"t{k}", speaker="S", audio=fresh_pcm(speech, voice, k, 4242))
    before = batcher.stats()
    verdicts = await asyncio.gather(*(stub.CheckDialogue(req, timeout=120) for _ in range(4)))
    assert batcher.stats().requests - before.requests == 3  # three clips, embedded once for four RPCs
    assert len({tuple(t.score for t in v.turns) for v in verdicts}) == 1


async def test_a_cancelled_request_leaves_the_shared_clip_to_the_other(engine: Engine, speech: Speech) -> None:
    encoder = engine.encoders["ge2e"]
    audio = audio_from_pb(fresh_pcm(speech, VOICE_A, 3, 777), "audio")
    leaving = asyncio.ensure_future(engine.embedder.embed_audio(encoder, [(audio, "leaving")]))
    staying = asyncio.ensure_future(engine.embedder.embed_audio(encoder, [(audio, "staying")]))
    await asyncio.sleep(0.01)
    leaving.cancel()
    (clip,) = await staying
    assert leaving.cancelled() and clip.usable
    assert len(engine.embedder._in_flight) == 0
    # What the survivor got is what the cache now holds for everyone.
    (again,) = await engine.embedder.embed_audio(encoder, [(audio, "later")])
    assert again is clip


async def test_a_deadline_still_ends_a_shared_request(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="late-shared")
    for k in range(5):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=fresh_pcm(speech, VOICE_B, k, 99))
    patient = asyncio.ensure_future(stub.CheckDialogue(req, timeout=120))
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.CheckDialogue(req, timeout=0.05)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len((await patient).turns) == 5


async def test_joining_a_flight_just_abandoned_starts_a_new_one() -> None:
    # The last waiter of a flight went away (its request failed on another clip), so the flight was
    # cancelled; a request for the same clip arriving before the cancellation landed used to join it
    # and receive a CancelledError that was not its own. The servicer read that as the client having
    # cancelled and never answered: the client waited for its deadline (found by tests/test_fuzz.py).
    flights: SingleFlight[str, str] = SingleFlight()
    first, second = Work("first"), Work("second")
    a = asyncio.ensure_future(flights.run("clip", first))
    await asyncio.sleep(0)  # a starts the flight
    a.cancel()
    await asyncio.sleep(0)  # a leaves: nobody waits, the flight is cancelled (not yet landed)
    b = asyncio.ensure_future(flights.run("clip", second))
    await asyncio.sleep(0)
    second.release.set()
    assert await asyncio.wait_for(b, 5) == ("second", False)
    assert first.cancelled and second.starts == 1
    assert a.cancelled()

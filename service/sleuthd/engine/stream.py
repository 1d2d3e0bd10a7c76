"""One streamed dialogue: turns arrive in chunks, each is judged as soon as it is complete.

A :class:`StreamSession` is the engine side of ``StreamDialogue`` (it never imports grpc). It buffers
the audio of open turns (bounded per stream), embeds a turn when its final chunk arrives, adds it to the
dialogue's state and reports the new turn's verdict plus a revision for every earlier turn whose status
changed. On close it gives the same verdict CheckDialogue gives for the whole dialogue.

Bounds (sleuthd.config.AdmissionConfig): every audio message costs its bytes plus a fixed overhead
against the stream's buffer bound and the process's audio budget (sleuthd.engine.admission: its client's
share, and the share all streams together may buffer), so empty or one-byte chunks are not free;
:func:`paced` ends a stream that goes quiet, stays open too long, or leaves a turn unfinished too long
(a turn trickled a chunk at a time must not hold its buffer for the stream's whole lifetime). Each
finished turn is one unit of work for the engine's admission (its cost from the turn's header).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sleuthd.config import AdmissionConfig
from sleuthd.domain import AudioInput, CheckOptions, DialogueResult, PcmSpec, Reference, TurnUpdate
from sleuthd.engine.admission import AudioBudget, current_client
from sleuthd.engine.facade import Engine
from sleuthd.errors import Duplicate, InvalidRequest, LimitExceeded, OutOfSequence, ShuttingDown, UnknownName
from sleuthd.judgment.dialogue import Dialogue, TurnAudio, check_id, require_references

T = TypeVar("T")


@dataclass
class _OpenTurn:
    turn_id: str
    speaker: str
    position: int  # order of turn_start in the stream
    pcm: PcmSpec | None
    started: float  # event-loop time of its turn_start
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes counted: the chunks' data plus the per-message overhead of each


class StreamSession:
    def __init__(self, engine: Engine, budget: AudioBudget | None = None) -> None:
        self.engine = engine
        self._budget = budget or AudioBudget(engine.config.admission.max_audio_in_flight_bytes)
        self._client = current_client.get()  # the client that opened the stream (set by the RPC gate)
        self._overhead = engine.config.admission.stream_message_overhead_bytes
        self.dialogue_id = ""
        self._state: Dialogue | None = None
        self._open: dict[str, _OpenTurn] = {}
        self._done: set[str] = set()
        self._started = 0
        self._last_index = -1
        self._buffered = 0
        self._kept = 0  # decoded audio the dialogue keeps (the LALM judge's), counted in the audio budget

    def release(self) -> None:
        """Free buffered audio; safe to call more than once (the servicer calls it in ``finally``)."""
        if self._state is not None:
            self._state.close()
        self._open.clear()
        self._budget.release(self._buffered, self._client, buffered=True)
        self._buffered = 0
        self._budget.release(self._kept, self._client)
        self._kept = 0

    def _count_kept(self) -> None:
        """Hold in the budget what the dialogue now keeps of decoded audio (Overloaded when there is no
        room: the stream ends, busy, and its kept audio is freed)."""
        assert self._state is not None
        grown = self._state.kept_audio_bytes - self._kept
        if grown > 0:
            self._budget.acquire(grown, "the decoded audio this stream's judge keeps to hear again", self._client)
            self._kept += grown

    def turn_deadline(self) -> tuple[float, str] | None:
        """When the oldest unfinished turn runs out of time (event-loop clock), and its id; None when no
        turn is open."""
        if not self._open:
            return None
        oldest = min(self._open.values(), key=lambda t: t.started)
        return oldest.started + self.engine.config.admission.stream_turn_seconds, oldest.turn_id

    def _require_open(self) -> Dialogue:
        if self._state is None:
            raise OutOfSequence("the first message of a stream must be `open`")
        return self._state

    async def open(
        self, dialogue_id: str, references: dict[str, Reference], options: CheckOptions, deadline: float | None = None
    ) -> None:
        if self._state is not None:
            raise OutOfSequence("the stream is already open; send `open` once, first")
        opts = self.engine.resolve(options)
        sent = sum(len(a.data) for a in references.values() if isinstance(a, AudioInput))  # voice ids: no audio
        with self._budget.hold(sent, "this stream's references", self._client):
            self._state = await self.engine.open_dialogue(dialogue_id, references, opts, deadline, stream=True)
        self.dialogue_id = dialogue_id
        self._count_kept()

    def start_turn(self, turn_id: str, speaker: str, index: int, pcm: PcmSpec | None) -> None:
        state = self._require_open()
        check_id(turn_id, "turn_start.turn_id")
        check_id(speaker, f"turn {turn_id!r} speaker")
        if turn_id in self._open or turn_id in self._done:
            raise Duplicate(f"turn_id {turn_id!r} was already started in this stream; turn ids must be unique")
        if index <= self._last_index:
            raise InvalidRequest(
                f"turn {turn_id!r} has index {index} but turn index {self._last_index} was already started: "
                "start turns in dialogue order (increasing index)"
            )
        if self._started >= self.engine.config.max_turns:
            raise LimitExceeded(f"this stream already has {self._started} turns, the limit; open a new stream")
        require_references(state.opts, [speaker], state.references.keys())
        self._last_index = index
        started = asyncio.get_running_loop().time()
        self._open[turn_id] = _OpenTurn(turn_id, speaker, self._started, pcm, started)
        self._started += 1

    def add_audio(self, turn_id: str, data: bytes) -> None:
        self._require_open()
        turn = self._open.get(turn_id)
        if turn is None:
            if turn_id in self._done:
                raise OutOfSequence(f"turn {turn_id!r} is already complete (its final chunk arrived); no more audio")
            raise UnknownName(f"audio for turn {turn_id!r}, which was never started: send turn_start first")
        limit = self.engine.config.max_stream_buffer_bytes
        cost = len(data) + self._overhead
        if self._buffered + cost > limit:
            raise LimitExceeded(
                f"this stream would buffer {self._buffered + cost} bytes of unfinished turns (each audio message "
                f"counts {self._overhead} bytes on top of its data); the limit is {limit}: finish turns "
                "(final=true) before sending more audio, in fewer, larger chunks"
            )
        self._budget.acquire(cost, "this audio chunk", self._client, buffered=True)
        if data:
            turn.chunks.append(data)
        turn.size += cost
        self._buffered += cost

    async def finish_turn(self, turn_id: str, deadline: float | None = None) -> list[TurnUpdate]:
        """Hear the completed turn and judge the dialogue so far; the turn's verdict and revisions."""
        state = self._require_open()
        turn = self._open.pop(turn_id)
        data = b"".join(turn.chunks)
        turn.chunks.clear()
        self._buffered -= turn.size
        self._budget.unbuffer(turn.size)
        try:  # the turn's bytes stay counted in the audio budget until the dialogue has heard it
            completed = TurnAudio(turn_id, turn.speaker, turn.position, AudioInput(data, turn.pcm))
            async with self.engine.admitted(
                [(completed.audio, f"turn {turn_id!r}")], state.opts, deadline, "StreamTurn"
            ):
                updates = await state.finish_turn(completed, deadline)
            self._count_kept()
            return updates
        finally:
            self._done.add(turn_id)
            self._budget.release(turn.size, self._client)

    async def close(self, deadline: float | None = None) -> DialogueResult:
        """The whole dialogue's verdict, as CheckDialogue would give it."""
        state = self._require_open()
        if self._open:
            still_open = ", ".join(repr(t) for t in sorted(self._open))
            raise OutOfSequence(f"stream closed with turns still open: {still_open}; send their final chunk first")
        if not len(state):
            raise InvalidRequest("the stream ended without any complete turn: nothing to judge")
        return await state.result(deadline)


async def paced(
    messages: AsyncIterator[T],
    bounds: AdmissionConfig,
    turn_deadline: Callable[[], tuple[float, str] | None] = lambda: None,
    stopping: asyncio.Event | None = None,
) -> AsyncIterator[T]:
    """``messages`` as they come, ending the stream with LimitExceeded when none arrives for
    ``bounds.stream_idle_seconds``, when it has been open ``bounds.stream_lifetime_seconds``, or when
    ``turn_deadline()`` (when the oldest unfinished turn runs out of time, and its id) passes; and with
    ShuttingDown once ``stopping`` is set (the server's grace period is ending). Messages are handed out one
    at a time, so by then every turn whose final chunk was handed out has had its verdicts sent."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + bounds.stream_lifetime_seconds
    source = aiter(messages)
    stop = None if stopping is None else asyncio.ensure_future(stopping.wait())
    try:
        while True:
            if stop is not None and stop.done():
                raise ShuttingDown(
                    "the server is shutting down: the verdicts of every turn finished so far were sent; reopen the "
                    "stream on another replica for the rest of the dialogue"
                )
            message = await _next(source, loop, ends, bounds, turn_deadline, stop)
            if message is _STOPPED:
                continue
            if message is _ENDED:
                return
            yield message  # type: ignore[misc]
    finally:
        if stop is not None:
            stop.cancel()


_STOPPED, _ENDED = object(), object()


async def _next(
    source: AsyncIterator[T],
    loop: asyncio.AbstractEventLoop,
    ends: float,
    bounds: AdmissionConfig,
    turn_deadline: Callable[[], tuple[float, str] | None],
    stop: asyncio.Future[Any] | None,
) -> T | object:
    """The next message; _ENDED when the client half-closed; _STOPPED when ``stop`` finished first; or
    LimitExceeded for a stream too quiet, too long, or with a turn open too long."""
    while True:
        now = loop.time()
        left = ends - now
        turn = turn_deadline()
        if turn is not None and turn[0] <= now:
            raise LimitExceeded(
                f"turn {turn[1]!r} has been open {bounds.stream_turn_seconds:g} s without its final chunk, the "
                "longest a turn may take: send each turn's audio as it is made and finish it (final=true)"
            )
        wait = min(bounds.stream_idle_seconds, left, bounds.stream_idle_seconds if turn is None else turn[0] - now)
        reading: asyncio.Future[T] | None = None
        try:
            async with asyncio.timeout(wait):
                if stop is None:
                    return await anext(source)
                reading = asyncio.ensure_future(anext(source))
                # However this ends (the call cancelled meanwhile included), its outcome is looked at: an
                # unread StopAsyncIteration would be logged as "Task exception was never retrieved".
                reading.add_done_callback(lambda t: None if t.cancelled() else t.exception())
                try:
                    await asyncio.wait((reading, stop), return_when=asyncio.FIRST_COMPLETED)
                except BaseException:  # the call was cancelled, or timed out (below)
                    reading.cancel()
                    raise
                if not reading.done():
                    reading.cancel()
                    return _STOPPED
                return reading.result()
        except StopAsyncIteration:
            return _ENDED
        except TimeoutError:
            if reading is not None:
                reading.cancel()
            if turn is not None and loop.time() >= turn[0]:
                continue  # reported above, with the turn's id
            if left <= bounds.stream_idle_seconds:
                raise LimitExceeded(
                    f"the stream has been open {bounds.stream_lifetime_seconds:g} s, the longest a stream may "
                    "last: close it (half-close) and open a new one for further turns"
                ) from None
            raise LimitExceeded(
                f"no message for {bounds.stream_idle_seconds:g} s, the longest a stream may stay quiet: send "
                "audio as it is made, or close the stream and open a new one when there is more"
            ) from None

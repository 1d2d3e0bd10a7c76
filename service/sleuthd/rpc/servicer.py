"""The gRPC servicer: proto in, engine call, proto out, errors to status codes. No scoring logic here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn, TypeVar

import grpc

from sleuthd import __version__
from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.manifest import PAPER_THRESHOLDS
from sleuthd.engine.admission import AudioBudget, HeapTrimmer, Slots
from sleuthd.engine.facade import Engine
from sleuthd.engine.stream import StreamSession, paced
from sleuthd.errors import (
    DeadlineExceeded,
    DependencyUnavailable,
    Duplicate,
    EngineFailure,
    InvalidRequest,
    LimitExceeded,
    OutOfSequence,
    Overloaded,
    UnknownName,
    Unsupported,
)
from sleuthd.ops.logs import clip
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc import convert, voice_convert
from sleuthd.rpc.limits import RequestLimits, oversize_advice
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Most specific first: Duplicate, OutOfSequence, ... are InvalidRequest subclasses.
_STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (UnknownName, grpc.StatusCode.NOT_FOUND),
    (Duplicate, grpc.StatusCode.ALREADY_EXISTS),
    (OutOfSequence, grpc.StatusCode.FAILED_PRECONDITION),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    # "Send less" is the client's to fix (INVALID_ARGUMENT); RESOURCE_EXHAUSTED means only "busy, retry later".
    (LimitExceeded, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    # The registry's database is unreachable or locked: retry later, but this server is healthy.
    (DependencyUnavailable, grpc.StatusCode.UNAVAILABLE),
)


class _Abort(Exception):
    """Carries the status an RPC ends with (the RPC gate, sleuthd.rpc.gate, counts and logs it)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SleuthServicer(pb_grpc.SleuthServicer):
    def __init__(
        self,
        engine: Engine,
        max_message_bytes: int,
        on_engine_failure: Callable[[], None],
        metrics: ServiceMetrics,
    ) -> None:
        self.engine = engine
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self._on_engine_failure = on_engine_failure
        # Admission (sleuthd.engine.admission, sleuthd.rpc.limits): shape checked before converting, audio
        # bytes and open streams bounded before any work; going over a bound is "busy" at once.
        bounds = engine.config.admission
        self.limits = RequestLimits.from_config(engine.config, max_message_bytes)
        self.audio_budget = AudioBudget(bounds.max_audio_in_flight_bytes, on_idle=HeapTrimmer())
        self.stream_slots = Slots(bounds.max_streams, "streams")

    # ------------------------------------------------------------------ error and metric plumbing

    def _status_for(self, exc: BaseException) -> _Abort:
        for kind, code in _STATUS_OF:
            if isinstance(exc, kind):
                # Messages may echo client strings (names, ids): bounded, so the status trailer stays
                # under gRPC's metadata limit and the client gets this code, not RESOURCE_EXHAUSTED.
                return _Abort(code, clip(str(exc)))
        if isinstance(exc, EngineFailure):
            logger.error("engine failure: %s", exc)
            self._on_engine_failure()
            return _Abort(grpc.StatusCode.UNAVAILABLE, "the scoring engine failed; retry on another replica")
        logger.error("unexpected error", exc_info=exc)
        return _Abort(grpc.StatusCode.INTERNAL, "internal error; the server log has the details")

    def status_of(self, exc: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status an RPC failing with ``exc`` ends with (sleuthd.rpc.guard refuses with it before parsing)."""
        abort = self._status_for(exc)
        return abort.code, abort.details

    def _check_size(self, request_bytes: int) -> None:
        if request_bytes > self.max_message_bytes:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, oversize_advice(request_bytes, self.max_message_bytes))

    @staticmethod
    def _deadline(context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else asyncio.get_running_loop().time() + remaining

    async def _finish(self, context: grpc.aio.ServicerContext, method: str, started: float, abort: _Abort) -> NoReturn:
        await context.abort(abort.code, abort.details)
        raise AssertionError("unreachable: context.abort raises")

    async def _unary(
        self, context: grpc.aio.ServicerContext, method: str, request_bytes: int, work: Callable[[], Awaitable[T]]
    ) -> T:
        started = time.perf_counter()
        try:
            self._check_size(request_bytes)
            # Before any conversion or decoding: "busy" at once when the audio in flight is at its bound or
            # would outlast this call's deadline.
            with self.audio_budget.hold(request_bytes, seconds_left=context.time_remaining()):
                result = await work()
        except _Abort as abort:
            await self._finish(context, method, started, abort)
        except Exception as exc:
            await self._finish(context, method, started, self._status_for(exc))
        return result

    # ------------------------------------------------------------------ unary RPCs

    async def CheckDialogue(
        self, request: pb.CheckDialogueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DialogueVerdict:
        async def work() -> pb.DialogueVerdict:
            self.limits.check_message(request)  # counts, before converting
            result = await self.engine.check_dialogue(convert.dialogue_from_pb(request), self._deadline(context))
            return convert.verdict_to_pb(result)

        return await self._unary(context, "CheckDialogue", request.ByteSize(), work)

    async def RankCandidates(
        self, request: pb.RankCandidatesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RankCandidatesResponse:
        async def work() -> pb.RankCandidatesResponse:
            self.limits.check_message(request)  # counts, before converting
            result = await self.engine.rank_candidates(convert.rank_from_pb(request), self._deadline(context))
            return convert.rank_to_pb(result)

        return await self._unary(context, "RankCandidates", request.ByteSize(), work)

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        async def work() -> pb.GetServerInfoResponse:
            encoders = [
                pb.EncoderInfo(
                    name=name,
                    embedding_size=enc.manifest.embedding_size,
                    min_speech_seconds=enc.manifest.min_speech_seconds,
                    default_thresholds=enc.manifest.default_thresholds,
                    default_method=enc.manifest.default_method,
                    execution_provider=enc.provider,
                    sha256=enc.manifest.sha256,
                    components=enc.component_names if isinstance(enc, FusedEncoder) else (),
                )
                for name, enc in sorted(self.engine.encoders.items())
            ]
            registry = self.engine.registry
            lalm = self.engine.lalm
            judge = lalm.judge
            return pb.GetServerInfoResponse(
                version=__version__,
                encoders=encoders,
                default_encoder=self.engine.models.default_encoder,
                max_message_bytes=self.max_message_bytes,
                paper_thresholds=PAPER_THRESHOLDS,
                registry=voice_convert.registry_info_to_pb(registry) if registry is not None else None,
                judge=None
                if judge is None
                else convert.judge_info_to_pb(
                    judge.info, judge.max_context_clips, lalm.config.judge_orderings, lalm.decision_threshold
                ),
            )

        return await self._unary(context, "GetServerInfo", 0, work)

    # ------------------------------------------------------------------ voice registry

    async def RegisterVoice(self, request: pb.RegisterVoiceRequest, context: grpc.aio.ServicerContext) -> pb.Voice:
        async def work() -> pb.Voice:
            voices = self.engine.voices
            registration = voice_convert.registration_from_pb(request)
            return voice_convert.voice_to_pb(await voices.register(registration, self._deadline(context)), voices)

        return await self._unary(context, "RegisterVoice", request.ByteSize(), work)

    async def GetVoice(self, request: pb.GetVoiceRequest, context: grpc.aio.ServicerContext) -> pb.Voice:
        async def work() -> pb.Voice:
            voices = self.engine.voices
            return voice_convert.voice_to_pb(await voices.get(request.voice_id), voices)

        return await self._unary(context, "GetVoice", request.ByteSize(), work)

    async def ListVoices(
        self, request: pb.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListVoicesResponse:
        async def work() -> pb.ListVoicesResponse:
            voices = self.engine.voices
            listing = await voices.list(request.page_size, request.page_token)
            return voice_convert.listing_to_pb(listing, voices)

        return await self._unary(context, "ListVoices", request.ByteSize(), work)

    async def DeleteVoice(
        self, request: pb.DeleteVoiceRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteVoiceResponse:
        async def work() -> pb.DeleteVoiceResponse:
            await self.engine.voices.delete(request.voice_id)
            return pb.DeleteVoiceResponse()

        return await self._unary(context, "DeleteVoice", request.ByteSize(), work)

    # ------------------------------------------------------------------ streaming

    async def StreamDialogue(
        self, request_iterator: AsyncIterator[pb.StreamDialogueRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamDialogueResponse]:
        started = time.perf_counter()
        session = StreamSession(self.engine, self.audio_budget)
        self.metrics.streams_active.inc()
        try:
            with self.stream_slots.take():
                async for message in paced(request_iterator, self.engine.config.admission):
                    self._check_size(message.ByteSize())
                    self.limits.check_message(message)
                    for response in await self._stream_step(session, message, context):
                        yield response
                # Its turns' verdicts were counted as each turn completed.
                final = await session.close(self._deadline(context))
            yield pb.StreamDialogueResponse(final=convert.verdict_to_pb(final))
        except _Abort as abort:
            await self._finish(context, "StreamDialogue", started, abort)
        except asyncio.CancelledError:
            # The client went away (or cancelled): nothing to answer; the buffers are freed below.
            logger.info("stream %r cancelled by the client", session.dialogue_id)
            raise
        except Exception as exc:
            await self._finish(context, "StreamDialogue", started, self._status_for(exc))
        finally:
            session.release()
            self.metrics.streams_active.dec()

    async def _stream_step(
        self, session: StreamSession, message: pb.StreamDialogueRequest, context: grpc.aio.ServicerContext
    ) -> list[pb.StreamDialogueResponse]:
        kind = message.WhichOneof("message")
        if kind == "open":
            o = message.open
            await session.open(
                o.dialogue_id,
                convert.references_from_pb(o.references),
                convert.options_from_pb(o.options),
                self._deadline(context),
            )
            return []
        if kind == "turn_start":
            t = message.turn_start
            pcm = convert.pcm_spec_from_pb(t.pcm, "turn_start.pcm") if t.HasField("pcm") else None
            session.start_turn(t.turn_id, t.speaker, int(t.index), pcm)
            return []
        if kind == "audio":
            a = message.audio
            session.add_audio(a.turn_id, a.data)
            if not a.final:
                return []
            updates = await session.finish_turn(a.turn_id, self._deadline(context))
            return [pb.StreamDialogueResponse(turn=convert.turn_update_to_pb(u)) for u in updates]
        raise InvalidRequest("empty stream message: set open, turn_start or audio")

"""The gRPC servicer: proto in, engine call, proto out, errors to status codes. No scoring logic here.

It trusts the RPC gate (sleuthd.rpc.gate) for everything before the method: access, admission, message
size and field counts, holding a unary request's audio bytes and a stream's slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn, TypeVar

import grpc

from sleuthd import __version__
from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.manifest import PAPER_THRESHOLDS
from sleuthd.engine.admission import AudioBudget
from sleuthd.engine.facade import Engine
from sleuthd.engine.stream import StreamSession, paced
from sleuthd.errors import DependencyUnavailable, EngineFailure, InvalidRequest, Overloaded
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc import convert
from sleuthd.rpc.status import status_of
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SleuthServicer(pb_grpc.SleuthServicer):
    def __init__(
        self,
        engine: Engine,
        max_message_bytes: int,
        on_engine_failure: Callable[[], None],
        metrics: ServiceMetrics,
        budget: AudioBudget,
        stopping: asyncio.Event | None = None,
    ) -> None:
        """``budget``: the audio budget the gate holds unary requests in; a stream's chunks count in it too.
        ``stopping``: set near the end of the shutdown grace period; open streams then end once the turns
        they are finishing have their verdicts (UNAVAILABLE: reopen elsewhere)."""
        self.engine = engine
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self.audio_budget = budget
        self.stopping = stopping
        self._on_engine_failure = on_engine_failure

    # ------------------------------------------------------------------ errors to status codes

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
        if isinstance(exc, DependencyUnavailable):
            # The client is told UNAVAILABLE ("retry later"); whoever runs the server is told what failed and
            # why, here: the access line alone shows only the code.
            cause = exc.__cause__
            logger.warning(
                "a service the server relies on failed (the call gets UNAVAILABLE): %s", exc,
                extra={"fields": {"error": type(exc).__name__, "cause": repr(cause) if cause else ""}},
            )  # fmt: skip
        known = status_of(exc)
        if known is not None:
            await context.abort(*known)
        if isinstance(exc, EngineFailure):
            logger.error("engine failure: %s", exc)
            self._on_engine_failure()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the scoring engine failed; retry on another replica")
        logger.error("unexpected error", exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; the server log has the details")
        raise AssertionError("unreachable: context.abort raises")

    @staticmethod
    def _deadline(context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else asyncio.get_running_loop().time() + remaining

    async def _unary(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except Overloaded:
            raise  # "busy" is the gate's to answer, once the request's audio has left the budget (sleuthd.rpc.gate)
        except Exception as exc:
            await self._abort(context, exc)

    # ------------------------------------------------------------------ unary RPCs

    async def CheckDialogue(
        self, request: pb.CheckDialogueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DialogueVerdict:
        async def work() -> pb.DialogueVerdict:
            result = await self.engine.check_dialogue(convert.dialogue_from_pb(request), self._deadline(context))
            return convert.verdict_to_pb(result)

        return await self._unary(context, work)

    async def RankCandidates(
        self, request: pb.RankCandidatesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RankCandidatesResponse:
        async def work() -> pb.RankCandidatesResponse:
            result = await self.engine.rank_candidates(convert.rank_from_pb(request), self._deadline(context))
            return convert.rank_to_pb(result)

        return await self._unary(context, work)

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
                registry=convert.registry_info_to_pb(registry) if registry is not None else None,
                judge=None
                if judge is None
                else convert.judge_info_to_pb(
                    judge.info, judge.max_context_clips, lalm.config.judge_orderings, lalm.decision_threshold
                ),
            )

        return await self._unary(context, work)

    # ------------------------------------------------------------------ voice registry

    async def RegisterVoice(self, request: pb.RegisterVoiceRequest, context: grpc.aio.ServicerContext) -> pb.Voice:
        async def work() -> pb.Voice:
            voices = self.engine.voices
            registration = convert.registration_from_pb(request)
            return convert.voice_to_pb(await voices.register(registration, self._deadline(context)), voices)

        return await self._unary(context, work)

    async def GetVoice(self, request: pb.GetVoiceRequest, context: grpc.aio.ServicerContext) -> pb.Voice:
        async def work() -> pb.Voice:
            voices = self.engine.voices
            return convert.voice_to_pb(await voices.get(request.voice_id), voices)

        return await self._unary(context, work)

    async def ListVoices(
        self, request: pb.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListVoicesResponse:
        async def work() -> pb.ListVoicesResponse:
            voices = self.engine.voices
            listing = await voices.list(request.page_size, request.page_token)
            return convert.listing_to_pb(listing, voices)

        return await self._unary(context, work)

    async def DeleteVoice(
        self, request: pb.DeleteVoiceRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteVoiceResponse:
        async def work() -> pb.DeleteVoiceResponse:
            await self.engine.voices.delete(request.voice_id)
            return pb.DeleteVoiceResponse()

        return await self._unary(context, work)

    # ------------------------------------------------------------------ streaming

    async def StreamDialogue(
        self, request_iterator: AsyncIterator[pb.StreamDialogueRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamDialogueResponse]:
        session = StreamSession(self.engine, self.audio_budget)
        self.metrics.streams_active.inc()
        try:
            messages = paced(request_iterator, self.engine.config.admission, session.turn_deadline, self.stopping)
            async for message in messages:
                for response in await self._stream_step(session, message, context):
                    yield response
            # Its turns' verdicts were counted as each turn completed.
            final = await session.close(self._deadline(context))
            yield pb.StreamDialogueResponse(final=convert.verdict_to_pb(final))
        except asyncio.CancelledError:
            # The client went away (or cancelled): nothing to answer; the buffers are freed below.
            logger.info("stream %r cancelled by the client", session.dialogue_id)
            raise
        except Exception as exc:
            await self._abort(context, exc)
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

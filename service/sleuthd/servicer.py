"""The gRPC servicer: proto in, engine call, proto out, errors to status codes. No scoring logic here."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from sleuthd import __version__, convert
from sleuthd.engine import Engine
from sleuthd.errors import EngineFailure, InvalidRequest, Overloaded, UnknownName
from sleuthd.manifest import PAPER_THRESHOLDS
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SleuthServicer(pb_grpc.SleuthServicer):
    def __init__(self, engine: Engine, max_message_bytes: int, on_engine_failure: Callable[[], None]) -> None:
        self.engine = engine
        self.max_message_bytes = max_message_bytes
        self._on_engine_failure = on_engine_failure

    async def _serve(
        self, context: grpc.aio.ServicerContext, request_bytes: int, work: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``work`` and turn engine errors into status codes (abort raises, ending the RPC)."""
        if request_bytes > self.max_message_bytes:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request is {request_bytes} bytes; this server accepts at most {self.max_message_bytes} bytes "
                "per request: send compressed audio (FLAC/OGG), fewer turns per call, or shorter clips",
            )
        try:
            return await work()
        except UnknownName as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except EngineFailure as exc:
            logger.error("engine failure: %s", exc)
            self._on_engine_failure()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the scoring engine failed; retry on another replica")
        except Exception:
            logger.exception("unexpected error")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; the server log has the details")
        raise AssertionError("unreachable: context.abort raises")

    async def CheckDialogue(
        self, request: pb.CheckDialogueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DialogueVerdict:
        async def work() -> pb.DialogueVerdict:
            result = await self.engine.check_dialogue(convert.dialogue_from_pb(request))
            return convert.verdict_to_pb(result)

        return await self._serve(context, request.ByteSize(), work)

    async def RankCandidates(
        self, request: pb.RankCandidatesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RankCandidatesResponse:
        async def work() -> pb.RankCandidatesResponse:
            result = await self.engine.rank_candidates(convert.rank_from_pb(request))
            return convert.rank_to_pb(result)

        return await self._serve(context, request.ByteSize(), work)

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        encoders = []
        for name, enc in sorted(self.engine.encoders.items()):
            m = enc.manifest
            encoders.append(
                pb.EncoderInfo(
                    name=name,
                    embedding_size=m.embedding_size,
                    min_speech_seconds=m.min_speech_seconds,
                    default_thresholds=m.default_thresholds,
                    default_method=m.default_method,
                    execution_provider=enc.provider,
                    sha256=m.sha256,
                )
            )
        return pb.GetServerInfoResponse(
            version=__version__,
            encoders=encoders,
            default_encoder=self.engine.config.default_encoder,
            max_message_bytes=self.max_message_bytes,
            paper_thresholds=PAPER_THRESHOLDS,
        )

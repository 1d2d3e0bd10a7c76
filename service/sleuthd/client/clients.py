"""Synchronous and asyncio clients with typed results.

Both take the same arguments and return the same dataclasses; failures raise ``grpc.RpcError`` (the
asyncio client: ``grpc.aio.AioRpcError``) with the server's status code and a message that says what to
fix. Calls are retried on UNAVAILABLE only, by the channel's service config. ``timeout`` is each call's
deadline in seconds (the client's default, or per call).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from sleuthd.client import channels
from sleuthd.client.requests import (
    AudioLike,
    Turn,
    check_request,
    dialogue_request_from_file,
    make_options,
    rank_candidates_request,
    register_request,
    stream_open,
    stream_turn,
)
from sleuthd.client.results import Ranking, ServerInfo, TurnUpdate, Verdict, VoiceInfo, VoicePage
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

TurnLike = Turn | tuple[str, AudioLike]
# What a stream yields: each turn's update as it is judged (revisions of earlier turns included), then the
# whole dialogue's final Verdict, last.
StreamResult = TurnUpdate | Verdict


def _stream_result(response: pb.StreamDialogueResponse) -> StreamResult:
    if response.WhichOneof("message") == "final":
        return Verdict.from_pb(response.final)
    return TurnUpdate.from_pb(response.turn)


class _Base:
    def __init__(self, target: str, timeout: float | None) -> None:
        self.target = target
        self.timeout = timeout

    def _call(self, timeout: float | None) -> dict[str, Any]:
        return {"timeout": self.timeout if timeout is None else timeout}


class SleuthClient(_Base):
    """A blocking client::

        sleuth = SleuthClient("127.0.0.1:50051")
        verdict = sleuth.check([("Maya", "t1.wav"), ("Tom", "t2.wav"), ("Maya", "t3.wav")])
        print(verdict.consistent, verdict.inconsistent_turns)

    ``credentials``: TLS (``grpc.ssl_channel_credentials(...)`` or :func:`~sleuthd.client.tls_credentials` from
    PEM files); ``token``: sent as a bearer token on every call; ``server_name``: the name to expect in the
    server's certificate; ``target`` may list several replicas (see :class:`~sleuthd.client.Dialer`).
    """

    def __init__(
        self,
        target: str = channels.DEFAULT_TARGET,
        *,
        timeout: float | None = 120.0,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        server_name: str | None = None,
        max_message_bytes: int = channels.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(target, timeout)
        self.channel = channels.Dialer(target, credentials, token, server_name, max_message_bytes).sync()
        self.stub = pb_grpc.SleuthStub(self.channel)

    def check(
        self,
        turns: Iterable[TurnLike],
        *,
        references: Mapping[str, AudioLike] | None = None,
        voices: Mapping[str, str] | None = None,
        dialogue_id: str = "",
        method: str | None = None,
        thresholds: str | None = None,
        threshold: float | None = None,
        encoder: str = "",
        detect_drift: bool = False,
        sample_rate: int | None = None,
        timeout: float | None = None,
        similarity_matrix: bool = False,
    ) -> Verdict:
        """Check a dialogue: turns as ``(speaker, audio)`` or :class:`Turn`; ``references`` maps speakers to
        reference audio, ``voices`` to registered voice ids; ``sample_rate`` (Hz) for NumPy samples;
        ``similarity_matrix``: the verdict also carries the turn x turn cosines (``Verdict.similarity``)."""
        req = check_request(
            turns, references=references, voices=voices, dialogue_id=dialogue_id, method=method, thresholds=thresholds,
            threshold=threshold, encoder=encoder, detect_drift=detect_drift, sample_rate=sample_rate,
            similarity_matrix=similarity_matrix,
        )  # fmt: skip
        return Verdict.from_pb(self.stub.CheckDialogue(req, **self._call(timeout)))

    def check_file(self, path: str | os.PathLike[str], *, timeout: float | None = None) -> Verdict:
        """Check a dialogue JSON file (the format of ``sleuthd check``)."""
        return Verdict.from_pb(self.stub.CheckDialogue(dialogue_request_from_file(Path(path)), **self._call(timeout)))

    def rank(
        self,
        candidates: Mapping[str, AudioLike] | Sequence[AudioLike],
        *,
        context: Sequence[AudioLike] = (),
        reference: AudioLike = None,
        reference_voice: str = "",
        speaker: str = "speaker",
        method: str | None = None,
        encoder: str = "",
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> Ranking:
        """Order candidates for one slot of a speaker, best first."""
        req = rank_candidates_request(
            candidates, context=context, reference=reference, reference_voice=reference_voice, speaker=speaker,
            method=method, encoder=encoder, sample_rate=sample_rate,
        )  # fmt: skip
        return Ranking.from_pb(self.stub.RankCandidates(req, **self._call(timeout)))

    def stream(
        self,
        turns: Iterable[TurnLike],
        *,
        references: Mapping[str, AudioLike] | None = None,
        voices: Mapping[str, str] | None = None,
        dialogue_id: str = "",
        method: str | None = None,
        thresholds: str | None = None,
        threshold: float | None = None,
        encoder: str = "",
        detect_drift: bool = False,
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[StreamResult]:
        """Check a dialogue as it is made (StreamDialogue): ``turns`` may be a generator that yields each turn
        when it is synthesized; each turn is sent as it comes. Yields a :class:`TurnUpdate` for each turn as
        it is judged (and for each earlier turn a later one revises), then the final :class:`Verdict` (the
        one ``check`` gives for the whole dialogue). ``timeout``: the whole stream's deadline, seconds.
        Leaving the loop early cancels the stream."""
        options = make_options(method, thresholds, threshold, encoder, detect_drift)
        first = stream_open(references=references, voices=voices, dialogue_id=dialogue_id, options=options,
                            sample_rate=sample_rate)  # fmt: skip

        def requests() -> Iterator[pb.StreamDialogueRequest]:
            yield first
            for n, item in enumerate(turns):
                yield from stream_turn(item, n, sample_rate)

        call = self.stub.StreamDialogue(requests(), **self._call(timeout))
        try:
            for response in call:
                yield _stream_result(response)
        finally:
            call.cancel()  # a no-op once the stream has ended

    def server_info(self, *, timeout: float | None = None) -> ServerInfo:
        """The server's version, encoders, limits, voice registry and LALM judge."""
        return ServerInfo.from_pb(self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._call(timeout)))

    def register_voice(
        self,
        voice_id: str,
        clips: AudioLike | Sequence[AudioLike],
        *,
        metadata: Mapping[str, str] | None = None,
        replace: bool = False,
        keep_audio: bool | None = None,
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> VoiceInfo:
        """Enrol a voice from one clip or several; then name it in ``check(voices=...)``/``rank(reference_voice=)``."""
        req = register_request(
            voice_id, clips, metadata=metadata, replace=replace, keep_audio=keep_audio, sample_rate=sample_rate
        )
        return VoiceInfo.from_pb(self.stub.RegisterVoice(req, **self._call(timeout)))

    def get_voice(self, voice_id: str, *, timeout: float | None = None) -> VoiceInfo:
        return VoiceInfo.from_pb(self.stub.GetVoice(pb.GetVoiceRequest(voice_id=voice_id), **self._call(timeout)))

    def list_voices(self, *, page_size: int = 0, page_token: str = "", timeout: float | None = None) -> VoicePage:
        req = pb.ListVoicesRequest(page_size=page_size, page_token=page_token)
        return VoicePage.from_pb(self.stub.ListVoices(req, **self._call(timeout)))

    def voices(self, *, page_size: int = 0) -> Iterator[VoiceInfo]:
        """Every registered voice, page after page."""
        token = ""
        while True:
            page = self.list_voices(page_size=page_size, page_token=token)
            yield from page.voices
            token = page.next_page_token
            if not token:
                return

    def delete_voice(self, voice_id: str, *, timeout: float | None = None) -> None:
        self.stub.DeleteVoice(pb.DeleteVoiceRequest(voice_id=voice_id), **self._call(timeout))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SleuthClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSleuthClient(_Base):
    """The asyncio client: the same methods as :class:`SleuthClient`, awaited::

    async with AsyncSleuthClient("127.0.0.1:50051") as sleuth:
        verdict = await sleuth.check([("Maya", "t1.wav"), ("Maya", "t2.wav")], voices={"Maya": "maya-v2"})
    """

    def __init__(
        self,
        target: str = channels.DEFAULT_TARGET,
        *,
        timeout: float | None = 120.0,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        server_name: str | None = None,
        max_message_bytes: int = channels.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(target, timeout)
        self.channel = channels.Dialer(target, credentials, token, server_name, max_message_bytes).aio()
        self.stub = pb_grpc.SleuthStub(self.channel)

    async def check(
        self,
        turns: Iterable[TurnLike],
        *,
        references: Mapping[str, AudioLike] | None = None,
        voices: Mapping[str, str] | None = None,
        dialogue_id: str = "",
        method: str | None = None,
        thresholds: str | None = None,
        threshold: float | None = None,
        encoder: str = "",
        detect_drift: bool = False,
        sample_rate: int | None = None,
        timeout: float | None = None,
        similarity_matrix: bool = False,
    ) -> Verdict:
        req = check_request(
            turns, references=references, voices=voices, dialogue_id=dialogue_id, method=method, thresholds=thresholds,
            threshold=threshold, encoder=encoder, detect_drift=detect_drift, sample_rate=sample_rate,
            similarity_matrix=similarity_matrix,
        )  # fmt: skip
        return Verdict.from_pb(await self.stub.CheckDialogue(req, **self._call(timeout)))

    async def check_file(self, path: str | os.PathLike[str], *, timeout: float | None = None) -> Verdict:
        req = dialogue_request_from_file(Path(path))
        return Verdict.from_pb(await self.stub.CheckDialogue(req, **self._call(timeout)))

    async def rank(
        self,
        candidates: Mapping[str, AudioLike] | Sequence[AudioLike],
        *,
        context: Sequence[AudioLike] = (),
        reference: AudioLike = None,
        reference_voice: str = "",
        speaker: str = "speaker",
        method: str | None = None,
        encoder: str = "",
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> Ranking:
        req = rank_candidates_request(
            candidates, context=context, reference=reference, reference_voice=reference_voice, speaker=speaker,
            method=method, encoder=encoder, sample_rate=sample_rate,
        )  # fmt: skip
        return Ranking.from_pb(await self.stub.RankCandidates(req, **self._call(timeout)))

    async def stream(
        self,
        turns: Iterable[TurnLike] | AsyncIterable[TurnLike],
        *,
        references: Mapping[str, AudioLike] | None = None,
        voices: Mapping[str, str] | None = None,
        dialogue_id: str = "",
        method: str | None = None,
        thresholds: str | None = None,
        threshold: float | None = None,
        encoder: str = "",
        detect_drift: bool = False,
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[StreamResult]:
        """:meth:`SleuthClient.stream` for asyncio: ``turns`` may be an async iterable (each turn sent as it
        comes); ``async for`` over the updates, the final :class:`Verdict` last."""
        options = make_options(method, thresholds, threshold, encoder, detect_drift)
        first = stream_open(references=references, voices=voices, dialogue_id=dialogue_id, options=options,
                            sample_rate=sample_rate)  # fmt: skip

        async def requests() -> AsyncIterator[pb.StreamDialogueRequest]:
            yield first
            n = 0
            if isinstance(turns, AsyncIterable):
                async for item in turns:
                    for message in stream_turn(item, n, sample_rate):
                        yield message
                    n += 1
            else:
                for item in turns:
                    for message in stream_turn(item, n, sample_rate):
                        yield message
                    n += 1

        call = self.stub.StreamDialogue(requests(), **self._call(timeout))
        try:
            async for response in call:
                yield _stream_result(response)
        finally:
            call.cancel()  # a no-op once the stream has ended

    async def server_info(self, *, timeout: float | None = None) -> ServerInfo:
        return ServerInfo.from_pb(await self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._call(timeout)))

    async def register_voice(
        self,
        voice_id: str,
        clips: AudioLike | Sequence[AudioLike],
        *,
        metadata: Mapping[str, str] | None = None,
        replace: bool = False,
        keep_audio: bool | None = None,
        sample_rate: int | None = None,
        timeout: float | None = None,
    ) -> VoiceInfo:
        req = register_request(
            voice_id, clips, metadata=metadata, replace=replace, keep_audio=keep_audio, sample_rate=sample_rate
        )
        return VoiceInfo.from_pb(await self.stub.RegisterVoice(req, **self._call(timeout)))

    async def get_voice(self, voice_id: str, *, timeout: float | None = None) -> VoiceInfo:
        msg = await self.stub.GetVoice(pb.GetVoiceRequest(voice_id=voice_id), **self._call(timeout))
        return VoiceInfo.from_pb(msg)

    async def list_voices(self, *, page_size: int = 0, page_token: str = "", timeout: float | None = None) -> VoicePage:
        req = pb.ListVoicesRequest(page_size=page_size, page_token=page_token)
        return VoicePage.from_pb(await self.stub.ListVoices(req, **self._call(timeout)))

    async def voices(self, *, page_size: int = 0) -> AsyncIterator[VoiceInfo]:
        token = ""
        while True:
            page = await self.list_voices(page_size=page_size, page_token=token)
            for voice in page.voices:
                yield voice
            token = page.next_page_token
            if not token:
                return

    async def delete_voice(self, voice_id: str, *, timeout: float | None = None) -> None:
        await self.stub.DeleteVoice(pb.DeleteVoiceRequest(voice_id=voice_id), **self._call(timeout))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncSleuthClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

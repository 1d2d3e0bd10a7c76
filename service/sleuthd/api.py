"""The public in-process API: dialogues judged, candidates ranked and speaker embeddings computed through
exactly the service's own path, without a server.

Judging, with the client library's own result types, equal to a server's answers bit for bit::

    from sleuthd.api import Judge

    judge = Judge.load()                                 # models/ of the checkout (or $SLEUTHD_MODELS_DIR)
    verdict = judge.check([("Maya", "m1.wav"), ("Tom", "t1.wav"), ("Maya", "m2.wav")], references={"Maya": "ref.wav"})
    print(verdict.consistent, verdict.inconsistent_turns)
    judge.close()

A request is built by the client library's own functions (sleuthd.client.requests), read and answered by the
server's own conversions (sleuthd.rpc.convert) around the server's engine (sleuthd.engine.facade.Engine), and
the answer read back by the client's result types: the one path a server's request takes, minus the wire.

Embeddings, for scripts, the research tools and tests, in the spirit of SpeechBrain's ``inference/speaker.py``::

    from sleuthd.api import SpeakerEncoder

    encoder = SpeakerEncoder.load()                      # models/ of the checkout, GE2E, CPU
    clips = encoder.embed_files(["a.wav", "b.wav"])      # ClipEmbedding per file
    cosine = float(clips[0].embedding @ clips[1].embedding)
    encoder.close()

Audio goes through decode, resampling to 16 kHz, loudness normalisation, silence trimming (VAD), the
encoder's windows and the shared micro-batcher, so these embeddings are the ones the server judges with.
A clip with too little speech comes back unusable (``embedding`` None) with the reason in ``detail``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

# Channel, pitch and length matching's inputs as the server makes them (a clip's bandwidth, plateau fraction and median
# pitch; its copies at the common band or clipping or moved in pitch, and the clipping target; pitch matching's
# moves and guard; length matching's short turns, its clearing bound and, through SpeakerEncoder, its trimmed lengths
# and cuts), so the offline judges (sleuthd_bench.robustness) read exactly what the server reads.
from sleuthd.audio.clipping import copy_target
from sleuthd.audio.noise import copy_snr
from sleuthd.audio.windows import WindowSpec
from sleuthd.config import EngineConfig, RegistryConfig, default_models_dir
from sleuthd.domain import AudioInput, VoiceRef
from sleuthd.encoders.clips import (
    NARROWBAND,
    ChannelCopy,
    ClipEmbedding,
    channel_copy,
    clip_channel,
    clip_pitch,
    kept_samples,
    narrowband_copy,
    prepare_waveform,
    speech_cut,
)
from sleuthd.encoders.embedder import ClipEmbedder, embed_prepared
from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.engine.facade import Engine
from sleuthd.engine.loading import LoadedModels, load_models
from sleuthd.errors import Unsupported
from sleuthd.judgment.length_matching import CLEAR_BELOW, MAX_PIECES, short_turns
from sleuthd.judgment.pitch_matching import GUARD_COSINE, GUARD_ENCODER, guard_margin, pitch_moves
from sleuthd.ops.observe import NullObserver
from sleuthd.rpc import convert
from sleuthd.v1 import sleuthd_pb2 as pb

if TYPE_CHECKING:
    from sleuthd.client import Ranking, Turn, Verdict
    from sleuthd.client.requests import AudioLike

__all__ = [
    "CLEAR_BELOW",
    "GUARD_COSINE",
    "GUARD_ENCODER",
    "MAX_PIECES",
    "NARROWBAND",
    "ChannelCopy",
    "ClipEmbedding",
    "Judge",
    "SpeakerEncoder",
    "WindowSpec",
    "channel_copy",
    "clip_channel",
    "clip_pitch",
    "copy_snr",
    "copy_target",
    "guard_margin",
    "narrowband_copy",
    "pitch_moves",
    "short_turns",
]

T = TypeVar("T")


class _SyncLoop:
    """One private event loop for synchronous callers, for an object's lifetime: its micro-batchers belong to
    the loop that first uses them (use either the async or the sync methods of one object, not both)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)

    def close(self, last: Coroutine[Any, Any, None]) -> None:
        """Run ``last`` (the release of the models), then close the loop."""
        loop = self._loop or asyncio.new_event_loop()
        try:
            loop.run_until_complete(last)
        finally:
            loop.close()
            self._loop = None

    def release_if_used(self, release: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """For a Judge or SpeakerEncoder used from synchronous code and never closed, called when it is
        collected or the interpreter exits: release its models on this loop, so a script that forgets
        ``close()`` does not end with asyncio's "Task was destroyed but it is pending!" for every micro-batcher.
        One used only through its asyncio methods has no loop here; its batchers belong to the caller's loop,
        which ``aclose()`` must use."""
        if self._loop is not None:
            self.close(release())


class Judge:
    """Dialogues judged and candidates ranked in-process, through the server's exact path: the request the
    client library builds, the server's conversions and engine, the client library's result types. A verdict
    equals the one a server with the same models and options answers, bit for bit.

    ``check``/``rank`` block (on a private event loop); ``acheck``/``arank`` are their asyncio twins. Errors
    are the engine's own, each a ValueError or RuntimeError subclass of :mod:`sleuthd.errors` whose message
    says what to fix (InvalidRequest for bad audio or options, UnknownName, Unsupported, ...).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sync = _SyncLoop()
        self._release = weakref.finalize(self, self._sync.release_if_used, engine.aclose)

    @classmethod
    def load(
        cls,
        models_dir: Path | None = None,
        *,
        encoder: str = "auto",
        device: Literal["auto", "cpu", "cuda"] = "auto",
        vad: Literal["energy", "silero"] = "energy",
        registry: str = "",
    ) -> Judge:
        """Load every encoder under ``models_dir`` (default: $SLEUTHD_MODELS_DIR, else the checkout's models/),
        as `sleuthd serve` does with the same options: ``encoder`` is what a request that names none gets
        (``auto``: the GE2E + CAM++ fusion when both are there), ``registry`` a voice registry to name voices
        from (a SQLite file or postgresql:// URL; "" = none). Raises ManifestError when the folder has no
        models (the message names the command that builds them)."""
        return cls.from_config(
            EngineConfig(
                models_dir=models_dir or default_models_dir(),
                default_encoder=encoder,
                device=device,
                vad=vad,
                voice_registry=RegistryConfig(registry=registry),
            )
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> Judge:
        """The engine of ``config`` (every option of `sleuthd serve`'s engine), loaded and warmed up."""
        return cls(Engine.load(config))

    # ------------------------------------------------------------------ the wire types, as a server takes them

    async def check_request(self, request: pb.CheckDialogueRequest, timeout: float | None = None) -> pb.DialogueVerdict:
        """CheckDialogue in-process: ``request`` read as the server reads it, the verdict it would answer.
        ``timeout``: the deadline, seconds (None: none)."""
        dialogue = convert.dialogue_from_pb(request)
        self._require_registry(dialogue.references.values())
        return convert.verdict_to_pb(await self.engine.check_dialogue(dialogue, _deadline(timeout)))

    async def rank_request(
        self, request: pb.RankCandidatesRequest, timeout: float | None = None
    ) -> pb.RankCandidatesResponse:
        """RankCandidates in-process (see :meth:`check_request`)."""
        ranking = convert.rank_from_pb(request)
        self._require_registry([ranking.reference])
        return convert.rank_to_pb(await self.engine.rank_candidates(ranking, _deadline(timeout)))

    def _require_registry(self, references: Iterable[object]) -> None:
        # Said here, in the API's words: the engine's own message speaks of starting a server with --registry.
        if self.engine.registry is None and any(isinstance(r, VoiceRef) for r in references):
            raise Unsupported(
                "voice ids name voices in a voice registry, and this judge has none: give reference audio "
                "instead, or load the judge with a registry (Judge.load(registry=FILE))"
            )

    # ------------------------------------------------------------------ the client library's arguments and results

    async def acheck(
        self,
        turns: Iterable[Turn | tuple[str, AudioLike]],
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
        similarity_matrix: bool = False,
        timeout: float | None = None,
    ) -> Verdict:
        """Check a dialogue: the arguments and the result of :meth:`sleuthd.client.SleuthClient.check`."""
        # The client library loads grpc (its channels); imported here, so `import sleuthd.api` stays free of it.
        from sleuthd.client import Verdict, check_request

        req = check_request(
            turns, references=references, voices=voices, dialogue_id=dialogue_id, method=method, thresholds=thresholds,
            threshold=threshold, encoder=encoder, detect_drift=detect_drift, sample_rate=sample_rate,
            similarity_matrix=similarity_matrix,
        )  # fmt: skip
        return Verdict.from_pb(await self.check_request(req, timeout))

    def check(
        self,
        turns: Iterable[Turn | tuple[str, AudioLike]],
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
        similarity_matrix: bool = False,
        timeout: float | None = None,
    ) -> Verdict:
        """:meth:`acheck` from synchronous code."""
        return self._sync.run(
            self.acheck(
                turns, references=references, voices=voices, dialogue_id=dialogue_id, method=method,
                thresholds=thresholds, threshold=threshold, encoder=encoder, detect_drift=detect_drift,
                sample_rate=sample_rate, similarity_matrix=similarity_matrix, timeout=timeout,
            )
        )  # fmt: skip

    async def arank(
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
        """Order candidates for one slot of a speaker, best first: :meth:`sleuthd.client.SleuthClient.rank`."""
        from sleuthd.client import Ranking, rank_candidates_request

        req = rank_candidates_request(
            candidates, context=context, reference=reference, reference_voice=reference_voice, speaker=speaker,
            method=method, encoder=encoder, sample_rate=sample_rate,
        )  # fmt: skip
        return Ranking.from_pb(await self.rank_request(req, timeout))

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
        """:meth:`arank` from synchronous code."""
        return self._sync.run(
            self.arank(
                candidates, context=context, reference=reference, reference_voice=reference_voice, speaker=speaker,
                method=method, encoder=encoder, sample_rate=sample_rate, timeout=timeout,
            )
        )  # fmt: skip

    async def aclose(self) -> None:
        self._release.detach()
        await self.engine.aclose()

    async def __aenter__(self) -> Judge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Release the models from synchronous code (outside any running event loop)."""
        self._release.detach()
        self._sync.close(self.aclose())

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


class SpeakerEncoder:
    """One encoder of a models folder, with the VAD and the micro-batcher it is served with."""

    def __init__(self, models: LoadedModels, name: str, config: EngineConfig) -> None:
        if name not in models.encoders:
            raise ValueError(f"unknown encoder {name!r}; the models folder has: {', '.join(sorted(models.encoders))}")
        self._models = models
        self._encoder = models.encoders[name]
        self._embedder = ClipEmbedder(
            models.vad, models.prep_pool, NullObserver(), config.max_clip_seconds, config.embedding_cache_entries
        )
        self._sync = _SyncLoop()
        self._release = weakref.finalize(self, self._sync.release_if_used, models.aclose)

    @classmethod
    def load(
        cls,
        models_dir: Path | None = None,
        encoder: str = "ge2e",
        device: str = "cpu",
        vad: str = "energy",
        workers: int = 0,
    ) -> SpeakerEncoder:
        """Load ``encoder`` from ``models_dir`` (default: $SLEUTHD_MODELS_DIR, else the checkout's models/).
        The embedding cache is off: every call embeds from scratch."""
        config = EngineConfig(
            models_dir=models_dir or default_models_dir(),
            default_encoder=encoder,
            device=device,  # type: ignore[arg-type]
            vad=vad,  # type: ignore[arg-type]
            workers=workers,
            embedding_cache_entries=0,
        )
        return cls(load_models(config), encoder, config)

    @property
    def manifest(self) -> EncoderManifest:
        return self._encoder.manifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def window(self) -> WindowSpec:
        """The encoder's own window placement (a different rate gives denser or sparser windows)."""
        return self.manifest.window

    def windows_at(self, rate_per_second: float) -> WindowSpec:
        """The encoder's windows started ``rate_per_second`` times per second of speech."""
        return replace(self.manifest.window, rate_per_second=rate_per_second)

    async def embed(
        self, audios: Sequence[bytes | Path | AudioInput], labels: Sequence[str] | None = None
    ) -> list[ClipEmbedding]:
        """Encoded audio files (bytes, paths) or :class:`AudioInput`; results in input order. A clip
        that cannot be decoded raises AudioError naming its label (default: its path or position)."""
        inputs = []
        for n, a in enumerate(audios):
            label = labels[n] if labels is not None else (str(a) if isinstance(a, Path) else f"clip #{n}")
            if isinstance(a, Path):
                a = a.read_bytes()
            inputs.append((a if isinstance(a, AudioInput) else AudioInput(a), label))
        return await self._embedder.embed_audio(self._encoder, inputs)

    async def embed_waveform(self, samples: np.ndarray, window: WindowSpec | None = None) -> ClipEmbedding:
        """A 16 kHz mono float32 waveform already in memory, under ``window`` (default: the encoder's)."""
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(
            self._models.prep_pool, prepare_waveform, samples, self.manifest, self._models.vad, window
        )
        return await embed_prepared(self._encoder, prepared)

    def kept_samples(self, audio: AudioInput) -> int:
        """The clip's trimmed speech in samples at this encoder's loudness target, as length matching measures it."""
        return kept_samples(
            audio, self._embedder.max_clip_seconds, self.manifest.loudness_target_dbfs, self._models.vad
        )

    def speech_cut(self, audio: AudioInput, samples: int) -> AudioInput:
        """The clip's copy cut to the middle ``samples`` of its trimmed speech, as length matching makes it (the clip
        itself when its trimmed speech is no longer)."""
        vad = self._models.vad
        return speech_cut(audio, self._embedder.max_clip_seconds, samples, self.manifest.loudness_target_dbfs, vad)

    def embed_files(self, paths: Sequence[str | Path]) -> list[ClipEmbedding]:
        """:meth:`embed` for audio files, from synchronous code."""
        return self.embed_sync([Path(p) for p in paths])

    def embed_sync(self, audios: Sequence[bytes | Path | AudioInput]) -> list[ClipEmbedding]:
        """:meth:`embed` from synchronous code (encoded audio as bytes, files, or :class:`AudioInput`)."""
        return self._sync.run(self.embed(list(audios)))

    async def aclose(self) -> None:
        self._release.detach()
        await self._models.aclose()

    async def __aenter__(self) -> SpeakerEncoder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Release the models from synchronous code (outside any running event loop)."""
        self._release.detach()
        self._sync.close(self.aclose())

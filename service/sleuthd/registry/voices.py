"""The engine's side of the voice registry: enrol a voice with every loaded encoder, and turn a voice id
into the embedding a request is judged against. Never imports grpc.

A voice's embedding under an encoder is the L2-normalised mean of the windows of all its clips, made by
the same clip path as a reference sent with a request (decode, resample, loudness, VAD, windows,
micro-batcher), so a voice enrolled from one clip judges exactly as that clip sent as reference audio.
Embeddings are stored per encoder *weights* (the model file's SHA-256) and only ever used with the same
weights: a voice enrolled before an encoder was re-exported is re-embedded from its stored clips on first
use, or refused with the way to re-enrol it when its clips were not kept.

For channel matching (sleuthd.judgment.channel_matching) a voice also records each clip's channel (effective
bandwidth, plateau fraction, SNR, low band level) and, where the server band-matches, an embedding of its clips'
copies low-passed at the common band, stored under the encoder key with a "+band3600" suffix (the same weights;
made from the stored clips on first use when missing, as a re-embedding is). Its clipped, noisy or telephone-band
copies depend on the other clips of the dialogue it is a reference in (the target is the speaker's most clipped or
noisiest piece; the telephone band is used only beside a telephone clip), so they are made per request from the kept
clips and not stored; a voice registered without its audio cannot have them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sleuthd.config import RegistryConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import NARROWBAND, Channel, ChannelCopy, ClipEmbedding, pool
from sleuthd.encoders.embedder import ClipEmbedder
from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.encoders.single_flight import SingleFlight
from sleuthd.errors import (
    DeadlineExceeded,
    Duplicate,
    InvalidRequest,
    LimitExceeded,
    OutOfSequence,
    UnknownName,
    Unsupported,
)
from sleuthd.registry.model import (
    ClipInput,
    Embedding,
    Voice,
    VoicePage,
    base_encoder,
    check_metadata,
    check_voice_id,
    narrowband_key,
)
from sleuthd.registry.store import AsyncVoiceStore

logger = logging.getLogger(__name__)

# A voice replaced while it was being re-embedded is read again, at most this many times.
_REEMBED_ATTEMPTS = 3


@dataclass(frozen=True)
class Registration:
    """A RegisterVoice request in engine terms."""

    voice_id: str
    clips: tuple[AudioInput, ...]
    metadata: Mapping[str, str]
    replace: bool = False
    keep_audio: bool | None = None  # None: the registry's --registry-keep-audio


@dataclass(frozen=True)
class VoiceListing:
    page: VoicePage
    total: int  # voices registered, all pages together


class VoiceRegistry:
    """Registered voices for one engine: its encoders and clip embedder over one store."""

    def __init__(
        self,
        store: AsyncVoiceStore,
        encoders: Mapping[str, WindowEncoder],
        embedder: ClipEmbedder,
        default_encoder: str,
        narrowband: bool = False,
    ) -> None:
        """``encoders``: every loaded encoder; a voice is stored with an embedding per model (the fusion is
        joined from its components' when asked for). ``narrowband``: the server band-matches, so a registration
        also stores each model's embedding of the clips' narrowband copies."""
        self.store = store
        self.encoders = {n: e for n, e in encoders.items() if not isinstance(e, FusedEncoder)}
        self.embedder = embedder
        fused = encoders.get(default_encoder)
        # Clip lengths are recorded as the default encoder measured them (the fusion's first component).
        self.default_encoder = fused.component_names[0] if isinstance(fused, FusedEncoder) else default_encoder
        self.narrowband = narrowband
        # Concurrent first uses of one voice under new weights share one re-embedding: keyed by voice id, the
        # stored encoder key and the weights.
        self._reembedding: SingleFlight[tuple[str, str, str], np.ndarray] = SingleFlight()

    @property
    def config(self) -> RegistryConfig:
        return self.store.store.config

    @property
    def backend(self) -> str:
        return self.store.store.backend

    # ------------------------------------------------------------------ registration

    async def register(self, request: Registration, deadline: float | None = None) -> Voice:
        """Embed the clips with every loaded encoder, then store the voice with all its embeddings in one
        transaction, so a voice never lands without them."""
        check_voice_id(request.voice_id)
        check_metadata(request.metadata, self.config)
        self._check_sizes(request.clips)
        if not request.replace:
            # Fail fast before the encoders run; the store checks again inside its write transaction.
            try:
                await self.store.get(request.voice_id)
            except UnknownName:
                pass
            else:
                raise Duplicate(
                    f"voice {request.voice_id!r} is already registered; set replace to overwrite it or delete it first"
                )
        names = sorted(self.encoders)
        labelled = [(c, f"clip #{k}") for k, c in enumerate(request.clips)]
        found = await asyncio.gather(
            asyncio.gather(*(self._embed_clips(self.encoders[n], request.clips, deadline) for n in names)),
            asyncio.gather(
                *(self._embed_clips(self.encoders[n], request.clips, deadline, NARROWBAND) for n in names)
                if self.narrowband
                else ()
            ),
            self.embedder.channels(labelled),
            return_exceptions=True,
        )
        # The clips as sent first: a clip unusable as sent is reported as such, not as "its narrowband copy",
        # whichever of the two finished first.
        for outcome in found:
            if isinstance(outcome, BaseException):
                raise outcome
        per_encoder, narrow, channels = found
        embeddings = [
            Embedding(name, self.encoders[name].manifest.sha256, vector)
            for name, (vector, _) in zip(names, per_encoder, strict=True)
        ]
        if self.narrowband:
            embeddings += [
                Embedding(narrowband_key(name), self.encoders[name].manifest.sha256, vector)
                for name, (vector, _) in zip(names, narrow, strict=True)
            ]
        # Lengths as the default encoder's path measured them (its loudness target feeds the VAD).
        _, measured = per_encoder[names.index(self.default_encoder)]
        clips = [
            ClipInput(a.data, a.pcm, c.audio_seconds, c.speech_seconds, *channel)
            for a, c, channel in zip(request.clips, measured, channels, strict=True)
        ]
        return await self.store.register(
            request.voice_id,
            clips,
            metadata=request.metadata,
            embeddings=embeddings,
            replace=request.replace,
            keep_audio=request.keep_audio,
        )

    def _check_sizes(self, clips: Sequence[AudioInput]) -> None:
        """The bounds that need no decoding, before any work (the store checks every bound again)."""
        config = self.config
        if not clips:
            raise InvalidRequest("a voice needs at least one clip: send its audio in clips")
        if len(clips) > config.registry_max_clips_per_voice:
            raise LimitExceeded(
                f"{len(clips)} clips sent; a voice may have at most {config.registry_max_clips_per_voice} "
                "(registry_max_clips_per_voice)"
            )
        for k, clip in enumerate(clips):
            if len(clip.data) > config.max_clip_bytes:
                raise LimitExceeded(
                    f"clip #{k} is {len(clip.data) / 2**20:.1f} MiB; the limit is {config.registry_max_clip_mb:g} MiB "
                    "per clip (registry_max_clip_mb)"
                )

    async def _embed_clips(
        self,
        encoder: WindowEncoder,
        clips: Sequence[AudioInput],
        deadline: float | None,
        how: ChannelCopy | None = None,
    ) -> tuple[np.ndarray, list[ClipEmbedding]]:
        """The voice's embedding under ``encoder`` (windows of all clips pooled) and each clip's figures; with
        ``how``, of the clips' copies made so (what a clip sent as reference audio is copied to)."""
        name = encoder.manifest.name
        labelled = [(c, f"clip #{k}") for k, c in enumerate(clips)]
        if how is None:
            embedded = await self.embedder.embed_audio(encoder, labelled, deadline)
        else:
            embedded = await self.embedder.copies(encoder, how, labelled, deadline)
        for k, clip in enumerate(embedded):
            if clip.window_embeddings is None:
                copy = "" if how is None else f" (its {how.describe()})"
                raise InvalidRequest(f"clip #{k}{copy} cannot be enrolled with encoder {name}: {clip.detail}")
        windows = np.concatenate([c.window_embeddings for c in embedded if c.window_embeddings is not None])
        return pool(windows), embedded

    # ------------------------------------------------------------------ voice ids as references

    async def embedding(
        self, voice_id: str, encoder: WindowEncoder, deadline: float | None = None, narrow: bool = False
    ) -> np.ndarray:
        """The voice's embedding under exactly ``encoder``'s weights (with ``narrow``, of its clips' narrowband
        copies): stored, or made now from the voice's stored clips. UnknownName when no such voice; Unsupported
        (with how to re-enrol) when it has no such embedding and its clips were not kept."""
        if isinstance(encoder, FusedEncoder):  # stored per component; joined as a clip's would be
            return encoder.join([await self.embedding(voice_id, c, deadline, narrow) for c in encoder.components])
        name, sha = encoder.manifest.name, encoder.manifest.sha256
        key = narrowband_key(name) if narrow else name
        found = await self.store.embedding(voice_id, key, sha)
        if found is not None:
            return np.asarray(found.vector, dtype=np.float32)
        loop = asyncio.get_running_loop()
        timeout = None if deadline is None else max(deadline - loop.time(), 0.0)
        try:
            vector, _ = await self._reembedding.run(
                (voice_id, key, sha), lambda: self._reembed(voice_id, encoder, narrow), timeout
            )
        except TimeoutError as exc:
            if isinstance(exc, DeadlineExceeded):
                raise
            raise DeadlineExceeded(f"the deadline passed while voice {voice_id!r} was re-embedded") from exc
        return vector

    async def _reembed(self, voice_id: str, encoder: WindowEncoder, narrow: bool) -> np.ndarray:
        name, sha = encoder.manifest.name, encoder.manifest.sha256
        key = narrowband_key(name) if narrow else name
        for _ in range(_REEMBED_ATTEMPTS):
            voice = await self.store.get(voice_id, with_audio=True)
            audios = _kept_audio(voice)
            if audios is None:
                # Its message says what it was enrolled under and how to register it again.
                return (await self.store.require_embedding(voice_id, key, sha)).vector
            vector, _ = await self._embed_clips(encoder, audios, None, NARROWBAND if narrow else None)
            try:
                await self.store.put_embedding(voice_id, Embedding(key, sha, vector), revision=voice.revision)
            except OutOfSequence:
                continue  # replaced meanwhile: embed its new clips
            logger.info("voice %s re-embedded from its stored clips for %s weights %s", voice_id, key, sha[:12])
            return vector
        raise OutOfSequence(f"voice {voice_id!r} kept being replaced while it was re-embedded; retry the request")

    # ------------------------------------------------------------------ reads and deletion

    async def get(self, voice_id: str) -> Voice:
        return await self.store.get(voice_id)

    async def list(self, page_size: int = 0, page_token: str = "") -> VoiceListing:
        page = await self.store.list_voices(page_size=page_size, page_token=page_token)
        return VoiceListing(page, await self.store.count())

    async def delete(self, voice_id: str) -> None:
        await self.store.delete(voice_id)

    async def channels(self, voice_id: str) -> tuple[Channel, ...]:
        """Each of the voice's clips' channel as registered. A voice registered before they were recorded (schema
        version 1 to 3) has them measured from its kept clips on first use, and stored, as a missing embedding is
        made; one whose clips were not kept has None where they were not recorded (a clip without its low band level
        never counts as a telephone clip). UnknownName when no such voice."""
        voice = await self.store.get(voice_id)
        # Every enrolled clip has speech, so a plateau fraction and a low band level (None only for a silent or
        # too-short one, which cannot be enrolled): None here means "not recorded".
        if voice.audio_kept and any(c.plateau is None or c.low_band_db is None for c in voice.clips):
            voice = await self.store.get(voice_id, with_audio=True)
            audios = _kept_audio(voice)
            if audios is not None:
                measured = tuple(await self.embedder.channels([(a, f"clip #{k}") for k, a in enumerate(audios)]))
                try:
                    await self.store.put_channels(voice_id, measured, revision=voice.revision)
                except OutOfSequence:
                    return await self.channels(voice_id)  # replaced meanwhile: its new clips were measured
                logger.info("voice %s: its clips' channels measured from its stored clips", voice_id)
                return measured
        return tuple(Channel(c.bandwidth_hz, c.plateau, c.snr_db, c.low_band_db) for c in voice.clips)

    async def copy_embedding(
        self, voice_id: str, encoder: WindowEncoder, how: ChannelCopy, deadline: float | None = None
    ) -> np.ndarray:
        """The voice's embedding under ``encoder`` of its kept clips' copies made as ``how`` says (clip and noise
        matching; not stored: its target is the dialogue's). Unsupported when its clips were not kept."""
        audios = await self._kept_clips(voice_id, how.describe())
        if isinstance(encoder, FusedEncoder):  # per component, joined as a clip's would be
            parts = [(await self._embed_clips(c, audios, deadline, how))[0] for c in encoder.components]
            return encoder.join(parts)
        return (await self._embed_clips(encoder, audios, deadline, how))[0]

    async def noisiest_clip(self, voice_id: str) -> AudioInput:
        """The audio of the voice's clip with the lowest recorded SNR (its noise is what a noise-matched speaker's
        copies get when the voice is the speaker's noisiest piece). Unsupported when its clips were not kept."""
        voice = await self.store.get(voice_id, with_audio=True)
        audios = self._kept(voice, "noise")
        measured = [(c.snr_db, k) for k, c in enumerate(voice.clips) if c.snr_db is not None]
        if not measured:
            raise Unsupported(f"voice {voice_id!r} has no clip whose SNR was recorded: register it again with replace")
        return audios[min(measured)[1]]

    async def _kept_clips(self, voice_id: str, what: str) -> tuple[AudioInput, ...]:
        return self._kept(await self.store.get(voice_id, with_audio=True), what)

    @staticmethod
    def _kept(voice: Voice, what: str) -> tuple[AudioInput, ...]:
        audios = _kept_audio(voice)
        if audios is None:
            raise Unsupported(
                f"its {what} is made from its clips, which were not kept (keep_audio off): register it again with "
                "its clips, keep_audio on and replace"
            )
        return audios

    def loaded(self, encoder: str, weights_sha256: str) -> bool:
        """Whether this engine embeds with exactly these weights (a narrowband key counts as its encoder's)."""
        enc = self.encoders.get(base_encoder(encoder))
        return enc is not None and enc.manifest.sha256 == weights_sha256


def _kept_audio(voice: Voice) -> tuple[AudioInput, ...] | None:
    """The voice's clips as audio (read with their audio), or None when they were not kept."""
    if not voice.audio_kept or any(c.data is None for c in voice.clips):
        return None
    return tuple(AudioInput(c.data or b"", c.pcm) for c in voice.clips)

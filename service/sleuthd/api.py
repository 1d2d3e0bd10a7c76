"""The public in-process API: speaker embeddings through exactly the service's own path.

For scripts, the research tools and tests, in the spirit of SpeechBrain's ``inference/speaker.py``::

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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from sleuthd.audio.windows import WindowSpec
from sleuthd.config import EngineConfig, default_models_dir
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ClipEmbedding, prepare_waveform
from sleuthd.encoders.embedder import ClipEmbedder, embed_prepared
from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.engine.loading import LoadedModels, load_models
from sleuthd.ops.observe import NullObserver

__all__ = ["ClipEmbedding", "SpeakerEncoder", "WindowSpec"]


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
        # The micro-batcher belongs to the event loop that first uses it: synchronous callers get one
        # private loop for the encoder's lifetime (use either the async or the sync methods, not both).
        self._sync_loop: asyncio.AbstractEventLoop | None = None

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

    def embed_files(self, paths: Sequence[str | Path]) -> list[ClipEmbedding]:
        """:meth:`embed` for audio files, from synchronous code."""
        return self.embed_sync([Path(p) for p in paths])

    def embed_sync(self, audios: Sequence[bytes | Path]) -> list[ClipEmbedding]:
        """:meth:`embed` from synchronous code (encoded audio as bytes, or files)."""
        if self._sync_loop is None:
            self._sync_loop = asyncio.new_event_loop()
        return self._sync_loop.run_until_complete(self.embed(list(audios)))

    async def aclose(self) -> None:
        await self._models.aclose()

    async def __aenter__(self) -> SpeakerEncoder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Release the models from synchronous code (outside any running event loop)."""
        loop = self._sync_loop or asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.aclose())
        finally:
            loop.close()
            self._sync_loop = None

"""Enrolment clips and embeddings for the registry tests, made the way the server will make them:
real recordings (sleuthd/export/parity_clips) decoded and measured by sleuthd.audio.decode and the energy VAD."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
from sleuthd.audio.decode import PcmEncoding, PcmSpec, decode_encoded, to_model_rate
from sleuthd.audio.vad import EnergyVad
from sleuthd.registry import ClipInput, Embedding

from tests.support import FSDD_SUBSET

# Two encoder weights of one encoder: what a registry sees when a model file is re-exported or swapped.
WEIGHTS_A = hashlib.sha256(b"ge2e weights, export 1").hexdigest()
WEIGHTS_B = hashlib.sha256(b"ge2e weights, export 2").hexdigest()


def recordings() -> list[Path]:
    return sorted(FSDD_SUBSET.glob("*.wav"))


@functools.cache
def clip_from_file(path: Path) -> ClipInput:
    data = path.read_bytes()
    wave = to_model_rate(decode_encoded(data, max_seconds=300.0))
    speech = EnergyVad().speech_mask(wave.samples).speech_seconds
    return ClipInput(data=data, pcm=None, audio_seconds=wave.seconds, speech_seconds=speech)


def pcm_clip(path: Path) -> ClipInput:
    """The same recording sent as headerless s16le PCM at 16 kHz."""
    wave = to_model_rate(decode_encoded(path.read_bytes(), max_seconds=300.0))
    data = (np.clip(wave.samples, -1, 1) * 32767).astype("<i2").tobytes()
    speech = EnergyVad().speech_mask(wave.samples).speech_seconds
    return ClipInput(data, PcmSpec(PcmEncoding.S16LE, 16_000, 1), wave.seconds, speech)


def clips_for(n: int, start: int = 0) -> list[ClipInput]:
    files = recordings()
    return [clip_from_file(files[(start + k) % len(files)]) for k in range(n)]


def vector_for(voice_id: str, weights: str, dim: int = 256) -> np.ndarray:
    """A unit vector determined by (voice, weights), so a test can check exactly what came back."""
    seed = int.from_bytes(hashlib.sha256(f"{voice_id}/{weights}".encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def embedding_for(voice_id: str, weights: str = WEIGHTS_A, encoder: str = "ge2e") -> Embedding:
    return Embedding(encoder, weights, vector_for(voice_id, weights))

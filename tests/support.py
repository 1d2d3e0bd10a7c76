"""Constants and helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from sleuthd.v1 import sleuthd_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "models"
FSDD_SUBSET = REPO / "service" / "sleuthd" / "export" / "parity_clips"  # real speech shipped for parity
SPEECH_CACHE = REPO / "data" / "test-speech"

# Synthetic speakers used across tests. A and B are a same-gender pair (like the paper's S3),
# F is the opposite gender (S2).
VOICE_A = "espeak-m3"
VOICE_B = "espeak-m7"
VOICE_F = "espeak-f2"
VOICE_C = "flite-slt"
CLIPS_PER_VOICE = 7

# A small limit so the oversized-message test needs only a few MB.
TEST_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Speech:
    """Cached synthetic clips: ``clips[voice][k]`` is a 16 kHz mono WAV path."""

    clips: dict[str, list[Path]]

    def wav_bytes(self, voice: str, k: int) -> bytes:
        return self.clips[voice][k].read_bytes()


def encode_wav(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def enc(data: bytes) -> pb.Audio:
    return pb.Audio(encoded=data)

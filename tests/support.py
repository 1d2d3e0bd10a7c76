"""Constants and helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def assert_same_up_to_batch_rounding(a: object, b: object, path: str = "verdict") -> None:
    """``a == b`` field by field, floats within 1e-5 relative (1e-7 absolute): CAM++'s ONNX model rounds a row
    differently with the other rows of its batch (up to ~2e-7 on an embedding, measured), and the micro-batcher
    packs a request's windows by arrival, so under the fused encoder two runs of one request agree to rounding,
    not to the bit. Everything else (statuses, ids, texts) must be equal."""
    import dataclasses
    import math

    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same_up_to_batch_rounding(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, tuple | list):
        assert isinstance(b, tuple | list) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_up_to_batch_rounding(x, y, f"{path}[{k}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a!r} != {b!r}"
        for k in a:
            assert_same_up_to_batch_rounding(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.shape == b.shape, f"{path}: shapes differ"
        assert np.allclose(a, b, rtol=1e-5, atol=1e-7), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def check_request(audio: list[bytes], method: int = pb.METHOD_AUTO, encoder: str = "fused") -> pb.CheckDialogueRequest:
    """A CheckDialogue of these clips as turns t0, t1, ... of one speaker "B"."""
    options = pb.CheckOptions(encoder=encoder, method=method)  # type: ignore[arg-type]
    req = pb.CheckDialogueRequest(dialogue_id="band", options=options)
    for k, data in enumerate(audio):
        req.turns.add(turn_id=f"t{k}", speaker="B", audio=enc(data))
    return req


def calls_to(monkeypatch: Any, module: Any, name: str) -> list[tuple[Any, ...]]:
    """A list that grows by the arguments of every call of ``module.name`` from here on (the call still happens)."""
    made: list[tuple[Any, ...]] = []
    real = getattr(module, name)

    def counting(*args: Any) -> Any:
        made.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, counting)
    return made


def copies_made(monkeypatch: Any) -> list[Any]:
    """A list that grows by the ChannelCopy of every channel copy the server makes from here on
    (sleuthd.encoders.embedder)."""
    from sleuthd.encoders import embedder

    made: list[Any] = []
    channel_copy = embedder.channel_copy

    def counting(audio: Any, max_seconds: float, copy: Any, *args: Any) -> Any:
        made.append(copy)
        return channel_copy(audio, max_seconds, copy, *args)

    monkeypatch.setattr(embedder, "channel_copy", counting)
    return made

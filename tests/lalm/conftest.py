"""Fixtures for the LALM judge tests: tiny random checkpoints of both architectures, built offline into a
temporary folder once per session and loaded through the code a real checkpoint takes, and real
synthesized speech at 16 kHz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sleuthd.audio.decode import decode_encoded, to_model_rate

from tests.lalm.lalm_support import ARCHS
from tests.support import VOICE_A, VOICE_B, VOICE_F, Speech


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from sleuthd.lalm.tiny import build_tiny_judge

    root = tmp_path_factory.mktemp("tiny-judges")
    return {arch: build_tiny_judge(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def models(tiny_dirs: dict[str, Path]) -> dict[str, object]:
    from sleuthd.lalm.local import LocalModel

    return {arch: LocalModel.load(path, device="cpu") for arch, path in tiny_dirs.items()}


@pytest.fixture(scope="session")
def voices(speech: Speech) -> dict[str, list[np.ndarray]]:
    """16 kHz mono float32 turns of three synthetic speakers (A and B same gender, F the other)."""
    out = {}
    for voice in (VOICE_A, VOICE_B, VOICE_F):
        waves = []
        for k in range(4):
            wave = to_model_rate(decode_encoded(speech.wav_bytes(voice, k), max_seconds=60))
            waves.append(wave.samples)
        out[voice] = waves
    return out

"""Helpers shared by the LALM judge tests (fixtures live in tests/lalm/conftest.py)."""

from __future__ import annotations

import numpy as np

ARCHS = ("qwen2-audio", "qwen2.5-omni")


def tone(seconds: float, hz: float = 180.0) -> np.ndarray:
    """A plain harmonic tone, where the content does not matter (e.g. the over-long clip rule)."""
    t = np.arange(int(seconds * 16_000)) / 16_000
    return (0.1 * np.sin(2 * np.pi * hz * t) + 0.05 * np.sin(2 * np.pi * 2 * hz * t)).astype(np.float32)

"""WORLD (pyworld) prosody copies: a clip's F0 contour scaled by 2**shift octaves, spectral envelope and
aperiodicity kept. Analysis on the 16 kHz mono decode the server embeds (sleuthd.audio.decode), F0 by harvest
(or dio+stonemask), envelope by cheaptrick, aperiodicity by d4c; synthesis at 16 kHz, written as 16-bit WAV bytes."""
from __future__ import annotations

import io
import wave

import numpy as np
import pyworld as pw
from sleuthd.audio.decode import decode_encoded, to_model_rate

SR = 16000
FRAME_MS = 5.0


def decode(path) -> np.ndarray:
    w = to_model_rate(decode_encoded(open(path, "rb").read(), 600.0))
    return np.asarray(w.samples, np.float64)


def analyse(x: np.ndarray, method: str = "harvest"):
    if method == "harvest":
        f0, t = pw.harvest(x, SR, f0_floor=60.0, f0_ceil=500.0, frame_period=FRAME_MS)
    else:
        f0, t = pw.dio(x, SR, f0_floor=60.0, f0_ceil=500.0, frame_period=FRAME_MS)
        f0 = pw.stonemask(x, f0, t, SR)
    sp = pw.cheaptrick(x, f0, t, SR)
    ap = pw.d4c(x, f0, t, SR)
    return f0, sp, ap


def median_f0(f0: np.ndarray) -> float:
    """log2 Hz median over voiced frames (NaN when fewer than 5)."""
    v = f0[f0 > 0]
    return float(np.median(np.log2(v))) if len(v) >= 5 else float("nan")


def synth(f0, sp, ap, shift_oct: float, peak: float) -> np.ndarray:
    y = pw.synthesize(np.ascontiguousarray(f0 * 2.0 ** shift_oct), sp, ap, SR, FRAME_MS)
    m = np.max(np.abs(y)) or 1.0
    return y * (peak / m)


def wav_bytes(y: np.ndarray) -> bytes:
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(np.clip(np.round(y * 32767), -32768, 32767).astype("<i2").tobytes())
    return b.getvalue()

"""Rendering the clips of the robustness matrix: a source (espeak-ng, Kokoro or an FSDD turn) and a
chain of effects (prosody, a cut, a channel), all described by a JSON-able spec.

A clip's id is a hash of its spec, and its file is ``audio/<id[:2]>/<id>.<ext>`` under the data folder:
the same spec is rendered once, however many dialogues and conditions use it. Every random choice is
made when the spec is drawn (sleuthd_bench.robustness.build), never here, so rendering is deterministic.

Effects, in the order of a chain (a codec, when present, is last: it writes the file):

- ``["sox", cents, tempo]``: sox pitch shift (cents) and tempo factor: prosody within one voice;
- ``["cut", start, seconds]``: ``seconds`` of the clip's audible part from ``start`` (0-1 of the room);
- ``["reverb", reverberance, room]``: sox reverb (0-100 each);
- ``["noise", snr_db, colour, seed]``: white/pink/brown noise at ``snr_db`` below the speech RMS;
- ``["phone"]``: telephone band: 300-3400 Hz, 8 kHz, 8-bit mu-law, written as 8 kHz 16-bit WAV;
- ``["level", rms_dbfs]``: gain to that RMS (dBFS), hard-clipped at full scale;
- ``["clip", gain_db]``: gain by ``gain_db`` from -3 dBFS peak, hard-clipped (the clipping condition);
- ``["mp3", kbps]``: lame CBR MP3; ``["opus", level]`` / ``["vorbis", level]``: libsndfile OGG at
  compression level 0-1 (higher = fewer bits).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from sleuthd_bench import synth

SAMPLE_RATE = 16_000
AUDIBLE_SHARE = 0.01  # a sample is audible above this share of the clip's peak (as turn_lengths)
_TIMEOUT_S = 120


def clip_id(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:20]


def extension(spec: Mapping[str, Any]) -> str:
    fx = spec.get("fx") or []
    last = fx[-1][0] if fx else ""
    return {"mp3": "mp3", "opus": "ogg", "vorbis": "ogg"}.get(last, "wav")


def relpath(spec: Mapping[str, Any]) -> str:
    cid = clip_id(spec)
    return f"audio/{cid[:2]}/{cid}.{extension(spec)}"


def _run(argv: Sequence[str], stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise synth.SynthesisError(
            f"{argv[0]} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[:300]}"
        )
    return proc.stdout


def _wav_bytes(x: np.ndarray, rate: int = SAMPLE_RATE, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1.0, 1.0), rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def _read(data: bytes) -> np.ndarray:
    x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = x.mean(axis=1)
    return mono if rate == SAMPLE_RATE else soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32)


# ------------------------------------------------------------------------------------------ sources


def espeak(src: Mapping[str, Any]) -> np.ndarray:
    """espeak-ng voice ``lang+variant`` with pitch (-p 0-99), rate (-s wpm) and amplitude (-a); ``ssml``:
    the text is SSML (emphasis, prosody)."""
    argv = ["espeak-ng", "-v", f"{src['lang']}+{src['variant']}", "-p", str(src["p"]), "-s", str(src["s"])]
    argv += ["-a", str(src.get("a", 100)), "--stdout"]
    if src.get("ssml"):
        argv.append("-m")
    raw = _run([*argv, "--stdin"], stdin=str(src["text"]).encode())
    x = _read(raw)
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak < 1e-3:
        raise synth.SynthesisError(f"espeak-ng produced silence for {src}")
    return (x * (10 ** (-3 / 20) / peak)).astype(np.float32)  # -3 dBFS peak, as synth.synthesize


class KokoroSource:
    """Kokoro-82M, loaded on first use (one engine for the process)."""

    def __init__(self) -> None:
        self._engine: Any = None

    def __call__(self, src: Mapping[str, Any]) -> np.ndarray:
        from sleuthd_bench.kokoro import KokoroEngine
        from sleuthd_bench.kokoro_voices import DESIGNS, design_voices

        if self._engine is None:
            self._engine = KokoroEngine(threads=1)
            self._voices = {v.name: v for v in design_voices(DESIGNS["large"], 0)}
        audio = self._engine.speak(
            self._voices[src["voice"]], src["text"], float(src["speed"]), lang=src["lang"], speed_range=(0.5, 2.0)
        )
        peak = float(np.abs(audio).max())
        return (audio * (10 ** (-3 / 20) / max(peak, 1e-6))).astype(np.float32)


def fsdd(src: Mapping[str, Any], root: Path) -> np.ndarray:
    return _read((root / src["path"]).read_bytes())


# ------------------------------------------------------------------------------------------ effects


def audible(x: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(x) > AUDIBLE_SHARE * max(float(np.abs(x).max()), 1e-9))
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, len(x))


def _speech_rms(x: np.ndarray) -> float:
    """RMS over the louder half of 20 ms frames (the speech, not the pauses)."""
    frames = x[: len(x) // 320 * 320].reshape(-1, 320)
    if not len(frames):
        return float(np.sqrt(np.mean(x**2)) + 1e-9)
    e = np.sort((frames**2).mean(axis=1))
    return float(np.sqrt(e[len(e) // 2 :].mean()) + 1e-9)


def _noise(n: int, colour: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    white = rng.standard_normal(n)
    if colour == "white":
        return white
    spec = np.fft.rfft(white)
    f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
    spec /= np.sqrt(f) if colour == "pink" else f
    out = np.fft.irfft(spec, n)
    return out / (np.std(out) + 1e-12)


def _sox(x: np.ndarray, effects: Sequence[str]) -> np.ndarray:
    out = _run(
        ["sox", "-R", "-D", "-q", "-t", "wav", "-", "-t", "wav", "-e", "floating-point", "-", *effects],
        stdin=_wav_bytes(x, subtype="FLOAT"),
    )
    return _read(out)


def _mulaw(x: np.ndarray) -> np.ndarray:
    mu = 255.0
    y = np.sign(x) * np.log1p(mu * np.abs(np.clip(x, -1, 1))) / np.log1p(mu)
    y = np.round(y * 127.0) / 127.0
    return (np.sign(y) * ((1 + mu) ** np.abs(y) - 1) / mu).astype(np.float32)


def apply(x: np.ndarray, fx: Sequence[Sequence[Any]]) -> bytes:
    """The effect chain on a 16 kHz waveform -> the file's bytes."""
    for step in fx:
        name = step[0]
        if name == "sox":
            x = _sox(x, ["pitch", str(int(step[1])), "tempo", "-s", f"{float(step[2]):.3f}"])
        elif name == "cut":
            first, last = audible(x)
            length = int(float(step[2]) * SAMPLE_RATE)
            room = max(last - first - length, 0)
            start = first + int(float(step[1]) * room)
            x = x[start : start + length]
        elif name == "reverb":
            x = _sox(x, ["reverb", str(int(step[1])), "50", str(int(step[2])), "pad", "0", "0.3"])
        elif name == "noise":
            noise = _noise(len(x), str(step[2]), int(step[3]))
            x = (x + noise * _speech_rms(x) * 10 ** (-float(step[1]) / 20)).astype(np.float32)
            x = x / max(1.0, float(np.abs(x).max()) / 0.99)
        elif name == "phone":
            band = _sox(x, ["sinc", "300-3400"])
            narrow = _mulaw(soxr.resample(band, SAMPLE_RATE, 8000).astype(np.float32))
            return _wav_bytes(narrow, 8000)
        elif name == "level":
            x = x * (10 ** (float(step[1]) / 20) / _speech_rms(x))
        elif name == "clip":
            x = x * (10 ** ((float(step[1]) - 3) / 20) / max(float(np.abs(x).max()), 1e-9))
        elif name == "mp3":
            return _run(
                [
                    "lame",
                    "--quiet",
                    "-r",
                    "-s",
                    "16",
                    "--bitwidth",
                    "16",
                    "--signed",
                    "--little-endian",
                    "-m",
                    "m",
                    "-b",
                    str(int(step[1])),
                    "-",
                    "-",
                ],
                stdin=(np.clip(x, -1, 1) * 32767).astype("<i2").tobytes(),
            )
        elif name in ("opus", "vorbis"):
            buf = io.BytesIO()
            sf.write(
                buf,
                np.clip(x, -1, 1),
                SAMPLE_RATE,
                format="OGG",
                subtype=name.upper(),
                compression_level=float(step[1]),
            )
            return buf.getvalue()
        else:
            raise ValueError(f"unknown effect {name!r}")
    return _wav_bytes(x)


class Renderer:
    """Renders specs into ``root`` (the data folder), caching each source waveform in memory per batch."""

    def __init__(self, root: Path, fsdd_root: Path) -> None:
        self.root = root
        self.fsdd_root = fsdd_root
        self.kokoro = KokoroSource()

    def source(self, src: Mapping[str, Any]) -> np.ndarray:
        kind = src["kind"]
        if kind == "espeak":
            return espeak(src)
        if kind == "kokoro":
            cache = self.root / "sources" / f"{clip_id(src)}.wav"
            if cache.is_file():
                return _read(cache.read_bytes())
            x = self.kokoro(src)
            cache.parent.mkdir(parents=True, exist_ok=True)
            _atomic(cache, _wav_bytes(x, subtype="FLOAT"))
            return x
        if kind == "fsdd":
            return fsdd(src, self.root)  # the joined FSDD turns live under the data folder
        raise ValueError(f"unknown source {kind!r}")

    def render(self, spec: Mapping[str, Any]) -> Path:
        path = self.root / relpath(spec)
        if path.is_file() and path.stat().st_size > 0:
            return path
        data = apply(self.source(spec["src"]), spec.get("fx") or [])
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path, data)
        return path


def _atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

"""The audio a report plays: copied (or linked) into the report's ``audio/`` folder under content names.

Copied by default, because a report is a record of what was judged: TTS pipelines regenerate a broken turn
into the same path, and a link would then play audio that was never checked. Copies are named by the
SHA-256 of their bytes, so a reference shared by a thousand dialogues is stored once. ``link`` makes
symbolic links to the originals instead (no copy of a large corpus; the report then breaks when the
originals move or change).

Waveforms are drawn in the browser with Web Audio, which needs the file's bytes; a page opened from disk
(file://) may play audio but not read it (fetch and XMLHttpRequest refuse file URLs), while it may load a
script from its own folder. So each clip whose waveform is drawn also gets a sidecar script next to it,
``<name>.js``, that hands its bytes (base64) to the page.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUDIO_MODES = ("copy", "link")
# Audio as a report accepts it: a file path, an encoded file's bytes (WAV, FLAC, OGG, MP3), or NumPy
# samples with their rate as ``(samples, sample_rate_hz)`` (float in [-1, 1] or int16; mono or (frames, channels)).
AudioSource = Any

_MAGIC = ((b"RIFF", ".wav"), (b"fLaC", ".flac"), (b"OggS", ".ogg"), (b"ID3", ".mp3"), (b"\xff\xfb", ".mp3"))
_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".mp3", ".opus", ".m4a", ".webm"}


class ReportError(ValueError):
    """A report cannot be written as asked (bad option, unreadable audio); the message says what to fix."""


@dataclass(frozen=True)
class StoredClip:
    url: str  # relative to the report's index.html
    name: str  # what the user called it (file name), for tooltips
    size_bytes: int


class AudioStore:
    """Puts clips into ``root/audio`` and answers their URLs relative to ``root``."""

    def __init__(self, root: Path, mode: str = "copy") -> None:
        if mode not in AUDIO_MODES:
            raise ReportError(f"audio mode {mode!r} is not one of: {', '.join(AUDIO_MODES)}")
        self.root = root
        self.folder = root / "audio"
        self.mode = mode
        self._by_path: dict[str, StoredClip] = {}
        self._sidecars: dict[str, str] = {}

    def add(self, source: AudioSource, what: str) -> StoredClip:
        """Store ``source`` (``what`` names it in errors) and return where the page finds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if isinstance(source, str | os.PathLike):
            return self._add_path(Path(source), what)
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            return self._write(data, _sniff(data), f"{what}{_sniff(data)}")
        if isinstance(source, tuple) and len(source) == 2:
            data = _wav_from_samples(source[0], source[1], what)
            return self._write(data, ".wav", f"{what}.wav")
        raise ReportError(
            f"{what}: a report plays a file path, encoded bytes or (samples, sample_rate); got {type(source).__name__}"
        )

    def _add_path(self, path: Path, what: str) -> StoredClip:
        key = str(path.resolve())
        if key in self._by_path:
            return self._by_path[key]
        if not path.is_file():
            raise ReportError(f"{what}: audio file {path} does not exist")
        suffix = path.suffix.lower() if path.suffix.lower() in _SUFFIXES else ".bin"
        if self.mode == "copy":
            stored = self._write(path.read_bytes(), suffix, path.name)
        else:
            target = self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}{suffix}"
            if not target.is_symlink():
                target.symlink_to(Path(key))
            stored = StoredClip(f"audio/{target.name}", path.name, path.stat().st_size)
        self._by_path[key] = stored
        return stored

    def _write(self, data: bytes, suffix: str, name: str) -> StoredClip:
        target = self.folder / f"{hashlib.sha256(data).hexdigest()[:20]}{suffix}"
        if not target.exists():
            tmp = target.with_suffix(".part")
            tmp.write_bytes(data)
            tmp.replace(target)
        return StoredClip(f"audio/{target.name}", name, len(data))

    def sidecar(self, clip: StoredClip) -> str:
        """The URL of a script that puts ``clip``'s bytes, base64, in ``window.SLEUTHD_AUDIO[clip.url]``."""
        if clip.url not in self._sidecars:
            source = self.root / clip.url
            payload = base64.b64encode(source.read_bytes()).decode("ascii")
            holder = "(window.SLEUTHD_AUDIO=window.SLEUTHD_AUDIO||{})"
            script = f"{holder}[{json.dumps(clip.url)}]={json.dumps(payload)};\n"
            (self.root / f"{clip.url}.js").write_text(script)
            self._sidecars[clip.url] = f"{clip.url}.js"
        return self._sidecars[clip.url]


def _sniff(data: bytes) -> str:
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    return ".bin"


def _wav_from_samples(samples: Any, rate: Any, what: str) -> bytes:
    """16-bit PCM WAV of NumPy samples (NumPy is imported only here: the caller has it loaded already)."""
    import numpy as np

    a = np.asarray(samples)
    if not isinstance(rate, int) or rate <= 0 or a.ndim not in (1, 2) or a.size == 0:
        raise ReportError(f"{what}: expected (samples of shape (frames,) or (frames, channels), sample_rate in Hz)")
    pcm = a.astype("<i2") if a.dtype == np.int16 else (np.clip(a, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1 if a.ndim == 1 else int(a.shape[1]))
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()

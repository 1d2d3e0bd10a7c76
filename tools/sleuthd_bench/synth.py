"""Synthetic speakers and speech corpora for tests, the demo and the development benchmark.

Real (synthesized) speech, not tones: voices come from the Debian text-to-speech engines
``espeak-ng`` and ``flite``, plus ``sox`` pitch/tempo/EQ variants of some of them that act as
"similar speakers".  A second builder joins real spoken-digit recordings (FSDD) of one speaker
into turns of a few seconds.

Everything is deterministic given a seed and cached on disk: an output file that already exists
with nonzero size (and, for synthesized clips, whose recorded text matches) is not rebuilt.
Nothing runs at import time; the engines are only looked up when speech is synthesized.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

__all__ = [
    "CSV_HEADER",
    "DROPPED_VOICES",
    "SAMPLE_RATE",
    "TOOLS",
    "MissingToolError",
    "SynthesisError",
    "Voice",
    "build_corpus",
    "build_fsdd_corpus",
    "catalogue",
    "get_voice",
    "require_tools",
    "sentences",
    "synthesize",
]

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
CSV_HEADER = ("path", "speaker", "gender", "text")
TOOLS = ("espeak-ng", "flite", "sox")

_ESPEAK_LANGUAGE = "en-us"
_ESPEAK_RATE_WPM = 160
_TIMEOUT_S = 60.0
_MIN_RMS = 1e-3  # full scale = 1.0; a clip below this is treated as silent


class SynthesisError(RuntimeError):
    """A text-to-speech or audio tool failed or produced unusable output."""


class MissingToolError(SynthesisError):
    """A required command-line tool is not installed."""


# --------------------------------------------------------------------------------------------
# Voices
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker.

    ``engine_args`` is the engine command line without input text or output file, e.g.
    ``("espeak-ng", "-v", "en-us+m3", "-s", "160")`` or ``("flite", "-voice", "slt")``.
    A ``sox`` variant carries its base voice's ``engine_args``, the base's name in ``base`` and
    the sox effect arguments applied on top in ``sox_effects``.
    """

    name: str
    family: str
    gender: str
    engine_args: tuple[str, ...]
    base: str | None = None
    sox_effects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gender not in ("M", "F"):
            raise ValueError(f"voice {self.name!r}: gender must be 'M' or 'F', not {self.gender!r}")
        if self.family not in ("espeak", "flite", "sox"):
            raise ValueError(f"voice {self.name!r}: unknown family {self.family!r}")
        voice_flag = {"espeak-ng": "-v", "flite": "-voice"}.get(self.engine_args[0] if self.engine_args else "")
        if voice_flag is None or voice_flag not in self.engine_args[:-1]:
            raise ValueError(
                f"voice {self.name!r}: engine_args must be espeak-ng ... -v VOICE or flite ... -voice VOICE"
            )
        if self.family == "sox" and (self.base is None or not self.sox_effects):
            raise ValueError(f"voice {self.name!r}: a sox variant needs a base and sox_effects")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"voice name {self.name!r} is not usable as a directory name")

    @property
    def engine(self) -> str:
        """The text-to-speech program that renders this voice."""
        return self.engine_args[0]

    def describe(self) -> dict[str, object]:
        """A JSON-friendly description (as written to ``voices.json``)."""
        return {
            "name": self.name,
            "family": self.family,
            "gender": self.gender,
            "base": self.base,
            "effects": list(self.sox_effects),
            "engine_args": list(self.engine_args),
        }


# espeak-ng variants (file names under espeak-ng-data/voices/!v), grouped by the gender that
# `espeak-ng --voices=variant` lists for them.
_ESPEAK_MALE: tuple[str, ...] = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "klatt", "klatt2", "klatt3", "klatt4",
    "Andy", "Alex", "benjamin", "david", "edward", "Michael", "paul", "john", "robert",
)  # fmt: skip
_ESPEAK_FEMALE: tuple[str, ...] = (
    "f1", "f2", "f3", "f4", "f5", "Annie", "Alicia", "Andrea", "belinda", "linda",
    "steph", "steph2", "steph3", "anika", "aunty", "grandma",
)  # fmt: skip

# flite built-in voices (awb_time is a limited-domain clock voice and is left out).
_FLITE_VOICES: tuple[tuple[str, str], ...] = (
    ("slt", "F"),
    ("rms", "M"),
    ("awb", "M"),
    ("kal16", "M"),
    ("kal", "M"),
)

# sox "similar speaker" variants: (base voice name, sox effect arguments).
_SOX_VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("espeak-m3", ("pitch", "200")),
    ("espeak-m1", ("pitch", "-250")),
    ("espeak-m5", ("pitch", "-200", "tempo", "0.92")),
    ("espeak-andy", ("pitch", "-150", "treble", "3")),
    ("espeak-klatt", ("pitch", "250")),
    ("espeak-f2", ("pitch", "-200")),
    ("espeak-f4", ("pitch", "300")),
    ("espeak-annie", ("pitch", "150", "tempo", "1.08", "bass", "4")),
    ("espeak-belinda", ("pitch", "-150")),
    ("flite-slt", ("pitch", "200")),
    ("flite-slt", ("pitch", "-250")),
    ("flite-rms", ("pitch", "-200")),
    ("flite-rms", ("pitch", "250")),
    ("flite-awb", ("pitch", "150", "bass", "4")),
    ("flite-kal16", ("pitch", "-200", "tempo", "1.08")),
    ("flite-kal", ("pitch", "200")),
)

# Near-duplicate voices left out of catalogue(): under GE2E (resemblyzer, 10 clips per voice)
# their mean cosine to their nearest other voice exceeded 0.95, i.e. matched their own
# same-voice cosine. The three Steph variants differ only in formant amplitudes; Steph is kept
# (nearest other after the drop: 0.84 or lower). flite's kal and kal16 are the same recorded
# speaker at 8 and 16 kHz: as two "speakers" they made S3 instances whose "similar speaker" is the
# target himself (wrong labels), so kal (and, as for every dropped voice, its sox variant) is left
# out and kal16 kept.
DROPPED_VOICES: frozenset[str] = frozenset({"espeak-steph2", "espeak-steph3", "flite-kal"})

_EFFECT_TAGS = {"pitch": "p", "tempo": "t", "treble": "tr", "bass": "b"}


def _variant_suffix(effects: Sequence[str]) -> str:
    """``("pitch", "200", "treble", "3")`` -> ``"p+200-tr+3"``."""
    if len(effects) % 2:
        raise ValueError(f"sox effects must be (effect, value) pairs: {effects!r}")
    parts = []
    for effect, value in zip(effects[::2], effects[1::2], strict=True):
        tag = _EFFECT_TAGS[effect]
        if effect == "tempo":
            parts.append(f"{tag}{value}")
        else:
            parts.append(f"{tag}{'' if value.startswith('-') else '+'}{value}")
    return "-".join(parts)


@functools.cache
def _full_catalogue() -> tuple[Voice, ...]:
    voices: list[Voice] = []
    espeak = [(v, "M") for v in _ESPEAK_MALE] + [(v, "F") for v in _ESPEAK_FEMALE]
    for variant, gender in espeak:
        voices.append(
            Voice(
                name=f"espeak-{variant.lower()}",
                family="espeak",
                gender=gender,
                engine_args=(
                    "espeak-ng",
                    "-v",
                    f"{_ESPEAK_LANGUAGE}+{variant}",
                    "-s",
                    str(_ESPEAK_RATE_WPM),
                ),
            )
        )
    for name, gender in _FLITE_VOICES:
        voices.append(Voice(name=f"flite-{name}", family="flite", gender=gender, engine_args=("flite", "-voice", name)))
    by_name = {v.name: v for v in voices}
    for base_name, effects in _SOX_VARIANTS:
        base = by_name[base_name]
        voices.append(
            Voice(
                name=f"{base.name}-{_variant_suffix(effects)}",
                family="sox",
                gender=base.gender,
                engine_args=base.engine_args,
                base=base.name,
                sox_effects=effects,
            )
        )
    names = [v.name for v in voices]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate voice names in the catalogue")
    return tuple(voices)


def catalogue() -> list[Voice]:
    """All synthetic voices, in a stable order: espeak-ng, flite, then sox variants.

    Voices in :data:`DROPPED_VOICES` (and variants built on them) are excluded.
    """
    return [
        v
        for v in _full_catalogue()
        if v.name not in DROPPED_VOICES and (v.base is None or v.base not in DROPPED_VOICES)
    ]


def get_voice(name: str) -> Voice:
    """Look a catalogue voice up by name (``KeyError`` if unknown)."""
    for voice in catalogue():
        if voice.name == name:
            return voice
    raise KeyError(f"unknown voice {name!r}")


# --------------------------------------------------------------------------------------------
# Tools and synthesis
# --------------------------------------------------------------------------------------------


def require_tools(tools: Sequence[str] = TOOLS) -> None:
    """Raise :class:`MissingToolError` unless every tool in ``tools`` is on ``PATH``."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise MissingToolError(
            f"missing command-line tool(s): {', '.join(missing)}. Run `make setup`, or install "
            "the Debian packages: sudo apt-get install espeak-ng flite sox"
        )


def _run(argv: Sequence[str], *, stdin_text: str | None = None) -> subprocess.CompletedProcess[str]:
    tool = argv[0]
    try:
        proc = subprocess.run(
            list(argv),
            input=stdin_text,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        require_tools([tool])
        raise SynthesisError(f"{tool} could not be started: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SynthesisError(f"{tool} timed out after {_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0:
        raise SynthesisError(f"{tool} failed with exit code {proc.returncode}: {proc.stderr.strip() or '(no stderr)'}")
    return proc


@functools.cache
def _espeak_variants() -> frozenset[str]:
    """Variant file names that espeak-ng has installed (``m3``, ``Andy``, ...)."""
    out = _run(["espeak-ng", "--voices=variant"]).stdout
    names = set()
    for line in out.splitlines():
        for field in line.split():
            if field.startswith("!v/"):
                names.add(field[3:])
    return frozenset(names)


@functools.cache
def _flite_voices() -> frozenset[str]:
    out = _run(["flite", "-lv"]).stdout
    _, _, listed = out.partition(":")
    return frozenset(listed.split())


def _check_installed(voice: Voice) -> None:
    # Both engines silently fall back to a default voice for an unknown name, which would
    # quietly merge two "speakers"; refuse instead.
    args = voice.engine_args
    if voice.engine == "espeak-ng":
        spec = args[args.index("-v") + 1]
        _, _, variant = spec.partition("+")
        if variant and variant not in _espeak_variants():
            raise SynthesisError(f"espeak-ng has no voice variant {variant!r} (voice {voice.name})")
    else:
        name = args[args.index("-voice") + 1]
        if name not in _flite_voices():
            raise SynthesisError(f"flite has no voice {name!r} (voice {voice.name})")


def synthesize(voice: Voice, text: str, out_path: Path) -> Path:
    """Speak ``text`` with ``voice`` into ``out_path`` as a 16 kHz mono 16-bit PCM WAV.

    Always (re)writes the file; the write is atomic (temporary file, then rename).
    Raises :class:`SynthesisError` if an engine fails or the result is empty or silent.
    """
    text = " ".join(text.split())
    if not text:
        raise ValueError("cannot synthesize empty text")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _check_installed(voice)
    with tempfile.TemporaryDirectory(prefix="sleuthd-synth-") as tmp:
        raw = Path(tmp) / "engine.wav"
        if voice.engine == "espeak-ng":
            _run([*voice.engine_args, "-w", str(raw), "--stdin"], stdin_text=text)
        else:
            text_file = Path(tmp) / "text.txt"
            text_file.write_text(text + "\n", encoding="utf-8")
            _run([*voice.engine_args, "-f", str(text_file), "-o", str(raw)])
        if not raw.is_file() or raw.stat().st_size <= 44:
            raise SynthesisError(f"{voice.engine} wrote no audio for voice {voice.name}")
        fd, tmp_out = tempfile.mkstemp(prefix=f".{out_path.stem}-", suffix=".wav", dir=out_path.parent)
        os.close(fd)
        try:
            # -R/-D: repeatable, no dither, so the output is bit-identical run to run.
            sox_argv = [
                "sox", "-R", "-D", "-q", str(raw),
                "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", "-e", "signed-integer", tmp_out,
                *voice.sox_effects,
                "rate", "-h", str(SAMPLE_RATE), "gain", "-n", "-3",
            ]  # fmt: skip
            _run(sox_argv)
            _validate_clip(Path(tmp_out), voice.name)
            os.replace(tmp_out, out_path)
        finally:
            if os.path.exists(tmp_out):
                os.unlink(tmp_out)
    logger.debug("synthesized %s (%s): %s", out_path, voice.name, text)
    return out_path


def _validate_clip(path: Path, what: str) -> None:
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    if rate != SAMPLE_RATE or audio.shape[1] != 1:
        raise SynthesisError(f"sox produced {rate} Hz x{audio.shape[1]} for {what}, expected mono 16 kHz")
    if audio.shape[0] < SAMPLE_RATE // 10:
        raise SynthesisError(f"synthesized clip for {what} is shorter than 0.1 s")
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    if rms < _MIN_RMS:
        raise SynthesisError(f"synthesized clip for {what} is silent (RMS {rms:.2e})")


# --------------------------------------------------------------------------------------------
# Sentences (our own word lists)
# --------------------------------------------------------------------------------------------

_SUBJECTS = (
    "the young doctor",
    "my neighbour",
    "a tired student",
    "the old carpenter",
    "our new manager",
    "the bus driver",
    "my younger sister",
    "a quiet engineer",
    "the hotel cook",
    "your uncle",
    "the school teacher",
    "a local farmer",
    "the night nurse",
    "her best friend",
    "the tall pilot",
    "a patient librarian",
    "the shop owner",
    "my grandfather",
    "the team captain",
    "a curious child",
    "the city gardener",
    "our landlord",
    "the museum guide",
    "a busy lawyer",
    "the village baker",
)
# (past tense, base form) of transitive verbs.
_VERBS = (
    ("painted", "paint"),
    ("found", "find"),
    ("carried", "carry"),
    ("sold", "sell"),
    ("borrowed", "borrow"),
    ("repaired", "repair"),
    ("cleaned", "clean"),
    ("hid", "hide"),
    ("delivered", "deliver"),
    ("ordered", "order"),
    ("photographed", "photograph"),
    ("wrapped", "wrap"),
    ("opened", "open"),
    ("measured", "measure"),
    ("packed", "pack"),
    ("returned", "return"),
    ("dropped", "drop"),
    ("checked", "check"),
    ("moved", "move"),
    ("described", "describe"),
)
_OBJECTS = (
    "a red bicycle",
    "the broken lamp",
    "three paper boxes",
    "an old map",
    "the silver kettle",
    "a basket of apples",
    "the wooden chair",
    "two heavy suitcases",
    "a blue umbrella",
    "the kitchen window",
    "a stack of letters",
    "the garden gate",
    "a small brown dog",
    "the spare tyre",
    "a bottle of milk",
    "the green curtains",
    "a pair of boots",
    "the office printer",
    "a loaf of bread",
    "the long ladder",
    "a box of nails",
    "the yellow kite",
    "a jar of honey",
    "the family photographs",
)
_PLACES = (
    "near the harbour",
    "behind the train station",
    "in the small garden",
    "at the corner shop",
    "next to the library",
    "on the top floor",
    "outside the bakery",
    "by the river",
    "in the parking lot",
    "under the old bridge",
    "at the market square",
    "inside the garage",
    "across the street",
    "in the back office",
    "beside the fountain",
    "at the bus stop",
)
_TIMES = (
    "early this morning",
    "last Friday",
    "after the long meeting",
    "before lunch",
    "on Sunday evening",
    "yesterday afternoon",
    "during the storm",
    "late last night",
    "a week ago",
    "right after breakfast",
    "in the spring",
    "on the way home",
)
_FUTURE_TIMES = (
    "tomorrow morning",
    "next Friday",
    "after the meeting",
    "before lunch",
    "on Sunday evening",
    "this afternoon",
    "later tonight",
    "next week",
    "right after breakfast",
    "in the spring",
)
_ADVERBS = ("carefully", "quickly", "slowly", "quietly", "happily", "reluctantly", "proudly")
_REPORTS = ("said", "told me", "mentioned", "explained", "heard", "wrote")

_MIN_WORDS, _MAX_WORDS = 8, 16


def _cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def _compose(rng: random.Random) -> str:
    subj, subj2 = rng.sample(_SUBJECTS, 2)
    past, base = rng.choice(_VERBS)
    obj, place = rng.choice(_OBJECTS), rng.choice(_PLACES)
    when, later, adverb = rng.choice(_TIMES), rng.choice(_FUTURE_TIMES), rng.choice(_ADVERBS)
    template = rng.randrange(8)
    if template == 0:
        s = f"{_cap(when)}, {subj} {past} {obj} {place}."
    elif template == 1:
        s = f"{_cap(subj)} {adverb} {past} {obj} {place} {when}."
    elif template == 2:
        s = f"Did {subj} really {base} {obj} {place} {when}?"
    elif template == 3:
        s = f"{_cap(subj)} {rng.choice(_REPORTS)} that {subj2} {past} {obj} {when}."
    elif template == 4:
        s = f"Please ask {subj} to {base} {obj} {place} {later}."
    elif template == 5:
        s = f"I think {subj} will {adverb} {base} {obj} {later}."
    elif template == 6:
        s = f"{_cap(place)}, {subj} {past} {obj} while {subj2} waited."
    else:
        s = f"Nobody expected {subj} to {base} {obj} {place}, but it happened {when}."
    return s


def _sentence_stream(rng: random.Random) -> Iterator[str]:
    while True:
        s = _compose(rng)
        if _MIN_WORDS <= len(s.split()) <= _MAX_WORDS:
            yield s


def sentences(n: int, seed: int) -> list[str]:
    """``n`` distinct English sentences of 8-16 words (about 2-6 s spoken), deterministic in ``seed``."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    for s in _sentence_stream(rng):
        if len(out) == n:
            break
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _voice_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _assign_texts(voices: Sequence[Voice], clips_per_voice: int, seed: int) -> dict[str, list[str]]:
    # Each voice draws from its own stream (seeded by seed and voice name), so adding or removing
    # voices leaves the other voices' texts (and their cached audio) unchanged; a sentence
    # already taken by an earlier voice is skipped so that text never identifies a speaker.
    taken: set[str] = set()
    texts: dict[str, list[str]] = {}
    for voice in voices:
        mine: list[str] = []
        for s in _sentence_stream(random.Random(_voice_seed(seed, voice.name))):
            if len(mine) == clips_per_voice:
                break
            if s not in taken:
                taken.add(s)
                mine.append(s)
        texts[voice.name] = mine
    return texts


# --------------------------------------------------------------------------------------------
# Corpora
# --------------------------------------------------------------------------------------------


def _write_text_atomic(path: Path, content: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(content)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_corpus_csv(out_dir: Path, rows: Sequence[tuple[str, str, str, str]]) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows(rows)
    csv_path = out_dir / "corpus.csv"
    _write_text_atomic(csv_path, buf.getvalue())
    return csv_path


def _is_fresh(wav: Path, text: str) -> bool:
    """A cached clip: nonzero-size WAV whose ``.txt`` sidecar records the same text."""
    if not (wav.is_file() and wav.stat().st_size > 0):
        return False
    sidecar = wav.with_suffix(".txt")
    return sidecar.is_file() and sidecar.read_text(encoding="utf-8") == text


def build_corpus(
    out_dir: Path,
    voices: list[Voice],
    clips_per_voice: int,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 2,
) -> Path:
    """Synthesize ``clips_per_voice`` different sentences per voice into ``out_dir/<voice>/<nn>.wav``.

    Writes ``out_dir/corpus.csv`` (``path,speaker,gender,text``, paths relative to ``out_dir``)
    and ``out_dir/voices.json`` (name, family, gender, base, effects per voice); returns the CSV
    path. A clip is reused if its WAV exists with nonzero size and its ``<nn>.txt`` sidecar holds
    the same text. ``progress(done, total)`` is called from this thread after every clip.
    """
    if clips_per_voice < 1:
        raise ValueError("clips_per_voice must be >= 1")
    names = [v.name for v in voices]
    if len(set(names)) != len(names):
        raise ValueError("duplicate voice names")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = _assign_texts(voices, clips_per_voice, seed)
    width = max(2, len(str(clips_per_voice - 1)))

    rows: list[tuple[str, str, str, str]] = []
    todo: list[tuple[Voice, str, Path]] = []
    for voice in voices:
        (out_dir / voice.name).mkdir(exist_ok=True)
        for i, text in enumerate(texts[voice.name]):
            rel = f"{voice.name}/{i:0{width}d}.wav"
            wav = out_dir / rel
            rows.append((rel, voice.name, voice.gender, text))
            if not _is_fresh(wav, text):
                todo.append((voice, text, wav))

    total, done = len(rows), len(rows) - len(todo)
    logger.info(
        "corpus %s: %d voices x %d clips, %d cached, %d to synthesize",
        out_dir,
        len(voices),
        clips_per_voice,
        done,
        len(todo),
    )
    if progress is not None:
        progress(done, total)
    if todo:
        require_tools(sorted({v.engine for v, _, _ in todo} | {"sox"}))

    def job(voice: Voice, text: str, wav: Path) -> None:
        synthesize(voice, text, wav)
        _write_text_atomic(wav.with_suffix(".txt"), text)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(job, *item) for item in todo]
        try:
            for fut in as_completed(futures):
                fut.result()
                done += 1
                if progress is not None:
                    progress(done, total)
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    description = {"seed": seed, "clips_per_voice": clips_per_voice, "voices": [v.describe() for v in voices]}
    _write_text_atomic(out_dir / "voices.json", json.dumps(description, indent=2) + "\n")
    return _write_corpus_csv(out_dir, rows)


def _load_take(path: Path, rate: int) -> np.ndarray:
    audio, file_rate = sf.read(str(path), dtype="float32", always_2d=True)
    if file_rate != rate:
        raise ValueError(f"{path}: {file_rate} Hz, expected {rate} Hz like the rest of FSDD")
    mono: np.ndarray = audio.mean(axis=1)
    return mono


_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def build_fsdd_corpus(
    fsdd_dir: Path,
    out_dir: Path,
    turns_per_speaker: int,
    seed: int,
    digits_per_turn: tuple[int, int] = (5, 9),
    *,
    turn_seconds: tuple[float, float] = (2.0, 8.0),
) -> Path:
    """Join one FSDD speaker's digit takes into turns of a few seconds, at 16 kHz.

    For every speaker in ``fsdd_dir/fsdd.csv``, writes ``turns_per_speaker`` turns to
    ``out_dir/<speaker>/<nn>.wav``: a random number of takes in ``digits_per_turn`` (inclusive)
    separated by 150-250 ms of silence, resampled with soxr. ``turn_seconds`` bounds the turn
    length and wins over ``digits_per_turn`` (a take that would overshoot is skipped, more takes
    are added while a turn is too short). Each take is used at most once per speaker until the
    speaker's takes run out. Writes ``out_dir/corpus.csv`` (``path,speaker,gender,text``, text =
    the digits as words) and returns its path. Existing nonzero-size WAVs are kept.
    """
    lo, hi = digits_per_turn
    if not 1 <= lo <= hi:
        raise ValueError(f"bad digits_per_turn {digits_per_turn!r}")
    min_s, max_s = turn_seconds
    if not 0 < min_s < max_s:
        raise ValueError(f"bad turn_seconds {turn_seconds!r}")
    if turns_per_speaker < 1:
        raise ValueError("turns_per_speaker must be >= 1")
    fsdd_dir, out_dir = Path(fsdd_dir), Path(out_dir)
    index = fsdd_dir / "fsdd.csv"
    if not index.is_file():
        raise FileNotFoundError(f"FSDD index not found: {index}")

    takes: dict[str, list[tuple[str, str]]] = {}
    genders: dict[str, str] = {}
    with index.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            takes.setdefault(row["speaker"], []).append((row["path"], row["text"]))
            genders[row["speaker"]] = row["gender"]

    first = next(iter(takes.values()))[0][0]
    rate = int(sf.info(str(fsdd_dir / first)).samplerate)
    out_dir.mkdir(parents=True, exist_ok=True)
    width = max(2, len(str(turns_per_speaker - 1)))
    rows: list[tuple[str, str, str, str]] = []
    for speaker in sorted(takes):
        rng = random.Random(_voice_seed(seed, f"fsdd:{speaker}"))
        all_takes = sorted(takes[speaker])
        pool: list[tuple[str, str]] = []
        (out_dir / speaker).mkdir(exist_ok=True)
        for turn in range(turns_per_speaker):
            target = rng.randint(lo, hi)
            pieces: list[np.ndarray] = []
            words: list[str] = []
            length = 0  # samples at the source rate
            for _ in range(len(all_takes) + 100):
                if len(words) >= target and length >= min_s * rate:
                    break
                if not pool:  # every take used once: start another shuffled pass
                    pool = list(all_takes)
                    rng.shuffle(pool)
                rel, digit = pool.pop()
                take = _load_take(fsdd_dir / rel, rate)
                gap = round(rng.uniform(0.150, 0.250) * rate) if pieces else 0
                if length + gap + take.size > max_s * rate:
                    pool.insert(0, (rel, digit))  # too long for this turn; keep it for later
                    if len(words) >= lo and length >= min_s * rate:
                        break
                    continue
                if gap:
                    pieces.append(np.zeros(gap, dtype=np.float32))
                pieces.append(take)
                words.append(_DIGIT_WORDS[int(digit)])
                length += gap + take.size
            if not words:
                raise RuntimeError(f"could not build a turn for FSDD speaker {speaker}")
            rel_out = f"{speaker}/{turn:0{width}d}.wav"
            rows.append((rel_out, speaker, genders[speaker], " ".join(words)))
            wav = out_dir / rel_out
            text = " ".join(words)
            if _is_fresh(wav, text):
                continue
            joined = np.concatenate(pieces)
            audio = soxr.resample(joined, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else joined
            audio = np.clip(audio, -1.0, 1.0)
            fd, tmp = tempfile.mkstemp(prefix=f".{wav.stem}-", suffix=".wav", dir=wav.parent)
            os.close(fd)
            try:
                sf.write(tmp, audio, SAMPLE_RATE, subtype="PCM_16")
                os.replace(tmp, wav)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            _write_text_atomic(wav.with_suffix(".txt"), text)
    logger.info("FSDD corpus %s: %d speakers x %d turns", out_dir, len(takes), turns_per_speaker)
    return _write_corpus_csv(out_dir, rows)


def render_dialogue_script(script_path: Path, out_dir: Path) -> Path:
    """Synthesize a scripted dialogue into WAVs plus a dialogue file `sleuthd check` reads.

    Script (JSON): ``{"dialogue_id", "turns": [{"turn_id", "speaker", "voice", "text"}],
    "references": {speaker: {"voice", "text"}}}``; ``voice`` is a catalogue name. Writes
    ``out_dir/<turn_id>.wav``, ``out_dir/ref-<speaker>.wav`` and ``out_dir/dialogue.json``
    (same turns, with ``audio`` paths relative to it) and returns the dialogue file's path.
    Clips whose WAV and text sidecar already match are reused.
    """
    script = json.loads(Path(script_path).read_text(encoding="utf-8"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def render(voice_name: str, text: str, stem: str) -> str:
        wav = out_dir / f"{stem}.wav"
        if not _is_fresh(wav, text):
            synthesize(get_voice(voice_name), text, wav)
            _write_text_atomic(wav.with_suffix(".txt"), text)
        return wav.name

    turns = [
        {
            "turn_id": t["turn_id"],
            "speaker": t["speaker"],
            "text": t["text"],
            "audio": render(t["voice"], t["text"], t["turn_id"]),
        }
        for t in script["turns"]
    ]
    references = {
        speaker: render(ref["voice"], ref["text"], f"ref-{speaker}")
        for speaker, ref in (script.get("references") or {}).items()
    }
    dialogue = {"dialogue_id": script["dialogue_id"], "turns": turns, "references": references}
    path = out_dir / "dialogue.json"
    _write_text_atomic(path, json.dumps(dialogue, indent=2) + "\n")
    return path

"""The speaker-drift dev set (``sleuthd-bench drift``): plan it, synthesize it and write its labels.

Layout follows the speaker-drift paper (Sec. 2): every utterance is three speech segments joined
with 500 ms of digital silence, and there are equal numbers of five subtypes:

* ``non_drift`` (label 0): three sentences of one voice.
* ``hard_negative_speed`` (label 0): the same, but from segment ``boundary`` on the audio is played
  ×1.05 faster with ``sox speed`` (tempo and pitch both rise 5 %).
* ``hard_negative_noise`` (label 0): the same, but from the start of segment ``boundary`` to the end
  white Gaussian noise is added at −30 dB relative to the RMS of the clean speech (the three
  segments without the silent gaps), i.e. a 30 dB SNR.
* ``abrupt`` (label 1): segments from ``boundary`` on are spoken by another voice (``boundary`` is 1
  or 2, alternating, so the change is after the first or the second segment).
* ``smooth`` (label 1): voice A's three-segment utterance is cross-faded linearly into voice B
  speaking other sentences in the same layout, over ``FADE_SECONDS`` (3 s) from the start of A's
  second segment: both talk at once inside the fade, as in the paper's time-domain morphing.

The hard negatives change recording conditions at the same place an abrupt drift changes voice, so
a detector cannot pass by spotting "something changed here". Drift partners are a different voice of
the same gender, from the same split, built on a different engine voice (a sox variant never drifts
into its own base voice or a sibling variant): same-gender changes are the hard, realistic case.

Splits: ``fit`` uses espeak-ng voices only (thresholds are fitted there), ``transfer`` uses the
flite voices and the sox variants (reported, never fitted on).

Embedding, fitting and evaluating the set: :mod:`sleuthd_bench.drift_eval`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import soundfile as sf

from sleuthd_bench import synth

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
SUBTYPES = ("non_drift", "hard_negative_speed", "hard_negative_noise", "abrupt", "smooth")
LABELS: dict[str, int] = {
    "non_drift": 0,
    "hard_negative_speed": 0,
    "hard_negative_noise": 0,
    "abrupt": 1,
    "smooth": 1,
}
SPLITS = ("fit", "transfer")
SPLIT_FAMILIES: dict[str, frozenset[str]] = {"fit": frozenset({"espeak"}), "transfer": frozenset({"flite", "sox"})}
GAP_SECONDS = 0.5  # silence between segments (the paper's 500 ms)
SPEED_FACTOR = 1.05  # the paper's speed-up hard negative
NOISE_DB = -30.0  # the paper's noise hard negative, relative to the clean speech RMS
FADE_SECONDS = 3.0  # length of the smooth drift's linear cross-fade
MIN_SEGMENT_SECONDS = 2.5  # a shorter synthesized sentence gets a second sentence appended
LABELS_FILE = "labels.jsonl"

# Trimming the engines' own leading/trailing silence, so the gap between segments is exactly 500 ms
# and the recorded segment times are where speech starts and stops.
_TRIM_FRAME = 160  # 10 ms
_TRIM_DB_BELOW_PEAK = 40.0
_TRIM_MARGIN_S = 0.02


class DriftSetError(ValueError):
    """The drift dev set cannot be built or evaluated as asked."""


# ---------------------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class DriftSetSpec:
    """One size of the drift dev set: ``per_subtype`` utterances of each subtype in each split.

    ``*_voices``: catalogue names voice A is drawn from (empty = every voice of the split's families);
    drift partners are always drawn from all of the split's voices.
    """

    size: str
    per_subtype: int
    fit_voices: tuple[str, ...] = ()
    transfer_voices: tuple[str, ...] = ()


# small: a quick look (4 x 5 x 2 = 40 utterances); large: the paper's 32 per subtype, per split (320).
PRESETS: dict[str, DriftSetSpec] = {
    "small": DriftSetSpec(size="small", per_subtype=4),
    "large": DriftSetSpec(size="large", per_subtype=32),
}


@dataclass(frozen=True)
class UtterancePlan:
    """What one dev-set utterance is made of, before any audio exists.

    ``texts`` are voice A's three sentences; ``texts_b`` voice B's (abrupt: index i is used for
    segment i from ``boundary`` on; smooth: as many as it takes for B to speak as long as A).
    ``boundary`` (1 or 2) is the index of the first segment that is changed (another voice, or
    augmented); ``noise_seed`` seeds the noise of ``hard_negative_noise``.
    """

    uid: str
    split: str
    subtype: str
    voice_a: str
    voice_b: str | None
    texts: tuple[str, str, str]
    texts_b: tuple[str, ...] | None
    boundary: int
    noise_seed: int
    spare_texts: tuple[str, ...] = ()  # appended to a sentence that renders shorter than MIN_SEGMENT_SECONDS

    def __post_init__(self) -> None:
        if self.subtype not in LABELS:
            raise DriftSetError(f"unknown subtype {self.subtype!r}; choose from {', '.join(SUBTYPES)}")
        if self.boundary not in (1, 2):
            raise DriftSetError(f"boundary must be 1 or 2, not {self.boundary}")
        if LABELS[self.subtype] == 1 and (self.voice_b is None or self.texts_b is None):
            raise DriftSetError(f"{self.uid}: a drift utterance needs voice_b and texts_b")
        if self.voice_b == self.voice_a:
            raise DriftSetError(f"{self.uid}: voice_b must differ from voice_a")


@dataclass(frozen=True)
class DriftLabel:
    """One utterance's ground truth, as written to ``labels.jsonl`` (times in seconds of the WAV).

    ``segments``: start/end of the three speech segments (smooth: voice A's layout).
    ``change_seconds``: abrupt: ``[start of the first changed segment]``; smooth: ``[fade start,
    fade end]``; label 0: ``[]``. ``change_interval``: where the voice is changing: the 500 ms gap
    before the changed segment (abrupt) or the fade (smooth); ``None`` for label 0.
    ``condition_change_seconds``: hard negatives: start of the augmented segment.
    """

    uid: str
    path: str  # relative to the labels file
    split: str
    subtype: str
    label: int
    voice_a: str
    voice_b: str | None
    segment_voices: tuple[str, str, str]
    texts: tuple[str, ...]
    segments: tuple[tuple[float, float], ...]
    change_seconds: tuple[float, ...]
    change_interval: tuple[float, float] | None
    condition_change_seconds: float | None
    augmentation: dict[str, Any]
    duration_seconds: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DriftLabel:
        interval = d.get("change_interval")
        return cls(
            uid=str(d["uid"]),
            path=str(d["path"]),
            split=str(d["split"]),
            subtype=str(d["subtype"]),
            label=int(d["label"]),
            voice_a=str(d["voice_a"]),
            voice_b=d.get("voice_b"),
            segment_voices=tuple(d["segment_voices"]),  # type: ignore[arg-type]
            texts=tuple(d["texts"]),
            segments=tuple((float(a), float(b)) for a, b in d["segments"]),
            change_seconds=tuple(float(t) for t in d["change_seconds"]),
            change_interval=None if interval is None else (float(interval[0]), float(interval[1])),
            condition_change_seconds=(
                None if d.get("condition_change_seconds") is None else float(d["condition_change_seconds"])
            ),
            augmentation=dict(d.get("augmentation") or {}),
            duration_seconds=float(d["duration_seconds"]),
        )


def read_labels(path: Path) -> list[DriftLabel]:
    """The labels of a built dev set (``labels.jsonl``)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [DriftLabel.from_dict(json.loads(line)) for line in lines if line.strip()]


# ---------------------------------------------------------------------------------------------- planning


def split_voices(split: str, names: Sequence[str] = ()) -> list[synth.Voice]:
    """The catalogue voices of ``split`` (``names`` empty: all voices of its families)."""
    if split not in SPLIT_FAMILIES:
        raise DriftSetError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    families = SPLIT_FAMILIES[split]
    voices = [v for v in synth.catalogue() if v.family in families]
    if not names:
        return voices
    by_name = {v.name: v for v in voices}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DriftSetError(f"voice(s) {', '.join(missing)} are not {'/'.join(sorted(families))} voices of {split}")
    return [by_name[n] for n in names]


def _root_voice(voice: synth.Voice) -> str:
    return voice.base or voice.name


def drift_partners(voice: synth.Voice, pool: Sequence[synth.Voice]) -> list[synth.Voice]:
    """Voices ``voice`` may drift into: same gender, built on a different engine voice."""
    return [v for v in pool if v.gender == voice.gender and _root_voice(v) != _root_voice(voice)]


def plan_driftset(spec: DriftSetSpec, seed: int = 0, splits: Sequence[str] = SPLITS) -> list[UtterancePlan]:
    """Every utterance of the dev set, deterministic in ``seed``.

    Voice A cycles through a seeded shuffle of the split's voices so voices are used about equally;
    sentences are never reused within the set, so text cannot identify a voice.
    """
    if spec.per_subtype < 1:
        raise DriftSetError("per_subtype must be >= 1")
    n_texts = len(splits) * len(SUBTYPES) * spec.per_subtype * 10
    pool = synth.sentences(n_texts, seed=seed + 7919)
    cursor = 0

    def take(n: int) -> tuple[str, ...]:
        nonlocal cursor
        if cursor + n > len(pool):
            raise AssertionError("sentence pool exhausted")
        out = tuple(pool[cursor : cursor + n])
        cursor += n
        return out

    plans: list[UtterancePlan] = []
    for split in splits:
        rng = random.Random(f"{seed}:{split}")
        all_voices = split_voices(split)
        a_voices = split_voices(split, spec.fit_voices if split == "fit" else spec.transfer_voices)
        order = list(a_voices)
        rng.shuffle(order)
        k = 0
        for subtype in SUBTYPES:
            for i in range(spec.per_subtype):
                # Voices whose gender has no partner in this split cannot drift; skip them for every
                # subtype so the label-0 and label-1 voice mix stays the same.
                while not drift_partners(order[k % len(order)], all_voices):
                    k += 1
                voice_a = order[k % len(order)]
                k += 1
                drifts = LABELS[subtype] == 1
                voice_b = rng.choice(drift_partners(voice_a, all_voices)).name if drifts else None
                texts = take(3)
                texts_b = take(5) if drifts else None
                plans.append(
                    UtterancePlan(
                        uid=f"{split}-{subtype}-{i:02d}",
                        split=split,
                        subtype=subtype,
                        voice_a=voice_a.name,
                        voice_b=voice_b,
                        texts=(texts[0], texts[1], texts[2]),
                        texts_b=texts_b,
                        # smooth always fades from the start of the second segment, leaving at least
                        # the third segment of B after the fade; the others alternate 1, 2, 1, ...
                        boundary=1 if subtype == "smooth" else 1 + i % 2,
                        noise_seed=rng.randrange(2**31),
                        spare_texts=take(2),
                    )
                )
    return plans


# ---------------------------------------------------------------------------------------------- audio


def _trim_silence(audio: np.ndarray) -> np.ndarray:
    """Cut the engine's leading/trailing silence: frames 40 dB below the loudest 10 ms frame."""
    n = len(audio) // _TRIM_FRAME
    if n == 0:
        return audio
    energy = np.sqrt(np.mean(np.square(audio[: n * _TRIM_FRAME].reshape(n, _TRIM_FRAME), dtype=np.float64), axis=1))
    loud = np.flatnonzero(energy >= energy.max() * 10 ** (-_TRIM_DB_BELOW_PEAK / 20))
    margin = int(_TRIM_MARGIN_S * SAMPLE_RATE)
    start = max(0, int(loud[0]) * _TRIM_FRAME - margin)
    end = min(len(audio), (int(loud[-1]) + 1) * _TRIM_FRAME + margin)
    return audio[start:end]


def read_wav(path: Path) -> np.ndarray:
    """A 16 kHz WAV as mono float32 samples in [-1, 1]."""
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    if rate != SAMPLE_RATE:
        raise DriftSetError(f"{path}: {rate} Hz, expected {SAMPLE_RATE}")
    mono: np.ndarray = audio.mean(axis=1)
    return mono


def _write_wav(path: Path, audio: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".wav", dir=path.parent)
    os.close(fd)
    try:
        sf.write(tmp, np.clip(audio, -1.0, 1.0), SAMPLE_RATE, subtype="PCM_16")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class SegmentCache:
    """Synthesized, silence-trimmed sentences on disk: ``<root>/<voice>/<sha1 of text>.wav``.

    A cached file is reused when its ``.txt`` sidecar holds the same text (as in ``sleuthd_bench.synth``).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def get(self, voice_name: str, text: str, spare: Sequence[str] = ()) -> tuple[np.ndarray, str]:
        """The trimmed audio of ``text`` spoken by ``voice_name``, and the text actually spoken.

        A sentence shorter than MIN_SEGMENT_SECONDS is re-rendered with the next spare sentence
        appended, so every segment is long enough to hold a few analysis windows.
        """
        spoken = text
        for extra in (None, *spare):
            if extra is not None:
                spoken = f"{spoken} {extra}"
            audio = self._render(voice_name, spoken)
            if len(audio) >= MIN_SEGMENT_SECONDS * SAMPLE_RATE:
                return audio, spoken
        return audio, spoken

    def _render(self, voice_name: str, text: str) -> np.ndarray:
        key = hashlib.sha1(text.encode()).hexdigest()[:16]
        wav = self.root / voice_name / f"{key}.wav"
        sidecar = wav.with_suffix(".txt")
        if wav.is_file() and sidecar.is_file() and sidecar.read_text(encoding="utf-8") == text:
            return read_wav(wav)
        raw = wav.with_name(f".{key}.raw.wav")
        synth.synthesize(synth.get_voice(voice_name), text, raw)
        try:
            audio = _trim_silence(read_wav(raw))
        finally:
            raw.unlink(missing_ok=True)
        _write_wav(wav, audio)
        sidecar.write_text(text, encoding="utf-8")
        return read_wav(wav)  # what was written (16-bit), so a cached read gives the same samples


def speed_up(audio: np.ndarray, factor: float = SPEED_FACTOR) -> np.ndarray:
    """Play ``audio`` ``factor`` times faster with ``sox speed`` (pitch rises with it), back at 16 kHz."""
    synth.require_tools(["sox"])
    with tempfile.TemporaryDirectory(prefix="sleuthd-drift-") as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        sf.write(str(src), audio, SAMPLE_RATE, subtype="FLOAT")
        argv = ["sox", "-R", "-D", "-q", str(src), "-b", "32", "-e", "floating-point", str(dst),
                "speed", str(factor), "rate", "-h", str(SAMPLE_RATE)]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise synth.SynthesisError(f"sox speed failed: {proc.stderr.strip()}")
        return read_wav(dst)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def join_segments(
    parts: Sequence[np.ndarray], gap_seconds: float = GAP_SECONDS
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Concatenate segments with ``gap_seconds`` of silence; returns the audio and each segment's start/end."""
    gap = np.zeros(round(gap_seconds * SAMPLE_RATE), np.float32)
    pieces: list[np.ndarray] = []
    spans: list[tuple[float, float]] = []
    pos = 0
    for i, part in enumerate(parts):
        if i:
            pieces.append(gap)
            pos += len(gap)
        spans.append((pos / SAMPLE_RATE, (pos + len(part)) / SAMPLE_RATE))
        pieces.append(part.astype(np.float32))
        pos += len(part)
    return np.concatenate(pieces), spans


def cross_fade(a: np.ndarray, b: np.ndarray, start_seconds: float, fade_seconds: float) -> np.ndarray:
    """``a`` until ``start``, a linear cross-fade to ``b`` over ``fade_seconds``, then ``b`` (length of ``a``).

    ``b`` is cut or zero-padded to ``a``'s length: x(t) = (1 − α(t))·a(t) + α(t)·b(t), α ramps 0 → 1.
    """
    n = len(a)
    b = np.pad(b[:n], (0, max(0, n - len(b))))
    t = np.arange(n) / SAMPLE_RATE
    alpha = np.clip((t - start_seconds) / fade_seconds, 0.0, 1.0).astype(np.float32)
    out: np.ndarray = (1.0 - alpha) * a + alpha * b
    return out.astype(np.float32)


def render_utterance(plan: UtterancePlan, out_dir: Path, cache: SegmentCache) -> DriftLabel:
    """Build one utterance's audio under ``out_dir/<split>/<uid>.wav`` and return its label."""
    k = plan.boundary
    spare = plan.spare_texts
    parts: list[np.ndarray] = []
    texts: list[str] = []
    voices: list[str] = []
    for i in range(3):
        if plan.subtype == "abrupt" and i >= k:
            assert plan.voice_b is not None and plan.texts_b is not None
            voice, text = plan.voice_b, plan.texts_b[i]
        else:
            voice, text = plan.voice_a, plan.texts[i]
        audio, spoken = cache.get(voice, text, spare)
        parts.append(audio)
        texts.append(spoken)
        voices.append(voice)
    clean_rms = _rms(np.concatenate(parts))
    augmentation: dict[str, Any] = {}
    if plan.subtype == "hard_negative_speed":
        parts = [speed_up(p) if i >= k else p for i, p in enumerate(parts)]
        augmentation = {"speed_factor": SPEED_FACTOR, "tool": "sox speed"}
    audio, spans = join_segments(parts)
    change: tuple[float, ...] = ()
    interval: tuple[float, float] | None = None
    condition: float | None = None
    if plan.subtype == "abrupt":
        change = (spans[k][0],)
        interval = (spans[k - 1][1], spans[k][0])
    elif plan.subtype == "smooth":
        assert plan.voice_b is not None and plan.texts_b is not None
        # B speaks its own sentences (same 500 ms layout) until it has spoken at least as long as A,
        # so the utterance ends in B's voice rather than in silence.
        b_parts: list[np.ndarray] = []
        for text in plan.texts_b:
            b_audio, spoken = cache.get(plan.voice_b, text, spare)
            b_parts.append(b_audio)
            texts.append(spoken)
            audio_b, _ = join_segments(b_parts)
            if len(audio_b) >= len(audio):
                break
        start = spans[k][0]
        audio = cross_fade(audio, audio_b, start, FADE_SECONDS)
        change = (start, start + FADE_SECONDS)
        interval = change
        voices = [plan.voice_a, f"{plan.voice_a}->{plan.voice_b}", plan.voice_b]
    elif plan.subtype.startswith("hard_negative"):
        condition = spans[k][0]
    if plan.subtype == "hard_negative_noise":
        rng = np.random.default_rng(plan.noise_seed)
        first = round(spans[k][0] * SAMPLE_RATE)
        noise_rms = clean_rms * 10 ** (NOISE_DB / 20)
        audio = audio.copy()
        audio[first:] += (rng.standard_normal(len(audio) - first) * noise_rms).astype(np.float32)
        augmentation = {
            "noise_db": NOISE_DB,
            "noise": "white Gaussian",
            "reference": "RMS of the clean speech segments",
        }
    rel = f"{plan.split}/{plan.uid}.wav"
    _write_wav(out_dir / rel, audio)
    return DriftLabel(
        uid=plan.uid,
        path=rel,
        split=plan.split,
        subtype=plan.subtype,
        label=LABELS[plan.subtype],
        voice_a=plan.voice_a,
        voice_b=plan.voice_b,
        segment_voices=(voices[0], voices[1], voices[2]),
        texts=tuple(texts),
        segments=tuple((round(a, 4), round(b, 4)) for a, b in spans),
        change_seconds=tuple(round(t, 4) for t in change),
        change_interval=None if interval is None else (round(interval[0], 4), round(interval[1], 4)),
        condition_change_seconds=None if condition is None else round(condition, 4),
        augmentation=augmentation,
        duration_seconds=round(len(audio) / SAMPLE_RATE, 4),
    )


def build_driftset(
    out_dir: Path,
    spec: DriftSetSpec,
    *,
    seed: int = 0,
    splits: Sequence[str] = SPLITS,
    workers: int = 2,
    segment_cache: Path | None = None,
) -> Path:
    """Render every planned utterance into ``out_dir`` and write ``out_dir/labels.jsonl``; returns its path.

    Synthesized sentences are cached under ``segment_cache`` (default ``out_dir/segments``), so a
    rebuild only re-mixes. Also writes ``driftset.json`` describing the build.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = plan_driftset(spec, seed, splits)
    cache = SegmentCache(segment_cache or out_dir / "segments")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        labels = list(pool.map(lambda p: render_utterance(p, out_dir, cache), plans))
    path = out_dir / LABELS_FILE
    path.write_text("".join(label.to_json() + "\n" for label in labels), encoding="utf-8")
    description = {
        "spec": dataclasses.asdict(spec),
        "seed": seed,
        "splits": list(splits),
        "subtypes": list(SUBTYPES),
        "gap_seconds": GAP_SECONDS,
        "speed_factor": SPEED_FACTOR,
        "noise_db": NOISE_DB,
        "noise_reference": "RMS of the clean speech segments (without the silent gaps)",
        "fade_seconds": FADE_SECONDS,
        "partners": "a different voice of the same gender in the same split, on a different engine voice",
        "utterances": len(labels),
    }
    (out_dir / "driftset.json").write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    logger.info("drift dev set %s: %d utterances", out_dir, len(labels))
    return path

"""The speaker-drift dev set (``sleuthd bench drift``): build it, embed it, fit and evaluate drift detection.

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

Evaluation compares :func:`sleuthd.drift.detect_drift` with the paper's baseline: embed each of the
three segments (GE2E utterance embedding: the pooled windows at the encoder's own rate) and call
drift when the smallest cosine between adjacent segments is below a threshold. The baseline is given
the true segment boundaries (the known 500 ms silences; for smooth drift, voice A's layout), which
helps it; the detector sees only the whole utterance. Both thresholds are fitted for accuracy on
``fit``, the detector's with its window rate, ``min_side_windows`` and ``transition_level``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import soundfile as sf

from sleuthd import synth
from sleuthd.drift import DriftConfig, DriftResult, detect_drift

if TYPE_CHECKING:
    from sleuthd.engine import Engine

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
REPO = Path(__file__).resolve().parents[3]

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

    A cached file is reused when its ``.txt`` sidecar holds the same text (as in ``sleuthd.synth``).
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


# ---------------------------------------------------------------------------------------------- embedding


@dataclass(frozen=True)
class EmbeddedUtterance:
    """An utterance's windows for the detector and its three segment embeddings for the baseline.

    ``window_embeddings`` (n, D) unit vectors of windows started ``rate_per_second`` times a second,
    ``window_times`` (n, 2) their start/end seconds in the WAV; ``segment_embeddings`` (3, D): each
    segment embedded on its own (windows at the encoder's rate, pooled: GE2E's utterance embedding).
    """

    label: DriftLabel
    rate_per_second: float
    window_embeddings: np.ndarray
    window_times: np.ndarray
    segment_embeddings: np.ndarray

    def subsampled(self, every: int) -> EmbeddedUtterance:
        """The same utterance at ``rate / every``: every ``every``-th window (the same window starts
        a direct run at that rate would use, except possibly the last)."""
        if every == 1:
            return self
        return dataclasses.replace(
            self,
            rate_per_second=self.rate_per_second / every,
            window_embeddings=self.window_embeddings[::every],
            window_times=self.window_times[::every],
        )


def _file_digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


async def embed_driftset(
    labels_path: Path,
    engine: Engine,
    rate_per_second: float,
    *,
    encoder: str = "ge2e",
    show_progress: bool = False,
) -> list[EmbeddedUtterance]:
    """Embed every utterance of a built dev set with the in-process engine.

    Window embeddings go through the service's own path (loudness, VAD trimming, windows at
    ``rate_per_second``, encoder); results are cached next to the labels in
    ``embeddings-<encoder>-<rate>.npz`` and reused for WAVs whose content has not changed.
    """
    from sleuthd.bench.progress import Progress
    from sleuthd.clips import pool, prepare_waveform

    labels_path = Path(labels_path)
    root = labels_path.parent
    labels = read_labels(labels_path)
    if encoder not in engine.encoders:
        raise DriftSetError(f"unknown encoder {encoder!r}; loaded: {', '.join(sorted(engine.encoders))}")
    enc = engine.encoders[encoder]
    manifest = enc.manifest
    dense = dataclasses.replace(manifest, window=dataclasses.replace(manifest.window, rate_per_second=rate_per_second))
    cache_path = root / f"embeddings-{encoder}-{rate_per_second:g}.npz"
    cached: dict[str, np.ndarray] = {}
    digests: dict[str, str] = {}
    if cache_path.is_file():
        with np.load(cache_path) as npz:
            cached = {k: npz[k] for k in npz.files}
        digests = json.loads(str(cached.pop("__digests__"))) if "__digests__" in cached else {}

    out: list[EmbeddedUtterance] = []
    fresh: dict[str, np.ndarray] = {}
    fresh_digests: dict[str, str] = {}
    with Progress(len(labels), "embedding", enabled=show_progress) as bar:
        for label in labels:
            wav = root / label.path
            digest = _file_digest(wav)
            keys = (f"{label.uid}/emb", f"{label.uid}/times", f"{label.uid}/seg")
            if digests.get(label.uid) == digest and all(k in cached for k in keys):
                emb, times, seg = (cached[k] for k in keys)
            else:
                samples = read_wav(wav)
                clip = prepare_waveform(samples, dense, engine.vad)
                if clip.windows is None or clip.window_times is None:
                    raise DriftSetError(f"{wav}: not usable: {clip.detail}")
                emb = await enc.encode(clip.windows)
                times = clip.window_times
                seg_list = []
                for start, end in label.segments:
                    piece = samples[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)]
                    seg_clip = prepare_waveform(piece, manifest, engine.vad)
                    if seg_clip.windows is None:
                        raise DriftSetError(f"{wav}: segment {start:.2f}-{end:.2f} s not usable: {seg_clip.detail}")
                    seg_list.append(pool(await enc.encode(seg_clip.windows)))
                seg = np.stack(seg_list)
            fresh.update(dict(zip(keys, (emb, times, seg), strict=True)))
            fresh_digests[label.uid] = digest
            out.append(EmbeddedUtterance(label, rate_per_second, emb, times, seg))
            bar.advance()
    fresh["__digests__"] = np.array(json.dumps(fresh_digests))
    tmp = cache_path.with_name(f".{cache_path.stem}.tmp.npz")
    np.savez(tmp, **fresh)  # type: ignore[arg-type]
    os.replace(tmp, cache_path)
    return out


# ---------------------------------------------------------------------------------------------- scoring


def baseline_min_cosine(segment_embeddings: np.ndarray) -> float:
    """The paper's baseline score: the smallest cosine between adjacent segment embeddings."""
    s = np.asarray(segment_embeddings, dtype=np.float64)
    s = s / np.linalg.norm(s, axis=1, keepdims=True)
    return float(np.min(np.sum(s[:-1] * s[1:], axis=1)))


@dataclass(frozen=True)
class Prediction:
    """Both methods' output for one utterance (thresholds are applied later, per fit)."""

    label: DriftLabel
    rate_per_second: float
    detector: DriftResult  # at the config's threshold
    top_change: tuple[float, float] | None  # (start, end) of the strongest change, whatever its score
    baseline_score: float  # min adjacent-segment cosine
    detect_ms: float  # detect_drift wall time, milliseconds


def predict(utterances: Sequence[EmbeddedUtterance], config: DriftConfig) -> list[Prediction]:
    """Run the detector (at ``config``) and the baseline score on every utterance."""
    every = max(1, round(utterances[0].rate_per_second / config.window_rate_per_second)) if utterances else 1
    out = []
    for u in utterances:
        v = u.subsampled(every)
        if not math.isclose(v.rate_per_second, config.window_rate_per_second, rel_tol=1e-6):
            raise DriftSetError(
                f"embeddings at {u.rate_per_second:g}/s cannot give {config.window_rate_per_second:g}/s windows"
            )
        started = time.perf_counter()
        result = detect_drift(v.window_embeddings, v.window_times, config)
        elapsed = (time.perf_counter() - started) * 1000
        # The strongest change regardless of the threshold, for localization figures.
        top = detect_drift(
            v.window_embeddings, v.window_times, dataclasses.replace(config, threshold=0.0, max_changes=1)
        )
        top_span = (top.segments[0].start_seconds, top.segments[0].end_seconds) if top.segments else None
        out.append(
            Prediction(u.label, v.rate_per_second, result, top_span, baseline_min_cosine(u.segment_embeddings), elapsed)
        )
    return out


@dataclass(frozen=True)
class BinaryScores:
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float


def binary_scores(truth: Sequence[int], predicted: Sequence[bool]) -> BinaryScores:
    """Accuracy and F1 with drift (label 1) as the positive class."""
    tp = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 1 and p)
    fp = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 0 and p)
    fn = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 1 and not p)
    tn = len(truth) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return BinaryScores(len(truth), (tp + tn) / len(truth) if truth else 0.0, precision, recall, f1)


def fit_threshold(scores: Sequence[float], truth: Sequence[int], *, drift_if: str) -> tuple[float, float]:
    """The threshold with the best accuracy on (scores, truth); returns (threshold, accuracy).

    ``drift_if`` is ``"above"`` (detector: cosine distance) or ``"below"`` (baseline: cosine).
    Candidates are midpoints between consecutive distinct scores; among equally accurate ones the
    widest gap wins (the most room on both sides).
    """
    if drift_if not in ("above", "below"):
        raise ValueError("drift_if must be 'above' or 'below'")
    values = np.unique(np.asarray(scores, dtype=np.float64))
    if len(values) == 0:
        raise DriftSetError("no scores to fit a threshold on")
    edges = np.concatenate([[values[0] - 1e-3], values, [values[-1] + 1e-3]])
    best: tuple[float, float, float] | None = None  # (accuracy, gap, threshold)
    y = np.asarray(truth)
    s = np.asarray(scores, dtype=np.float64)
    for lo, hi in itertools.pairwise(edges):
        thr = 0.5 * (lo + hi)
        flagged = s > thr if drift_if == "above" else s < thr
        acc = float(np.mean(flagged == (y == 1)))
        key = (acc, hi - lo, thr)
        if best is None or key[:2] > best[:2]:
            best = key
    assert best is not None
    return float(best[2]), best[0]


# ---------------------------------------------------------------------------------------------- localization


def _distance_to_interval(t: float, interval: tuple[float, float]) -> float:
    lo, hi = interval
    return max(0.0, lo - t, t - hi)


@dataclass(frozen=True)
class Localization:
    """Where the strongest change was put, against the truth (seconds; windows = seconds x rate)."""

    uid: str
    subtype: str
    predicted: float  # middle of the strongest change's segment
    to_change: float  # |predicted - change|: abrupt: start of the changed segment; smooth: middle of the fade
    to_interval: float  # distance to the silent gap (abrupt) or the fade (smooth); 0 inside
    coverage: float  # fraction of the gap/fade inside the reported segment
    rate_per_second: float


def localize(predictions: Iterable[Prediction]) -> list[Localization]:
    out = []
    for p in predictions:
        lab = p.label
        if lab.label != 1 or p.top_change is None or lab.change_interval is None:
            continue
        start, end = p.top_change
        mid = 0.5 * (start + end)
        truth = lab.change_seconds[0] if lab.subtype == "abrupt" else 0.5 * sum(lab.change_interval)
        lo, hi = lab.change_interval
        covered = max(0.0, min(end, hi) - max(start, lo)) / (hi - lo) if hi > lo else 0.0
        out.append(
            Localization(
                uid=lab.uid,
                subtype=lab.subtype,
                predicted=mid,
                to_change=abs(mid - truth),
                to_interval=_distance_to_interval(mid, lab.change_interval),
                coverage=covered,
                rate_per_second=p.rate_per_second,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Candidate:
    """One detector setting tried on the fit split."""

    config: DriftConfig
    fit_accuracy: float
    fit_spurious_segments: int  # reported segments away from any true change (fit split)
    fit_localization_s: float  # mean distance of the strongest change to the gap/fade, fit abrupt + smooth


@dataclass(frozen=True)
class FitResult:
    config: DriftConfig  # the chosen detector setting, threshold included
    baseline_threshold: float  # min adjacent-segment cosine below this = drift
    baseline_fit_accuracy: float
    candidates: tuple[Candidate, ...]
    n_fit: int


def _split(predictions: Iterable[Prediction], split: str) -> list[Prediction]:
    return [p for p in predictions if p.label.split == split]


def shortest_turn_seconds(config: DriftConfig, window_seconds: float = 1.6) -> float:
    """Speech a turn needs before it can be searched: ``2 * min_side_windows`` windows at the config's rate."""
    return (2 * config.min_side_windows - 1) / config.window_rate_per_second + window_seconds


def spurious_segments(predictions: Iterable[Prediction]) -> tuple[int, int]:
    """(segments on a true change, segments elsewhere) among the reported segments.

    A segment is on the change when it comes within one window hop of the 500 ms gap (abrupt) or
    the fade (smooth); every segment of a label-0 utterance is elsewhere.
    """
    on, off = 0, 0
    for p in predictions:
        hop = 1.0 / p.rate_per_second
        for seg in p.detector.segments:
            interval = p.label.change_interval
            if interval is not None and seg.end_seconds >= interval[0] - hop and seg.start_seconds <= interval[1] + hop:
                on += 1
            else:
                off += 1
    return on, off


def fit_drift(
    utterances: Sequence[EmbeddedUtterance],
    *,
    rates: Sequence[float],
    min_sides: Sequence[int] = (4, 6, 8, 10),
    levels: Sequence[float] = (0.1, 0.15, 0.2),
    max_shortest_turn_seconds: float = 6.0,
    base: DriftConfig | None = None,
) -> FitResult:
    """Fit the detector and the baseline on the ``fit`` split only.

    For every (rate, min_side_windows, transition_level) the detector threshold is the accuracy-
    maximising one (:func:`fit_threshold`). The setting with the best fit accuracy wins; ties go to
    fewer spurious segments (reported away from any true change: binary segmentation on the shorter
    sides of a change is where noise gets through), then to the better localization (mean distance of
    the change point to the gap or fade), then to the lower window rate (cheaper). Settings that could
    not search a turn of ``max_shortest_turn_seconds`` of speech are not tried. The baseline threshold
    is fitted the same way.
    """
    base = base or DriftConfig()
    fit_set = [u for u in utterances if u.label.split == "fit"]
    if not fit_set:
        raise DriftSetError("the dev set has no fit split to fit on")
    truth = [u.label.label for u in fit_set]
    candidates: list[Candidate] = []
    for rate in rates:
        for m in min_sides:
            for level in levels:
                cfg = dataclasses.replace(base, window_rate_per_second=rate, min_side_windows=m, transition_level=level)
                if shortest_turn_seconds(cfg) > max_shortest_turn_seconds:
                    continue
                scores = [p.detector.score for p in predict(fit_set, cfg)]
                thr, _ = fit_threshold(scores, truth, drift_if="above")
                cfg = dataclasses.replace(cfg, threshold=round(thr, 4))
                preds = predict(fit_set, cfg)  # again, so segments are those at the fitted threshold
                acc = binary_scores(truth, [p.detector.score > cfg.threshold for p in preds]).accuracy
                loc = localize(preds)
                mean_loc = float(np.mean([x.to_interval for x in loc])) if loc else math.inf
                candidates.append(Candidate(cfg, acc, spurious_segments(preds)[1], mean_loc))
    if not candidates:
        raise DriftSetError("no detector setting can search turns as short as asked")
    best = max(
        candidates,
        key=lambda c: (
            c.fit_accuracy,
            -c.fit_spurious_segments,
            -c.fit_localization_s,
            -c.config.window_rate_per_second,
        ),
    )
    base_thr, _ = fit_threshold([baseline_min_cosine(u.segment_embeddings) for u in fit_set], truth, drift_if="below")
    base_thr = round(base_thr, 4)
    base_acc = binary_scores(truth, [baseline_min_cosine(u.segment_embeddings) < base_thr for u in fit_set]).accuracy
    return FitResult(best.config, base_thr, base_acc, tuple(candidates), len(fit_set))


# ---------------------------------------------------------------------------------------------- report


def _method_summary(preds: Sequence[Prediction], flagged: Sequence[bool], threshold: float) -> dict[str, Any]:
    scores = binary_scores([p.label.label for p in preds], flagged)
    per_subtype = {}
    for subtype in SUBTYPES:
        idx = [k for k, p in enumerate(preds) if p.label.subtype == subtype]
        if idx:
            correct = sum(1 for k in idx if flagged[k] == (preds[k].label.label == 1))
            per_subtype[subtype] = {"n": len(idx), "accuracy": correct / len(idx)}
    return {"threshold": threshold, **dataclasses.asdict(scores), "per_subtype": per_subtype}


def _localization_summary(loc: Sequence[Localization]) -> dict[str, Any]:
    if not loc:
        return {"n": 0}
    to_change = np.array([x.to_change for x in loc])
    to_interval = np.array([x.to_interval for x in loc])
    hop = 1.0 / loc[0].rate_per_second
    return {
        "n": len(loc),
        "hop_seconds": hop,
        "to_change_median_s": float(np.median(to_change)),
        "to_change_mean_s": float(np.mean(to_change)),
        "to_change_max_s": float(np.max(to_change)),
        "to_interval_median_s": float(np.median(to_interval)),
        "to_interval_mean_s": float(np.mean(to_interval)),
        "to_interval_max_s": float(np.max(to_interval)),
        "to_interval_mean_windows": float(np.mean(to_interval) / hop),
        "within_one_hop": float(np.mean(to_interval <= hop + 1e-9)),
        "coverage_mean": float(np.mean([x.coverage for x in loc])),
    }


def evaluate(utterances: Sequence[EmbeddedUtterance], fit: FitResult) -> dict[str, Any]:
    """Both methods at their fitted thresholds on every split; localization and detector runtime."""
    preds = predict(utterances, fit.config)
    report: dict[str, Any] = {
        "drift_config": dataclasses.asdict(fit.config),
        "baseline_threshold": fit.baseline_threshold,
        "splits": {},
        "localization": {},
    }
    for split in SPLITS:
        ps = _split(preds, split)
        if not ps:
            continue
        report["splits"][split] = {
            "n": len(ps),
            "detector": _method_summary(
                ps, [p.detector.score > fit.config.threshold for p in ps], fit.config.threshold
            ),
            "baseline": _method_summary(
                ps, [p.baseline_score < fit.baseline_threshold for p in ps], fit.baseline_threshold
            ),
        }
        loc = localize(ps)
        report["localization"][split] = {
            subtype: _localization_summary([x for x in loc if x.subtype == subtype]) for subtype in ("abrupt", "smooth")
        }
        # Reported segments at the fitted threshold: on a true change, or elsewhere.
        on, off = spurious_segments(ps)
        report["localization"][split]["segments"] = {"on_change": on, "elsewhere": off}
    times = np.array([p.detect_ms for p in preds])
    windows = np.array(
        [
            len(u.subsampled(max(1, round(u.rate_per_second / fit.config.window_rate_per_second))).window_times)
            for u in utterances
        ]
    )
    report["shortest_turn_seconds"] = shortest_turn_seconds(fit.config)
    report["runtime"] = {
        "detect_drift_ms_median": float(np.median(times)),
        "detect_drift_ms_p95": float(np.percentile(times, 95)),
        "detect_drift_ms_max": float(np.max(times)),
        "windows_per_turn_median": float(np.median(windows)),
        "turn_seconds_median": float(np.median([u.label.duration_seconds for u in utterances])),
    }
    report["predictions"] = [
        {
            "uid": p.label.uid,
            "split": p.label.split,
            "subtype": p.label.subtype,
            "label": p.label.label,
            "detector_score": round(p.detector.score, 5),
            "segments": [
                [round(s.start_seconds, 3), round(s.end_seconds, 3), round(s.score, 4)] for s in p.detector.segments
            ],
            "top_change": None if p.top_change is None else [round(t, 3) for t in p.top_change],
            "baseline_min_cosine": round(p.baseline_score, 5),
            "change_seconds": list(p.label.change_seconds),
            "change_interval": p.label.change_interval,
        }
        for p in preds
    ]
    return report


def drift_block(fit: FitResult, report: Mapping[str, Any]) -> dict[str, Any]:
    """The model card's ``drift`` block: the fitted setting and how it was fitted."""
    c = fit.config
    fit_det = report["splits"]["fit"]["detector"]
    how = (
        f"fitted on the fit split of `sleuthd bench drift` ({fit.n_fit} espeak-ng utterances: 5 subtypes x "
        f"{fit.n_fit // len(SUBTYPES)}, paper layout of 3 segments + 500 ms silence): threshold = the accuracy-"
        f"maximising cut of the detector score (fit accuracy {fit_det['accuracy']:.3f}, F1 {fit_det['f1']:.3f}); "
        f"window rate, min_side_windows and transition_level chosen from {len(fit.candidates)} settings by fit "
        "accuracy, then fewest segments away from a true change, then localization, then lower rate. Turns with "
        f"less than {shortest_turn_seconds(c):.1f} s of speech are too short to search (score 0)."
    )
    if "transfer" in report["splits"]:
        tr = report["splits"]["transfer"]["detector"]
        how += (
            f" Transfer split (flite + sox voices, never fitted on): accuracy {tr['accuracy']:.3f}, F1 {tr['f1']:.3f}."
        )
    return {
        "window_rate_per_second": c.window_rate_per_second,
        "threshold": c.threshold,
        "scale": "cosine_distance",
        "min_side_windows": c.min_side_windows,
        "transition_level": c.transition_level,
        "max_changes": c.max_changes,
        "how": how,
    }


def markdown_report(report: Mapping[str, Any]) -> str:
    """The comparison and localization tables as markdown."""
    short = {"non_drift": "non-drift", "hard_negative_speed": "HN speed", "hard_negative_noise": "HN noise"}
    lines = [
        "| split | method | threshold | accuracy | F1 | precision | recall | "
        + " | ".join(short.get(s, s) for s in SUBTYPES)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(SUBTYPES),
    ]
    names = {"detector": "drift detector (cos. distance >)", "baseline": "paper baseline (min adj. cos <)"}
    for split, rows in report["splits"].items():
        for method in ("detector", "baseline"):
            r = rows[method]
            subs = " | ".join(f"{r['per_subtype'][s]['accuracy']:.3f}" for s in SUBTYPES if s in r["per_subtype"])
            lines.append(
                f"| {split} (n={rows['n']}) | {names[method]} | {r['threshold']:.4f} | {r['accuracy']:.3f} | "
                f"{r['f1']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} | {subs} |"
            )
    lines += [
        "",
        "Localization of the strongest change (all drift utterances, whatever their score). to change: |predicted - "
        "true| with true = start of the changed segment (abrupt) or middle of the fade (smooth); to gap/fade: "
        "distance to the 500 ms silence before the changed segment (abrupt) or to the fade (smooth), 0 inside.",
        "",
        "| split | subtype | n | to change median / mean / max (s) | to gap/fade median / mean / max (s) | "
        "to gap/fade mean (hops) | within 1 hop | coverage of gap/fade |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for split, per in report["localization"].items():
        for subtype in ("abrupt", "smooth"):
            x = per[subtype]
            if not x.get("n"):
                continue
            lines.append(
                f"| {split} | {subtype} | {x['n']} | {x['to_change_median_s']:.2f} / {x['to_change_mean_s']:.2f} / "
                f"{x['to_change_max_s']:.2f} | {x['to_interval_median_s']:.2f} / {x['to_interval_mean_s']:.2f} / "
                f"{x['to_interval_max_s']:.2f} | {x['to_interval_mean_windows']:.2f} | {x['within_one_hop']:.3f} | "
                f"{x['coverage_mean']:.2f} |"
            )
    lines.append("")
    for split, per in report["localization"].items():
        seg = per["segments"]
        lines.append(
            f"{split}: {seg['on_change']} reported segments on a true change, {seg['elsewhere']} elsewhere "
            "(label-0 utterances or away from the change)."
        )
    rt = report["runtime"]
    lines += [
        "",
        f"detect_drift: median {rt['detect_drift_ms_median']:.2f} ms, p95 {rt['detect_drift_ms_p95']:.2f} ms, "
        f"max {rt['detect_drift_ms_max']:.2f} ms per turn (median {rt['windows_per_turn_median']:.0f} windows, "
        f"{rt['turn_seconds_median']:.1f} s turns; NumPy on this machine's CPU, embeddings not included).",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- command


@dataclass(frozen=True)
class DriftBenchResult:
    out_dir: Path
    fit: FitResult
    report: dict[str, Any]
    block: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)


def _embedding_rates(rates: Sequence[float]) -> float:
    """The one rate to embed at; every other rate must be it divided by a whole number."""
    top = max(rates)
    for r in rates:
        k = top / r
        if r <= 0 or abs(k - round(k)) > 1e-6:
            raise DriftSetError(f"window rates must be the largest one divided by whole numbers: {list(rates)}")
    return top


async def run_drift_bench(
    out_dir: Path,
    spec: DriftSetSpec,
    engine: Engine,
    *,
    seed: int = 0,
    rates: Sequence[float] = (5.0, 2.5),
    encoder: str = "ge2e",
    workers: int = 2,
    show_progress: bool = True,
) -> DriftBenchResult:
    """Build (or reuse) the dev set, embed it, fit on ``fit``, evaluate on every split and write the report.

    Writes ``labels.jsonl`` and the audio, ``report.json``, ``report.md`` and ``drift_block.json``
    (the card's ``drift`` block) under ``out_dir``.
    """
    top_rate = _embedding_rates(rates)
    labels_path = await asyncio.to_thread(build_driftset, out_dir, spec, seed=seed, workers=workers)
    utterances = await embed_driftset(labels_path, engine, top_rate, encoder=encoder, show_progress=show_progress)
    fit = fit_drift(utterances, rates=rates)
    report = evaluate(utterances, fit)
    block = drift_block(fit, report)
    report["drift_block"] = block
    report["candidates"] = [
        {
            **dataclasses.asdict(c.config),
            "fit_accuracy": c.fit_accuracy,
            "fit_spurious_segments": c.fit_spurious_segments,
            "fit_localization_s": c.fit_localization_s,
        }
        for c in fit.candidates
    ]
    files = {
        "report.json": out_dir / "report.json",
        "report.md": out_dir / "report.md",
        "drift_block.json": out_dir / "drift_block.json",
    }
    files["report.json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    files["report.md"].write_text(markdown_report(report), encoding="utf-8")
    files["drift_block.json"].write_text(json.dumps(block, indent=2) + "\n", encoding="utf-8")
    return DriftBenchResult(out_dir, fit, report, block, files)


def cmd_bench_drift(args: argparse.Namespace) -> int:
    """``sleuthd bench drift``: exit 0 on success, 2 on bad input or a missing tool/model."""
    from sleuthd.engine import Engine, EngineConfig
    from sleuthd.manifest import ManifestError

    out = Path(args.out) if args.out else REPO / "data" / "drift" / args.size
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
        _embedding_rates(rates)
        engine = Engine.load(
            EngineConfig(models_dir=args.models_dir, default_encoder=args.encoder, device=args.device, batching="clip")
        )
    except (ValueError, ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        result = asyncio.run(
            run_drift_bench(
                out,
                PRESETS[args.size],
                engine,
                seed=args.seed,
                rates=rates,
                encoder=args.encoder,
                workers=args.workers,
                show_progress=not args.quiet,
            )
        )
    except (DriftSetError, synth.SynthesisError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    print(markdown_report(result.report), end="")
    print("\ndrift block for the model card:")
    print(json.dumps(result.block, indent=2))
    print(f"report in {out} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``drift`` subcommand (``sleuthd bench drift``) to ``subparsers``."""
    from sleuthd.cli import default_models_dir

    p = subparsers.add_parser(
        "drift",
        help="build the speaker-drift dev set, fit drift detection on it and compare with the paper's baseline",
        description="Build the speaker-drift dev set (3 segments + 500 ms silence; non-drift, hard negatives "
        "(speed x1.05, noise -30 dB), abrupt and smooth drift, equal numbers; fit = espeak voices, transfer = "
        "flite + sox voices), fit the detector and the paper's min-adjacent-cosine baseline on fit, and report "
        "accuracy, F1 and localization on both splits. Prints the card's drift block.",
    )
    p.add_argument("--size", choices=sorted(PRESETS), default="small", help="small: 4, large: 32 per subtype and split")
    p.add_argument("--out", type=Path, help="output folder (default: data/drift/<size>/)")
    p.add_argument("--rates", default="5,2.5", help="window rates to try, windows/s; each the largest / a whole number")
    p.add_argument("--seed", type=int, default=0, help="seed for voices, sentences and noise (default: 0)")
    p.add_argument("--workers", type=int, default=2, help="parallel synthesis threads (default: 2)")
    p.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    p.add_argument("--encoder", default="ge2e", help="encoder to embed with (default: ge2e)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the encoder runs")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_bench_drift)

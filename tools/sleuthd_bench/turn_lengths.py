"""Short turns: cutting clips to about 2 s of speech, and corpora whose clips differ in length.

A TTS dialogue mixes long turns with short ones ("Yes.", "Of course."), and real speech comes in short
takes. Short turns give noisier embeddings: on the fit voices the same-voice cosines (10/50/90 %) fall
from 0.91/0.94/0.96 (whole clips, 4.5 s of speech) to 0.79/0.86/0.91 for cuts of 1.2-3 s (about 2 s of
speech), about where real speech of 2-3 s sits (FSDD: 0.81/0.88/0.93). The embedding jitter of
`calibrate cv` does not imitate this: it lowers every cosine alike, whatever the turn's length.

- ``short_crop``: one random cut of a clip, as WAV bytes (used by `calibrate cv --short-turns` and
  `calibrate cohort-eval --turn-lengths`, which embed the cuts in memory);
- ``cut_corpus`` (`sleuthd-bench cut`): a corpus CSV in which a share of the clips are replaced by cuts
  written to disk, so `bench make` and `replay` can measure turn-length variation through the API.
"""

from __future__ import annotations

import csv
import io
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from sleuthd_bench.corpus import read_corpus

SHORT_TURN_SECONDS = (1.2, 3.0)  # length of a cut, seconds of audio, uniform
# In a corpus of mixed lengths, the share of clips replaced by a cut (each by a coin flip).
MIXED_SHORT_SHARE = 0.5
# The share of training clips `calibrate fit` replaces by a cut of themselves, so the models see how
# much more a short genuine turn scatters (chosen by `calibrate cv --train-short-shares`;
# docs/research/auto-turn-lengths.md).
TRAIN_SHORT_SHARE = 0.0
# A clip counts as audible from the first to the last sample above this share of its peak.
AUDIBLE_SHARE = 0.01


def short_crop(path: Path, rng: random.Random) -> bytes:
    """WAV bytes of a random 1.2-3 s stretch of the clip's audible part (all of it when shorter)."""
    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    loud = np.flatnonzero(np.abs(mono) > AUDIBLE_SHARE * max(float(np.abs(mono).max()), 1e-9))
    first, last = (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, len(mono))
    length = int(rng.uniform(*SHORT_TURN_SECONDS) * rate)
    start = first if last - first <= length else rng.randrange(first, last - length)
    out = io.BytesIO()
    soundfile.write(out, mono[start : start + length], rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


@dataclass(frozen=True)
class CutCorpus:
    csv_path: Path
    clips: int
    cut: int


def cut_corpus(corpus_csv: Path, out_dir: Path, share: float, seed: int) -> CutCorpus:
    """Write ``out_dir/corpus.csv``: every clip of ``corpus_csv``, a share ``share`` of them (each by a
    coin flip) replaced by a cut written under ``out_dir/<speaker>/``; the others point at the original
    files. Raises CorpusError on a bad corpus, ValueError on a share outside [0, 1]."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--share must be between 0 and 1, not {share:g}")
    clips = read_corpus(corpus_csv)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    cut = 0
    for k, clip in enumerate(clips):
        path = clip.path
        if rng.random() < share:
            path = out_dir / clip.speaker / f"{k:05d}-{clip.path.stem}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(short_crop(clip.path, rng))
            cut += 1
        # The text of a cut is not known (it is part of the sentence), so cut rows leave it empty.
        text = clip.text if path == clip.path else ""
        rows.append((os.path.relpath(path, out_dir), clip.speaker, clip.gender, text))
    csv_path = out_dir / "corpus.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(("path", "speaker", "gender", "text"))
        writer.writerows(rows)
    return CutCorpus(csv_path, len(clips), cut)

"""The short-turn stand-in of `calibrate cv --short-turns`: cuts of real synthesized speech, embedded by
the real engine."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import soundfile as sf
from sleuthd.bench.calibrate import SHORT_TURN_SECONDS, embed_corpus, short_crop
from sleuthd.bench.corpus import CorpusClip
from sleuthd.engine import Engine

from tests.support import VOICE_A, VOICE_B, Speech


def test_a_crop_is_a_stretch_of_the_audible_part(tmp_path: Path) -> None:
    rate = 16_000
    rng = np.random.default_rng(0)
    # 1 s of silence, 4 s of sound, 1 s of silence: every crop must lie inside the sound.
    sound = np.concatenate([np.zeros(rate), 0.5 * np.sin(np.arange(4 * rate) * 0.05), np.zeros(rate)])
    sound[rate : 5 * rate] += 0.01 * rng.normal(size=4 * rate)
    path = tmp_path / "clip.wav"
    sf.write(path, sound, rate, subtype="PCM_16")
    lengths = []
    for seed in range(20):
        cut, cut_rate = sf.read(io.BytesIO(short_crop(path, random.Random(seed))))
        assert cut_rate == rate
        lengths.append(len(cut) / rate)
        assert np.abs(cut).max() > 0.3  # not a stretch of the silence
        assert np.mean(np.abs(cut) < 1e-3) < 0.01  # and none of it
    assert SHORT_TURN_SECONDS[0] <= min(lengths) and max(lengths) <= SHORT_TURN_SECONDS[1]
    assert len(set(lengths)) > 10  # lengths vary
    same = short_crop(path, random.Random(3))
    assert same == short_crop(path, random.Random(3))


def test_a_clip_shorter_than_the_cut_is_kept_whole(tmp_path: Path) -> None:
    rate = 16_000
    sound = 0.5 * np.cos(np.arange(rate) * 0.05)  # 1 s, audible from the first sample, shorter than any cut
    path = tmp_path / "short.wav"
    sf.write(path, sound, rate, subtype="PCM_16")
    cut, _ = sf.read(io.BytesIO(short_crop(path, random.Random(0))))
    assert len(cut) == len(sound)


async def test_crops_embed_as_short_turns_of_the_same_voice(engine: Engine, speech: Speech) -> None:
    clips = [CorpusClip(p, voice, "M") for voice in (VOICE_A, VOICE_B) for p in speech.clips[voice]]
    whole = await embed_corpus(engine, clips, lambda done, total: None)
    cut = await embed_corpus(engine, clips, lambda done, total: None, short_crop_seed=0)
    assert [c.source for c in whole] == [str(c.path) for c in clips]
    by_source = {c.source: c for c in whole}
    for c in cut:
        full = by_source[c.source]
        assert c.speaker == full.speaker
        assert c.speech_seconds <= SHORT_TURN_SECONDS[1] + 1e-6 and c.speech_seconds < full.speech_seconds
        # A cut of a clip still sounds like its own voice more than like the other voice's clips.
        own = [float(c.embedding @ w.embedding) for w in whole if w.speaker == c.speaker and w.source != c.source]
        other = [float(c.embedding @ w.embedding) for w in whole if w.speaker != c.speaker]
        assert np.mean(own) > np.mean(other)
    assert len(cut) >= len(clips) - 2  # a cut may fall below the minimum speech, rarely

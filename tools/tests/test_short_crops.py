"""Short turns (sleuthd_bench.turn_lengths): cuts of real synthesized speech, embedded by the real encoder,
and `sleuthd-bench cut`."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import soundfile as sf
from sleuthd.api import SpeakerEncoder
from sleuthd_bench.calibrate import embed_corpus
from sleuthd_bench.corpus import CorpusClip, read_corpus
from sleuthd_bench.turn_lengths import SHORT_TURN_SECONDS, cut_corpus, short_crop

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


async def test_crops_embed_as_short_turns_of_the_same_voice(speaker_encoder: SpeakerEncoder, speech: Speech) -> None:
    clips = [CorpusClip(p, voice, "M") for voice in (VOICE_A, VOICE_B) for p in speech.clips[voice]]
    whole = await embed_corpus(speaker_encoder, clips, lambda done, total: None)
    cut = await embed_corpus(speaker_encoder, clips, lambda done, total: None, short_crop_seed=0)
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


def write_corpus(path: Path, speech: Speech) -> list[Path]:
    clips = [p for voice in (VOICE_A, VOICE_B) for p in speech.clips[voice]]
    lines = ["path,speaker,gender,text"] + [f"{p},{p.parent.name},M,a sentence" for p in clips]
    path.write_text("\n".join(lines) + "\n")
    return clips


def test_bench_cut_writes_a_corpus_of_mixed_lengths(tmp_path: Path, speech: Speech) -> None:
    from sleuthd_bench.cli import main

    originals = write_corpus(tmp_path / "corpus.csv", speech)
    out = tmp_path / "mixed"
    assert main(["cut", str(tmp_path / "corpus.csv"), "--out", str(out), "--seed", "2"]) == 0
    rows = read_corpus(out / "corpus.csv")
    assert [r.speaker for r in rows] == [p.parent.name for p in originals]
    cut = [r for r, p in zip(rows, originals, strict=True) if r.path != p.resolve()]
    assert 0 < len(cut) < len(rows)
    for r, p in zip(rows, originals, strict=True):
        if r in cut:  # a new file under OUT/<speaker>/, shorter than its clip, without the clip's text
            assert r.path.parent == (out / r.speaker).resolve() and r.text == ""
            assert sf.info(r.path).duration <= min(SHORT_TURN_SECONDS[1], sf.info(p).duration) + 1e-3
        else:
            assert r.text == "a sentence"
    # The same seed makes the same corpus; every clip or none with share 1 or 0.
    again = tmp_path / "again"
    assert main(["cut", str(tmp_path / "corpus.csv"), "--out", str(again), "--seed", "2"]) == 0
    assert [r.path.name for r in read_corpus(again / "corpus.csv")] == [r.path.name for r in rows]
    assert cut_corpus(tmp_path / "corpus.csv", tmp_path / "all", 1.0, 0).cut == len(rows)
    assert cut_corpus(tmp_path / "corpus.csv", tmp_path / "none", 0.0, 0).cut == 0


def test_bench_cut_refuses_a_bad_share_or_corpus(tmp_path: Path, speech: Speech, capsys) -> None:
    from sleuthd_bench.cli import main

    write_corpus(tmp_path / "corpus.csv", speech)
    assert main(["cut", str(tmp_path / "corpus.csv"), "--out", str(tmp_path / "o"), "--share", "1.5"]) == 2
    assert "--share must be between 0 and 1" in capsys.readouterr().err
    assert main(["cut", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read corpus" in capsys.readouterr().err

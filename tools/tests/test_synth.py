"""Tests for sleuthd_bench.synth: real synthesized speech from espeak-ng / flite / sox, and FSDD turns."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd_bench import synth
from sleuthd_bench.synth import MissingToolError, SynthesisError, Voice

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in synth.TOOLS),
    reason="needs espeak-ng, flite and sox (make setup)",
)

TEXT = "The quiet engineer carried two heavy suitcases to the station before lunch."


# The committed FSDD subset (digits 0-9, takes 0 and 1, six speakers; see its README).
FSDD_SUBSET = Path(__file__).resolve().parents[2] / "service" / "sleuthd" / "export" / "parity_clips"


def _read(path: Path) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(str(path), dtype="float64")
    return audio, int(rate)


def _median_f0(audio: np.ndarray, rate: int, fmin: float = 60.0, fmax: float = 450.0) -> float:
    """Median F0 of the loud frames, by normalised autocorrelation (good enough for TTS voices)."""
    frame, hop = int(0.040 * rate), int(0.010 * rate)
    lag_min, lag_max = int(rate / fmax), int(rate / fmin)
    frames = [audio[i : i + frame] for i in range(0, len(audio) - frame, hop)]
    energies = np.array([np.sqrt(np.mean(f**2)) for f in frames])
    loud = energies > 0.3 * np.percentile(energies, 95)
    f0s = []
    for f, is_loud in zip(frames, loud, strict=True):
        if not is_loud:
            continue
        f = (f - f.mean()) * np.hanning(frame)
        ac = np.correlate(f, f, mode="full")[frame - 1 :]
        if ac[0] <= 0:
            continue
        ac = ac / ac[0]
        lag = lag_min + int(np.argmax(ac[lag_min:lag_max]))
        if ac[lag] > 0.5:  # voiced
            f0s.append(rate / lag)
    assert len(f0s) > 20, "too few voiced frames to estimate F0"
    return float(np.median(f0s))


# ---------------------------------------------------------------------------------------------
# Catalogue, sentences, tool checks (no engines needed)
# ---------------------------------------------------------------------------------------------


def test_catalogue_shape() -> None:
    voices = synth.catalogue()
    names = [v.name for v in voices]
    assert len(names) == len(set(names))
    by_family = {f: [v for v in voices if v.family == f] for f in ("espeak", "flite", "sox")}
    assert len(by_family["espeak"]) >= 28
    assert {v.name for v in by_family["flite"]} >= {"flite-slt", "flite-rms", "flite-awb"}
    sox = by_family["sox"]
    assert len(sox) >= 12
    assert {v.gender for v in sox} == {"M", "F"}
    by_name = {v.name: v for v in voices}
    for v in sox:
        assert v.base in by_name, f"{v.name}: base voice missing from the catalogue"
        base = by_name[v.base]
        assert v.gender == base.gender and v.engine_args == base.engine_args and v.sox_effects
    assert {by_name[v.base].family for v in sox if v.base} == {"espeak", "flite"}
    assert not synth.DROPPED_VOICES & set(names)
    assert synth.get_voice("flite-slt").gender == "F"
    with pytest.raises(KeyError):
        synth.get_voice("no-such-voice")


def test_voice_validation() -> None:
    with pytest.raises(ValueError):
        Voice("x", "espeak", "X", ("espeak-ng", "-v", "en-us"))
    with pytest.raises(ValueError):
        Voice("x", "sox", "M", ("flite", "-voice", "rms"))  # variant without base/effects


def test_sentences_deterministic_and_varied() -> None:
    a = synth.sentences(40, seed=1)
    assert a == synth.sentences(40, seed=1)
    b = synth.sentences(40, seed=2)
    assert a != b
    assert len(set(a)) == 40
    for s in a:
        assert 8 <= len(s.split()) <= 16, s
        assert s[0].isupper() and s[-1] in ".?", s
    assert synth.sentences(0, seed=1) == []


def test_require_tools_reports_missing_tool() -> None:
    with pytest.raises(MissingToolError, match="make setup"):
        synth.require_tools(["sleuthd-no-such-tool-xyz"])
    synth.require_tools([])  # nothing required, nothing raised


# ---------------------------------------------------------------------------------------------
# Synthesis
# ---------------------------------------------------------------------------------------------


@needs_tools
@pytest.mark.parametrize("name", ["espeak-m3", "flite-slt", "flite-kal16", "espeak-f2-p-200"])
def test_synthesize_clip_format(tmp_path: Path, name: str) -> None:
    out = synth.synthesize(synth.get_voice(name), TEXT, tmp_path / "clip.wav")
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    assert 1.0 <= info.duration <= 8.0
    audio, _ = _read(out)
    assert np.sqrt(np.mean(audio**2)) > 0.02
    assert not list(tmp_path.glob(".*")), "temporary files left behind"


@needs_tools
def test_synthesize_is_deterministic(tmp_path: Path) -> None:
    voice = synth.get_voice("espeak-andy-p-150-tr+3")
    a = synth.synthesize(voice, TEXT, tmp_path / "a.wav").read_bytes()
    b = synth.synthesize(voice, TEXT, tmp_path / "b.wav").read_bytes()
    assert a == b


@needs_tools
def test_different_voices_sound_different(tmp_path: Path) -> None:
    male, _ = _read(synth.synthesize(synth.get_voice("espeak-m3"), TEXT, tmp_path / "m.wav"))
    female, _ = _read(synth.synthesize(synth.get_voice("espeak-f2"), TEXT, tmp_path / "f.wav"))
    assert _median_f0(female, 16000) > 1.3 * _median_f0(male, 16000)
    slt, _ = _read(synth.synthesize(synth.get_voice("flite-slt"), TEXT, tmp_path / "slt.wav"))
    rms, _ = _read(synth.synthesize(synth.get_voice("flite-rms"), TEXT, tmp_path / "rms.wav"))
    assert _median_f0(slt, 16000) > 1.3 * _median_f0(rms, 16000)


@needs_tools
def test_sox_variant_differs_from_base(tmp_path: Path) -> None:
    variant = synth.get_voice("espeak-m3-p+200")
    assert variant.base == "espeak-m3"
    base_audio, _ = _read(synth.synthesize(synth.get_voice("espeak-m3"), TEXT, tmp_path / "b.wav"))
    var_audio, _ = _read(synth.synthesize(variant, TEXT, tmp_path / "v.wav"))
    ratio = _median_f0(var_audio, 16000) / _median_f0(base_audio, 16000)
    assert 1.06 < ratio < 1.19  # +200 cents = x1.122
    assert abs(len(var_audio) - len(base_audio)) < 0.05 * len(base_audio)  # pitch keeps the tempo


@needs_tools
def test_unknown_engine_voice_is_an_error(tmp_path: Path) -> None:
    # Both engines silently fall back to a default voice for unknown names; synthesize must not.
    bogus = Voice("espeak-bogus", "espeak", "M", ("espeak-ng", "-v", "en-us+nosuchvariant"))
    with pytest.raises(SynthesisError, match="nosuchvariant"):
        synth.synthesize(bogus, TEXT, tmp_path / "x.wav")
    bogus_flite = Voice("flite-bogus", "flite", "M", ("flite", "-voice", "nosuchvoice"))
    with pytest.raises(SynthesisError, match="nosuchvoice"):
        synth.synthesize(bogus_flite, TEXT, tmp_path / "y.wav")
    with pytest.raises(ValueError):
        synth.synthesize(synth.get_voice("espeak-m3"), "   ", tmp_path / "z.wav")
    assert not any(tmp_path.iterdir())


@needs_tools
def test_every_catalogue_voice_is_distinct(tmp_path: Path) -> None:
    csv_path = synth.build_corpus(tmp_path, synth.catalogue(), clips_per_voice=1, seed=3, workers=2)
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(synth.catalogue())
    digests = {hashlib.sha256((tmp_path / r["path"]).read_bytes()).hexdigest() for r in rows}
    assert len(digests) == len(rows)


# ---------------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------------


@needs_tools
def test_build_corpus_and_cache(tmp_path: Path) -> None:
    voices = [synth.get_voice(n) for n in ("espeak-m3", "flite-slt", "flite-rms-p-200")]
    calls: list[tuple[int, int]] = []
    out = tmp_path / "corpus"
    csv_path = synth.build_corpus(out, voices, clips_per_voice=2, seed=11, progress=lambda d, t: calls.append((d, t)))
    assert csv_path == out / "corpus.csv"
    with csv_path.open(newline="") as fh:
        assert fh.readline().strip() == "path,speaker,gender,text"
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6
    assert {r["speaker"] for r in rows} == {v.name for v in voices}
    assert len({r["text"] for r in rows}) == 6, "text must not identify the speaker"
    for r in rows:
        rel = Path(r["path"])
        assert not rel.is_absolute() and rel.parts[0] == r["speaker"]
        assert (out / rel).is_file()
        assert r["gender"] == synth.get_voice(r["speaker"]).gender
    assert calls[-1] == (6, 6)
    meta = {v["name"]: v for v in json.loads((out / "voices.json").read_text())["voices"]}
    assert (meta["flite-rms-p-200"]["family"], meta["flite-rms-p-200"]["base"]) == ("sox", "flite-rms")

    mtimes = {r["path"]: (out / r["path"]).stat().st_mtime_ns for r in rows}
    calls.clear()
    again = synth.build_corpus(out, voices, clips_per_voice=2, seed=11, progress=lambda d, t: calls.append((d, t)))
    assert again.read_text() == csv_path.read_text()
    assert {p: (out / p).stat().st_mtime_ns for p in mtimes} == mtimes
    assert calls == [(6, 6)]  # everything cached

    # A voice's texts do not depend on which other voices are in the corpus.
    alone = synth.build_corpus(tmp_path / "alone", voices[:1], clips_per_voice=2, seed=11)
    with alone.open(newline="") as fh:
        alone_texts = [r["text"] for r in csv.DictReader(fh)]
    assert alone_texts == [r["text"] for r in rows if r["speaker"] == voices[0].name]


def _two_speaker_fsdd(tmp_path: Path) -> Path:
    """An ``fsdd.csv`` in FSDD's own format over two speakers of the committed subset."""
    wavs = sorted(FSDD_SUBSET.glob("*_*_*.wav"))
    assert wavs, f"FSDD test subset missing under {FSDD_SUBSET}"
    speakers = sorted({w.stem.split("_")[1] for w in wavs})[:2]
    dst = tmp_path / "fsdd"
    dst.mkdir()
    with (dst / "fsdd.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "speaker", "gender", "text"])
        for w in wavs:
            digit, speaker, _take = w.stem.split("_")
            if speaker in speakers:
                writer.writerow([str(w), speaker, "M", digit])
    return dst


def test_build_fsdd_corpus(tmp_path: Path) -> None:
    fsdd = _two_speaker_fsdd(tmp_path)
    csv_path = synth.build_fsdd_corpus(fsdd, tmp_path / "out", turns_per_speaker=2, seed=5)
    with csv_path.open(newline="") as fh:
        assert fh.readline().strip() == "path,speaker,gender,text"
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and len({r["speaker"] for r in rows}) == 2
    digit_words = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
    for r in rows:
        assert r["path"].startswith(r["speaker"] + "/")
        info = sf.info(str(csv_path.parent / r["path"]))
        assert (info.samplerate, info.channels) == (16000, 1)
        assert 2.0 <= info.duration <= 8.0
        words = r["text"].split()
        assert 5 <= len(words) <= 9 and set(words) <= digit_words

    same = synth.build_fsdd_corpus(fsdd, tmp_path / "same", turns_per_speaker=2, seed=5)
    other = synth.build_fsdd_corpus(fsdd, tmp_path / "other", turns_per_speaker=2, seed=6)
    first = rows[0]["path"]
    assert (same.parent / first).read_bytes() == (csv_path.parent / first).read_bytes()
    assert (other.parent / first).read_bytes() != (csv_path.parent / first).read_bytes()

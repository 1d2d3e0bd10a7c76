"""Pitch matching (--pitch-match-octaves, on by default at 0.25) through the real server: a turn of the speaker's own
voice moved in pitch the way a resampling pitch control moves it (spectral envelope with the pitch) is flagged as
another voice with it off, and cleared on its copy moved back to the speaker's pitch; another voice within reach stays
flagged; a voice closer than the lower bound is not moved; an octave away is never moved; a stream gives
CheckDialogue's verdicts. The pitch estimate and the move themselves are checked on
synthetic tones."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.bandwidth import low_pass
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd.audio.pitch import median_pitch_octaves, shift_pitch
from sleuthd.config import ConfigError, EngineConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd.engine.facade import Engine
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc
from sleuthd_bench import synth

from .offline_judges import assert_offline_flags_as_served, offline_judges
from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, calls_to, check_request, copies_made, encode_wav
from .test_band_matching import _assert_consistent_as_checked, _stream

SLOT = 2
DEFAULT = 0.25  # the served default: the lowest lower bound that leaves the dev transfer split's sox variants flagged
SCREENED = 0.15  # session 24's setting (chosen on the matrix's train split), which reaches voices 0.15-0.25 apart


def _samples(wav: bytes) -> np.ndarray:
    return to_model_rate(decode_encoded(wav, 60.0)).samples


def moved(wav: bytes, steps: int) -> bytes:
    """The clip moved ``steps`` quarter tones, as a resampling pitch shift (sox `pitch`) or a wrong playback rate."""
    return encode_wav(shift_pitch(_samples(wav), steps), SAMPLE_RATE)


def band_limited(wav: bytes) -> bytes:
    """The clip low-passed at 5 kHz: room above its band for a shift up (as an 8 kHz recording has at 16 kHz)."""
    return encode_wav(low_pass(_samples(wav), 5000.0).astype(np.float32), SAMPLE_RATE)


def espeak_native(voice: str, k: int) -> bytes:
    """A sentence from espeak-ng at its own rate (22.05 kHz: a band up to about 11 kHz, as TTS engines send)."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["espeak-ng", "-v", voice, "-w", f"{d}/a.wav", synth.sentences(8, seed=5)[k]], check=True)
        return Path(f"{d}/a.wav").read_bytes()


def moved_native(wav: bytes, steps: int) -> bytes:
    """The clip moved at its own rate (a shift up keeps what moves above 8 kHz, below the file's Nyquist)."""
    x, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return encode_wav(shift_pitch(x, steps, rate), rate)


def pitch_steps(made: list[Any]) -> list[int]:
    """The pitch steps of the copies moved in pitch among those made (support.copies_made)."""
    return [c.pitch_steps for c in made if c.pitch_steps]


def pitch_matching(engine: Engine, monkeypatch: pytest.MonkeyPatch, octaves: float) -> None:
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, pitch_match_octaves=octaves))


@pytest.mark.parametrize(
    ("voice", "steps", "limited"), [(VOICE_B, -8, False), (VOICE_F, -8, False), (VOICE_C, 8, True)]
)
async def test_a_turn_of_the_same_voice_moved_in_pitch_is_cleared_on_its_copy_moved_back(
    stub: pb_grpc.SleuthStub,
    speech: Speech,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    voice: str,
    steps: int,
    limited: bool,
) -> None:
    """A third of an octave down (full band), or up (a band-limited voice: a 16 kHz file shifted up at full band
    lost the top of its band at 8 kHz, and the copy moved back is then narrower than the other turns: docs/auto.md;
    a file at 22 kHz keeps it, the test after this one)."""
    audio = [speech.wav_bytes(voice, k) for k in range(5)]
    if limited:
        audio = [band_limited(a) for a in audio]
    audio[SLOT] = moved(audio[SLOT], steps)
    assert EngineConfig().pitch_match_octaves == engine.config.pitch_match_octaves == DEFAULT
    pitch_matching(engine, monkeypatch, 0.0)
    off = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert off.turns[SLOT].status == pb.INCONSISTENT and off.turns[SLOT].score > 0.9, off.turns[SLOT].detail
    assert "pitch matched" not in off.turns[SLOT].detail

    pitch_matching(engine, monkeypatch, DEFAULT)
    copies = copies_made(monkeypatch)
    on = await stub.CheckDialogue(check_request(audio), timeout=120)
    turn = on.turns[SLOT]
    assert turn.status == pb.CONSISTENT and turn.score < 0.5, turn.detail
    assert on.speakers[0].consistent
    # One copy, moved back by about what the turn was moved (the estimate is the median of the other turns').
    made = pitch_steps(copies)
    assert len(made) == 1 and abs(made[0] + steps) <= 2, made
    assert re.search(
        r"pitch matched: judged again with a copy moved in pitch \(and spectral envelope\) to the median pitch of "
        rf"speaker 'B''s other clips \(turn 't{SLOT}' [+-]0\.\d\d octave\); auto",
        turn.detail,
    ), turn.detail
    # Only the flagged turn changed: the others keep their first verdicts, bit for bit.
    for k in range(5):
        if k != SLOT:
            assert on.turns[k] == off.turns[k]


@pytest.mark.parametrize("voice", ["en-us+m7", "en-us+f4"])
async def test_a_turn_sent_at_22_khz_moved_up_is_cleared_on_its_copy_moved_back_at_its_own_rate(
    stub: pb_grpc.SleuthStub, engine: Engine, monkeypatch: pytest.MonkeyPatch, voice: str
) -> None:
    """A third of an octave up at full band: the copy is moved back before the 16 kHz decode, so the band the turn
    had between 8 and 10 kHz comes back within the model's band (moved after the decode, it is lost, and the copy
    is narrower than the other turns)."""
    audio = [espeak_native(voice, k) for k in range(5)]
    audio[SLOT] = moved_native(audio[SLOT], 8)
    pitch_matching(engine, monkeypatch, 0.0)
    off = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert off.turns[SLOT].status == pb.INCONSISTENT, off.turns[SLOT].detail
    pitch_matching(engine, monkeypatch, DEFAULT)
    on = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert on.turns[SLOT].status == pb.CONSISTENT and "pitch matched" in on.turns[SLOT].detail, on.turns[SLOT].detail
    assert on.speakers[0].consistent


def test_a_copy_is_moved_at_the_clips_own_rate() -> None:
    """A 10 kHz tone in a 24 kHz file moved down half an octave is at 7.07 kHz: within the model's band."""
    rate = 24000
    t = np.arange(rate) / rate
    wav = encode_wav((0.3 * np.sin(2 * np.pi * 10000 * t)).astype(np.float32), rate)
    out = decode(AudioInput(wav), 60.0, pitch_steps=-12)
    assert out.sample_rate_hz == SAMPLE_RATE
    spectrum = np.abs(np.fft.rfft(out.samples))
    peak_hz = np.argmax(spectrum) * SAMPLE_RATE / len(out.samples)
    assert peak_hz == pytest.approx(10000 / 2**0.5, abs=20)


async def test_another_voice_a_fifth_of_an_octave_away_stays_flagged_moved_or_not(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flite's slt (about 171 Hz) in a dialogue of espeak-ng's f2 (about 197 Hz): 0.2 octave apart. At the default
    lower bound (0.25) her turn is not moved at all; at 0.15 it is moved, and still flagged (its copy is no closer to
    f2 than the guard allows, or judged inconsistent again)."""
    audio = [speech.wav_bytes(VOICE_F, k) for k in range(5)]
    audio[SLOT] = speech.wav_bytes(VOICE_C, 0)
    for octaves, moves in ((DEFAULT, 0), (SCREENED, 1)):
        pitch_matching(engine, monkeypatch, octaves)
        copies = copies_made(monkeypatch)
        v = await stub.CheckDialogue(check_request(audio), timeout=120)
        made = pitch_steps(copies)
        assert len(made) == moves and all(m > 0 for m in made), (octaves, made)  # moved up towards f2, if at all
        assert list(v.speakers[0].inconsistent_turn_ids) == [f"t{SLOT}"], [(t.status, t.detail) for t in v.turns]
        assert "pitch matched" not in v.turns[SLOT].detail


async def test_a_voice_an_octave_away_is_never_moved(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """espeak-ng's m3 (about 106 Hz) in f2's dialogue: 0.9 octave, beyond the ceiling (another gender's jump)."""
    pitch_matching(engine, monkeypatch, DEFAULT)
    copies = copies_made(monkeypatch)
    audio = [speech.wav_bytes(VOICE_F, k) for k in range(5)]
    audio[SLOT] = speech.wav_bytes(VOICE_A, 0)
    v = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert pitch_steps(copies) == []
    assert v.turns[SLOT].status == pb.INCONSISTENT


async def test_a_clips_pitch_is_measured_once_across_requests(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RankCandidates judges its context once per candidate, and a regeneration loop sends it again: each clip's
    pitch is remembered by its digest, as its embeddings are."""
    from sleuthd.encoders import embedder

    measured = calls_to(monkeypatch, embedder, "clip_pitch")
    pitch_matching(engine, monkeypatch, DEFAULT)
    audio = [speech.wav_bytes(VOICE_F, k) for k in range(5)]
    audio[SLOT] = moved(audio[SLOT], -7)  # a move no other test makes: these clips are new to the server
    first = await stub.CheckDialogue(check_request(audio), timeout=120)
    # The moved clip at least (the others may have been measured by an earlier test of this session's server).
    assert 1 <= (n := len(measured)) <= 5 and first.turns[SLOT].status == pb.CONSISTENT
    again = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert len(measured) == n and again == first


async def test_a_stream_pitch_matches_as_check_dialogue_does(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pitch_matching(engine, monkeypatch, DEFAULT)
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[SLOT] = moved(audio[SLOT], -8)
    checked = await stub.CheckDialogue(check_request(audio), timeout=120)
    updates, final = await _stream(stub, audio)
    # With two turns of the speaker before it, the moved turn is judged again on its copy as it arrives.
    _assert_consistent_as_checked(checked, updates, final, SLOT, "pitch")


async def test_the_offline_judges_pitch_match_as_the_server_does(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    """`sleuthd-bench robustness report|verify` pitch match from the clips' measured pitches and their moved copies'
    embeddings (`robustness embed --pitched`): on a dialogue with a turn of the speaker's own voice moved a third of
    an octave down, under S1, S2 and S3, they flag exactly the turns the server flags; under S1 that is none, where
    without pitch matching they flag the moved turn."""
    from sleuthd_bench.robustness import judges

    from .offline_judges import SERVER_MATCHING

    clips = {f"b{k}.wav": speech.wav_bytes(VOICE_B, k) for k in range(6)}
    clips["b2.wav"] = moved(clips["b2.wav"], -8)
    clips["f0.wav"], clips["a0.wav"] = speech.wav_bytes(VOICE_F, 0), speech.wav_bytes(VOICE_A, 0)
    line = {
        "dialogue_id": "d0", "source": "test", "target_speaker": "B", "reference": "b5.wav",
        "target_turns": [f"b{k}.wav" for k in range(5)], "altered_turn": 4, "s2_audio": "f0.wav", "s3_audio": "a0.wav",
    }  # fmt: skip
    offline = await offline_judges(tmp_path, models_dir, clips, [line])
    assert offline.pitch is not None and offline.pitch.octaves == DEFAULT == EngineConfig().pitch_match_octaves

    def check(inst: Any, served: pb.DialogueVerdict) -> None:
        if inst.scenario == "S1":
            assert "pitch matched" in served.turns[SLOT].detail, served.turns[SLOT].detail
            unmatched = judges.evidence_flags(inst, offline.blend, offline.calibration, *SERVER_MATCHING)[0]
            assert unmatched == {SLOT}

    await assert_offline_flags_as_served(stub, tmp_path, offline, check)


@pytest.mark.parametrize("hz", [95.0, 140.0, 210.0])
def test_the_median_pitch_of_a_voiced_tone_and_of_its_copy_moved_in_pitch(hz: float) -> None:
    t = np.arange(int(2.0 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = sum(np.sin(2 * np.pi * hz * h * t) / h for h in range(1, 12)).astype(np.float32) * 0.1
    assert median_pitch_octaves(tone) == pytest.approx(np.log2(hz), abs=0.01)
    for steps in (-8, 5):
        copy = shift_pitch(tone, steps)
        assert len(copy) == pytest.approx(len(tone) / 2 ** (steps / 24), abs=2)  # the pace moves with it
        assert median_pitch_octaves(copy) == pytest.approx(np.log2(hz) + steps / 24, abs=0.01)
    assert median_pitch_octaves(np.zeros(SAMPLE_RATE, np.float32)) is None  # silence
    assert median_pitch_octaves(tone[:400]) is None  # shorter than one frame
    rng = np.random.default_rng(0)
    assert median_pitch_octaves(rng.normal(0, 0.1, SAMPLE_RATE).astype(np.float32)) is None  # noise


@pytest.mark.parametrize("bad", [-0.1, 0.5, 0.8, float("nan")])
def test_pitch_match_octaves_outside_its_range_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match="pitch_match_octaves"):
        EngineConfig(pitch_match_octaves=bad)

"""Length matching (--length-match-ratio, on by default at 0.5) through the real server: a short turn of the speaker's
own voice among long ones, flagged with it off, is judged again against the speaker's other clips cut to its length
and cleared; a short turn of another voice stays flagged; a stream gives CheckDialogue's verdicts; the offline judges
(`sleuthd-bench robustness report|verify`) flag what the server flags. The rule and the cut are checked alone too."""

from __future__ import annotations

import dataclasses
import io
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from sleuthd.api import MAX_PIECES, short_turns
from sleuthd.audio import SAMPLE_RATE
from sleuthd.config import ConfigError, EngineConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ChannelCopy, decode, kept_samples, speech_cut
from sleuthd.engine.facade import Engine
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .offline_judges import assert_offline_flags_as_served, offline_judges
from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, calls_to, check_request, enc, encode_wav
from .test_band_matching import _assert_consistent_as_checked, _stream

SLOT = 3
DEFAULT = 0.5  # the served default (chosen on the matrix's train split)
NOTE = re.compile(
    r"length matched: judged again against speaker 'B''s other clips cut to this turn's length \(1\.\d\d s of trimmed "
    r"speech\); auto"
)


def short(wav: bytes, seconds: float = 1.2, start: float = 0.3) -> bytes:
    """``seconds`` of the clip from ``start``: a short turn (1.2 s of speech) among the test voices' 4-5 s sentences."""
    x, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return encode_wav(x[int(start * rate) : int((start + seconds) * rate)], rate)


def with_reference(audio: list[bytes], reference: bytes) -> pb.CheckDialogueRequest:
    request = check_request(audio)
    request.references.add(speaker="B", audio=enc(reference))
    return request


def length_matching(engine: Engine, monkeypatch: pytest.MonkeyPatch, ratio: float) -> None:
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, length_match_ratio=ratio))


def cuts_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by the length of every cut copy the server makes from here on."""
    from sleuthd.encoders import embedder

    made: list[int] = []
    cut = embedder.speech_cut

    def counting(audio: Any, max_seconds: float, samples: int, *args: Any) -> Any:
        made.append(samples)
        return cut(audio, max_seconds, samples, *args)

    monkeypatch.setattr(embedder, "speech_cut", counting)
    return made


def dialogue(speech: Speech, slot_audio: bytes) -> tuple[list[bytes], bytes]:
    """espeak-ng's f2: five sentences with ``slot_audio`` in SLOT, and a sixth as the reference."""
    audio = [speech.wav_bytes(VOICE_F, k) for k in range(5)]
    audio[SLOT] = slot_audio
    return audio, speech.wav_bytes(VOICE_F, 6)


async def test_a_short_turn_of_the_speakers_own_voice_is_cleared_against_cuts_of_its_other_clips(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.2 s of f2's speech among four 4.5-5.5 s turns and a 5 s reference: flagged as another voice (0.88) with length
    matching off; judged again against cuts of the other four turns and the reference to its length, clearly the
    speaker's (0.02), and cleared."""
    audio, reference = dialogue(speech, short(speech.wav_bytes(VOICE_F, SLOT)))
    assert EngineConfig().length_match_ratio == engine.config.length_match_ratio == DEFAULT
    length_matching(engine, monkeypatch, 0.0)
    off = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    assert off.turns[SLOT].status == pb.INCONSISTENT and off.turns[SLOT].score > 0.8, off.turns[SLOT].detail

    length_matching(engine, monkeypatch, DEFAULT)
    cuts = cuts_made(monkeypatch)
    on = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    turn = on.turns[SLOT]
    assert turn.status == pb.CONSISTENT and turn.score < 0.2, turn.detail
    assert NOTE.search(turn.detail), turn.detail
    assert on.speakers[0].consistent
    # The other four turns and the reference, each cut to the short turn's trimmed length (its speech and the VAD's
    # padding: a little over 1.2 s, under the clip's 1.2 s plus padding at both ends).
    n = kept_samples(AudioInput(audio[SLOT]), 60.0, -30.0, engine.models.vad)
    assert cuts == [n] * 5 and 1.0 * SAMPLE_RATE < n <= 1.5 * SAMPLE_RATE, (cuts, n)
    # Only the short turn changed: the others keep their first verdicts, bit for bit.
    for k in range(5):
        if k != SLOT:
            assert on.turns[k] == off.turns[k]
    # The cuts are remembered with the embeddings: the same dialogue again makes none.
    again = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    assert len(cuts) == 5 and again == on


@pytest.mark.parametrize("pitch", [0.25, 0.0])
async def test_a_dialogue_is_scored_once_before_length_matching_with_pitch_matching_on_or_off(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch, pitch: float
) -> None:
    """The verdicts reuse the scores the candidates were chosen from: one scoring of the dialogue's pools per request
    (none of its speakers is channel matched), not one more for the verdicts when pitch matching is off."""
    from sleuthd.judgment import dialogue as dialogue_module

    audio, reference = dialogue(speech, short(speech.wav_bytes(VOICE_F, SLOT)))
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, pitch_match_octaves=pitch))
    calls = calls_to(monkeypatch, dialogue_module, "score_speakers")
    verdict = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    assert verdict.turns[SLOT].status == pb.CONSISTENT and NOTE.search(verdict.turns[SLOT].detail)
    assert len(calls) == 1


@pytest.mark.parametrize("voice", [VOICE_A, VOICE_B])
async def test_a_short_turn_of_another_voice_stays_flagged(
    stub: pb_grpc.SleuthStub,
    speech: Speech,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    voice: str,
) -> None:
    """1.4 s of espeak-ng's m3 or m7 in f2's dialogue: judged again against the cuts (it is short and flagged), and
    still flagged. (flite's slt, a woman too, has a narrower band than espeak-ng's voices: her turn makes f2 a
    band-matched speaker, whom length matching leaves alone.)"""
    length_matching(engine, monkeypatch, DEFAULT)
    audio, reference = dialogue(speech, short(speech.wav_bytes(voice, 0), 1.4))
    with caplog.at_level(logging.DEBUG, logger="sleuthd.judgment.length_matching"):
        v = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    judged = [r.getMessage() for r in caplog.records if "judged on cuts" in r.getMessage()]
    assert len(judged) == 1 and f"turn 't{SLOT}'" in judged[0], judged
    assert list(v.speakers[0].inconsistent_turn_ids) == [f"t{SLOT}"], [(t.status, t.detail) for t in v.turns]
    assert "length matched" not in v.turns[SLOT].detail


async def test_a_short_turn_of_the_opposite_gender_among_many_turns_is_kept_flagged_by_the_guard(
    stub: pb_grpc.SleuthStub,
    speech: Speech,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1.2 s of f2 as the fourth of 50 turns of m3 (its seven sentences repeated; streamed, as one CheckDialogue
    would exceed the test server's message limit), the most a length-matched speaker may have: judged against the
    cuts of the other 49, the model's probability falls as the pool grows (0.93 at 6 turns, 0.25 at 50, 0.17 at 100,
    where it would have been cleared); the CAM++ guard keeps it flagged (its cosine to the cuts far under their own
    level)."""
    from sleuthd.judgment.pitch_matching import GUARD_COSINE

    length_matching(engine, monkeypatch, DEFAULT)
    audio = [speech.wav_bytes(VOICE_A, k % 7) for k in range(MAX_PIECES)]
    audio[SLOT] = short(speech.wav_bytes(VOICE_F, 0))
    with caplog.at_level(logging.DEBUG, logger="sleuthd.judgment.length_matching"):
        _, final = await _stream(stub, audio)
    assert list(final.speakers[0].inconsistent_turn_ids) == [f"t{SLOT}"], [t.detail for t in final.turns[:5]]
    judged = [r.getMessage() for r in caplog.records if "judged on cuts" in r.getMessage()][-1]  # at the last turn
    found = re.search(r"samples: ([0-9.e-]+); guard ([-+0-9.]+)", judged)
    assert found is not None, judged
    assert float(found[1]) < 0.5 and float(found[2]) < GUARD_COSINE - 0.2, judged


async def test_a_speaker_of_more_pieces_than_the_bound_is_not_length_matched(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short turn of f2's own among 51 of her turns, streamed: while she has at most 50 pieces it is length matched
    as the turns arrive; once she has 51, the final verdict is exactly the one without length matching."""
    audio = [speech.wav_bytes(VOICE_F, k % 7) for k in range(MAX_PIECES + 1)]
    audio[SLOT] = short(speech.wav_bytes(VOICE_F, SLOT))
    finals = {}
    for ratio in (0.0, DEFAULT):
        length_matching(engine, monkeypatch, ratio)
        updates, finals[ratio] = await _stream(stub, audio)
    assert any("length matched" in u.verdict.detail for u in updates)  # with 4-50 pieces
    assert finals[DEFAULT] == finals[0.0]


async def test_a_stream_length_matches_as_check_dialogue_does(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    length_matching(engine, monkeypatch, DEFAULT)
    audio, reference = dialogue(speech, short(speech.wav_bytes(VOICE_F, SLOT)))
    checked = await stub.CheckDialogue(with_reference(audio, reference), timeout=120)
    refs = [pb.SpeakerReference(speaker="B", audio=enc(reference))]
    updates, final = await _stream(stub, audio, refs)
    # With three turns of the speaker and the reference before it, the short turn is judged again as it arrives.
    _assert_consistent_as_checked(checked, updates, final, SLOT, "length")


async def test_the_offline_judges_length_match_as_the_server_does(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    """`sleuthd-bench robustness report|verify` length match from the clips' trimmed lengths and their cut copies'
    embeddings (`robustness embed --cut`): with f2's short turn among long ones, under S1, S2 (m3) and S3 (slt) they
    flag exactly the turns the server flags; under S1 that is none, where without length matching they flag the
    short turn."""
    from sleuthd_bench.robustness import judges

    from .offline_judges import SERVER_MATCHING

    clips = {f"f{k}.wav": speech.wav_bytes(VOICE_F, k) for k in range(7)}
    clips[f"f{SLOT}.wav"] = short(clips[f"f{SLOT}.wav"])
    clips["a0.wav"], clips["c0.wav"] = speech.wav_bytes(VOICE_A, 0), speech.wav_bytes(VOICE_C, 0)
    line = {
        "dialogue_id": "d0", "source": "test", "target_speaker": "B", "reference": "f6.wav",
        "target_turns": [f"f{k}.wav" for k in range(5)], "altered_turn": 1, "s2_audio": "a0.wav", "s3_audio": "c0.wav",
    }  # fmt: skip
    offline = await offline_judges(tmp_path, models_dir, clips, [line])
    assert offline.length is not None and offline.length.ratio == DEFAULT == EngineConfig().length_match_ratio

    def check(inst: Any, served: pb.DialogueVerdict) -> None:
        if inst.scenario == "S1":
            assert "length matched" in served.turns[SLOT].detail, served.turns[SLOT].detail
            unmatched = judges.evidence_flags(inst, offline.blend, offline.calibration, *SERVER_MATCHING, offline.pitch)
            assert unmatched[0] == {SLOT}

    await assert_offline_flags_as_served(stub, tmp_path, offline, check)


@pytest.mark.parametrize(
    ("seconds", "rows", "ratio", "expected"),
    [
        ([1.5, 4.5, 4.9, 4.6, 3.9, 5.0], [0], 0.5, [0]),  # 1.5 s against a median of 4.6 s (the reference counts)
        ([1.5, 4.5, 4.9, 4.6, 3.9, 5.0], [1], 0.5, []),  # a long turn is never short
        ([1.5, 4.5, 4.9, 4.6, 3.9, 5.0], [0], 0.3, []),  # 0.33 of the median: not under 0.3
        ([1.5, 1.4, 1.6, 1.5, 5.0], [0, 1], 0.5, []),  # all short: the median of the others is short too
        ([1.5], [0], 0.5, []),  # nothing to compare with
    ],
)
def test_which_flagged_turns_are_short(
    seconds: list[float], rows: list[int], ratio: float, expected: list[int]
) -> None:
    assert short_turns(seconds, rows, ratio) == expected


def test_a_cut_is_the_middle_of_the_trimmed_speech_and_a_short_clip_is_not_cut(engine: Engine) -> None:
    """Two tones with silence between and around them: the cut's samples are the middle of what trimming keeps, as
    float32 PCM; asked for more than that, the clip comes back as sent (so its copy's embedding is its own)."""
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    gap = np.zeros(SAMPLE_RATE, np.float32)
    clip = AudioInput(encode_wav(np.concatenate([gap, tone, gap, tone, gap]), SAMPLE_RATE))
    vad = engine.models.vad
    n = kept_samples(clip, 60.0, -30.0, vad)
    assert 2 * SAMPLE_RATE <= n < 3.5 * SAMPLE_RATE  # the two tones and the VAD's padding, not the silences
    cut = speech_cut(clip, 60.0, SAMPLE_RATE // 2, -30.0, vad)
    assert cut.pcm is not None and len(cut.data) == 4 * SAMPLE_RATE // 2
    samples = decode(cut, 60.0).samples
    assert len(samples) == SAMPLE_RATE // 2 and np.abs(samples).max() > 0
    assert speech_cut(clip, 60.0, n, -30.0, vad) is clip


def test_a_cut_copy_is_a_cut_of_the_clip_as_sent() -> None:
    assert ChannelCopy(cut_samples=16000).describe() == "copy cut to 1.00 s of trimmed speech"
    with pytest.raises(ValueError, match="nothing else"):
        ChannelCopy(narrow=True, cut_samples=16000)


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_length_match_ratio_outside_its_range_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match="length_match_ratio"):
        EngineConfig(length_match_ratio=bad)

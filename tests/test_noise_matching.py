"""Noise matching (issue 27) through the real server: a speaker whose clips differ in estimated SNR (one turn with
background noise among clean turns of the same voice) is judged on copies of every clip with the noisiest clip's
own noise added until each is as noisy, so the noise is not read as another voice; another voice in that slot is
still found; a stream gives CheckDialogue's verdicts when the noisiest turn changes."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import soundfile as sf
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd.audio.noise import CAP_DB, add_noise, noise_bed, snr_db
from sleuthd.client.results import TurnVerdict
from sleuthd.engine.facade import Engine
from sleuthd.rpc.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .offline_judges import assert_offline_flags_as_served, offline_judges
from .support import VOICE_A, VOICE_B, VOICE_F, Speech, check_request, copies_made
from .test_band_matching import _stream, judged_with_registered, lowest_bitrate_opus

# That module's engine and server that keep no stream audio (fixtures: imported under their own names).
from .test_band_matching import narrowing_engine as narrowing_engine
from .test_band_matching import narrowing_server as narrowing_server

SLOT = 2


def noisy(wav: bytes, snr: float, seed: int = 1) -> bytes:
    """The clip with white noise ``snr`` dB below its speech (the louder half of its 20 ms frames), as 16-bit WAV:
    how the robustness matrix's d-noise condition renders its clips (5-30 dB; white, pink or brown)."""
    x = to_model_rate(decode_encoded(wav, 60.0)).samples.astype(np.float64)
    frames = x[: len(x) // 320 * 320].reshape(-1, 320)
    energy = np.sort((frames**2).mean(axis=1))
    speech = np.sqrt(energy[len(energy) // 2 :].mean())
    y = x + np.random.default_rng(seed).standard_normal(len(x)) * speech * 10 ** (-snr / 20)
    buf = io.BytesIO()
    sf.write(
        buf, (y / max(1.0, np.abs(y).max() / 0.99)).astype(np.float32), SAMPLE_RATE, format="WAV", subtype="PCM_16"
    )
    return buf.getvalue()


def turns(speech: Speech, slot_voice: str, snr: float = 10.0) -> list[bytes]:
    out = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    out[SLOT] = noisy(speech.wav_bytes(slot_voice, SLOT if slot_voice == VOICE_B else 0), snr)
    return out


def test_the_snr_estimate_and_a_noisy_copy(speech: Speech) -> None:
    clean = to_model_rate(decode_encoded(speech.wav_bytes(VOICE_B, 0), 60.0)).samples
    assert snr_db(clean) == CAP_DB  # synthetic speech with silent pauses: clean
    hiss = to_model_rate(decode_encoded(noisy(speech.wav_bytes(VOICE_B, 0), 10.0), 60.0)).samples
    assert 8.0 < snr_db(hiss) < 13.0  # within a few dB of the noise rendered (speech pauses are part of "speech")
    copy = add_noise(clean, snr_db(hiss), noise_bed(hiss))
    # Brought to about the noisy clip's SNR (re-estimated, the copy reads a little cleaner: the noise added to
    # its speech frames counts as speech).
    assert snr_db(copy) == pytest.approx(snr_db(hiss), abs=1.0)
    assert np.array_equal(add_noise(hiss, 15.0, noise_bed(clean)), hiss)  # already noisier: left as it is
    assert snr_db(np.zeros(16000, np.float32)) is None and snr_db(np.zeros(100, np.float32)) is None


async def test_a_noisy_turn_of_the_same_voice_is_compared_on_copies_as_noisy(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without noise matching the noisy turn (10 dB SNR) is flagged (probability ~1.0); judged on copies of every
    turn with its noise added to its SNR, it is cleared (0.02). Measured on varied speech by the robustness matrix
    (d-noise S1 70 % -> 96 %, docs/research/robustness.md)."""
    v = await stub.CheckDialogue(check_request(turns(speech, VOICE_B)), timeout=120)
    hot = v.turns[SLOT]
    others = [t for k, t in enumerate(v.turns) if k != SLOT]
    assert 8.0 < hot.snr_db < 13.0 and min(t.snr_db for t in others) > 19.0, [t.snr_db for t in v.turns]
    assert all(t.compared_snr_db == pytest.approx(hot.snr_db, abs=0.05) for t in v.turns)
    assert not any(t.HasField("compared_below_hz") or t.HasField("compared_clipped_fraction") for t in v.turns)
    assert re.match(
        r"compared on copies with its noisiest clip's noise added to \d+\.\d dB SNR: the clips of speaker 'B' "
        r"differ in noise \(\d+\.\d-20\.0 dB SNR\); auto",
        hot.detail,
    ), hot.detail
    assert [t.status for t in v.turns] == [pb.CONSISTENT] * 5, [(t.score, t.detail) for t in v.turns]
    typed = TurnVerdict.from_pb(hot)  # the client library reads both fields
    assert typed.compared_snr_db == pytest.approx(hot.compared_snr_db) and typed.snr_db == pytest.approx(hot.snr_db)

    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, noise_match_db=0.0))
    off = await stub.CheckDialogue(check_request(turns(speech, VOICE_B)), timeout=120)
    assert off.turns[SLOT].status == pb.INCONSISTENT and off.turns[SLOT].score > 0.9
    assert not any(t.HasField("compared_snr_db") for t in off.turns)


async def test_another_voice_in_the_noisy_slot_is_still_flagged(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    v = await stub.CheckDialogue(check_request(turns(speech, VOICE_F)), timeout=120)
    assert v.turns[SLOT].HasField("compared_snr_db")
    assert list(v.speakers[0].inconsistent_turn_ids) == [f"t{SLOT}"], [(t.score, t.detail) for t in v.turns]
    assert v.turns[SLOT].score > 0.9


async def test_a_stream_follows_its_noisiest_turn_as_check_dialogue_does(
    stub: pb_grpc.SleuthStub, engine: Engine, speech: Speech
) -> None:
    """Turn 1 is a little noisy (the speaker is matched from then on, with its noise), turn 3 much noisier: the
    noisiest turn changes, and every copy is made again with its noise from the audio the stream kept. The final
    verdict is CheckDialogue's, bit for bit."""
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[1] = noisy(audio[1], 14.0)
    audio[3] = noisy(audio[3], 6.0)
    updates, final = await _stream(stub, audio)
    unary = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert engine.kept_audio.held == 0
    first = [u.verdict for u in updates if not u.revision]
    targets = [t.compared_snr_db if t.HasField("compared_snr_db") else None for t in first]
    assert targets[0] is None and targets[1] == targets[2] and targets[3] == targets[4] < targets[1], targets
    fields = ("turn_id", "status", "score", "compared_snr_db", "snr_db", "detail")
    assert [tuple(getattr(t, f) for f in fields) for t in final.turns] == [
        tuple(getattr(t, f) for f in fields) for t in unary.turns
    ]


async def test_the_offline_judges_noise_match_as_the_server_does(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    """`sleuthd-bench robustness report|verify` mirror noise matching: each clip's SNR (`robustness embed
    --clipped` measures it beside the bandwidth and plateau) and the noisy copies' embeddings at the instance's
    noisiest piece. On a dialogue with a noisy turn, under S1, S2 and S3, they flag exactly what the server
    flags."""
    clips = {f"b{k}.wav": speech.wav_bytes(VOICE_B, k) for k in range(6)}
    clips["b3-noise.wav"] = noisy(speech.wav_bytes(VOICE_B, 3), 10.0)
    clips["f0.wav"], clips["a0.wav"] = speech.wav_bytes(VOICE_F, 0), speech.wav_bytes(VOICE_A, 0)
    line = {"dialogue_id": "d0", "source": "test", "target_speaker": "B", "reference": "b5.wav",
            "target_turns": ["b0.wav", "b1.wav", "b2.wav", "b3-noise.wav", "b4.wav"], "altered_turn": 2,
            "s2_audio": "f0.wav", "s3_audio": "a0.wav"}  # fmt: skip
    offline = await offline_judges(tmp_path, models_dir, clips, [line])

    def check(inst: Any, served: pb.DialogueVerdict) -> None:
        assert inst.noise_matched(3.0) is not None and inst.noise is not None
        assert all(t.compared_snr_db == pytest.approx(round(inst.noise[0], 1)) for t in served.turns)

    await assert_offline_flags_as_served(stub, tmp_path, offline, check)


async def test_a_stream_past_its_bound_keeps_noise_matching_while_its_noisiest_turn_stays(
    narrowing_server: RunningServer, speech: Speech
) -> None:
    """A stream that keeps no turn audio (past --band-match-stream-mb) still has the noise of its speaker's noisiest
    turn (kept apart, a clip or a few per speaker), so each later turn's noisy copy is made as it arrives: the final
    verdict is CheckDialogue's."""
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[1] = noisy(audio[1], 8.0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{narrowing_server.port}") as channel:
        narrowing = pb_grpc.SleuthStub(channel)
        _, final = await _stream(narrowing, audio)
        # On the same server: its embedding cache then holds the copies the stream made (another server's would
        # embed them in other batches, which CAM++ rounds differently in the last bits).
        unary = await narrowing.CheckDialogue(check_request(audio), timeout=120)
    assert all(t.HasField("compared_snr_db") for t in final.turns), [t.detail for t in final.turns]
    fields = ("turn_id", "status", "score", "compared_snr_db", "detail")
    assert [tuple(getattr(t, f) for f in fields) for t in final.turns] == [
        tuple(getattr(t, f) for f in fields) for t in unary.turns
    ]


def _compared(v: pb.DialogueVerdict) -> list[tuple[str, int, float, float, str]]:
    return [(t.turn_id, t.status, t.score, t.compared_snr_db, t.detail) for t in v.turns]


async def test_a_registered_voice_is_noise_matched_as_its_clip_sent_as_reference(
    engine: Engine, speech: Speech, tmp_path: Path
) -> None:
    """A registered voice records each clip's SNR, and a speaker whose reference it is counts them as a reference
    clip's: judged on copies with the noisiest piece's noise added (the voice's own kept clip's when the voice is
    the noisiest piece), the verdicts are exactly those with the clip sent as audio. A voice registered without its
    audio that is the noisiest piece has no noise to give: its speaker is judged as heard, and the turns say why.
    A stream gives CheckDialogue's verdicts."""
    clean, hiss = speech.wav_bytes(VOICE_B, 5), noisy(speech.wav_bytes(VOICE_B, 5), 10.0)
    voice, (own, other) = await judged_with_registered(
        engine, tmp_path, clean, [turns(speech, VOICE_B), turns(speech, VOICE_F)]
    )
    assert voice.clips[0].snr_db == CAP_DB
    noisy_voice, (clean_turns,) = await judged_with_registered(
        engine, tmp_path, hiss, [[speech.wav_bytes(VOICE_B, k) for k in range(5)]]
    )
    assert 8.0 < noisy_voice.clips[0].snr_db < 13.0
    for case, flagged in ((own, []), (other, [f"t{SLOT}"]), (clean_turns, [])):
        assert _compared(case.kept) == _compared(case.sent) == _compared(case.streamed), flagged
        assert all(t.HasField("compared_snr_db") for t in case.kept.turns)
        assert list(case.kept.speakers[0].inconsistent_turn_ids) == flagged, _compared(case.kept)
    # The voice is the noisiest piece: every turn gets its noise, to its SNR.
    expected = noisy_voice.clips[0].snr_db
    assert all(t.compared_snr_db == pytest.approx(expected, abs=0.05) for t in clean_turns.kept.turns)
    for case in (own, clean_turns):
        assert not any(t.HasField("compared_snr_db") for t in case.bare.turns)
    for t in clean_turns.bare.turns:  # its noise cannot be read
        assert re.match(
            r"compared as heard although the clips of speaker 'B' differ in noise \(.*\): registered voice 'bare': "
            r"its noise is made from its clips, which were not kept \(keep_audio off\)",
            t.detail,
        ), t.detail
    for t in own.bare.turns:  # a turn's noise, but no copy of the voice
        assert re.match(
            r"compared as heard although the clips of speaker 'B' differ in noise \(.*\): registered voice 'bare': "
            r"its copy with noise added to \d+\.\d dB SNR is made from its clips, which were not kept",
            t.detail,
        ), t.detail


# ---- noise matching on top of band matching: a channel that drifts from turn to turn (Screen 8)

OPUS, HISS = 1, 3


def drifting(speech: Speech, slot_voice: str) -> list[bytes]:
    """Five turns of VOICE_B: turn OPUS as lowest-bitrate Opus (so the speaker is band-matched), turn HISS with white
    noise 8 dB below its speech (``slot_voice``'s clip there: VOICE_B's own, or another voice's)."""
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[OPUS] = lowest_bitrate_opus(audio[OPUS])
    audio[HISS] = noisy(speech.wav_bytes(slot_voice, HISS if slot_voice == VOICE_B else 0), 8.0)
    return audio


async def test_a_band_matched_speaker_with_a_noisy_turn_is_compared_on_narrowband_copies_as_noisy(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Opus turn makes the speaker band-matched; on narrowband copies alone, the noisy turn of the same voice is
    still the one noisy piece and is flagged (probability ~0.97). With its noise added to every narrowband copy
    (the default --noise-compose-db, 6 dB) it is cleared (~0.01), and another voice in that slot is still flagged."""
    v = await stub.CheckDialogue(check_request(drifting(speech, VOICE_B)), timeout=120)
    hot = v.turns[HISS]
    assert all(t.compared_below_hz == 3600.0 for t in v.turns)
    assert all(t.compared_snr_db == pytest.approx(hot.snr_db, abs=0.05) for t in v.turns), [t.snr_db for t in v.turns]
    assert re.match(
        r"compared below 3\.6 kHz and on copies with its noisiest clip's noise added to \d+\.\d dB SNR: the clips of "
        r"speaker 'B' span \d\.\d\d octave of bandwidth \(.*\) and differ in noise \(\d+\.\d-20\.0 dB SNR\); auto",
        hot.detail,
    ), hot.detail
    assert [t.status for t in v.turns] == [pb.CONSISTENT] * 5, [(t.score, t.detail) for t in v.turns]

    other = await stub.CheckDialogue(check_request(drifting(speech, VOICE_F)), timeout=120)
    assert other.turns[HISS].HasField("compared_snr_db") and other.turns[HISS].HasField("compared_below_hz")
    assert list(other.speakers[0].inconsistent_turn_ids) == [f"t{HISS}"], [(t.score, t.detail) for t in other.turns]

    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, noise_compose_db=0.0))
    off = await stub.CheckDialogue(check_request(drifting(speech, VOICE_B)), timeout=120)
    assert all(t.compared_below_hz == 3600.0 and not t.HasField("compared_snr_db") for t in off.turns)
    assert off.turns[HISS].status == pb.INCONSISTENT and off.turns[HISS].score > 0.9
    # Above the trigger's spread only: 8 dB of noise (~9 dB SNR against the clean turns' 20) is noise-matched at 6 dB
    # but not at 12.
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, noise_compose_db=12.0))
    high = await stub.CheckDialogue(check_request(drifting(speech, VOICE_B)), timeout=120)
    assert _compared(high) == _compared(off)


async def test_a_drifting_stream_is_judged_as_check_dialogue_judges_it(
    stub: pb_grpc.SleuthStub, engine: Engine, speech: Speech
) -> None:
    """The speaker becomes band-matched at turn OPUS and noise-matched on top at turn HISS: the copies are made again
    with the noise, and the final verdict is CheckDialogue's, bit for bit."""
    audio = drifting(speech, VOICE_B)
    updates, final = await _stream(stub, audio)
    unary = await stub.CheckDialogue(check_request(audio), timeout=120)
    first = [u.verdict for u in updates if not u.revision]
    assert first[OPUS].HasField("compared_below_hz") and not first[OPUS].HasField("compared_snr_db")
    assert first[HISS].HasField("compared_below_hz") and first[HISS].HasField("compared_snr_db")
    fields = ("turn_id", "status", "score", "compared_below_hz", "compared_snr_db", "detail")
    assert [tuple(getattr(t, f) for f in fields) for t in final.turns] == [
        tuple(getattr(t, f) for f in fields) for t in unary.turns
    ]
    assert engine.kept_audio.held == 0


async def test_the_offline_judges_compose_noise_with_band_matching_as_the_server_does(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    """`robustness embed --clipped` embeds the composed copies (narrowband with the noisiest clip's noise) of an
    instance matched by band whose clips differ in SNR, and `report`/`verify` judge on them: under S1, S2 and S3
    they flag exactly what the server flags."""
    clips = {f"b{k}.bin": data for k, data in enumerate(drifting(speech, VOICE_B))}
    clips["b5.wav"] = speech.wav_bytes(VOICE_B, 5)
    clips["f0.wav"], clips["a0.wav"] = speech.wav_bytes(VOICE_F, 0), speech.wav_bytes(VOICE_A, 0)
    line = {"dialogue_id": "d0", "source": "test", "target_speaker": "B", "reference": "b5.wav",
            "target_turns": [f"b{k}.bin" for k in range(5)], "altered_turn": HISS,
            "s2_audio": "f0.wav", "s3_audio": "a0.wav"}  # fmt: skip
    offline = await offline_judges(tmp_path, models_dir, clips, [line])
    s1 = next(i for i in offline.instances if i.scenario == "S1")
    assert s1.composed_matched(6.0, True, False) is not None and s1.composed_matched(12.0, True, False) is None

    def check(inst: Any, served: pb.DialogueVerdict) -> None:
        composed = inst.composed_matched(6.0, inst.band_mixed(0.3), False) is not None
        assert all(t.HasField("compared_snr_db") == composed for t in served.turns), inst.scenario

    await assert_offline_flags_as_served(stub, tmp_path, offline, check)


async def test_a_composed_speaker_makes_only_the_copies_it_is_judged_on(
    stub: pb_grpc.SleuthStub, speech: Speech, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kinds a matched speaker falls back to (here its narrowband copies without the noise) are made only when the
    copies it is judged on cannot stand in for its pool: one copy per clip, where making every fallback beside them
    cost a second encoder pass over the dialogue."""
    made = copies_made(monkeypatch)
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[OPUS] = lowest_bitrate_opus(audio[OPUS])
    audio[HISS] = noisy(speech.wav_bytes(VOICE_B, HISS), 7.5, seed=3)  # bytes no other test sends
    v = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert all(t.HasField("compared_snr_db") and t.compared_below_hz == 3600.0 for t in v.turns)
    assert len(made) == 5, len(made)  # every turn's composed copy, and nothing else

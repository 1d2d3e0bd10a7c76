"""Clip matching (issue 27) through the real server: a speaker whose clips differ in clipping (one turn rendered
too loud and hard-clipped among clean turns of the same voice) is judged on copies of every clip clipped as hard
as its most-clipped one, so the clipping is not read as another voice; another voice in that slot is still
found; a stream gives CheckDialogue's verdicts when the clipping target moves, and says so when it no longer has
the audio to follow it."""

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
from sleuthd.audio.clipping import clip_to_plateau, plateau_fraction
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd.client.results import TurnVerdict
from sleuthd.engine.facade import Engine
from sleuthd.rpc.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .offline_judges import assert_offline_flags_as_served, offline_judges
from .support import VOICE_A, VOICE_B, VOICE_F, Speech, check_request, copies_made
from .test_band_matching import _stream, judged_with_an_older_voice, judged_with_registered, lowest_bitrate_opus

# That module's engine and server that keep no stream audio (fixtures: imported under their own names).
from .test_band_matching import narrowing_engine as narrowing_engine
from .test_band_matching import narrowing_server as narrowing_server

SLOT = 2


def clipped(wav: bytes, gain_db: float) -> bytes:
    """The clip raised ``gain_db`` above a -3 dBFS peak and hard-clipped at full scale, as 16-bit WAV: how the
    robustness matrix's d-clip condition renders every clip (6-20 dB)."""
    x = to_model_rate(decode_encoded(wav, 60.0)).samples
    x = x / np.abs(x).max() * 10 ** ((gain_db - 3) / 20)
    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1, 1), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def turns(speech: Speech, slot_voice: str, gain_db: float = 12.0) -> list[bytes]:
    """Five WAV turns of VOICE_B; turn SLOT is a clip of ``slot_voice`` (VOICE_B's own of that slot, or another
    voice's clip 0) clipped at ``gain_db``."""
    out = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    out[SLOT] = clipped(speech.wav_bytes(slot_voice, SLOT if slot_voice == VOICE_B else 0), gain_db)
    return out


def test_the_plateau_fraction_is_the_clipped_share_and_a_copy_is_clipped_to_it() -> None:
    rng = np.random.default_rng(0)
    clean = (0.3 * rng.standard_normal(16000)).astype(np.float32)
    assert plateau_fraction(clean) < 1e-3  # a clean clip's peak is a sample or two
    hard = np.clip(clean, -0.2, 0.2)
    share = float(np.mean(np.abs(clean) >= 0.99 * 0.2))  # on the ceiling, or within 1 % of it
    assert plateau_fraction(hard) == pytest.approx(share)
    copy = clip_to_plateau(clean, 0.1)
    assert 0.1 <= plateau_fraction(copy) < 0.105  # the share clipped, and the few within 1 % below the ceiling
    assert np.array_equal(clip_to_plateau(clean, 0.0), clean)  # nothing to match: left as it is
    assert plateau_fraction(np.zeros(100, np.float32)) is None and plateau_fraction(np.zeros(0, np.float32)) is None


async def test_a_clipped_turn_of_the_same_voice_is_compared_on_copies_clipped_alike(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without clip matching the clipped turn is flagged (probability 0.76); judged on copies of every turn
    clipped as hard as it is (2.4 % of samples at the peak), it is cleared (0.08). What it does on varied speech is
    measured by the robustness matrix (d-clip S1 75 % -> 94 %, docs/research/robustness.md)."""
    v = await stub.CheckDialogue(check_request(turns(speech, VOICE_B)), timeout=120)
    hot = v.turns[SLOT]
    others = [t for k, t in enumerate(v.turns) if k != SLOT]
    # Every turn reports how clipped it is: the loud turn a few per cent of its samples, the others none.
    assert 0.01 < hot.clipped_fraction < 0.2 and max(t.clipped_fraction for t in others) < 0.001
    # The speaker's every turn is judged on copies clipped to the loud turn's share, and says so.
    assert all(t.compared_clipped_fraction == pytest.approx(hot.clipped_fraction, abs=1e-4) for t in v.turns)
    assert not any(t.HasField("compared_below_hz") for t in v.turns)  # one band: not band-matched
    assert re.match(
        r"compared on copies clipped to \d\.\d\d % at the peak: the clips of speaker 'B' differ in clipping "
        r"\(0\.\d\d-\d\.\d\d % of samples at the peak\); auto",
        hot.detail,
    ), hot.detail
    assert [t.status for t in v.turns] == [pb.CONSISTENT] * 5, [(t.score, t.detail) for t in v.turns]
    typed = TurnVerdict.from_pb(hot)  # the client library reads both fields
    assert typed.compared_clipped_fraction == pytest.approx(hot.compared_clipped_fraction)
    assert typed.clipped_fraction == pytest.approx(hot.clipped_fraction)

    # The same request with clip matching off (--clip-match-spread 0): the clipping is read as another voice.
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, clip_match_spread=0.0))
    off = await stub.CheckDialogue(check_request(turns(speech, VOICE_B)), timeout=120)
    assert off.turns[SLOT].status == pb.INCONSISTENT and off.turns[SLOT].score > 0.5
    assert not any(t.HasField("compared_clipped_fraction") for t in off.turns)
    assert hot.score < off.turns[SLOT].score - 0.3


@pytest.mark.parametrize("gain_db", [12.0, 20.0])
async def test_another_voice_in_the_clipped_slot_is_still_flagged(
    stub: pb_grpc.SleuthStub, speech: Speech, gain_db: float
) -> None:
    v = await stub.CheckDialogue(check_request(turns(speech, VOICE_F, gain_db)), timeout=120)
    assert v.turns[SLOT].HasField("compared_clipped_fraction")
    assert list(v.speakers[0].inconsistent_turn_ids) == [f"t{SLOT}"], [(t.score, t.detail) for t in v.turns]
    assert v.turns[SLOT].score > 0.9


async def test_a_paper_method_and_a_single_encoder_are_never_clip_matched(
    stub: pb_grpc.SleuthStub, speech: Speech
) -> None:
    for method, encoder in ((pb.METHOD_PAIRWISE, "fused"), (pb.METHOD_AUTO, "ge2e")):
        v = await stub.CheckDialogue(check_request(turns(speech, VOICE_B), method, encoder), timeout=120)
        assert not any(t.HasField("compared_clipped_fraction") for t in v.turns), (method, encoder)
        assert all(t.HasField("clipped_fraction") == (encoder == "fused") for t in v.turns)


async def test_a_stream_follows_a_moving_clipping_target_as_check_dialogue_does(
    stub: pb_grpc.SleuthStub, engine: Engine, speech: Speech
) -> None:
    """Turn 1 is clipped a little (the speaker is matched from then on, at its share), turn 3 much harder: the
    target moves, and every copy is made again at the new one from the audio the stream kept. The final
    verdict is CheckDialogue's, bit for bit."""
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[1] = clipped(audio[1], 8.0)
    audio[3] = clipped(audio[3], 20.0)
    updates, final = await _stream(stub, audio)
    unary = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert engine.kept_audio.held == 0  # the ended stream let go of what it kept
    first = [u.verdict for u in updates if not u.revision]
    targets = [t.compared_clipped_fraction if t.HasField("compared_clipped_fraction") else None for t in first]
    assert targets[0] is None and targets[1] == targets[2] and targets[3] == targets[4] > targets[1] > 0, targets
    assert targets[3] == pytest.approx(first[3].clipped_fraction, abs=1e-4)
    fields = ("turn_id", "status", "score", "compared_clipped_fraction", "clipped_fraction", "detail")
    assert [tuple(getattr(t, f) for f in fields) for t in final.turns] == [
        tuple(getattr(t, f) for f in fields) for t in unary.turns
    ]


async def test_a_stream_past_its_bound_says_when_it_cannot_follow_a_moving_target(
    narrowing_server: RunningServer, speech: Speech
) -> None:
    """A stream that keeps no turn audio (past --band-match-stream-mb) clip-matches while the target stays (each
    turn's copy is made as it arrives) but cannot copy the turns it let go at a new target: the speaker is then
    judged as heard, and every turn says why."""
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    audio[1] = clipped(audio[1], 8.0)
    audio[3] = clipped(audio[3], 20.0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{narrowing_server.port}") as channel:
        updates, final = await _stream(pb_grpc.SleuthStub(channel), audio)
    first = [u.verdict for u in updates if not u.revision]
    assert first[2].HasField("compared_clipped_fraction")  # before the target moved
    assert not any(t.HasField("compared_clipped_fraction") for t in final.turns)
    assert all(
        re.match(
            r"compared as heard although the clips of speaker 'B' differ in clipping \(.*\): the stream no longer "
            r"keeps its turns' audio \(past --band-match-stream-mb\); auto",
            t.detail,
        )
        for t in final.turns
    ), [t.detail for t in final.turns]


async def test_the_offline_judges_clip_match_as_the_server_does(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    """`sleuthd-bench robustness report|verify` judge the matrix offline from cached embeddings; with clip matching
    they read each clip's plateau fraction and its clipped copy's embeddings at the instance's target (`robustness
    embed --clipped`). On a dialogue with a clipped turn (d0), and one with a clipped turn and a lowest-bitrate
    Opus turn (d1: copies clipped, then low-passed), under S1, S2 and S3, they flag exactly the turns the server
    flags."""
    clips = {f"b{k}.wav": speech.wav_bytes(VOICE_B, k) for k in range(6)}
    clips["b3-clip.wav"] = clipped(speech.wav_bytes(VOICE_B, 3), 12.0)
    clips["b1.ogg"] = lowest_bitrate_opus(speech.wav_bytes(VOICE_B, 1))
    clips["f0.wav"], clips["a0.wav"] = speech.wav_bytes(VOICE_F, 0), speech.wav_bytes(VOICE_A, 0)
    common = {"source": "test", "target_speaker": "B", "reference": "b5.wav", "altered_turn": 2,
              "s2_audio": "f0.wav", "s3_audio": "a0.wav"}  # fmt: skip
    lines = [
        {"dialogue_id": "d0", **common, "target_turns": ["b0.wav", "b1.wav", "b2.wav", "b3-clip.wav", "b4.wav"]},
        {"dialogue_id": "d1", **common, "target_turns": ["b0.wav", "b1.ogg", "b2.wav", "b3-clip.wav", "b4.wav"]},
    ]
    offline = await offline_judges(tmp_path, models_dir, clips, lines)

    def check(inst: Any, served: pb.DialogueVerdict) -> None:
        band_mixed = inst.dialogue_id == "d1"
        assert inst.clip_matched(0.005, band_mixed) is not None and (inst.band_octaves > 0.3) == band_mixed
        assert all(t.compared_clipped_fraction == pytest.approx(inst.clip_target()) for t in served.turns)
        assert all(t.HasField("compared_below_hz") == band_mixed for t in served.turns)

    await assert_offline_flags_as_served(stub, tmp_path, offline, check)


def test_a_bandwidth_cache_from_before_plateaus_has_them_measured(speech: Speech, tmp_path: Path) -> None:
    """`robustness embed --narrowband` caches of earlier sessions hold bandwidths only; measuring channels for one
    split's clips must not leave the other split's clips recorded as measured without a plateau."""
    from sleuthd_bench.robustness import embed

    paths = []
    for k in range(3):
        (tmp_path / f"b{k}.wav").write_bytes(clipped(speech.wav_bytes(VOICE_B, k), 6.0 * k))
        paths.append(f"b{k}.wav")
    old = embed.bandwidth_path(tmp_path)
    old.parent.mkdir(parents=True)
    np.savez(old, paths=np.array(paths), hz=np.full(3, 8000.0))  # the old format: no plateau
    embed.measure_channels(tmp_path, paths[:1])  # one split's clips
    assert set(embed.load_channels(tmp_path).plateaus) == {"b0.wav"}  # the others still count as unmeasured
    hz, plateaus, _, _ = embed.measure_channels(tmp_path, paths)
    assert set(plateaus) == set(paths) and plateaus["b0.wav"] < 1e-3 < plateaus["b2.wav"], plateaus
    assert set(hz) == set(paths) and all(4000 < v <= 8000 for v in hz.values()), hz  # measured again beside


def _compared(v: pb.DialogueVerdict) -> list[tuple[str, int, float, float, str]]:
    return [(t.turn_id, t.status, t.score, t.compared_clipped_fraction, t.detail) for t in v.turns]


async def test_a_registered_voice_is_clip_matched_as_its_clip_sent_as_reference(
    engine: Engine, speech: Speech, tmp_path: Path
) -> None:
    """A registered voice records each clip's plateau fraction, and a speaker whose reference it is counts them as
    a reference clip's: judged on copies of the voice's kept clips clipped per request, the dialogue's verdicts are
    exactly those with the clip sent as audio, whether a turn is the most clipped piece (the same voice's, or
    another voice's, which is still flagged) or the voice is (clean turns). A voice registered without its audio
    cannot be copied: its speaker is judged as heard, and the turns say why and how to fix it. A stream gives
    CheckDialogue's verdicts, also when its clipping target moves (the voice's copies are made again)."""
    clean, hot = speech.wav_bytes(VOICE_B, 5), clipped(speech.wav_bytes(VOICE_B, 5), 12.0)
    moving = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    moving[1], moving[3] = clipped(moving[1], 8.0), clipped(moving[3], 20.0)
    voice, (own, other, moved) = await judged_with_registered(
        engine, tmp_path, clean, [turns(speech, VOICE_B), turns(speech, VOICE_F), moving]
    )
    (stored,) = voice.clips
    assert stored.clipped_fraction is not None and stored.clipped_fraction < 0.001 and stored.snr_db is not None
    hot_voice, (clean_turns,) = await judged_with_registered(
        engine, tmp_path, hot, [[speech.wav_bytes(VOICE_B, k) for k in range(5)]]
    )
    assert 0.01 < hot_voice.clips[0].clipped_fraction < 0.2
    for case, flagged in ((own, []), (other, [f"t{SLOT}"]), (clean_turns, []), (moved, None)):
        assert _compared(case.kept) == _compared(case.sent) == _compared(case.streamed), flagged
        assert all(t.HasField("compared_clipped_fraction") for t in case.kept.turns)
        if flagged is not None:  # (the moving target's 20 dB turn, 16 % at the peak, is flagged either way)
            assert list(case.kept.speakers[0].inconsistent_turn_ids) == flagged, _compared(case.kept)
    # The voice is the most clipped piece: every turn is clipped to its share.
    expected = hot_voice.clips[0].clipped_fraction
    assert all(t.compared_clipped_fraction == pytest.approx(expected, abs=1e-4) for t in clean_turns.kept.turns)
    for case in (own, clean_turns):
        assert not any(t.HasField("compared_clipped_fraction") for t in case.bare.turns)
        for t in case.bare.turns:
            assert re.match(
                r"compared as heard although the clips of speaker 'B' differ in clipping \(.*\): registered voice "
                r"'bare': its copy clipped to \d\.\d\d % at the peak is made from its clips, which were not kept "
                r"\(keep_audio off\): register it again with its clips, keep_audio on and replace",
                t.detail,
            ), t.detail
    assert own.bare.turns[SLOT].status == pb.INCONSISTENT  # as heard, the clipping reads as another voice


async def test_a_voice_registered_before_its_channels_were_recorded_has_them_measured_from_its_kept_clips(
    engine: Engine, speech: Speech, tmp_path: Path
) -> None:
    """A voice from a registry older than schema version 3 has no plateau fraction or SNR recorded. Where its clips
    were kept, they are measured on its first use as a reference (and stored), so a speaker whose voice is the most
    clipped piece is clip-matched at its share, exactly as with the clip sent as audio."""

    hot = clipped(speech.wav_bytes(VOICE_B, 5), 12.0)
    audio = [speech.wav_bytes(VOICE_B, k) for k in range(5)]
    # As a registry of schema version 1 left it, upgraded.
    old = await judged_with_an_older_voice(
        engine, tmp_path, hot, audio, "bandwidth_hz = NULL, plateau = NULL, snr_db = NULL"
    )
    registered, before, after, by_id, sent = old.registered, old.before, old.after, old.by_id, old.sent
    assert (before.bandwidth_hz, before.clipped_fraction, before.snr_db) == (None, None, None)
    figures = (registered.bandwidth_hz, registered.clipped_fraction, registered.snr_db)
    assert (after.bandwidth_hz, after.clipped_fraction, after.snr_db) == figures  # measured again, and stored
    assert _compared(by_id) == _compared(sent)
    assert all(t.compared_clipped_fraction == pytest.approx(after.clipped_fraction, abs=1e-4) for t in by_id.turns)


async def test_a_dialogue_sent_again_does_not_make_its_copies_again(
    stub: pb_grpc.SleuthStub, speech: Speech, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy's embedding is remembered by its clip and how it was made: a regeneration loop that sends the same
    clip-mixed dialogue again gets the same verdicts without a copy being made again (a 1000-turn check whose
    turns were all cached spent ~0.8 s making its copies again: docs/research/cached-checks/)."""
    made = copies_made(monkeypatch)
    audio = turns(speech, VOICE_B, gain_db=13.7)  # bytes no other test sends
    first = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert all(t.HasField("compared_clipped_fraction") for t in first.turns)
    assert len(made) == 5  # every turn's copy, once
    again = await stub.CheckDialogue(check_request(audio), timeout=120)
    assert len(made) == 5 and again == first

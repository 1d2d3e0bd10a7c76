"""Every kind of bad input gets a precise status and a message that says what to fix, and the server
keeps answering valid requests. All through the real in-process server."""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc
import numpy as np
import pytest
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import TEST_MAX_MESSAGE_BYTES, VOICE_A, Speech, enc, encode_wav


def pcm(data: bytes, encoding: int, rate: int, channels: int = 1) -> pb.Audio:
    return pb.Audio(pcm=pb.PcmAudio(data=data, encoding=encoding, sample_rate_hz=rate, channels=channels))  # type: ignore[arg-type]


def dialogue_with(speech: Speech, bad: pb.Audio) -> pb.CheckDialogueRequest:
    """Two good turns of A and one turn carrying ``bad`` audio."""
    req = pb.CheckDialogueRequest(dialogue_id="bad")
    req.turns.add(turn_id="ok1", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
    req.turns.add(turn_id="ok2", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 1)))
    req.turns.add(turn_id="bad-turn", speaker="A", audio=bad)
    return req


async def assert_still_serving(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="after")
    for k in range(3):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, k)))
    v = await stub.CheckDialogue(req, timeout=60)
    assert [t.status for t in v.turns] == [pb.CONSISTENT] * 3


def _speech_f32(speech: Speech) -> np.ndarray:
    import soundfile as sf

    samples, rate = sf.read(speech.clips[VOICE_A][2], dtype="float32")
    assert rate == 16000
    return np.asarray(samples, np.float32)


@functools.cache
def _flac_bomb() -> bytes:
    """300 s of 8-channel 48 kHz silence: about 115 KiB of FLAC, 439 MiB decoded."""
    import io

    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 48000, 8, format="FLAC", subtype="PCM_16") as f:
        for _ in range(300):
            f.write(np.zeros((48000, 8), np.int16))
    return buf.getvalue()


def _flac_bytes(speech: Speech) -> bytes:
    import soundfile as sf

    samples, rate = sf.read(speech.clips[VOICE_A][2], dtype="float32")
    return encode_wav(samples, rate, "FLAC")


BAD_AUDIO: dict[str, tuple[Callable[[Speech], pb.Audio], str]] = {
    "empty": (lambda s: enc(b""), "audio is empty"),
    "non-audio bytes": (
        lambda s: enc(b"<html>this is not audio</html>" * 20),
        "its format is not accepted (the bytes look like text",
    ),
    "AIFF file": (lambda s: enc(encode_wav(np.zeros(16000, np.float32), 16000, "AIFF")), "look like AIFF"),
    "8-channel FLAC bomb": (lambda s: enc(_flac_bomb()), "decoded samples per clip: downmix it to mono"),
    "int16 values as PCM_F32LE": (
        lambda s: pcm((_speech_f32(s) * 32767).astype("<f4").tobytes(), pb.PCM_F32LE, 16000),
        "looks like int16 values sent as PCM_F32LE",
    ),
    "float WAV out of range": (
        lambda s: enc(encode_wav(_speech_f32(s) * 3e38, 16000, "WAV", "FLOAT")),
        "WAV file's samples reach",
    ),
    "truncated FLAC": (lambda s: enc(_flac_bytes(s)[: len(_flac_bytes(s)) // 2]), "could not be decoded"),
    "truncated WAV": (lambda s: enc(s.wav_bytes(VOICE_A, 2)[:20000]), "truncated"),
    "NaN PCM": (
        lambda s: pcm(np.array([0.1, np.nan, 0.2] * 8000, "<f4").tobytes(), pb.PCM_F32LE, 16000),
        "NaN or infinite",
    ),
    "inf PCM": (
        lambda s: pcm(np.array([0.1, np.inf, -np.inf] * 8000, "<f4").tobytes(), pb.PCM_F32LE, 16000),
        "NaN or infinite",
    ),
    "sample rate 0": (lambda s: pcm(b"\x00\x00" * 16000, pb.PCM_S16LE, 0), "expected 8000–48000 Hz"),
    "sample rate 1 MHz": (lambda s: pcm(b"\x00\x00" * 16000, pb.PCM_S16LE, 1_000_000), "1000000 Hz"),
    "WAV at 1 MHz": (lambda s: enc(encode_wav(np.zeros(1000, np.float32), 1_000_000)), "1000000 Hz"),
    "odd PCM length": (lambda s: pcm(b"\x00" * 3001, pb.PCM_S16LE, 16000), "not a multiple of 2"),
    "PCM without encoding": (lambda s: pcm(b"\x00\x00" * 100, pb.PCM_ENCODING_UNSPECIFIED, 16000), "PCM_S16LE"),
    "zero channels": (lambda s: pcm(b"\x00\x00" * 100, pb.PCM_S16LE, 16000, 0), "channel count 0"),
    "no source set": (lambda s: pb.Audio(), "set either encoded or pcm"),
}


@pytest.mark.parametrize("case", list(BAD_AUDIO))
async def test_bad_audio_is_invalid_argument(stub: pb_grpc.SleuthStub, speech: Speech, case: str) -> None:
    make, expected = BAD_AUDIO[case]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(dialogue_with(speech, make(speech)), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in err.value.details()
    assert "bad-turn" in err.value.details() or "turns[2]" in err.value.details()
    await assert_still_serving(stub, speech)


async def test_too_short_turn_is_insufficient_audio(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    import soundfile as sf

    samples, rate = sf.read(speech.clips[VOICE_A][3], dtype="float32")
    short = encode_wav(samples[: int(0.6 * rate)], rate)  # 0.6 s: below the encoder's 1 s minimum
    v = await stub.CheckDialogue(dialogue_with(speech, enc(short)), timeout=60)
    bad = next(t for t in v.turns if t.turn_id == "bad-turn")
    assert bad.status == pb.INSUFFICIENT_AUDIO
    assert not bad.HasField("score") and not bad.HasField("pairwise_mean_cosine")
    assert "needs at least 1.00 s" in bad.detail
    assert bad.speech_seconds < 1.0
    assert v.speakers[0].unscored_turns == 1 and v.speakers[0].scored_turns == 2
    assert [t.status for t in v.turns if t.turn_id != "bad-turn"] == [pb.CONSISTENT] * 2


async def test_silence_is_insufficient_audio(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    silence = encode_wav(np.zeros(48000, np.float32), 16000)
    v = await stub.CheckDialogue(dialogue_with(speech, enc(silence)), timeout=60)
    bad = next(t for t in v.turns if t.turn_id == "bad-turn")
    assert bad.status == pb.INSUFFICIENT_AUDIO and bad.speech_seconds == 0.0


async def test_near_zero_float_pcm_is_insufficient_audio(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    # Speech scaled by 1e-40 (denormals): loudness normalisation overflowed and the turn got a score.
    tiny = pcm((_speech_f32(speech) * np.float32(1e-40)).astype("<f4").tobytes(), pb.PCM_F32LE, 16000)
    v = await stub.CheckDialogue(dialogue_with(speech, tiny), timeout=60)
    bad = next(t for t in v.turns if t.turn_id == "bad-turn")
    assert bad.status == pb.INSUFFICIENT_AUDIO and bad.speech_seconds == 0.0
    assert not bad.HasField("score")


async def test_single_usable_turn_is_insufficient_context(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="lonely")
    req.turns.add(turn_id="only", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
    v = await stub.CheckDialogue(req, timeout=60)
    assert v.turns[0].status == pb.INSUFFICIENT_CONTEXT
    assert not v.turns[0].HasField("score")
    assert not v.speakers[0].judged and not v.speakers[0].consistent


BAD_REQUESTS: dict[str, tuple[Callable[[Speech], pb.CheckDialogueRequest], grpc.StatusCode, str]] = {
    "no turns": (lambda s: pb.CheckDialogueRequest(dialogue_id="x"), grpc.StatusCode.INVALID_ARGUMENT, "no turns"),
    "no audio turns": (
        lambda s: pb.CheckDialogueRequest(
            dialogue_id="x", turns=[pb.Turn(turn_id="a", speaker="A", text="hi"), pb.Turn(turn_id="b", speaker="B")]
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "no turn with audio",
    ),
    "duplicate turn id": (
        lambda s: pb.CheckDialogueRequest(
            turns=[
                pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0))),
                pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 1))),
            ]
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "appears twice",
    ),
    "empty speaker": (
        lambda s: pb.CheckDialogueRequest(turns=[pb.Turn(turn_id="a", audio=enc(s.wav_bytes(VOICE_A, 0)))]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "speaker is empty",
    ),
    "unknown encoder": (
        lambda s: pb.CheckDialogueRequest(
            turns=[pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0)))],
            options=pb.CheckOptions(encoder="wavlm"),
        ),
        grpc.StatusCode.NOT_FOUND,
        "unknown encoder 'wavlm'",
    ),
    "reference for unknown speaker": (
        lambda s: pb.CheckDialogueRequest(
            turns=[pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0)))],
            references=[pb.SpeakerReference(speaker="Zed", audio=enc(s.wav_bytes(VOICE_A, 1)))],
        ),
        grpc.StatusCode.NOT_FOUND,
        "'Zed'",
    ),
    "reference method without reference": (
        lambda s: pb.CheckDialogueRequest(
            turns=[pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0)))],
            options=pb.CheckOptions(method=pb.METHOD_REFERENCE),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "missing for: A",
    ),
    "threshold off scale": (
        lambda s: pb.CheckDialogueRequest(
            turns=[pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0)))],
            options=pb.CheckOptions(method=pb.METHOD_CENTROID, threshold=3.0),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside the centroid scale",
    ),
    "NaN threshold": (
        lambda s: pb.CheckDialogueRequest(
            turns=[pb.Turn(turn_id="a", speaker="A", audio=enc(s.wav_bytes(VOICE_A, 0)))],
            options=pb.CheckOptions(threshold=float("nan")),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "threshold nan",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_bad_dialogue_request(stub: pb_grpc.SleuthStub, speech: Speech, case: str) -> None:
    make, code, expected = BAD_REQUESTS[case]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(make(speech), timeout=60)
    assert err.value.code() == code
    assert expected in err.value.details()
    await assert_still_serving(stub, speech)


async def test_oversized_message(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    # Over the configured limit but under the transport cap: INVALID_ARGUMENT with advice.
    big = pcm(b"\x00\x01" * (TEST_MAX_MESSAGE_BYTES // 2 + 1000), pb.PCM_S16LE, 48000)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(dialogue_with(speech, big), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {TEST_MAX_MESSAGE_BYTES} bytes" in err.value.details()
    # Far over it: gRPC refuses before reading the request.
    huge = pcm(b"\x00\x01" * (TEST_MAX_MESSAGE_BYTES + 1000), pb.PCM_S16LE, 48000)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(dialogue_with(speech, huge), timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await assert_still_serving(stub, speech)


def rank_request(speech: Speech, n_candidates: int) -> pb.RankCandidatesRequest:
    req = pb.RankCandidatesRequest(speaker="A")
    for k in range(3):
        req.context.append(enc(speech.wav_bytes(VOICE_A, k)))
    for k in range(n_candidates):
        req.candidates.add(candidate_id=f"c{k}", audio=enc(speech.wav_bytes(VOICE_A, 3 + k)))
    return req


async def test_rank_needs_two_candidates(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RankCandidates(rank_request(speech, 1), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at least 2 candidates, got 1" in err.value.details()
    r = await stub.RankCandidates(rank_request(speech, 2), timeout=60)
    assert len(r.candidates) == 2


async def test_rank_bad_candidate_audio(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = rank_request(speech, 2)
    req.candidates.add(candidate_id="broken", audio=enc(b"garbage" * 50))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RankCandidates(req, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "candidate 'broken'" in err.value.details()
    req = rank_request(speech, 2)
    req.candidates.add(candidate_id="silent", audio=enc(encode_wav(np.zeros(32000, np.float32), 16000)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RankCandidates(req, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "candidate 'silent' cannot be scored" in err.value.details()
    await assert_still_serving(stub, speech)


@pytest.mark.parametrize(
    ("method", "expected"),
    [(pb.METHOD_PAIRWISE, "at least one context clip"), (pb.METHOD_AUTO, "context clips of the speaker, a reference")],
)
async def test_rank_without_context(stub: pb_grpc.SleuthStub, speech: Speech, method: int, expected: str) -> None:
    req = rank_request(speech, 2)
    req.options.method = method  # type: ignore[assignment]
    del req.context[:]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RankCandidates(req, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in err.value.details()

"""The offline judges (`sleuthd-bench robustness report|verify`) score the instances the server answers: a dialogue
whose reference clip is too short for the fused encoder gets INVALID_ARGUMENT from the server, not a verdict, and the
offline judges call it refused (left out of every run's figures, its share reported) instead of judging it without
the reference. The other offline-judge tests (band, clip, noise, telephone, pitch matching) are beside the features."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .offline_judges import offline_judges
from .support import VOICE_A, VOICE_B, VOICE_F, Speech, check_request, enc, encode_wav


async def test_a_dialogue_whose_reference_the_server_refuses_is_refused_offline(
    stub: pb_grpc.SleuthStub, speech: Speech, models_dir: Path, tmp_path: Path
) -> None:
    clips = {f"b{k}.wav": speech.wav_bytes(VOICE_B, k) for k in range(5)}
    whole = to_model_rate(decode_encoded(speech.wav_bytes(VOICE_B, 5), 60.0)).samples
    clips["ref.wav"] = encode_wav(whole[: int(0.6 * SAMPLE_RATE)], SAMPLE_RATE)  # under GE2E's 1 s of speech
    clips["f0.wav"], clips["a0.wav"] = speech.wav_bytes(VOICE_F, 0), speech.wav_bytes(VOICE_A, 0)
    line = {
        "dialogue_id": "d0", "source": "test", "target_speaker": "B", "reference": "ref.wav",
        "target_turns": [f"b{k}.wav" for k in range(5)], "altered_turn": 3, "s2_audio": "f0.wav", "s3_audio": "a0.wav",
    }  # fmt: skip
    offline = await offline_judges(tmp_path, models_dir, clips, [line])
    assert [i.scenario for i in offline.instances] == ["S1", "S2", "S3"]
    assert all(i.refused for i in offline.instances)

    request = check_request([clips[f"b{k}.wav"] for k in range(5)])
    request.references.add(speaker="B", audio=enc(clips["ref.wav"]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(request, timeout=120)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reference of speaker 'B' is unusable" in str(err.value.details()), err.value.details()
    # With its whole reference, the same dialogue is answered, and not refused offline.
    clips["ref.wav"] = speech.wav_bytes(VOICE_B, 5)
    (tmp_path / "whole").mkdir()
    answered = await offline_judges(tmp_path / "whole", models_dir, clips, [line])
    assert not any(i.refused for i in answered.instances)
    assert np.isfinite(answered.instances[0].views["fused"].reference).all()
    # The report scores the answered instances and gives the refused ones' share of all.
    from sleuthd_bench.robustness import report

    summary = report.condition_report("x", answered.instances, {}, {}, None, refused=3)
    assert (summary["instances"], summary["refused"]) == (3, 50.0)

"""CheckDialogue / RankCandidates / health / reflection through a real in-process server and channel."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import TEST_MAX_MESSAGE_BYTES, VOICE_A, VOICE_B, VOICE_F, Speech, enc

METHODS = {"pairwise": pb.METHOD_PAIRWISE, "centroid": pb.METHOD_CENTROID, "reference": pb.METHOD_REFERENCE}


def target_dialogue(speech: Speech, replace: str | None, method: int, altered: int = 2) -> pb.CheckDialogueRequest:
    """Five turns of speaker A (clips 0-4); turn ``altered`` replaced by clip 0 of voice ``replace``.
    Reference: A's clip 5, which is not among the turns."""
    req = pb.CheckDialogueRequest(dialogue_id="d1", options=pb.CheckOptions(method=method))  # type: ignore[arg-type]
    for k in range(5):
        data = speech.wav_bytes(replace, 0) if (replace and k == altered) else speech.wav_bytes(VOICE_A, k)
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=enc(data))
    req.references.add(speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 5)))
    return req


async def test_round_trip_two_speakers(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="round-trip")
    for k in range(3):
        req.turns.add(turn_id=f"a{k}", speaker="Ann", text="hello", audio=enc(speech.wav_bytes(VOICE_A, k)))
        req.turns.add(turn_id=f"f{k}", speaker="Fay", audio=enc(speech.wav_bytes(VOICE_F, k)))
    req.turns.add(turn_id="pending", speaker="Fay", text="not synthesized yet")  # no audio: carried, not judged
    v = await stub.CheckDialogue(req, timeout=60)

    assert v.dialogue_id == "round-trip"
    assert v.encoder == "ge2e"
    assert [t.turn_id for t in v.turns] == ["a0", "f0", "a1", "f1", "a2", "f2"]
    assert [t.speaker for t in v.turns] == ["Ann", "Fay"] * 3
    assert [s.speaker for s in v.speakers] == ["Ann", "Fay"]
    for t in v.turns:
        assert t.status == pb.CONSISTENT, t.detail
        assert t.HasField("score") and t.HasField("threshold")
        assert t.HasField("pairwise_mean_cosine") and t.HasField("centroid_cosine_distance")
        assert not t.HasField("reference_cosine")  # no reference was sent
        assert 0.5 < t.pairwise_mean_cosine <= 1.0
        assert 0.0 <= t.centroid_cosine_distance < 0.5
        assert 1.0 < t.speech_seconds <= t.audio_seconds
    for s in v.speakers:
        assert s.judged and s.consistent and not s.inconsistent_turn_ids
        assert (s.scored_turns, s.unscored_turns) == (3, 0)


@pytest.mark.parametrize("method", list(METHODS))
async def test_paper_method_flags_the_altered_turn(stub: pb_grpc.SleuthStub, speech: Speech, method: str) -> None:
    """At the encoder's default thresholds, S1 is left alone and the altered turn is flagged with the
    worst score. (Pairwise and centroid may flag clean turns too: one foreign turn drags every other
    turn's mean similarity down, the paper's own finding on localization precision.)"""
    s1 = await stub.CheckDialogue(target_dialogue(speech, None, METHODS[method]), timeout=60)
    assert s1.method == METHODS[method]
    assert [t.status for t in s1.turns] == [pb.CONSISTENT] * 5, [t.detail for t in s1.turns]
    assert s1.speakers[0].consistent

    for other in (VOICE_F, VOICE_B):  # S2: other gender; S3: same-gender voice
        v = await stub.CheckDialogue(target_dialogue(speech, other, METHODS[method]), timeout=60)
        assert "t2" in v.speakers[0].inconsistent_turn_ids, (other, [t.detail for t in v.turns])
        assert not v.speakers[0].consistent
        t2 = v.turns[2]
        assert t2.status == pb.INCONSISTENT and t2.reason == pb.SCORE_THRESHOLD
        if method == "centroid":
            assert t2.score_scale == "cosine_distance" and t2.score > t2.threshold
            assert t2.score == max(t.score for t in v.turns)
        else:
            assert t2.score_scale == "cosine_similarity" and t2.score < t2.threshold
            assert t2.score == min(t.score for t in v.turns)
    if method == "reference":  # the reference is not dragged down by the foreign turn: exact localization
        assert list(v.speakers[0].inconsistent_turn_ids) == ["t2"]


async def test_auto_localizes_exactly_with_probabilities(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    s1 = await stub.CheckDialogue(target_dialogue(speech, None, pb.METHOD_AUTO), timeout=60)
    assert [t.status for t in s1.turns] == [pb.CONSISTENT] * 5, [t.detail for t in s1.turns]
    for other in (VOICE_F, VOICE_B):
        v = await stub.CheckDialogue(target_dialogue(speech, other, pb.METHOD_AUTO), timeout=60)
        assert list(v.speakers[0].inconsistent_turn_ids) == ["t2"], [t.detail for t in v.turns]
        for t in v.turns:
            assert t.score_scale == "probability" and t.score == t.inconsistency_probability
            assert 0.0 <= t.score <= 1.0 and t.threshold == pytest.approx(0.5)
        assert v.turns[2].score > 0.5 > max(t.score for t in v.turns if t.turn_id != "t2")


async def test_paper_thresholds_and_explicit_threshold(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = target_dialogue(speech, VOICE_B, pb.METHOD_PAIRWISE)
    req.options.threshold_set = pb.THRESHOLD_SET_PAPER
    v = await stub.CheckDialogue(req, timeout=60)
    # The paper's 0.4 is far below GE2E's same-gender cosines: nothing is flagged (the paper's point).
    assert all(t.threshold == pytest.approx(0.4) for t in v.turns)
    assert v.threshold_set == pb.THRESHOLD_SET_PAPER
    assert v.speakers[0].consistent
    req.options.threshold = 0.999  # everything is below this
    v = await stub.CheckDialogue(req, timeout=60)
    assert len(v.speakers[0].inconsistent_turn_ids) == 5


@pytest.mark.parametrize("method", list(METHODS))
async def test_ranking_puts_true_speaker_first(stub: pb_grpc.SleuthStub, speech: Speech, method: str) -> None:
    req = pb.RankCandidatesRequest(speaker="A", options=pb.CheckOptions(method=METHODS[method]))  # type: ignore[arg-type]
    for k in range(4):
        req.context.append(enc(speech.wav_bytes(VOICE_A, k)))
    req.reference.CopyFrom(enc(speech.wav_bytes(VOICE_A, 5)))
    req.candidates.add(candidate_id="other-gender", audio=enc(speech.wav_bytes(VOICE_F, 1)))
    req.candidates.add(candidate_id="true", audio=enc(speech.wav_bytes(VOICE_A, 4)))
    req.candidates.add(candidate_id="similar", audio=enc(speech.wav_bytes(VOICE_B, 1)))
    r = await stub.RankCandidates(req, timeout=60)
    assert [c.rank for c in r.candidates] == [1, 2, 3]
    assert r.candidates[0].candidate_id == "true"
    assert sorted(c.candidate_id for c in r.candidates) == ["other-gender", "similar", "true"]
    scores = [c.score for c in r.candidates]
    assert scores == sorted(scores, reverse=r.candidates[0].higher_is_better)
    assert r.usable_context == 4
    assert r.candidates[0].higher_is_better == (method != "centroid")


async def test_server_info(stub: pb_grpc.SleuthStub) -> None:
    info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert info.default_encoder == "ge2e"
    by_name = {e.name: e for e in info.encoders}
    assert set(by_name) == {"ge2e", "campplus", "fused"}  # what `make models` exports, and their fusion
    ge2e = by_name["ge2e"]
    assert by_name["campplus"].embedding_size == 192
    assert ge2e.embedding_size == 256 and ge2e.execution_provider == "CPUExecutionProvider"
    assert set(ge2e.default_thresholds) == {"pairwise", "centroid", "reference"}
    assert dict(info.paper_thresholds) == {"pairwise": 0.4, "centroid": 0.3, "reference": 0.4}
    assert info.max_message_bytes == TEST_MAX_MESSAGE_BYTES


async def test_health_and_reflection(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    resp = await health.Check(health_pb2.HealthCheckRequest(service="sleuthd.v1.Sleuth"), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def one() -> reflection_pb2.ServerReflectionRequest:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = []
    async for r in refl.ServerReflectionInfo(one()):
        names = [s.name for s in r.list_services_response.service]
    assert "sleuthd.v1.Sleuth" in names and "grpc.health.v1.Health" in names

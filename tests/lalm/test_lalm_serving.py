"""Method lalm through a real server: `sleuthd serve --judge-model DIR` (a tiny random Qwen2.5-Omni folder,
loaded through the code a real checkpoint takes) and `--judge-endpoint URL` (the test's OpenAI-compatible
HTTP server answering from the same weights) serve CheckDialogue, StreamDialogue and RankCandidates.

The tiny model's probabilities are random, so the tests check the wiring, not accuracy: each verdict is
what the judge itself says about exactly those waveforms, reference and context turns; the stream's final
verdict is CheckDialogue's; the remote judge answers as the in-process one; bad requests get the status
code and message that say what to fix.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
from sleuthd.cli import main as cli
from sleuthd.config import ConfigError, JudgeConfig, ServerConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd.engine.facade import Engine
from sleuthd.lalm.calibration import Platt, weights_sha256
from sleuthd.lalm.judge import NO_JUDGE, LalmJudge
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc
from sleuthd_bench import cli as bench_cli
from sleuthd_bench.replay import ReplayConfig, ReplayError, replay

from tests.lalm.openai_server import OLD_TEMPLATE, TinyOpenAIServer
from tests.support import REPO, VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, encode_wav

ARCH = "qwen2.5-omni"  # cheaper on short clips (its encoder takes only real frames); also its folder name
SILENCE = encode_wav(np.zeros(32_000, np.float32), 16_000)  # 2 s of digital silence: INSUFFICIENT_AUDIO
TOL = 1e-5  # float32 answers of one prompt batched with different prompts differ by ~1e-7
REMOTE_TOL = 1e-4  # the endpoint reads every answer spelling by id, over the whole vocabulary, one prompt a call


@dataclass
class Served:
    running: RunningServer
    engine: Engine
    metrics: ServiceMetrics
    stub: pb_grpc.SleuthStub

    @property
    def judge(self) -> LalmJudge:
        judge = self.engine.lalm.judge
        assert isinstance(judge, LalmJudge)
        return judge


async def _serve(engine: Engine, judge: JudgeConfig) -> tuple[Served, grpc.aio.Channel]:
    """The session's loaded encoders behind a new engine with ``judge``, on a real server."""
    metrics = ServiceMetrics()
    judged = Engine(engine.models, replace(engine.config, judge=judge), metrics)
    running = await create_server(judged, ServerConfig(port=0, metrics_port=-1), metrics)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    return Served(running, judged, metrics, pb_grpc.SleuthStub(channel)), channel


async def _stop(served: Served, channel: grpc.aio.Channel) -> None:
    await channel.close()
    await served.running.stop(1.0)
    await served.engine.lalm.aclose()  # the encoders and pools belong to the session's engine


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def local(engine: Engine, tiny_dirs: dict[str, Path]) -> AsyncIterator[Served]:
    """`--judge-model DIR`; one context turn per prompt, so a streamed turn changes only some prompts."""
    config = JudgeConfig(judge_model=str(tiny_dirs[ARCH]), judge_device="cpu", judge_max_context_clips=1)
    served, channel = await _serve(engine, config)
    yield served
    await _stop(served, channel)


@pytest.fixture(scope="module")
def endpoint(models: dict[str, Any]) -> Iterator[TinyOpenAIServer]:
    server = TinyOpenAIServer(models[ARCH], "tiny-omni-served").start()
    yield server
    server.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def remote(engine: Engine, endpoint: TinyOpenAIServer) -> AsyncIterator[Served]:
    """`--judge-endpoint URL --judge-model-name NAME`, the same weights and options as ``local``."""
    config = JudgeConfig(judge_endpoint=endpoint.url, judge_model_name=endpoint.name, judge_max_context_clips=1)
    served, channel = await _serve(engine, config)
    yield served
    await _stop(served, channel)


# ------------------------------------------------------------------------------------------ helpers

LALM = pb.CheckOptions(method=pb.METHOD_LALM)


def _dialogue(speech: Speech) -> tuple[list[tuple[str, str, bytes]], dict[str, bytes]]:
    """Speaker A (with a reference): three own turns, one of another voice, one silent; B (no reference):
    two turns; C: one turn and no reference, so nothing to compare with."""
    w = speech.wav_bytes
    turns = [
        ("a0", "A", w(VOICE_A, 0)),
        ("b0", "B", w(VOICE_B, 0)),
        ("a1", "A", w(VOICE_A, 1)),
        ("x", "A", w(VOICE_F, 0)),
        ("quiet", "A", SILENCE),
        ("b1", "B", w(VOICE_B, 1)),
        ("a2", "A", w(VOICE_A, 2)),
        ("c0", "C", w(VOICE_C, 0)),
    ]
    return turns, {"A": w(VOICE_A, 5)}


def _check_request(
    turns: list[tuple[str, str, bytes]], refs: dict[str, bytes], options: pb.CheckOptions = LALM
) -> pb.CheckDialogueRequest:
    req = pb.CheckDialogueRequest(dialogue_id="d", options=options)
    for turn_id, speaker, data in turns:
        req.turns.add(turn_id=turn_id, speaker=speaker, audio=pb.Audio(encoded=data))
    for speaker, data in refs.items():
        req.references.add(speaker=speaker, audio=pb.Audio(encoded=data))
    return req


def _rank_request(speech: Speech, with_reference: bool = True) -> pb.RankCandidatesRequest:
    req = pb.RankCandidatesRequest(speaker="A", options=LALM)
    req.context.extend(pb.Audio(encoded=speech.wav_bytes(VOICE_A, k)) for k in (0, 1))
    if with_reference:
        req.reference.CopyFrom(pb.Audio(encoded=speech.wav_bytes(VOICE_A, 5)))
    for cid, voice, k in (("same", VOICE_A, 3), ("switch", VOICE_F, 1), ("similar", VOICE_B, 2)):
        req.candidates.add(candidate_id=cid, audio=pb.Audio(encoded=speech.wav_bytes(voice, k)))
    return req


def _wave(data: bytes) -> np.ndarray:
    """What the server decodes: 16 kHz mono float32."""
    return decode(AudioInput(data), 300).samples


async def _expected(judge: LalmJudge, turns: list[tuple[str, str, bytes]], refs: dict[str, bytes]) -> dict[str, Any]:
    """Turn id -> the judge's own answer, asked directly: per speaker, the usable turns in order, the
    speaker's reference (or none). The silent turn and a lone turn without a reference are not asked."""
    out: dict[str, Any] = {}
    for speaker in dict.fromkeys(s for _, s, _ in turns):
        mine = [(t, d) for t, s, d in turns if s == speaker and d is not SILENCE]
        ref = _wave(refs[speaker]) if speaker in refs else None
        if len(mine) < 2 and ref is None:
            continue
        answers = await judge.detect_turns([_wave(d) for _, d in mine], ref)
        out.update({t: a for (t, _), a in zip(mine, answers, strict=True)})
    return out


def _statuses(verdict: pb.DialogueVerdict) -> dict[str, int]:
    return {t.turn_id: t.status for t in verdict.turns}


def _assert_same_verdict(a: pb.DialogueVerdict, b: pb.DialogueVerdict, tol: float) -> None:
    assert _statuses(a) == _statuses(b)
    for x, y in zip(a.turns, b.turns, strict=True):
        assert x.HasField("judge_probability") == y.HasField("judge_probability"), x.turn_id
        assert x.judge_probability == pytest.approx(y.judge_probability, abs=tol), x.turn_id
    assert [(s.speaker, s.consistent, s.judged, list(s.inconsistent_turn_ids)) for s in a.speakers] == [
        (s.speaker, s.consistent, s.judged, list(s.inconsistent_turn_ids)) for s in b.speakers
    ]


async def _stream(
    stub: pb_grpc.SleuthStub, turns: list[tuple[str, str, bytes]], refs: dict[str, bytes], finish_order: list[str]
) -> tuple[list[pb.TurnUpdate], pb.DialogueVerdict]:
    """Start every turn in dialogue order, then finish them (one chunk each) in ``finish_order``."""
    call = stub.StreamDialogue(timeout=120)
    opening = pb.StreamOpen(dialogue_id="d", options=LALM)
    for speaker, data in refs.items():
        opening.references.add(speaker=speaker, audio=pb.Audio(encoded=data))
    await call.write(pb.StreamDialogueRequest(open=opening))
    for index, (turn_id, speaker, _) in enumerate(turns):
        start = pb.TurnStart(turn_id=turn_id, speaker=speaker, index=index)
        await call.write(pb.StreamDialogueRequest(turn_start=start))
    data = {t: d for t, _, d in turns}
    for turn_id in finish_order:
        await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn_id, data=data[turn_id], final=True)))
    await call.done_writing()
    messages = [m async for m in call]
    assert (await call.code()) == grpc.StatusCode.OK
    updates = [m.turn for m in messages[:-1]]
    # Each finished turn's own verdict first, then the revisions it caused, before the next turn's.
    firsts = [u for u in updates if not u.revision]
    assert [u.verdict.turn_id for u in firsts] == finish_order
    trigger = ""
    for u in updates:
        trigger = u.verdict.turn_id if not u.revision else trigger
        assert u.trigger_turn_id == trigger
    return updates, messages[-1].final


# ------------------------------------------------------------------------------------------ in-process


async def test_check_dialogue_verdicts_are_the_judges_answers(local: Served, speech: Speech) -> None:
    turns, refs = _dialogue(speech)
    verdict = await local.stub.CheckDialogue(_check_request(turns, refs), timeout=120)
    expected = await _expected(local.judge, turns, refs)
    assert verdict.method == pb.METHOD_LALM and verdict.encoder == "ge2e"
    by_id = {t.turn_id: t for t in verdict.turns}
    assert set(expected) == {"a0", "a1", "x", "a2", "b0", "b1"}
    for turn_id, answer in expected.items():
        t = by_id[turn_id]
        assert t.judge_probability == pytest.approx(answer.probability, abs=TOL), turn_id
        assert t.judge_answer_mass == pytest.approx(answer.answer_mass, rel=1e-4), turn_id
        assert 0.0 < t.judge_answer_mass <= 1.0
        assert (t.score, t.score_scale, t.threshold) == (t.judge_probability, "probability", 0.5)
        assert t.status == (pb.INCONSISTENT if t.judge_probability > 0.5 else pb.CONSISTENT), turn_id
        assert (t.judge_model, t.judge_calibrated) == (ARCH, False)
        assert "uncalibrated" in t.detail
        assert t.HasField("pairwise_mean_cosine")  # the encoder's view comes along, as under every method
    assert by_id["a0"].HasField("reference_cosine") and not by_id["b0"].HasField("reference_cosine")
    # Not heard by the judge: too little speech, and a lone turn without a reference.
    quiet, lone = by_id["quiet"], by_id["c0"]
    assert quiet.status == pb.INSUFFICIENT_AUDIO and not quiet.HasField("judge_probability")
    assert lone.status == pb.INSUFFICIENT_CONTEXT and not lone.HasField("judge_probability") and not lone.judge_model
    speakers = {s.speaker: s for s in verdict.speakers}
    flagged_a = [t for t in ("a0", "a1", "x", "a2") if by_id[t].status == pb.INCONSISTENT]
    assert list(speakers["A"].inconsistent_turn_ids) == flagged_a and speakers["A"].judged
    assert speakers["A"].scored_turns == 4 and speakers["A"].unscored_turns == 1
    assert not speakers["C"].judged


async def test_explicit_thresholds_and_the_paper_set(local: Served, speech: Speech) -> None:
    turns, refs = _dialogue(speech)
    # One long turn whose voice changes halfway (about 9 s), so that drift can be searched in it.
    halves = [_wave(speech.wav_bytes(v, 6)) for v in (VOICE_A, VOICE_F)]
    turns = [t for t in turns if t[1] == "A"] + [("drifting", "A", encode_wav(np.concatenate(halves), 16_000))]
    for threshold, status in ((0.0, pb.INCONSISTENT), (0.9999, pb.CONSISTENT)):
        options = pb.CheckOptions(method=pb.METHOD_LALM, threshold=threshold, detect_drift=threshold > 0)
        verdict = await local.stub.CheckDialogue(_check_request(turns, refs, options), timeout=120)
        judged = {t.turn_id: t for t in verdict.turns if t.HasField("judge_probability")}
        assert len(judged) == 5 and all(t.status == status and t.threshold == threshold for t in judged.values())
        # Drift inside a turn comes from the same decode (the encoder's denser windows), as under every method.
        assert judged["drifting"].HasField("drift_score") == options.detect_drift
        if options.detect_drift:
            assert judged["drifting"].drift_segments and judged["drifting"].detail.startswith("lalm (")
            assert "drift: too little speech to search" in judged["a0"].detail  # under 6 s of speech
    paper = pb.CheckOptions(method=pb.METHOD_LALM, threshold_set=pb.THRESHOLD_SET_PAPER)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.CheckDialogue(_check_request(turns, refs, paper), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no threshold for method lalm" in (err.value.details() or "")


async def test_stream_asks_only_changed_prompts_and_ends_as_check_does(local: Served, speech: Speech) -> None:
    turns, refs = _dialogue(speech)
    before = local.judge.scorer.stats().prompts  # type: ignore[attr-defined]
    updates, final = await _stream(local.stub, turns, refs, [t for t, _, _ in turns])
    asked = local.judge.scorer.stats().prompts - before  # type: ignore[attr-defined]
    # One context turn per prompt (the nearest, earlier on ties). A: a0 alone with the reference (1), then
    # a0 and a1 each hearing the other (2), x hearing a1 (1; a1 keeps a0), quiet not heard (0), a2 hearing
    # x (1). B: b0 alone without a reference (0), then b0 and b1 (2). C: nothing (0). Asking every turn
    # again after each would be 1 + 2 + 3 + 4 + 2 = 12.
    assert asked == 7
    check = await local.stub.CheckDialogue(_check_request(turns, refs), timeout=120)
    _assert_same_verdict(final, check, TOL)
    firsts = [u for u in updates if not u.revision]
    assert [u.verdict.turn_id for u in firsts] == [t for t, _, _ in turns]
    by_first = {u.verdict.turn_id: u.verdict for u in firsts}
    assert by_first["a0"].HasField("judge_probability")  # judged at once against the reference
    assert by_first["b0"].status == pb.INSUFFICIENT_CONTEXT  # alone, no reference: revised once b1 came
    status = {t: v.status for t, v in by_first.items()}
    for u in updates:
        if u.revision:  # a revision is a status change of an earlier turn, caused by a later one
            assert status[u.verdict.turn_id] != u.verdict.status and u.trigger_turn_id != u.verdict.turn_id
        status[u.verdict.turn_id] = u.verdict.status
    assert status == _statuses(final)


async def test_rank_candidates_is_the_judges_ranking(local: Served, speech: Speech) -> None:
    resp = await local.stub.RankCandidates(_rank_request(speech), timeout=120)
    expected = await local.judge.rank(
        [_wave(speech.wav_bytes(v, k)) for v, k in ((VOICE_A, 3), (VOICE_F, 1), (VOICE_B, 2))],
        _wave(speech.wav_bytes(VOICE_A, 5)),
        [_wave(speech.wav_bytes(VOICE_A, k)) for k in (0, 1)],
    )
    assert resp.method == pb.METHOD_LALM and resp.usable_context == 2
    ids = ["same", "switch", "similar"]
    by_id = {c.candidate_id: c for c in resp.candidates}
    for option in expected.options:
        c = by_id[ids[option.index]]
        assert c.rank == option.rank and c.score == pytest.approx(option.probability, abs=TOL)
        assert c.judge_answer_mass == pytest.approx(option.answer_mass, rel=1e-4)
    assert [c.rank for c in resp.candidates] == [1, 2, 3]  # best first
    assert sum(c.score for c in resp.candidates) == pytest.approx(1.0)
    for c in resp.candidates:
        assert (c.score_scale, c.higher_is_better, c.judge_model, c.judge_calibrated) == (
            "probability",
            True,
            ARCH,
            False,
        )
        assert c.HasField("fit_probability")  # the encoder is calibrated: auto's fit comes along
    # No reference and no context: nothing to compare with.
    bare = _rank_request(speech, with_reference=False)
    del bare.context[:]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.RankCandidates(bare, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "method lalm needs" in (err.value.details() or "")


async def test_server_info_describes_the_judge_and_metrics_count_its_calls(
    local: Served, tiny_dirs: dict[str, Path]
) -> None:
    info = (await local.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)).judge
    assert (info.model_name, info.backend, info.architecture, info.device, info.dtype) == (
        ARCH,
        "in-process",
        ARCH,
        "cpu",
        "float32",
    )
    assert info.weights_sha256 == weights_sha256(tiny_dirs[ARCH])
    assert (info.max_clip_seconds, info.max_context_clips, info.orderings, info.decision_threshold) == (300, 1, 0, 0.5)
    assert info.min_answer_mass == 0.5  # no option, no calibration: the default floor
    assert not info.calibrated_detection and not info.calibrated_discrimination and info.prompt_version
    # Every prompt the judge answered went through a batched model call the metrics saw.
    stats = local.judge.scorer.stats()  # type: ignore[attr-defined]
    sample = local.metrics.registry.get_sample_value
    assert stats.prompts > 0
    assert sample("sleuthd_judge_batch_prompts_sum") == stats.prompts
    assert sample("sleuthd_judge_batch_prompts_count") == stats.calls
    assert sample("sleuthd_judge_batch_padded_tokens_sum") == stats.padded_tokens
    assert sample("sleuthd_judge_rejected_total") == 0 and sample("sleuthd_judge_queue_prompts") == 0


async def test_voice_ids_and_clips_the_judge_cannot_hear_whole_are_refused(local: Served, speech: Speech) -> None:
    turns, _ = _dialogue(speech)
    req = _check_request(turns[:3], {})
    req.references.add(speaker="A", voice_id="maya-v2")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.CheckDialogue(req, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "send the reference clip of 'A' as audio" in (err.value.details() or "")


async def test_without_a_judge_lalm_is_a_failed_precondition(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    """The session's server runs no judge: every RPC asking for lalm gets the fix."""
    turns, refs = _dialogue(speech)
    info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert not info.HasField("judge")
    calls = [
        stub.CheckDialogue(_check_request(turns, refs), timeout=60),
        stub.RankCandidates(_rank_request(speech), timeout=60),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, NO_JUDGE)
    stream = stub.StreamDialogue(timeout=60)
    await stream.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="d", options=LALM)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stream.read()
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, NO_JUDGE)


# ------------------------------------------------------------------------------------------ remote


async def test_the_remote_judge_serves_as_the_in_process_one(local: Served, remote: Served, speech: Speech) -> None:
    turns, refs = _dialogue(speech)
    there = await remote.stub.CheckDialogue(_check_request(turns, refs), timeout=120)
    here = await local.stub.CheckDialogue(_check_request(turns, refs), timeout=120)
    _assert_same_verdict(there, here, REMOTE_TOL)
    assert {t.judge_model for t in there.turns if t.HasField("judge_probability")} == {"tiny-omni-served"}
    # Turns finishing out of order (b1 and a2 before x): the final verdict is still CheckDialogue's.
    _, final = await _stream(remote.stub, turns, refs, ["a0", "b0", "a1", "b1", "a2", "x", "quiet", "c0"])
    _assert_same_verdict(final, there, REMOTE_TOL)
    ranked_there = await remote.stub.RankCandidates(_rank_request(speech), timeout=120)
    ranked_here = await local.stub.RankCandidates(_rank_request(speech), timeout=120)
    assert [c.candidate_id for c in ranked_there.candidates] == [c.candidate_id for c in ranked_here.candidates]
    for x, y in zip(ranked_there.candidates, ranked_here.candidates, strict=True):
        assert x.score == pytest.approx(y.score, abs=REMOTE_TOL)
    info = (await remote.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)).judge
    assert (info.backend, info.device, info.model_name, info.architecture) == (
        "remote",
        remote.engine.config.judge.judge_endpoint,
        "tiny-omni-served",
        ARCH,  # told apart at start-up by how the server renders the judge's prompt
    )


async def test_turns_under_the_answer_mass_floor_are_uncertain_not_verdicts(
    engine: Engine, endpoint: TinyOpenAIServer, speech: Speech
) -> None:
    """A floor above every answer mass of the tiny judge (about 0.7): each judged turn is UNCERTAIN
    (LOW_ANSWER_MASS), still with what the judge said, and no speaker is called consistent."""
    endpoint.reset()
    strict = JudgeConfig(
        judge_endpoint=endpoint.url,
        judge_model_name=endpoint.name,
        judge_max_context_clips=1,
        judge_min_answer_mass=0.99,
    )
    served, channel = await _serve(engine, strict)
    try:
        info = (await served.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)).judge
        assert info.min_answer_mass == 0.99 and not info.calibrated_detection
        turns, refs = _dialogue(speech)
        verdict = await served.stub.CheckDialogue(_check_request(turns, refs), timeout=120)
        judged = [t for t in verdict.turns if t.HasField("judge_probability")]
        assert len(judged) == 6
        for t in judged:
            assert (t.status, t.uncertain_reason, t.reason) == (pb.UNCERTAIN, pb.LOW_ANSWER_MASS, 0), t.turn_id
            assert t.judge_answer_mass < 0.99 and t.score == t.judge_probability and not t.judge_calibrated
            assert "under the floor 0.99" in t.detail and "neither flagged nor cleared" in t.detail
        speakers = {s.speaker: s for s in verdict.speakers}
        assert not speakers["A"].consistent and list(speakers["A"].uncertain_turn_ids) == ["a0", "a1", "x", "a2"]
        assert not speakers["A"].inconsistent_turn_ids and list(speakers["B"].uncertain_turn_ids) == ["b0", "b1"]
    finally:
        await _stop(served, channel)


async def test_deployment_refusals_and_oversized_requests_say_what_to_fix(
    engine: Engine, remote: Served, endpoint: TinyOpenAIServer, speech: Speech
) -> None:
    """The endpoint's HTTP 400 reaches the client as FAILED_PRECONDITION with the endpoint's reason (not
    UNAVAILABLE "retry on another replica"); a request of more prompts than the judge's queue can ever hold is
    INVALID_ARGUMENT with the limit named (not RESOURCE_EXHAUSTED "retry later")."""
    turns, refs = _dialogue(speech)
    endpoint.limit_audio = 2  # vLLM started with --limit-mm-per-prompt '{"audio": 2}'; a prompt here has 3
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await remote.stub.CheckDialogue(_check_request(turns, refs), timeout=60)
    finally:
        endpoint.limit_audio = None
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "At most 2 audio(s) may be provided in one prompt" in (err.value.details() or "")
    assert "--limit-mm-per-prompt" in (err.value.details() or "")
    small = JudgeConfig(
        judge_endpoint=endpoint.url,
        judge_model_name=endpoint.name,
        judge_max_queue_prompts=1,
        judge_max_concurrent_requests=1,
    )
    served, channel = await _serve(engine, small)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.stub.CheckDialogue(_check_request(turns, refs), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "asks the judge 6 prompts at once" in (err.value.details() or "")
        assert "queue holds 2 (--judge-max-queue-prompts plus --judge-max-concurrent-requests)" in (
            err.value.details() or ""
        )
    finally:
        await _stop(served, channel)


async def test_remote_startup_checks_the_model_and_refuses_long_clips(
    engine: Engine, endpoint: TinyOpenAIServer, speech: Speech
) -> None:
    wrong = JudgeConfig(judge_endpoint=endpoint.url, judge_model_name="qwen2-audio-7b")
    with pytest.raises(ConfigError, match="serves \\['tiny-omni-served'\\], not 'qwen2-audio-7b'"):
        await _serve(engine, wrong)
    short = JudgeConfig(judge_endpoint=endpoint.url, judge_model_name=endpoint.name, judge_remote_max_clip_seconds=2.0)
    served, channel = await _serve(engine, short)
    try:
        turns, refs = _dialogue(speech)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.stub.CheckDialogue(_check_request(turns, refs), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "hears at most 2 s per clip and never cuts clips" in (err.value.details() or "")
    finally:
        await _stop(served, channel)


async def test_a_stream_keeps_bounded_audio_for_the_judge(
    engine: Engine, endpoint: TinyOpenAIServer, speech: Speech
) -> None:
    """A stream keeps its turns' waveforms (the judge hears them again): beyond the bound, INVALID_ARGUMENT."""
    small = JudgeConfig(
        judge_endpoint=endpoint.url, judge_model_name=endpoint.name, judge_max_stream_audio_mb=0.5
    )  # 0.5 MiB: the reference (about 5 s, 0.3 MiB as float32) and nothing much more
    served, channel = await _serve(engine, small)
    try:
        turns, refs = _dialogue(speech)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _stream(served.stub, turns, refs, [t for t, _, _ in turns])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "(--judge-max-stream-audio-mb): open a new stream" in (err.value.details() or "")
    finally:
        await _stop(served, channel)


async def test_the_audio_a_stream_keeps_for_the_judge_counts_in_the_audio_budget(
    engine: Engine, endpoint: TinyOpenAIServer, speech: Speech
) -> None:
    """Issue 33, finding 7: each lalm stream kept up to 256 MiB of decoded audio outside the process's audio
    budget. Now the waveforms a stream keeps are held in it (its client's share) until the stream ends."""
    config = JudgeConfig(judge_endpoint=endpoint.url, judge_model_name=endpoint.name)
    served, channel = await _serve(engine, config)
    budget = served.running.gate.limits.budget
    try:
        turns, refs = _dialogue(speech)
        call = served.stub.StreamDialogue(timeout=120)
        opening = pb.StreamOpen(dialogue_id="d", options=LALM)
        opening.references.add(speaker="A", audio=pb.Audio(encoded=refs["A"]))
        await call.write(pb.StreamDialogueRequest(open=opening))
        kept_seconds = 0.0
        for index, (turn_id, speaker, data) in enumerate(turns[:3]):
            await call.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id=turn_id, speaker=speaker,
                                                                                index=index)))  # fmt: skip
            await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn_id, data=data, final=True)))
            update = await call.read()
            assert update.turn.verdict.turn_id == turn_id
            kept_seconds += update.turn.verdict.audio_seconds
        # The reference and the three turns' waveforms (float32 at 16 kHz), and nothing else, are held.
        assert budget.held >= kept_seconds * 16_000 * 4 > 0
        await call.done_writing()
        while not (await call.read()).HasField("final"):
            pass
        assert await call.code() == grpc.StatusCode.OK
        assert budget.held == 0
    finally:
        await _stop(served, channel)


def test_the_serving_path_imports_no_torch_transformers_or_httpx() -> None:
    """A server installed without the judge extra still starts: the judge's libraries load only for a judge."""
    code = (
        "import sys\n"
        "import sleuthd.rpc.server, sleuthd.engine.facade, sleuthd.engine.judging, sleuthd.cli.main\n"
        "print(sorted(m for m in ('torch', 'transformers', 'httpx') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------ replay


async def test_replay_with_lalm_reports_the_judge_and_calibrates_it(
    local: Served, server: RunningServer, engine: Engine, tiny_dirs: dict[str, Path], speech: Speech, tmp_path: Path
) -> None:
    """Two dialogues of the test speech as a benchmark manifest, replayed with --methods lalm; then
    `sleuthd-bench judge calibrate` fits the judge's calibration from that replay, and a server started with it
    (--judge-calibration) applies it to every verdict."""
    for voice in (VOICE_A, VOICE_B, VOICE_F, VOICE_C):
        for k in range(6):
            (tmp_path / f"{voice}-{k}.wav").write_bytes(speech.wav_bytes(voice, k))
    lines = []
    for n, (target, similar) in enumerate(((VOICE_A, VOICE_B), (VOICE_B, VOICE_A))):
        lines.append(
            {
                "dialogue_id": f"d{n}",
                "source": "test",
                "target_speaker": "T",
                "reference": f"{target}-5.wav",
                "target_turns": [f"{target}-{k}.wav" for k in range(4)],
                "altered_turn": 1 + n,
                "s2_audio": f"{VOICE_F}-{n}.wav",
                "s3_audio": f"{similar}-4.wav",
            }
        )
    manifest = tmp_path / "tiny.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    config = ReplayConfig(manifest, f"127.0.0.1:{local.running.port}", out, ("lalm",), ("paper",), show_progress=False)
    result = await replay(config)
    assert result.failures == [] and result.incomplete_runs == []
    report = json.loads((out / "report.json").read_text())
    assert list(report["methods"]) == ["lalm", "pairwise@paper", "centroid@paper", "reference@paper"]
    assert set(report["methods"]["lalm"]) == {"detection", "localization", "discrimination"}
    predictions = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    lalm_turns = [t for p in predictions if p["run"] == "lalm" and "turns" in p for t in p["turns"]]
    assert len(lalm_turns) == 2 * 3 * 4 and all(t["judge_probability"] == t["score"] for t in lalm_turns)
    others = [t for p in predictions if p["run"] != "lalm" and "turns" in p for t in p["turns"]]
    assert others and not any("judge_probability" in t for t in others)  # other runs' records are unchanged
    replay_doc = json.loads((out / "replay.json").read_text())
    assert replay_doc["judge"]["model"] == ARCH and not replay_doc["judge"]["calibrated_detection"]
    calibration = json.loads((out / "calibration_lalm.json").read_text())
    assert calibration["run"] == "lalm" and calibration["turns"] == len(lalm_turns)
    assert (out / "reliability_lalm.png").exists() and not (out / "calibration.json").exists()
    md = (out / "report.md").read_text()
    assert "| lalm |" in md and "## The LALM judge (run `lalm`)" in md
    # A server without a judge is refused before any instance is sent.
    bare = replace(config, target=f"127.0.0.1:{server.port}", out_dir=tmp_path / "bare")
    with pytest.raises(ReplayError, match="has no LALM judge, so --methods lalm cannot run"):
        await replay(bare)

    # `sleuthd-bench judge calibrate OUT --out FILE`: keyed to the weights and prompt version the replay names.
    cal = tmp_path / "judge-calibration.json"
    assert bench_cli.main(["--log-level", "warning", "judge", "calibrate", str(out), "--out", str(cal)]) == 0
    weights = weights_sha256(tiny_dirs[ARCH])
    entry = json.loads(cal.read_text())["calibrations"][weights]
    assert entry["prompt_version"] == local.judge.info.prompt_version and entry["model_name"] == ARCH
    assert entry["detection"]["kind"] in ("platt", "temperature") and entry["detection"]["instances"] == 24
    assert entry["discrimination"]["instances"] == 2 and 0 < entry["min_answer_mass"] < 1
    fit_report = json.loads((tmp_path / "judge_calibration_report.json").read_text())
    det = fit_report["detection"]
    assert det["chosen"] == entry["detection"]["kind"] and set(det["cv_log_loss"]) == {"platt", "temperature"}
    assert {"ece", "brier", "log_loss"} <= set(det["before"]) == set(det["after_cross_validated"])
    assert (tmp_path / "judge_reliability.png").stat().st_size > 0
    # Refused: a replay of a calibrated judge (its probabilities are not raw).
    doc = json.loads((out / "replay.json").read_text())
    doc["judge"]["calibrated_detection"] = True
    (tmp_path / "calibrated").mkdir()
    (tmp_path / "calibrated" / "replay.json").write_text(json.dumps(doc))
    assert bench_cli.main(["judge", "calibrate", str(tmp_path / "calibrated"), "--out", str(cal)]) == 2

    # The server started with that file uses it: GetServerInfo and every verdict say so.
    raw_verdict = await local.stub.CheckDialogue(_check_request(*_dialogue(speech)), timeout=120)
    config = replace(local.engine.config.judge, judge_calibration=str(cal))
    served, channel = await _serve(engine, config)
    try:
        info = (await served.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)).judge
        assert info.calibrated_detection and info.calibrated_discrimination
        assert info.min_answer_mass == pytest.approx(entry["min_answer_mass"])
        verdict = await served.stub.CheckDialogue(_check_request(*_dialogue(speech)), timeout=120)
        platt = Platt(**entry["detection"])
        raw = {t.turn_id: t for t in raw_verdict.turns}
        judged = [t for t in verdict.turns if t.HasField("judge_probability")]
        assert len(judged) == 6
        for t in judged:
            assert t.judge_calibrated and ", calibrated)" in t.detail
            assert t.judge_probability == pytest.approx(platt.apply(raw[t.turn_id].judge_probability), abs=TOL)
            decided = pb.INCONSISTENT if t.judge_probability > 0.5 else pb.CONSISTENT
            assert t.status == (pb.UNCERTAIN if t.judge_answer_mass < info.min_answer_mass else decided)
    finally:
        await _stop(served, channel)


# ------------------------------------------------------------------------------------------ the command line


def test_sleuthd_serve_with_a_judge_model_folder(
    tmp_path: Path,
    tiny_dirs: dict[str, Path],
    endpoint: TinyOpenAIServer,
    speech: Speech,
    capsys: pytest.CaptureFixture,
) -> None:
    """`sleuthd serve --judge-model DIR` in a subprocess (DIR as `sleuthd models tiny-judge` writes it)."""
    folder = tiny_dirs[ARCH]
    # A judge that cannot start ends `sleuthd serve` with one line (after the encoders loaded).
    serve = ["serve", "--port", "0", "--metrics-port", "-1", "--models-dir", str(REPO / "models")]
    assert cli.main(["--log-level", "warning", *serve, "--judge-model", str(tmp_path / "missing")]) == 2
    missing = f"error: {tmp_path / 'missing'} is not a model folder: it has no config.json"
    assert capsys.readouterr().err.strip().splitlines()[-1] == missing
    # A vLLM started without sleuthd's chat template (an old checkpoint template: no audio placeholder).
    endpoint.reset()
    endpoint.chat_template = OLD_TEMPLATE
    try:
        remote = ["--judge-endpoint", endpoint.url, "--judge-model-name", endpoint.name]
        assert cli.main(["--log-level", "warning", *serve, *remote]) == 2
    finally:
        endpoint.reset()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: judge endpoint {endpoint.url} cannot render the judge's prompts: ")
    assert "found 0 prompt updates" in last and "--chat-template" in last

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", *serve]
    proc = subprocess.Popen(
        [*base, "--judge-model", str(folder), "--judge-device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sleuthd listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        turns, refs = _dialogue(speech)

        async def ask() -> tuple[pb.GetServerInfoResponse, pb.DialogueVerdict]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pb_grpc.SleuthStub(ch)
                info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
                return info, await stub.CheckDialogue(_check_request(turns[:4], refs), timeout=120)

        info, verdict = asyncio.run(ask())
        assert info.judge.model_name == ARCH and info.judge.weights_sha256 == weights_sha256(folder)
        assert [t.status != pb.INSUFFICIENT_CONTEXT for t in verdict.turns if t.speaker == "A"] == [True] * 3
        assert all(t.judge_model == ARCH for t in verdict.turns if t.speaker == "A")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

"""The remote judge against a real HTTP server that answers from the same tiny model in vLLM's shapes."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import torch
from sleuthd.config import ConfigError
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded
from sleuthd.lalm import prompts
from sleuthd.lalm.inprocess import LocalScorer
from sleuthd.lalm.judge import LalmJudge
from sleuthd.lalm.local import LocalModel
from sleuthd.lalm.remote import RemoteScorer
from sleuthd.lalm.selftest import self_test_prompt
from sleuthd.lalm.types import Clip, JudgeDeploymentError, JudgeUnanswered

from tests.lalm.lalm_support import ARCHS
from tests.lalm.openai_server import OLD_TEMPLATE, TinyOpenAIServer, decode_audio
from tests.support import VOICE_A, VOICE_B, VOICE_F

TOL = 1e-4  # probability: remote against in-process on the same weights


@pytest.fixture(scope="module", params=ARCHS)
def served(request: pytest.FixtureRequest, models: dict[str, Any]) -> Iterator[TinyOpenAIServer]:
    server = TinyOpenAIServer(models[request.param], f"tiny-{request.param}").start()
    yield server
    server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def remote(served: TinyOpenAIServer) -> AsyncIterator[RemoteScorer]:
    served.reset()
    scorer = RemoteScorer(served.url, served.name, request_timeout_s=30)
    await scorer.check()
    yield scorer
    await scorer.aclose()


@pytest.fixture(scope="module")
def confident(tiny_dirs: dict[str, Path]) -> LocalModel:
    """The tiny Qwen2-Audio with 25 other tokens made likelier than "No" and "No" left at about 4 % of "Yes":
    the losing answer is outside the top 20 (its probability is small, not 0)."""
    model = LocalModel.load(tiny_dirs["qwen2-audio"], device="cpu")
    head = model.model.lm_head.weight
    yes = head[model.answer_ids(prompts.SAME)[0]].clone()
    with torch.no_grad():
        for token in range(1000, 1025):
            head[token] = 0.95 * yes
        for token in model.answer_ids(prompts.DIFFERENT):
            head[token] = 0.75 * yes
    return model


@pytest.fixture(scope="module")
def evasive(tiny_dirs: dict[str, Path]) -> LocalModel:
    """The tiny Qwen2-Audio with one token made likelier than "Yes": it would rather say something else."""
    model = LocalModel.load(tiny_dirs["qwen2-audio"], device="cpu")
    head = model.model.lm_head.weight
    with torch.no_grad():
        head[1000] = 1.3 * head[model.answer_ids(prompts.SAME)[0]]
    return model


def _prompts(voices: dict[str, list[np.ndarray]]) -> list[prompts.Prompt]:
    a, b, f = ([Clip.of(w) for w in voices[v]] for v in (VOICE_A, VOICE_B, VOICE_F))
    return [
        prompts.detection(a[1], a[0], [a[2]]),
        prompts.detection(f[0], a[0]),
        prompts.discrimination([a[1], b[1], f[0]], a[0]),
    ]


def _assert_agree(got: Any, local: Any) -> None:
    assert got.exact
    np.testing.assert_allclose(np.exp(got.log_probs), np.exp(local.log_probs), atol=TOL)
    np.testing.assert_allclose(got.shares(), local.shares(), atol=TOL)
    assert got.answer_mass == pytest.approx(local.answer_mass, abs=TOL)


async def test_remote_and_in_process_agree_by_token_id(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    """Every answer spelling is read by id over the whole vocabulary (logprob_token_ids), as in-process does,
    whether the server writes tokens as text by default or as ids (--return-tokens-as-token-ids)."""
    model = served.model
    for by_default in (False, True):
        served.token_ids_by_default = by_default
        for prompt in _prompts(voices):
            got = await remote.score(prompt)
            (local,) = model.run([model.prepare(prompt)])
            _assert_agree(got, local)
    assert remote.exact_answers is True


async def test_the_losing_answer_outside_the_top_20_is_read_not_zero(
    confident: LocalModel, voices: dict[str, list[np.ndarray]]
) -> None:
    prompt = _prompts(voices)[0]
    prepared = confident.prepare(prompt)
    (local,) = confident.run([prepared])
    top20 = {i for i, _ in confident.top_log_probs([prepared], k=20)[0]}
    assert not top20 & set(prepared.answer_ids[1])  # no spelling of "No" is among the top 20
    assert 0.005 < local.shares()[1] < 0.2  # small, far from 0
    server = TinyOpenAIServer(confident, "tiny-confident").start()
    scorer = RemoteScorer(server.url, server.name)
    try:
        await scorer.check()
        for by_default in (False, True):
            server.token_ids_by_default = by_default
            _assert_agree(await scorer.score(prompt), local)
        # An older vLLM ignores logprob_token_ids and lists its top 20: "No" is then unknown, not 0 — bounded
        # by the 20th token's probability, and the judge reports the most it can be.
        server.named_ids = False
        bounded = await scorer.score(prompt)
        assert not bounded.exact and bounded.log_probs[1] == -math.inf
        low, high = bounded.share_bounds(1)
        assert low == 0.0 and local.shares()[1] < high < 1.0  # here about 0.6: 3 spellings could each be 20th
        test, reference, other = (prompt.clips[k].samples for k in (-1, 0, 1))
        judged = await LalmJudge(scorer).detect(test, reference, [other])
        assert judged.bounds == pytest.approx((low, high)) and judged.probability == pytest.approx(high)
        # With no answer at all among the 20 (the model would rather say token 1000, and "Yes" is hidden), the
        # served model does not follow the prompt: a deployment fault.
        head = confident.model.lm_head.weight
        with torch.no_grad():
            head[1000] = 1.3 * head[prepared.answer_ids[0][0]]
        server.hide_ids = set(prepared.answer_ids[0])
        with pytest.raises(JudgeUnanswered, match=r"none of the answers \(Yes, No\) is among the 20 first tokens"):
            await scorer.score(prompt)
    finally:
        await scorer.aclose()
        server.stop()


async def test_the_request_asks_for_the_answers_by_id_with_uuid_tagged_audio(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    prompt = _prompts(voices)[0]
    before = len(served.requests)
    await remote.score(prompt)
    body = served.requests[before]
    assert body["model"] == served.name
    assert (body["max_tokens"], body["temperature"], body["logprobs"], body["top_logprobs"]) == (1, 0.0, True, 20)
    assert body["return_tokens_as_token_ids"] is True
    want = sorted({i for a in prompt.answers for i in served.model.answer_ids(a)})
    assert body["logprob_token_ids"] == want and len(want) == 6  # Yes/yes/YES/No/no/NO, the served tokenizer's ids
    system, user = body["messages"]
    assert system == {"role": "system", "content": prompts.SYSTEM}
    audio = [p for p in user["content"] if p["type"] == "input_audio"]
    assert len(audio) == len(prompt.clips) == 3
    # Each clip its own input, in prompt order, as 16-bit WAV tagged with its content hash.
    for part, clip in zip(audio, prompt.clips, strict=True):
        assert part["uuid"] == clip.key
        np.testing.assert_array_equal(decode_audio(part), clip.samples)


async def test_a_server_that_writes_token_text_is_refused_not_matched_by_string(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.writes_token_text = True
    with pytest.raises(JudgeDeploymentError, match=r"not as 'token_id:N'.*cannot be matched by token id"):
        await remote.score(_prompts(voices)[1])


async def test_shared_clips_go_once_then_by_reference(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    """A speaker's four turns with a reference and two context turns each: 4 prompts of 4 clips. The reference
    and every turn travel in full once; the other 11 clip parts go by uuid; the answers are those of prompts
    sent in full."""
    turns = [*voices[VOICE_A][1:4], voices[VOICE_F][0]]
    reference = voices[VOICE_A][0]
    plain = RemoteScorer(served.url, served.name, reuse_clips=False)
    try:
        want = await LalmJudge(plain, max_context_clips=2).detect_turns(turns, reference)
    finally:
        await plain.aclose()
    assert await remote.probe_references(self_test_prompt())  # clips of its own: none of the dialogue's
    before = len(served.requests)
    got = await LalmJudge(remote, max_context_clips=2).detect_turns(turns, reference)
    bodies = served.requests[before:]
    parts = [p for body in bodies for p in body["messages"][1]["content"] if p["type"] == "input_audio"]
    full = [p["uuid"] for p in parts if p["input_audio"] is not None]
    assert len(parts) == 16 and sorted(full) == sorted({Clip.of(w).key for w in [reference, *turns]})
    for g, w in zip(got, want, strict=True):
        assert g.probability == pytest.approx(w.probability, abs=1e-9)
    # The server lost its media cache (restart, eviction): the refused prompt goes again in full, same answer.
    served.media.clear()
    sent = len(served.requests)
    again = await LalmJudge(remote, max_context_clips=2).detect(turns[0], reference, turns[1:3])
    assert len(served.requests) == sent + 2 and again.probability == pytest.approx(want[0].probability, abs=1e-9)
    # A server that takes no references (older vLLM) is found out at the probe: every prompt in full.
    served.media_uuids = False
    assert not await remote.probe_references(self_test_prompt()) and not remote.reuse_clips


async def test_refusals_carry_the_servers_reason(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.limit_audio = 2
    for legacy in (False, True):  # vLLM's error body, and the shape releases before 0.10 wrote
        served.legacy_errors = legacy
        with pytest.raises(
            JudgeDeploymentError, match=r"HTTP 400\): At most 2 audio\(s\) may be provided.*3 audio inputs.*--limit-mm"
        ):
            await remote.score(_prompts(voices)[0])
    served.limit_audio, served.chat_template = None, OLD_TEMPLATE
    with pytest.raises(JudgeDeploymentError, match=r"found 0 prompt updates.*--chat-template"):
        await remote.score(_prompts(voices)[1])
    served.fail_with = (429, "too many requests")
    with pytest.raises(Overloaded, match="busy"):
        await remote.score(_prompts(voices)[1])
    served.fail_with = (500, "engine dead")
    with pytest.raises(EngineFailure, match=r"HTTP 500.*engine dead"):
        await remote.score(_prompts(voices)[1])


async def test_check_lists_the_served_model(served: TinyOpenAIServer, remote: RemoteScorer) -> None:
    await remote.check()
    wrong = RemoteScorer(served.url, "qwen2-audio-7b")
    with pytest.raises(ConfigError, match="not 'qwen2-audio-7b'"):
        await wrong.check()
    await wrong.aclose()


async def test_the_self_test_fails_on_a_template_without_audio_placeholders(served: TinyOpenAIServer) -> None:
    served.reset()
    judge = LalmJudge(RemoteScorer(served.url, served.name))
    try:
        assert "renders prompts as sleuthd's" in await judge.start()
        assert judge.info.architecture == served.model.arch  # told apart by how the server renders
        served.chat_template = OLD_TEMPLATE
        with pytest.raises(ConfigError) as err:
            await judge.start()
        line = str(err.value)
        assert "\n" not in line and "prompt updates" in line and "--chat-template" in line
    finally:
        await judge.aclose()


async def test_the_self_test_fails_on_a_model_that_does_not_answer(evasive: LocalModel) -> None:
    server = TinyOpenAIServer(evasive, "tiny-evasive").start()
    try:
        for scorer in (RemoteScorer(server.url, server.name), LocalScorer(evasive)):
            judge = LalmJudge(scorer, min_answer_mass=0.99)  # a strict floor: the bar stays at 0.25
            try:
                with pytest.raises(ConfigError, match=r"put 0\.0\d+ of its first-token .*under 0\.25: it does not"):
                    await judge.start()
            finally:
                await judge.aclose()
    finally:
        server.stop()


async def test_deadline_and_cancellation_leave_the_request(
    served: TinyOpenAIServer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.reset()
    served.delay_s = 3.0
    scorer = RemoteScorer(served.url, served.name, max_concurrent_requests=1, max_queue_prompts=1, reuse_clips=False)
    await scorer.check()
    prompt = _prompts(voices)[1]
    loop = asyncio.get_running_loop()
    with pytest.raises(DeadlineExceeded, match="judge endpoint"):
        await scorer.score(prompt, deadline=loop.time() + 0.2)
    in_flight = asyncio.ensure_future(scorer.score(prompt))
    waiting = asyncio.ensure_future(scorer.score(prompt))
    while scorer.waiting < 1:  # the second request queues behind the first's connection slot
        await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="1 judge requests are waiting"):
        await scorer.score(prompt)
    for task in (in_flight, waiting):
        task.cancel()
    results = await asyncio.gather(in_flight, waiting, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    served.delay_s = 0.0
    await scorer.aclose()

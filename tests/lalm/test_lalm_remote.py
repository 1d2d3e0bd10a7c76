"""The remote judge against a real HTTP server that answers from the same tiny model."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from sleuthd.config import ConfigError
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded
from sleuthd.lalm import prompts
from sleuthd.lalm.inprocess import LocalScorer
from sleuthd.lalm.judge import LalmJudge
from sleuthd.lalm.remote import RemoteScorer
from sleuthd.lalm.types import Clip, JudgeUnanswered

from tests.lalm.lalm_support import ARCHS
from tests.lalm.openai_server import TinyOpenAIServer, decode_audio
from tests.support import VOICE_A, VOICE_B, VOICE_F


@pytest.fixture(scope="module", params=ARCHS)
def served(request: pytest.FixtureRequest, models: dict[str, Any]) -> Iterator[TinyOpenAIServer]:
    server = TinyOpenAIServer(models[request.param], f"tiny-{request.param}").start()
    yield server
    server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def remote(served: TinyOpenAIServer) -> AsyncIterator[RemoteScorer]:
    served.delay_s, served.fail_with, served.hide_tokens = 0.0, None, set()
    scorer = RemoteScorer(served.url, served.name, request_timeout_s=30)
    yield scorer
    await scorer.aclose()


def _prompts(voices: dict[str, list[np.ndarray]]) -> list[prompts.Prompt]:
    a, b, f = ([Clip.of(w) for w in voices[v]] for v in (VOICE_A, VOICE_B, VOICE_F))
    return [
        prompts.detection(a[1], a[0], [a[2]]),
        prompts.detection(f[0], a[0]),
        prompts.discrimination([a[1], b[1], f[0]], a[0]),
    ]


async def test_remote_and_in_process_probabilities_agree(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    model = served.model
    for prompt in _prompts(voices):
        got = await remote.score(prompt)
        prepared = model.prepare(prompt)
        (local,) = model.run([prepared])
        # Exactly what the top 20 say (only the spellings there are counted) …
        top = dict(model.top_log_probs([prepared], k=20)[0])
        for ids, lp in zip(prepared.answer_ids, got.log_probs, strict=True):
            seen = [top[i] for i in ids if i in top]
            assert seen, "the tiny judge puts its answer tokens in the top 20"
            assert lp == pytest.approx(math.log(sum(math.exp(x) for x in seen)), abs=1e-5)
        # … which is the full-vocabulary answer up to the spellings the top 20 leave out.
        np.testing.assert_allclose(got.shares(), local.shares(), atol=1e-4)
        assert got.answer_mass == pytest.approx(local.answer_mass, rel=1e-3)


async def test_the_request_is_one_token_at_temperature_zero_with_audio_parts(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    prompt = _prompts(voices)[0]
    before = len(served.requests)
    await remote.score(prompt)
    body = served.requests[before]
    assert body["model"] == served.name
    assert (body["max_tokens"], body["temperature"], body["logprobs"], body["top_logprobs"]) == (1, 0.0, True, 20)
    system, user = body["messages"]
    assert system == {"role": "system", "content": prompts.SYSTEM}
    audio = [p for p in user["content"] if p["type"] == "input_audio"]
    assert len(audio) == len(prompt.clips) == 3
    # Each clip its own input, in prompt order, as 16-bit WAV: the speech (16-bit already) arrives intact.
    for part, clip in zip(audio, prompt.clips, strict=True):
        np.testing.assert_array_equal(decode_audio(part), clip.samples)
    assert all("text" in p for p in user["content"] if p["type"] == "text")


async def test_remote_judge_matches_the_in_process_judge(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    turns = [voices[VOICE_A][1], voices[VOICE_F][0], voices[VOICE_A][2]]
    local = LocalScorer(served.model)
    try:
        here = await LalmJudge(local, max_context_clips=1).detect_turns(turns, voices[VOICE_A][0])
        there = await LalmJudge(remote, max_context_clips=1).detect_turns(turns, voices[VOICE_A][0])
    finally:
        await local.aclose()
    for h, t in zip(here, there, strict=True):
        assert t.probability == pytest.approx(h.probability, abs=1e-4)
        assert (t.calibrated, t.model_name) == (False, served.name)


async def test_check_lists_the_served_model(served: TinyOpenAIServer, remote: RemoteScorer) -> None:
    await remote.check()
    wrong = RemoteScorer(served.url, "qwen2-audio-7b")
    with pytest.raises(ConfigError, match="not 'qwen2-audio-7b'"):
        await wrong.check()
    await wrong.aclose()


async def test_a_model_that_does_not_answer_is_reported(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.hide_tokens = {"Yes", "No", "yes", "no", "YES", "NO"}
    with pytest.raises(JudgeUnanswered, match=r"20 most likely first tokens .* hold no answer \(Yes, No\)"):
        await remote.score(_prompts(voices)[0])


async def test_an_http_error_says_what_the_endpoint_said(
    served: TinyOpenAIServer, remote: RemoteScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.fail_with = (400, "At most 1 audio(s) may be provided in one prompt.")
    with pytest.raises(EngineFailure, match=r"HTTP 400: .*At most 1 audio.*--limit-mm-per-prompt"):
        await remote.score(_prompts(voices)[1])


async def test_deadline_and_cancellation_leave_the_request(
    served: TinyOpenAIServer, voices: dict[str, list[np.ndarray]]
) -> None:
    served.delay_s = 3.0
    scorer = RemoteScorer(served.url, served.name, max_concurrent_requests=1, max_queue_prompts=1)
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

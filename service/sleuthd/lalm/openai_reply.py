"""Reading an OpenAI-compatible server's answers the way vLLM writes them.

First-token log-probabilities (``choices[0].logprobs.content[0]``): the request asks for the answer tokens
by id (``logprob_token_ids``, vLLM's extension) and for tokens written as ids
(``return_tokens_as_token_ids``), so every entry reads ``{"token": "token_id:9454", "logprob": -0.11, …}``:
answers are matched by id, never by token text (which differs between tokenizers, byte-level pieces and
servers). vLLM writes log-probabilities below -9999 as -9999.0.

- A server that honours ``logprob_token_ids`` lists the sampled token and every id asked for: the answer is
  exact (the log-probabilities are over the whole vocabulary, as in-process).
- An older one ignores it and lists its top ``top_logprobs`` tokens: an answer spelling outside that list is
  unknown, with the k-th token's probability as its ceiling (:class:`~sleuthd.lalm.types.AnswerScores`
  bounds); when no spelling of any answer is there, :class:`~sleuthd.lalm.types.JudgeUnanswered`.
- A server that writes token text instead of ids cannot be read: :class:`JudgeDeploymentError`.

Error bodies: vLLM answers ``{"error": {"message", "type", "param", "code"}}`` (releases before 0.10:
``{"object": "error", "message", …}``); :func:`error_reason` takes the message out of either and
:func:`deployment_hint` adds the vLLM option that fixes the common ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from sleuthd.lalm.types import AnswerScores, JudgeDeploymentError, JudgeUnanswered

TOKEN_ID_PREFIX = "token_id:"
_VLLM_LOGPROB_FLOOR = -9999.0  # vLLM's lowest reported log-probability (it clamps, never writes -inf)


def _token_id(entry: dict[str, Any]) -> int:
    token = str(entry["token"])
    if not token.startswith(TOKEN_ID_PREFIX):
        raise JudgeDeploymentError(
            f"the judge endpoint wrote a first token as text ({token!r}), not as 'token_id:N': it ignores "
            "return_tokens_as_token_ids (a vLLM request field), so answers cannot be matched by token id; serve "
            "the judge with vLLM"
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


def _log_prob(entry: dict[str, Any]) -> float:
    value = float(entry["logprob"])
    return -math.inf if value <= _VLLM_LOGPROB_FLOOR else value


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values, default=-math.inf)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values))


def first_token_log_probs(reply: dict[str, Any]) -> tuple[dict[int, float], list[float]]:
    """Every first-token entry of a chat completion by token id (the sampled token and its
    ``top_logprobs``), and the log-probabilities of the ``top_logprobs`` list alone, in its order."""
    try:
        first = reply["choices"][0]["logprobs"]["content"][0]
        listed = list(first.get("top_logprobs") or [])
        seen = {_token_id(e): _log_prob(e) for e in [first, *listed]}
        return seen, [_log_prob(e) for e in listed]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise JudgeDeploymentError(
            f"the judge endpoint's reply has no first-token log-probabilities ({exc!r}); it must answer "
            "chat completions with logprobs as vLLM does"
        ) from exc


def parse_answer(reply: dict[str, Any], answer_ids: Sequence[Sequence[int]], labels: Sequence[str]) -> AnswerScores:
    """The answer options' log-probabilities from a chat completion; ``answer_ids[i]``: the token ids of
    option ``i``'s one-token spellings, ``labels[i]`` its name (for messages)."""
    seen, listed = first_token_log_probs(reply)
    lows, highs = [], []
    missing_any = False
    # No token outside a top-k list is more likely than its last; with no list at all, nothing bounds it.
    floor = min(listed) if listed else 0.0
    for ids in answer_ids:
        known = [seen[i] for i in ids if i in seen]
        missing = sum(1 for i in ids if i not in seen)
        missing_any |= missing > 0
        lows.append(_logsumexp(known))
        highs.append(_logsumexp([*known, *([floor] * missing)]))
    if all(lp == -math.inf for lp in lows) and missing_any:
        shown = ", ".join(f"{i}: {lp:.2f}" for i, lp in list(seen.items())[:5])
        raise JudgeUnanswered(
            f"none of the answers ({', '.join(labels)}) is among the {len(listed)} first tokens the judge endpoint "
            f"reported (token id: log-probability {shown}, …), and it ignored logprob_token_ids (serve the judge "
            "with a vLLM that has it); check the served model and its chat template"
        )
    mass = min(1.0, sum(math.exp(lp) for lp in lows))
    return AnswerScores(tuple(lows), mass, tuple(highs) if missing_any else None)


def error_reason(body: str) -> str:
    """The message of an error response (vLLM's current or older shape, or the raw text)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.strip()[:500]
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        if doc.get("message"):
            return str(doc["message"])[:500]
        if isinstance(inner, str):
            return inner[:500]
    return body.strip()[:500]


def deployment_hint(reason: str, audios: int, template_hint: str) -> str:
    """What to change in the vLLM deployment for a refusal that says ``reason`` (empty when unknown)."""
    text = reason.lower()
    if "may be provided in one prompt" in text or "limit-mm-per-prompt" in text or "limit_mm_per_prompt" in text:
        return (
            f"this prompt has {audios} audio inputs: start vLLM with --limit-mm-per-prompt '{{\"audio\": N}}', N at "
            "least --judge-max-context-clips + 11 (docs/judge.md)"
        )
    if "prompt updates" in text or "placeholder" in text:
        return f"its chat template rendered no audio placeholder for some clips: {template_hint}"
    if "maximum context length" in text or "max_model_len" in text or "too long" in text:
        return "the prompt is longer than the server's context: raise vLLM's --max-model-len or send shorter clips"
    if "logprobs" in text:
        return "vLLM's --max-logprobs must be at least --judge-top-logprobs"
    if "does not exist" in text or "not found" in text:
        return "check --judge-model-name against the endpoint's /v1/models"
    return ""

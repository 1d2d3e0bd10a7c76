"""The remote scoring backend: an OpenAI-compatible chat-completions endpoint (vLLM serves both judges).

Each prompt is one ``POST {endpoint}/chat/completions`` asking for one token at temperature 0 with the
first token's ``top_logprobs``; every clip is an ``input_audio`` content part (base64 16-bit WAV). The
answer options' probabilities are read from those log-probabilities by matching each option's spellings
to the returned token strings. An option missing from the top-k counts as probability 0 (its real
probability is below the smallest one returned); when no option is there at all the prompt fails with
:class:`~sleuthd.lalm.types.JudgeUnanswered`.

The HTTP client is ``httpx`` (in the ``judge`` extra): an asyncio client, so a cancelled RPC cancels its
request and closes the connection (vLLM then aborts the generation), with connection pooling and
per-request timeouts. The standard library's blocking client in a thread could do neither.

vLLM settings that matter: ``--limit-mm-per-prompt '{"audio": N}'`` (clips per prompt: reference + context
+ the turn, or + the candidates), ``--max-logprobs`` ≥ top_logprobs, and a request-level
``temperature: 0`` overrides the checkpoint's generation defaults.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import math
from collections import OrderedDict
from typing import Any

import soundfile as sf

from sleuthd.config import ConfigError
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded
from sleuthd.lalm.prompts import Prompt
from sleuthd.lalm.types import SAMPLE_RATE, AnswerScores, Clip, JudgeUnanswered

logger = logging.getLogger(__name__)

_WAV_CACHE_ENTRIES = 64  # encoded clips kept: the reference recurs in every prompt of a dialogue


class RemoteScorer:
    """Scores prompts through an OpenAI-compatible endpoint; bounded concurrency and queue."""

    backend = "remote"
    architecture = ""
    dtype = ""

    def __init__(
        self,
        endpoint: str,
        model_name: str,
        *,
        max_clip_seconds: float = 30.0,
        weights_sha256: str = "",
        top_logprobs: int = 20,
        max_concurrent_requests: int = 16,
        max_queue_prompts: int = 512,
        request_timeout_s: float = 120.0,
        api_key: str = "",
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise ConfigError("the remote judge needs httpx: pip install 'sleuthd[judge]'") from None
        self._httpx = httpx
        self.endpoint = endpoint.rstrip("/")
        self.model_name = model_name
        self.max_clip_seconds = max_clip_seconds
        self.weights_sha256 = weights_sha256
        self.device = self.endpoint
        self._top = top_logprobs
        self._max_queue = max_queue_prompts
        self._slots = asyncio.Semaphore(max_concurrent_requests)
        self._waiting = 0
        self._timeout = request_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s)),
            limits=httpx.Limits(max_connections=max_concurrent_requests),
            headers=headers,
        )
        self._wav: OrderedDict[str, str] = OrderedDict()

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection slot (the bounded queue)."""
        return self._waiting

    async def check(self) -> None:
        """Ask the endpoint which models it serves; raise ConfigError unless it serves ``model_name``."""
        try:
            resp = await self._client.get(f"{self.endpoint}/models")
            resp.raise_for_status()
            served = [m.get("id") for m in resp.json().get("data", [])]
        except (self._httpx.HTTPError, ValueError) as exc:
            raise ConfigError(f"judge endpoint {self.endpoint} did not list its models: {exc}") from exc
        if self.model_name not in served:
            raise ConfigError(f"judge endpoint {self.endpoint} serves {served}, not {self.model_name!r}")

    def request_body(self, prompt: Prompt) -> dict[str, Any]:
        """The chat-completions request for ``prompt``: one token, temperature 0, first-token logprobs."""
        return {
            "model": self.model_name,
            "messages": prompt.messages(self._audio_part),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": self._top,
        }

    async def score(self, prompt: Prompt, deadline: float | None = None) -> AnswerScores:
        """The answer log-probabilities of one prompt (see the module docstring)."""
        if self._waiting >= self._max_queue:
            raise Overloaded(f"{self._waiting} judge requests are waiting for {self.endpoint}; retry with backoff")
        body = self.request_body(prompt)
        try:
            async with asyncio.timeout_at(deadline):
                self._waiting += 1
                try:
                    await self._slots.acquire()
                finally:
                    self._waiting -= 1
                try:
                    reply = await self._post(body)
                finally:
                    self._slots.release()
        except TimeoutError:
            # Only asyncio.timeout raises TimeoutError here; httpx's own timeouts became EngineFailure.
            raise DeadlineExceeded("the request's deadline passed while waiting for the judge endpoint") from None
        return parse_answer(reply, prompt, self._top)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        httpx = self._httpx
        url = f"{self.endpoint}/chat/completions"
        try:
            resp = await self._client.post(url, json=body)
        except httpx.TimeoutException:
            raise EngineFailure(f"judge endpoint {self.endpoint} did not answer within {self._timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise EngineFailure(f"judge endpoint {self.endpoint} is unreachable: {exc}") from exc
        if resp.status_code != 200:
            raise EngineFailure(
                f"judge endpoint {self.endpoint} answered HTTP {resp.status_code}: {resp.text[:300]} (for many clips "
                "per prompt vLLM needs --limit-mm-per-prompt)"
            )
        try:
            reply: dict[str, Any] = resp.json()
        except ValueError as exc:
            raise EngineFailure(f"judge endpoint {self.endpoint} answered with invalid JSON: {exc}") from exc
        return reply

    def _audio_part(self, clip: Clip) -> dict[str, Any]:
        data = self._wav.get(clip.key)
        if data is None:
            buf = io.BytesIO()
            sf.write(buf, clip.samples, SAMPLE_RATE, format="WAV", subtype="PCM_16")
            data = base64.b64encode(buf.getvalue()).decode("ascii")
            self._wav[clip.key] = data
            if len(self._wav) > _WAV_CACHE_ENTRIES:
                self._wav.popitem(last=False)
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}

    async def aclose(self) -> None:
        await self._client.aclose()


def parse_answer(reply: dict[str, Any], prompt: Prompt, top: int) -> AnswerScores:
    """Answer-option log-probabilities from a chat-completions reply's first-token ``top_logprobs``."""
    try:
        first = reply["choices"][0]["logprobs"]["content"][0]
        entries = first["top_logprobs"]
        pairs = [(str(e["token"]), float(e["logprob"])) for e in entries]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineFailure(f"the judge endpoint's reply has no first-token top_logprobs ({exc!r})") from exc
    found = dict(pairs)
    log_probs = []
    for answer in prompt.answers:
        ps = [math.exp(found[s]) for s in answer.spellings if s in found]
        log_probs.append(math.log(sum(ps)) if ps else -math.inf)
    if all(lp == -math.inf for lp in log_probs):
        shown = ", ".join(repr(t) for t, _ in pairs[:5])
        raise JudgeUnanswered(
            f"the judge's {top} most likely first tokens ({shown}, …) hold no answer "
            f"({', '.join(a.label for a in prompt.answers)}): check the served model and its chat template"
        )
    mass = sum(math.exp(lp) for lp in log_probs if lp > -math.inf)
    return AnswerScores(tuple(log_probs), min(mass, 1.0))

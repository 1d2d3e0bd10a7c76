"""The remote scoring backend: an OpenAI-compatible chat-completions endpoint (vLLM serves both judges).

Each prompt is one ``POST {endpoint}/chat/completions`` asking for one token at temperature 0 with the
first token's log-probabilities of the answer tokens, named by id (``logprob_token_ids``) and written as
ids (``return_tokens_as_token_ids``): answers are matched by id, never by token text
(:mod:`sleuthd.lalm.openai_reply`). The ids come from the served tokenizer itself (vLLM's ``POST /tokenize``,
at the server's root, not under ``/v1``), asked once. A server that ignores ``logprob_token_ids`` reports
its top ``top_logprobs`` tokens instead: an answer outside them is then unknown, bounded, not 0.

Every clip is an ``input_audio`` part (base64 16-bit WAV) carrying a ``uuid`` (its content hash). vLLM
caches processed media under that uuid, and a later part may then send ``"input_audio": null`` with the
uuid alone: a dialogue's reference and context turns, which recur in many prompts, are sent in full once
and by reference afterwards (the first prompt carrying a new clip goes first; prompts sharing it follow
when it is answered). A reference the server no longer holds (its cache is an LRU, or a load balancer
sent the request elsewhere) is answered with an error, and the prompt is sent again in full; after
repeated misses, or when the start-up probe shows the server does not take references, every prompt
carries its clips in full (``--judge-remote-reuse-clips false`` forces that, e.g. behind a load balancer).

Refusals reach the gRPC client with the server's own reason: HTTP 4xx is a deployment fault
(:class:`~sleuthd.lalm.types.JudgeDeploymentError`, FAILED_PRECONDITION: too many audios for vLLM's
``--limit-mm-per-prompt``, a template without audio placeholders, a prompt over ``--max-model-len``),
429 is "busy" (RESOURCE_EXHAUSTED), 5xx and timeouts are the endpoint failing (UNAVAILABLE).

The HTTP client is ``httpx`` (in the ``judge`` extra): an asyncio client, so a cancelled RPC cancels its
request and closes the connection (vLLM then aborts the generation), with connection pooling and
per-request timeouts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import soundfile as sf

from sleuthd.config import ConfigError
from sleuthd.errors import DeadlineExceeded, EngineFailure, Overloaded
from sleuthd.lalm.openai_reply import deployment_hint, error_reason, parse_answer
from sleuthd.lalm.prompts import Answer, Prompt
from sleuthd.lalm.templates import TEMPLATE_HINT
from sleuthd.lalm.types import SAMPLE_RATE, AnswerScores, Clip, JudgeDeploymentError

logger = logging.getLogger(__name__)

_WAV_CACHE_ENTRIES = 64  # encoded clips kept: the reference recurs in every prompt of a dialogue
# Clips believed held by the server's media cache (vLLM's is 4 GiB by default: thousands of short clips).
_ON_SERVER_ENTRIES = 256
_MISSES_BEFORE_GIVING_UP = 3  # references refused in a row before every prompt carries its clips in full


class RemoteScorer:
    """Scores prompts through an OpenAI-compatible endpoint; bounded concurrency and queue."""

    backend = "remote"
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
        reuse_clips: bool = True,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise ConfigError("the remote judge needs httpx: pip install 'sleuthd[judge]'") from None
        self._httpx = httpx
        self.endpoint = endpoint.rstrip("/")
        # vLLM serves /tokenize at its root, beside /v1.
        self.root = self.endpoint.removesuffix("/v1")
        self.model_name = model_name
        self.max_clip_seconds = max_clip_seconds
        self.weights_sha256 = weights_sha256
        self.device = self.endpoint
        self.architecture = ""  # learned at check() from how the server renders a prompt
        self.reuse_clips = reuse_clips
        self.exact_answers: bool | None = None  # whether the server honours logprob_token_ids (seen in replies)
        self._top = top_logprobs
        self._max_concurrent = max_concurrent_requests
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
        self._ids: dict[str, int | None] = {}  # answer spelling -> its token id (None: not one token)
        self._ids_lock = asyncio.Lock()
        self._on_server: OrderedDict[str, None] = OrderedDict()
        self._uploading: dict[str, asyncio.Future[bool]] = {}
        self._misses = 0
        self.references_sent = 0  # clips sent by reference instead of in full (for tests and logs)

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection slot (the bounded queue)."""
        return self._waiting

    @property
    def max_request_prompts(self) -> int:
        """Prompts one request may ask at once: the connection slots and the queue behind them."""
        return self._max_concurrent + self._max_queue

    # ------------------------------------------------------------------ start-up

    async def check(self) -> None:
        """Ask the endpoint which models it serves (ConfigError unless ``model_name``) and the token ids of
        every answer spelling (ConfigError when it has no /tokenize)."""
        try:
            resp = await self._client.get(f"{self.endpoint}/models")
            resp.raise_for_status()
            served = [m.get("id") for m in resp.json().get("data", [])]
        except (self._httpx.HTTPError, ValueError) as exc:
            raise ConfigError(f"judge endpoint {self.endpoint} did not list its models: {exc}") from exc
        if self.model_name not in served:
            raise ConfigError(f"judge endpoint {self.endpoint} serves {served}, not {self.model_name!r}")
        try:
            await self.tokenize_text("Yes")
        except JudgeDeploymentError as exc:
            raise ConfigError(
                f"judge endpoint {self.endpoint}: {exc}. The judge reads the answer tokens by id and asks the served "
                f"tokenizer for them at {self.root}/tokenize (vLLM's); serve the judge with vLLM"
            ) from None

    async def tokenize_text(self, text: str) -> list[int]:
        """The served tokenizer's ids for ``text`` (no special tokens added; special tokens in it are parsed)."""
        body = {"model": self.model_name, "prompt": text, "add_special_tokens": False}
        return await self._tokenize(body)

    async def tokenize_chat(self, prompt: Prompt) -> list[int]:
        """The token ids of ``prompt`` as the server renders it with its chat template (audio placeholders
        possibly expanded to one per audio token)."""
        body = {
            "model": self.model_name,
            "messages": prompt.messages(self._full_part),
            "add_generation_prompt": True,
            "add_special_tokens": False,
        }
        return await self._tokenize(body)

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        reply = await self._post(f"{self.root}/tokenize", body, audios=0)
        try:
            return [int(t) for t in reply["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeDeploymentError(f"{self.root}/tokenize answered without a token list ({exc!r})") from exc

    async def answer_ids(self, answers: Sequence[Answer]) -> tuple[tuple[int, ...], ...]:
        """Per answer option, the served tokenizer's ids of its one-token spellings (asked once each)."""
        spellings = [s for a in answers for s in a.spellings if s not in self._ids]
        if spellings:
            async with self._ids_lock:
                for s in spellings:
                    if s not in self._ids:
                        toks = await self.tokenize_text(s)
                        self._ids[s] = toks[0] if len(toks) == 1 else None
        out = []
        for a in answers:
            ids = tuple(dict.fromkeys(i for s in a.spellings if (i := self._ids[s]) is not None))
            if not ids:
                raise JudgeDeploymentError(
                    f"no spelling of the answer {a.label!r} is one token of {self.model_name}'s vocabulary"
                )
            out.append(ids)
        return tuple(out)

    async def probe_references(self, prompt: Prompt) -> bool:
        """Whether the server answers ``prompt`` with its clips sent by reference as it did with them in full
        (they were sent in full just before); turns reuse off when not."""
        if not self.reuse_clips:
            return False
        ids = await self.answer_ids(prompt.answers)
        keys = {c.key for c in prompt.clips}
        try:
            full = await self._send(self.request_body(prompt, ids, set()), len(prompt.clips))
            self._remember(keys)
            by_ref = await self._send(self.request_body(prompt, ids, keys), len(prompt.clips))
            same = parse_answer(full, ids, []).log_probs == parse_answer(by_ref, ids, []).log_probs
        except (JudgeDeploymentError, EngineFailure) as exc:
            logger.info("judge endpoint %s does not take clips by reference (%s)", self.endpoint, exc)
            same = False
        if not same:
            self.reuse_clips = False
            self._on_server.clear()
        return same

    # ------------------------------------------------------------------ requests

    def request_body(
        self, prompt: Prompt, answer_ids: Sequence[Sequence[int]], by_reference: set[str]
    ) -> dict[str, Any]:
        """The chat-completions request: one token at temperature 0, the answer tokens' log-probabilities by
        id; the clips in ``by_reference`` as their uuid alone."""

        def part(clip: Clip) -> dict[str, Any]:
            if clip.key in by_reference:
                return {"type": "input_audio", "input_audio": None, "uuid": clip.key}
            return self._full_part(clip)

        return {
            "model": self.model_name,
            "messages": prompt.messages(part),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": self._top,
            "logprob_token_ids": sorted({i for ids in answer_ids for i in ids}),
            "return_tokens_as_token_ids": True,
        }

    async def score(self, prompt: Prompt, deadline: float | None = None) -> AnswerScores:
        """The answer log-probabilities of one prompt (see the module docstring)."""
        if self._waiting >= self._max_queue:
            raise Overloaded(f"{self._waiting} judge requests are waiting for {self.endpoint}; retry with backoff")
        ids = await self.answer_ids(prompt.answers)
        mine: list[str] = []
        sent = False
        try:
            async with asyncio.timeout_at(deadline):
                refs = await self._plan(prompt, mine)
                reply = await self._slot_send(self.request_body(prompt, ids, refs), len(prompt.clips))
                if reply is None:  # a reference the server no longer holds: the whole prompt in full
                    self._forget(refs)
                    reply = await self._slot_send(self.request_body(prompt, ids, set()), len(prompt.clips))
                    assert reply is not None
                else:
                    self._misses = 0
                    self.references_sent += len(refs)
                sent = True
        except TimeoutError:
            # Only asyncio.timeout raises TimeoutError here; httpx's own timeouts became EngineFailure.
            raise DeadlineExceeded("the request's deadline passed while waiting for the judge endpoint") from None
        finally:
            if sent:
                self._remember(prompt_keys(prompt))
            for key in mine:
                future = self._uploading.pop(key)
                if not future.done():
                    future.set_result(sent)
        scores = parse_answer(reply, ids, [a.label for a in prompt.answers])
        self.exact_answers = scores.exact if self.exact_answers is None else self.exact_answers and scores.exact
        return scores

    async def _plan(self, prompt: Prompt, mine: list[str]) -> set[str]:
        """Which clips go by reference: those the server holds, and those another prompt is sending now
        (waited for). Clips nobody sent yet are this prompt's to send (added to ``mine``)."""
        if not self.reuse_clips:
            return set()
        refs: set[str] = set()
        waits = []
        loop = asyncio.get_running_loop()
        for key in prompt_keys(prompt):
            if key in self._on_server:
                self._on_server.move_to_end(key)
                refs.add(key)
            elif key in self._uploading:
                waits.append((key, self._uploading[key]))
            else:  # registered before any await: a prompt only ever waits for prompts planned before it
                self._uploading[key] = loop.create_future()
                mine.append(key)
        for key, future in waits:
            if await asyncio.shield(future) and key in self._on_server:
                refs.add(key)
        return refs

    def _remember(self, keys: set[str] | Sequence[str]) -> None:
        if not self.reuse_clips:
            return
        for key in keys:
            self._on_server[key] = None
            self._on_server.move_to_end(key)
        while len(self._on_server) > _ON_SERVER_ENTRIES:
            self._on_server.popitem(last=False)

    def _forget(self, refs: set[str]) -> None:
        for key in refs:
            self._on_server.pop(key, None)
        self._misses += 1
        if self._misses >= _MISSES_BEFORE_GIVING_UP and self.reuse_clips:
            logger.warning(
                "judge endpoint %s refused clips sent by reference %d times in a row: every prompt now carries its "
                "clips in full (a load balancer in front of several servers? then set --judge-remote-reuse-clips "
                "false)",
                self.endpoint,
                self._misses,
            )
            self.reuse_clips = False
            self._on_server.clear()

    async def _slot_send(self, body: dict[str, Any], audios: int) -> dict[str, Any] | None:
        """Send once a connection slot is free; None when the request held references and the server refused
        it (however it words a reference it no longer holds: a 4xx or a 5xx)."""
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._send(body, audios)
        except (JudgeDeploymentError, _RefusedWith5xx):
            if _has_references(body):
                return None
            raise
        finally:
            self._slots.release()

    async def _send(self, body: dict[str, Any], audios: int) -> dict[str, Any]:
        return await self._post(f"{self.endpoint}/chat/completions", body, audios)

    async def _post(self, url: str, body: dict[str, Any], audios: int) -> dict[str, Any]:
        httpx = self._httpx
        try:
            resp = await self._client.post(url, json=body)
        except httpx.TimeoutException:
            raise EngineFailure(f"judge endpoint {self.endpoint} did not answer within {self._timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise EngineFailure(f"judge endpoint {self.endpoint} is unreachable: {exc}") from exc
        if resp.status_code != 200:
            reason = error_reason(resp.text)
            if resp.status_code == 429:
                raise Overloaded(f"judge endpoint {self.endpoint} is busy (HTTP 429: {reason}); retry later")
            if 400 <= resp.status_code < 500 and resp.status_code != 408:
                hint = deployment_hint(reason, audios, TEMPLATE_HINT)
                raise JudgeDeploymentError(
                    f"judge endpoint {url} refused the request (HTTP {resp.status_code}): {reason}"
                    + (f"; {hint}" if hint else "")
                )
            raise _RefusedWith5xx(f"judge endpoint {url} failed (HTTP {resp.status_code}): {reason}")
        try:
            reply: dict[str, Any] = resp.json()
        except ValueError as exc:
            raise EngineFailure(f"judge endpoint {url} answered with invalid JSON: {exc}") from exc
        return reply

    def _full_part(self, clip: Clip) -> dict[str, Any]:
        data = self._wav.get(clip.key)
        if data is None:
            buf = io.BytesIO()
            sf.write(buf, clip.samples, SAMPLE_RATE, format="WAV", subtype="PCM_16")
            data = base64.b64encode(buf.getvalue()).decode("ascii")
            self._wav[clip.key] = data
            if len(self._wav) > _WAV_CACHE_ENTRIES:
                self._wav.popitem(last=False)
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}, "uuid": clip.key}

    async def aclose(self) -> None:
        await self._client.aclose()


class _RefusedWith5xx(EngineFailure):
    """The endpoint answered with a server error (UNAVAILABLE, like any endpoint failure)."""


def prompt_keys(prompt: Prompt) -> list[str]:
    """The distinct clips of a prompt, in order."""
    return list(dict.fromkeys(c.key for c in prompt.clips))


def _has_references(body: dict[str, Any]) -> bool:
    return any(
        isinstance(part, dict) and part.get("type") == "input_audio" and part.get("input_audio") is None
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )

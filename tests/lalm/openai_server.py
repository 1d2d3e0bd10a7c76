"""A small OpenAI-compatible server answering from a tiny judge model the way vLLM does.

Real HTTP on 127.0.0.1:0 and real JSON, in vLLM's shapes (vllm/entrypoints/openai/chat_completion/protocol.py
and serving.py, vllm/entrypoints/serve/tokenize/):

- ``POST /v1/chat/completions``: the messages go through the server's chat template (sleuthd's, as
  ``--chat-template`` would set it, unless a test gives another) in vLLM's "openai" content format (string
  content becomes one text part, every audio part ``{"type": "audio"}``); a template that renders fewer
  audio placeholders than audio inputs is refused with vLLM's "Expected there to be N prompt updates…"
  (HTTP 400). One token at temperature 0: the first token's entry and ``top_logprobs``, which hold the
  sampled token and the ids named in ``logprob_token_ids`` (a server that has that field) or the top
  ``top_logprobs`` tokens (an older one, ``named_ids=False``); tokens written as ``token_id:N`` when the
  request or the server (``--return-tokens-as-token-ids``) asks, else as text; log-probabilities over the
  whole vocabulary, clamped at -9999.0.
- ``input_audio`` parts are base64 WAV; with a ``uuid`` the clip is cached, and a later part may send
  ``"input_audio": null`` with the uuid alone (refused when the server does not have it, or with
  ``media_uuids=False`` as an older vLLM's validation does).
- Refusals as vLLM words them, in its error body ``{"error": {"message", "type", "param", "code"}}`` (or the
  older ``{"object": "error", …}``): more audios than ``limit_audio`` (--limit-mm-per-prompt), top_logprobs
  over ``max_logprobs``, an unknown model.
- ``POST /tokenize`` at the root: a text ``prompt``, or chat ``messages`` (rendered, audio placeholders
  expanded to one per audio token, as vLLM's multimodal processor does); ``GET /v1/models``.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import soundfile as sf
import torch
from sleuthd.lalm.local import LocalModel, Prepared
from sleuthd.lalm.templates import template_text
from sleuthd.lalm.types import Clip

# A checkpoint template from before audio parts were recognised by their type: it looks for an "audio" key,
# which the {"type": "audio"} parts vLLM passes do not have, so it renders no audio placeholder.
OLD_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Refusal(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class TinyOpenAIServer:
    def __init__(self, model: LocalModel, name: str) -> None:
        self.model = model
        self.name = name
        self.requests: list[dict[str, Any]] = []  # chat completion bodies, in arrival order
        self.chat_template = template_text(model.arch)
        self.named_ids = True  # honours logprob_token_ids (False: an older vLLM that ignores the field)
        self.token_ids_by_default = False  # vllm serve --return-tokens-as-token-ids
        self.writes_token_text = False  # a server that ignores return_tokens_as_token_ids altogether
        self.media_uuids = True  # takes "input_audio": null with a uuid it holds
        self.limit_audio: int | None = None  # --limit-mm-per-prompt '{"audio": N}'
        self.max_logprobs = 20  # --max-logprobs
        self.legacy_errors = False  # error bodies as vLLM before 0.10 wrote them
        self.hide_ids: set[int] = set()  # token ids left out of a top-k list
        self.delay_s = 0.0
        self.fail_with: tuple[int, str] | None = None  # (HTTP status, message) for every chat completion
        self.media: OrderedDict[str, np.ndarray] = OrderedDict()
        self.media_entries = 256
        self._lock = threading.Lock()  # the model runs one call at a time
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (deadline or cancellation)

            def _refuse(self, refusal: Refusal) -> None:
                info = {"message": refusal.message, "type": refusal.kind, "param": None, "code": refusal.status}
                self._reply(refusal.status, {"object": "error", **info} if server.legacy_errors else {"error": info})

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    self._refuse(Refusal(404, f"Not Found: {self.path}", "NotFoundError"))
                    return
                self._reply(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    if self.path == "/tokenize":
                        self._reply(200, server.tokenize(body))
                    elif self.path == "/v1/chat/completions":
                        server.requests.append(body)
                        if server.delay_s:
                            time.sleep(server.delay_s)
                        if server.fail_with is not None:
                            raise Refusal(*server.fail_with)
                        self._reply(200, server.complete(body))
                    else:
                        raise Refusal(404, f"Not Found: {self.path}", "NotFoundError")
                except Refusal as refusal:
                    self._refuse(refusal)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def start(self) -> TinyOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def reset(self) -> None:
        """Back to a current vLLM started with sleuthd's template and default options."""
        self.chat_template = template_text(self.model.arch)
        self.named_ids, self.token_ids_by_default, self.writes_token_text = True, False, False
        self.media_uuids, self.limit_audio, self.max_logprobs, self.legacy_errors = True, None, 20, False
        self.hide_ids, self.delay_s, self.fail_with = set(), 0.0, None
        self.media.clear()

    # ------------------------------------------------------------------ requests

    def _check_model(self, body: dict[str, Any]) -> None:
        if body.get("model") not in (None, self.name):
            raise Refusal(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")

    def _conversation(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Clip]]:
        """vLLM's "openai" content format: string content as one text part, audio parts as {"type": "audio"}."""
        conversation, clips = [], []
        for message in messages:
            content = message["content"]
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
            for part in [] if isinstance(content, str) else content:
                if part["type"] == "text":
                    parts.append({"type": "text", "text": part["text"]})
                elif part["type"] == "input_audio":
                    clips.append(Clip.of(self._audio(part)))
                    parts.append({"type": "audio"})
                else:
                    raise Refusal(400, f"Unknown part type: {part['type']}")
            conversation.append({"role": message["role"], "content": parts})
        if self.limit_audio is not None and len(clips) > self.limit_audio:
            raise Refusal(400, f"At most {self.limit_audio} audio(s) may be provided in one prompt.")
        return conversation, clips

    def _audio(self, part: dict[str, Any]) -> np.ndarray:
        uuid, data = part.get("uuid"), part.get("input_audio")
        if data is None:
            if not self.media_uuids:
                raise Refusal(400, "1 validation error: input_audio: Input should be a valid dictionary")
            if uuid not in self.media:
                raise Refusal(400, f"Media with uuid {uuid!r} was skipped but is not in the multi-modal cache")
            self.media.move_to_end(uuid)
            return self.media[uuid]
        samples = decode_audio(part)
        if uuid and self.media_uuids:
            self.media[uuid] = samples
            while len(self.media) > self.media_entries:
                self.media.popitem(last=False)
        return samples

    def _render(self, conversation: list[dict[str, Any]], clips: list[Clip]) -> Prepared:
        """Template, tokens, and vLLM's check that every audio input has its placeholder; placeholders expanded."""
        text = self.model.tokenizer.apply_chat_template(
            conversation, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
        )
        ids = self.model.tokenizer.encode(text, add_special_tokens=False)
        found = ids.count(self.model.audio_token_id)
        if found != len(clips):
            raise Refusal(
                400,
                f"Expected there to be {len(clips)} prompt updates corresponding to {len(clips)} audio items, but "
                f"instead found {found} prompt updates! This is likely because you forgot to include input "
                "placeholder tokens (e.g., `<image>`, `<|image_pad|>`) in the prompt.",
            )
        self.model.check_lengths(clips)
        return self.model.expand(ids, clips, ())

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        if "messages" in body:
            ids = list(self._render(*self._conversation(body["messages"])).input_ids)
        else:
            specials = bool(body.get("add_special_tokens", True))
            ids = self.model.tokenizer.encode(body["prompt"], add_special_tokens=specials)
        return {"count": len(ids), "max_model_len": 32768, "tokens": ids, "token_strs": None}

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of one token at temperature 0 with the first token's log-probabilities."""
        self._check_model(body)
        top = int(body.get("top_logprobs") or 0)
        if top > self.max_logprobs:
            raise Refusal(400, f"Requested sample logprobs of {top}, which is greater than max allowed: 20")
        named = body.get("logprob_token_ids") if self.named_ids else None
        if named is not None and not body.get("logprobs"):
            raise Refusal(400, "when using `logprob_token_ids`, `logprobs` must be set to true.")
        prepared = self._render(*self._conversation(body["messages"]))
        with self._lock:
            full = self._log_softmax(prepared)
        sampled = int(torch.argmax(full))
        # vLLM's step log-probabilities: the sampled token first, then the named ids (all of them returned) or
        # the top-k (the first top_logprobs entries returned).
        if named:
            listed_ids = list(dict.fromkeys([sampled, *(int(i) for i in named)]))
        else:
            ranked = [i for i in torch.argsort(full, descending=True)[: top + len(self.hide_ids) + 1].tolist()]
            listed_ids = list(dict.fromkeys([sampled, *(i for i in ranked if i not in self.hide_ids)]))[:top]
        entries = {i: float(full[i]) for i in [sampled, *listed_ids]}
        as_ids = body.get("return_tokens_as_token_ids")
        as_ids = (self.token_ids_by_default if as_ids is None else bool(as_ids)) and not self.writes_token_text

        def entry(i: int, lp: float) -> dict[str, Any]:
            token = f"token_id:{i}" if as_ids else self.model.tokenizer.decode([i])
            return {"token": token, "logprob": max(lp, -9999.0), "bytes": list(token.encode())}

        listed = [entry(i, entries[i]) for i in listed_ids]
        first = {**entry(sampled, entries[sampled]), "top_logprobs": listed}
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.model.tokenizer.decode([sampled])},
                    "logprobs": {"content": [first]} if body.get("logprobs") else None,
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": prepared.tokens, "completion_tokens": 1, "total_tokens": prepared.tokens + 1},
        }

    def _log_softmax(self, prepared: Prepared) -> torch.Tensor:
        """The first generated token's log-probabilities over the whole vocabulary (float32)."""
        with torch.inference_mode():
            hidden = self.model.final_hidden([prepared])[0]
            return torch.log_softmax(self.model.model.lm_head.weight.float() @ hidden, dim=0)


def decode_audio(part: dict[str, Any]) -> np.ndarray:
    assert part["input_audio"]["format"] == "wav"
    samples, rate = sf.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])), dtype="float32")
    assert rate == 16_000
    return np.asarray(samples, np.float32)

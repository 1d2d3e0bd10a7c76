"""A small OpenAI-compatible chat-completions server answering from a tiny judge model, as vLLM would.

Real HTTP on 127.0.0.1:0 and real JSON: ``POST /v1/chat/completions`` decodes the ``input_audio`` parts
(base64 WAV), renders the messages through the model's chat template, runs the model for one token and
returns that token with its ``top_logprobs``; ``GET /v1/models`` lists the served name. Knobs let a test
slow it down, make it answer an HTTP error, or drop the answer tokens from its reply.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import soundfile as sf
from sleuthd.lalm.local import LocalModel
from sleuthd.lalm.prompts import Prompt
from sleuthd.lalm.types import Clip


class TinyOpenAIServer:
    def __init__(self, model: LocalModel, name: str) -> None:
        self.model = model
        self.name = name
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0
        self.fail_with: tuple[int, str] | None = None  # (HTTP status, message)
        self.hide_tokens: set[str] = set()  # token strings left out of top_logprobs
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

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})
                    return
                self._reply(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if server.delay_s:
                    time.sleep(server.delay_s)
                if server.fail_with is not None:
                    status, message = server.fail_with
                    self._reply(status, {"object": "error", "message": message, "code": status})
                    return
                if self.path != "/v1/chat/completions":
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if body.get("model") != server.name:
                    self._reply(404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist."})
                    return
                if body.get("top_logprobs", 0) > 20:
                    self._reply(400, {"object": "error", "message": "top_logprobs must be at most 20"})
                    return
                self._reply(200, server.complete(body))

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

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of ``max_tokens=1`` with the first token's log-probabilities."""
        prompt = _prompt(body["messages"])
        with self._lock:
            top = self.model.top_log_probs([self.model.prepare(prompt)], k=int(body.get("top_logprobs", 0)) + 50)[0]
        decode = self.model.tokenizer.decode
        entries = [(decode([i]), lp) for i, lp in top]
        entries = [(t, lp) for t, lp in entries if t not in self.hide_tokens][: int(body.get("top_logprobs", 0))]
        first, first_lp = entries[0]
        content = [
            {
                "token": first,
                "logprob": first_lp,
                "bytes": list(first.encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in entries],
            }
        ]
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": first},
                    "logprobs": {"content": content},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
        }


def decode_audio(part: dict[str, Any]) -> np.ndarray:
    assert part["input_audio"]["format"] == "wav"
    samples, rate = sf.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])), dtype="float32")
    assert rate == 16_000
    return np.asarray(samples, np.float32)


def _prompt(messages: list[dict[str, Any]]) -> Prompt:
    """The OpenAI messages back as a prompt (vLLM renders them with the checkpoint's chat template)."""
    system, user = messages
    parts: list[str | int] = []
    clips: list[Clip] = []
    for part in user["content"]:
        if part["type"] == "text":
            parts.append(part["text"])
        else:
            parts.append(len(clips))
            clips.append(Clip.of(decode_audio(part)))
    return Prompt(system["content"], tuple(parts), tuple(clips), ())

"""Client-side helpers: a channel that retries, and requests built from files on disk.

Used by the CLI (`sleuthd check`, `sleuthd rank`) and by the tools' replay; everything goes through a
real gRPC channel. Imports only grpc and the generated stubs, so a pipeline that talks to a server
never loads the engine, ONNX Runtime or audio libraries.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc

from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

THRESHOLD_SETS = {"default": pb.THRESHOLD_SET_DEFAULT, "paper": pb.THRESHOLD_SET_PAPER}
METHODS = ("pairwise", "centroid", "reference", "auto")

# Retries come from the channel's service config, not a loop: UNAVAILABLE only (the server is starting,
# draining or its engine failed; another attempt or replica can help). Every other code is final:
# RESOURCE_EXHAUSTED means busy or over a limit, which the caller must decide about.
RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.25s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sleuth"].full_name


class DialogueFileError(ValueError):
    """A dialogue JSON file is malformed or names audio that does not exist."""


def channel_options(max_message_bytes: int = 128 * 1024 * 1024) -> list[tuple[str, Any]]:
    """Message limits and the retry policy (a request is retried only if it fits the retry buffer, so
    the buffer is as large as the largest message)."""
    config = {"methodConfig": [{"name": [{"service": SERVICE_NAME}], "retryPolicy": RETRY_POLICY}]}
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(config)),
        ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
        ("grpc.retry_buffer_size", 2 * max_message_bytes),
    ]


def channel(target: str, max_message_bytes: int = 128 * 1024 * 1024) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=channel_options(max_message_bytes))


def stub(ch: grpc.aio.Channel) -> pb_grpc.SleuthStub:
    return pb_grpc.SleuthStub(ch)


def audio_file(path: Path) -> pb.Audio:
    if not path.is_file():
        raise DialogueFileError(f"audio file {path} does not exist")
    return pb.Audio(encoded=path.read_bytes())


def make_options(
    method: str | None = None, thresholds: str | None = None, threshold: float | None = None, encoder: str = ""
) -> pb.CheckOptions:
    opts = pb.CheckOptions(encoder=encoder)
    if method:
        if method not in METHODS:
            raise DialogueFileError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        opts.method = pb.Method.Value(f"METHOD_{method.upper()}")
    if thresholds:
        if thresholds not in THRESHOLD_SETS:
            raise DialogueFileError(f"thresholds must be one of {', '.join(THRESHOLD_SETS)}, not {thresholds!r}")
        opts.threshold_set = THRESHOLD_SETS[thresholds]  # type: ignore[assignment]
    if threshold is not None:
        opts.threshold = threshold
    return opts


def dialogue_request_from_file(path: Path) -> pb.CheckDialogueRequest:
    """Read a dialogue JSON file (audio paths relative to the file) into a request.

    Format: {"dialogue_id": str, "turns": [{"turn_id", "speaker", "text"?, "audio"?}],
    "references": {speaker: path}?, "options": {"method"?, "thresholds"?, "threshold"?, "encoder"?}?}
    """
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DialogueFileError(f"cannot read dialogue file {path}: {exc}") from exc
    base = path.parent
    if not isinstance(doc.get("turns"), list):
        raise DialogueFileError(f"{path}: 'turns' must be a list")
    req = pb.CheckDialogueRequest(dialogue_id=str(doc.get("dialogue_id", path.stem)))
    for n, t in enumerate(doc["turns"]):
        missing = [k for k in ("turn_id", "speaker") if k not in t]
        if missing:
            raise DialogueFileError(f"{path}: turns[{n}] lacks {', '.join(missing)}")
        turn = req.turns.add(turn_id=str(t["turn_id"]), speaker=str(t["speaker"]), text=str(t.get("text", "")))
        if t.get("audio"):
            turn.audio.CopyFrom(audio_file(base / t["audio"]))
    for speaker, ref in (doc.get("references") or {}).items():
        req.references.add(speaker=speaker, audio=audio_file(base / ref))
    o = doc.get("options") or {}
    req.options.CopyFrom(make_options(o.get("method"), o.get("thresholds"), o.get("threshold"), o.get("encoder", "")))
    return req

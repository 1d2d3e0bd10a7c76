"""Channels to a sleuthd server: message limits, retries from the service config, TLS and a bearer token."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import grpc

from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sleuth"].full_name

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

Metadata = tuple[tuple[str, str], ...]


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Message limits, the retry policy (a request is retried only if it fits the retry buffer, so
    the buffer is as large as the largest message) and client-side balancing: ``round_robin`` keeps a
    connection to every address the target resolves to (a DNS name of several replicas, e.g. a Kubernetes
    headless Service, or ``ipv4:10.0.0.1:50051,10.0.0.2:50051``) and sends each call to the next ready one,
    skipping replicas that are down; a retry goes to the next one too. With one address it is pick_first."""
    config = {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{"name": [{"service": SERVICE_NAME}], "retryPolicy": RETRY_POLICY}],
    }
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(config)),
        ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
        ("grpc.retry_buffer_size", 2 * max_message_bytes),
    ]


# ---------------------------------------------------------------------------------------------- credentials
# Built here with grpc's own APIs until sleuthd.credentials (branch `deploy`) lands; these two functions
# are the only place that decides how TLS and the token reach the server, so they can be switched over.


def channel_credentials(
    credentials: grpc.ChannelCredentials | None, token: str | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials, with ``token`` sent as ``authorization: Bearer <token>`` on every call; None for a
    plaintext channel. ``credentials``: e.g. ``grpc.ssl_channel_credentials(root_certificates=ca_pem)``
    (add ``private_key``/``certificate_chain`` for mutual TLS)."""
    if credentials is None:
        return None
    if token:
        return grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return credentials


def token_metadata(credentials: grpc.ChannelCredentials | None, token: str | None, target: str) -> Metadata:
    """Per-call metadata carrying ``token`` on a plaintext channel, where gRPC refuses call credentials.
    A token in the clear is readable on the network: fine on loopback, otherwise use TLS."""
    if not token or credentials is not None:
        return ()
    host = target.rsplit(":", 1)[0].strip("[]")
    if host not in ("localhost", "127.0.0.1", "::1") and not target.startswith("unix:"):
        logger.warning("sending the auth token to %s without TLS: pass credentials= to encrypt it", target)
    return (("authorization", f"Bearer {token}"),)


# ---------------------------------------------------------------------------------------------- channels


def channel(
    target: str,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel with the retry policy; TLS when ``credentials`` are given (with ``token`` on
    every call). On a plaintext channel pass :func:`token_metadata` with each call instead."""
    opts = [*channel_options(max_message_bytes), *options]
    creds = channel_credentials(credentials, token)
    if creds is None:
        return grpc.aio.insecure_channel(target, options=opts)
    return grpc.aio.secure_channel(target, creds, options=opts)


def sync_channel(
    target: str,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """:func:`channel` for synchronous code."""
    opts = [*channel_options(max_message_bytes), *options]
    creds = channel_credentials(credentials, token)
    if creds is None:
        return grpc.insecure_channel(target, options=opts)
    return grpc.secure_channel(target, creds, options=opts)


def stub(ch: grpc.aio.Channel | grpc.Channel) -> pb_grpc.SleuthStub:
    return pb_grpc.SleuthStub(ch)

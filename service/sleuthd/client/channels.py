"""Dialing a sleuthd server: the one place that decides how a channel is built.

Every caller dials here: the client library (:class:`~sleuthd.client.SleuthClient` and its asyncio twin),
`sleuthd check`, `rank` and `health`, and the research tools. A channel gets message limits and the retry
policy (from the service config), TLS when asked for (``credentials``, or PEM files), and a bearer token on
every call: as call credentials over TLS, as metadata added by an interceptor on plaintext (gRPC refuses
call credentials there). Imports only grpc and the standard library.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sleuthd.config import DEFAULT_TARGET as DEFAULT_TARGET  # re-exported: the client library's default
from sleuthd.config import ConnectConfig
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sleuth"].full_name
AUTHORIZATION = "authorization"
_LOOPBACK = ("localhost", "127.0.0.1", "::1")

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


class CredentialsError(ValueError):
    """A credentials file is missing or unusable; the message names the file and what is wrong."""


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


def read_pem(path: str | Path, what: str) -> bytes:
    """The bytes of a PEM file, refusing a file that holds no PEM block (a common copy-paste mistake)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CredentialsError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise CredentialsError(f"{what} {path} holds no PEM block (-----BEGIN ...-----)")
    return data


def read_token(path: str | Path) -> str:
    """The first token line of a token file (blank lines and ``#`` comments are skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"cannot read token file {path}: {exc}") from None
    for line in lines:
        token = line.strip()
        if token and not token.startswith("#"):
            return token
    raise CredentialsError(f"token file {path} holds no token")


def tls_credentials(
    root_ca_file: str | Path | None = None,
    client_cert_file: str | Path | None = None,
    client_key_file: str | Path | None = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: no root CA trusts gRPC's bundled roots; the client pair is
    for servers that require mutual TLS."""
    if bool(client_cert_file) != bool(client_key_file):
        raise CredentialsError("a client certificate needs its key and the key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(root_ca_file, "root CA") if root_ca_file else None,
        private_key=read_pem(client_key_file, "client key") if client_key_file else None,
        certificate_chain=read_pem(client_cert_file, "client certificate") if client_cert_file else None,
    )


@dataclass(frozen=True)
class Dialer:
    """How to reach a server: target, TLS and token. ``credentials`` None is plaintext; ``server_name``
    overrides the host name checked in the server's certificate (a certificate for ``sleuthd.internal``
    reached as ``10.0.0.5:50051``). ``target`` may name several replicas (``dns:///sleuthd:50051`` or
    ``ipv4:10.0.0.5:50051,10.0.0.6:50051``): calls are spread over them round robin."""

    target: str = DEFAULT_TARGET
    credentials: grpc.ChannelCredentials | None = None
    token: str | None = None
    server_name: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    options: Sequence[tuple[str, Any]] = ()

    @classmethod
    def from_config(cls, config: ConnectConfig, **kwargs: Any) -> Dialer:
        """From a :class:`sleuthd.config.ConnectConfig` (the CLI's connection flags). Raises CredentialsError
        for an unusable TLS or token file."""
        creds = None
        if config.use_tls:
            creds = tls_credentials(
                config.tls_root_ca or None, config.tls_client_cert or None, config.tls_client_key or None
            )
        token = read_token(config.auth_token_file) if config.auth_token_file else None
        return cls(config.target, creds, token, config.tls_server_name or None, **kwargs)

    def _options(self) -> list[tuple[str, Any]]:
        opts = [*channel_options(self.max_message_bytes)]  # balancing over replicas: round_robin, there
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return [*opts, *self.options]

    def _secure(self) -> grpc.ChannelCredentials | None:
        if self.credentials is None:
            if self.token and not _loopback(self.target):
                logger.warning("sending the auth token to %s in the clear: give TLS credentials", self.target)
            return None
        if self.token:
            return grpc.composite_channel_credentials(self.credentials, grpc.access_token_call_credentials(self.token))
        return self.credentials

    def aio(self) -> grpc.aio.Channel:
        """An asyncio channel."""
        creds = self._secure()
        if creds is not None:
            return grpc.aio.secure_channel(self.target, creds, options=self._options())
        interceptors = [_AioBearer(self.token)] if self.token else None
        return grpc.aio.insecure_channel(self.target, options=self._options(), interceptors=interceptors)

    def sync(self) -> grpc.Channel:
        """A blocking channel."""
        creds = self._secure()
        if creds is not None:
            return grpc.secure_channel(self.target, creds, options=self._options())
        plain = grpc.insecure_channel(self.target, options=self._options())
        return grpc.intercept_channel(plain, _SyncBearer(self.token)) if self.token else plain


def _loopback(target: str) -> bool:
    host = target.removeprefix("ipv4:").removeprefix("ipv6:").rsplit(":", 1)[0].strip("[]")
    return host in _LOOPBACK or target.startswith("unix:")


class _AioBearer(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call of a plaintext asyncio channel."""

    def __init__(self, token: str) -> None:
        self._header = (AUTHORIZATION, f"Bearer {token}")

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()))
        metadata.add(*self._header)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _SyncBearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call of a plaintext blocking channel."""

    def __init__(self, token: str) -> None:
        self._header = (AUTHORIZATION, f"Bearer {token}")

    def _details(self, d: Any) -> _CallDetails:
        metadata = [*(d.metadata or ()), self._header]
        return _CallDetails(
            d.method, d.timeout, metadata, d.credentials, getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )  # fmt: skip

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


# ---------------------------------------------------------------------------------------------- shorthands


def channel(
    target: str = DEFAULT_TARGET,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel (:meth:`Dialer.aio`); TLS when ``credentials`` are given, ``token`` on every call."""
    return Dialer(target, credentials, token, server_name, max_message_bytes, options).aio()


def sync_channel(
    target: str = DEFAULT_TARGET,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """:func:`channel` for synchronous code (:meth:`Dialer.sync`)."""
    return Dialer(target, credentials, token, server_name, max_message_bytes, options).sync()


def stub(ch: grpc.aio.Channel | grpc.Channel) -> pb_grpc.SleuthStub:
    return pb_grpc.SleuthStub(ch)

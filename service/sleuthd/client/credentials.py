"""Client-side credentials: TLS roots, a client certificate, and bearer-token call credentials.

Imports only grpc and the standard library, so the client library and small tools can use it. A server
started with ``--tls-cert/--tls-key`` needs :func:`tls_credentials`; with ``--tls-client-ca`` the client
also presents its own certificate; with ``--auth-token-file`` every call carries
``authorization: Bearer <token>`` (:func:`connect` adds it, over TLS or, on loopback, over plaintext).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

AUTHORIZATION = "authorization"


class CredentialsError(ValueError):
    """A credentials file is missing or unusable; the message names the file and what is wrong."""


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
    root_ca: bytes | None = None, client_cert: bytes | None = None, client_key: bytes | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials: ``root_ca`` None trusts gRPC's bundled roots; the client pair is for mTLS."""
    return grpc.ssl_channel_credentials(
        root_certificates=root_ca, private_key=client_key, certificate_chain=client_cert
    )


def token_credentials(token: str) -> grpc.CallCredentials:
    """Per-call ``authorization: Bearer <token>`` for a TLS channel (gRPC refuses call credentials on plaintext)."""
    return grpc.access_token_call_credentials(token)


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata to pass as ``metadata=`` on one call of a plaintext (loopback) channel."""
    return ((AUTHORIZATION, f"Bearer {token}"),)


class _Bearer(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call of a plaintext channel (where call credentials are refused)."""

    def __init__(self, token: str) -> None:
        self._header = bearer_metadata(token)[0]

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._with_token(details), request_iterator)

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._with_token(details), request_iterator)


def connect(
    target: str,
    *,
    tls: bool = False,
    root_ca_file: str | Path | None = None,
    client_cert_file: str | Path | None = None,
    client_key_file: str | Path | None = None,
    server_name: str | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An aio channel to ``target`` with whatever the server asks for.

    TLS is used when ``tls`` is true or any TLS file or ``server_name`` is given; ``server_name`` overrides
    the host name checked in the server's certificate (e.g. a certificate for ``sleuthd.internal`` reached
    as ``10.0.0.5:50051``). ``token`` travels as call credentials over TLS and as plain metadata otherwise.
    """
    opts = list(options)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    if tls or root_ca_file or client_cert_file or server_name:
        if bool(client_cert_file) != bool(client_key_file):
            raise CredentialsError("a client certificate needs its key and the key its certificate")
        creds = tls_credentials(
            read_pem(root_ca_file, "root CA") if root_ca_file else None,
            read_pem(client_cert_file, "client certificate") if client_cert_file else None,
            read_pem(client_key_file, "client key") if client_key_file else None,
        )
        if token:
            creds = grpc.composite_channel_credentials(creds, token_credentials(token))
        return grpc.aio.secure_channel(target, creds, options=opts)
    return grpc.aio.insecure_channel(target, options=opts, interceptors=[_Bearer(token)] if token else None)

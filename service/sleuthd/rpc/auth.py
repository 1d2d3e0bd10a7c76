"""Server-side security: TLS server credentials and the bearer tokens a server accepts.

The checks themselves run in the RPC gate (sleuthd.rpc.gate) for gRPC and in sleuthd.rpc.ops_http for /metrics.
Files are read once at start; a problem is a ConfigError naming the file and the fix.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from sleuthd.config import ConfigError, ServerConfig

logger = logging.getLogger(__name__)

# A token shorter than this is guessable by brute force over the network; refuse it at start.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class TokenSet:
    """The accepted bearer tokens (several, so a token can be rotated without a restart of every client)."""

    tokens: tuple[bytes, ...]

    @classmethod
    def from_file(cls, path: str | Path) -> TokenSet:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"auth_token_file {path}: cannot read it ({exc})") from None
        tokens = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not tokens:
            raise ConfigError(f"auth_token_file {path} holds no token: write one per line")
        for n, token in enumerate(tokens, 1):
            if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token) or not token.isprintable():
                raise ConfigError(
                    f"auth_token_file {path}: token {n} must be at least {MIN_TOKEN_CHARS} printable characters "
                    "without spaces (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
                )
        return cls(tuple(t.encode() for t in tokens))

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``authorization`` header value is ``Bearer <one of the tokens>`` (constant-time compare)."""
        return self.which(authorization) is not None

    def which(self, authorization: str | None) -> int | None:
        """Which token (its line among the tokens, from 1) an ``authorization`` header value presents, or
        None when it is not ``Bearer <one of the tokens>``."""
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        given = presented.strip().encode()
        # Compare with every token (no early exit) so timing does not tell which one nearly matched.
        matches = [hmac.compare_digest(given, t) for t in self.tokens]
        return matches.index(True) + 1 if any(matches) else None


def authorization_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials:
    """TLS credentials from ``tls_cert``/``tls_key`` (and ``tls_client_ca`` for mTLS), checked at start:
    a key that does not match its certificate is refused here, not at the first client's handshake."""
    cert, key = _read(config.tls_cert, "tls_cert"), _read(config.tls_key, "tls_key")
    check = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        check.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"tls_cert {config.tls_cert} and tls_key {config.tls_key} are not a matching PEM certificate "
            f"chain and private key ({exc.reason or exc})"
        ) from None
    client_ca = None
    if config.tls_client_ca:
        client_ca = _read(config.tls_client_ca, "tls_client_ca")
        try:
            check.load_verify_locations(cafile=config.tls_client_ca)
        except ssl.SSLError as exc:
            raise ConfigError(f"tls_client_ca {config.tls_client_ca} is not a PEM CA bundle ({exc.reason})") from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} holds no PEM block (-----BEGIN ...-----)")
    return data


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def warn_if_exposed(config: ServerConfig) -> None:
    """Log a warning for an interface reachable from other machines without TLS or a token."""
    auth = bool(config.auth_token_file)
    if not is_loopback(config.host):
        if not config.tls and not auth:
            logger.warning(
                "listening on %s:%d without TLS or a token: anyone who can reach it can use the service "
                "(set --tls-cert/--tls-key and --auth-token-file, or bind 127.0.0.1)",
                config.host,
                config.port,
            )
        elif auth and not config.tls:
            logger.warning("bearer tokens travel in clear text to %s: set --tls-cert/--tls-key", config.host)
    if config.metrics_port >= 0 and not is_loopback(config.metrics_host):
        if not (auth and config.metrics_auth == "token"):
            logger.warning("/metrics is open on %s:%d to anyone who can reach it", config.metrics_host,
                           config.metrics_port)  # fmt: skip

"""`sleuthd health`: ask a server's gRPC health service, as a container HEALTHCHECK or a script would."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from sleuthd.client.credentials import connect, read_token
from sleuthd.config import ConnectConfig


async def health_status(config: ConnectConfig, service: str = "") -> str:
    """The server's health status name for ``service`` ("" = the whole server), e.g. "SERVING".

    Raises grpc.aio.AioRpcError when the server cannot be reached or answered with an error, and
    CredentialsError when a TLS or token file is unusable.
    """
    token = read_token(config.auth_token_file) if config.auth_token_file else None
    channel = connect(
        config.target,
        tls=config.use_tls,
        root_ca_file=config.tls_root_ca or None,
        client_cert_file=config.tls_client_cert or None,
        client_key_file=config.tls_client_key or None,
        server_name=config.tls_server_name or None,
        token=token,
    )
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=config.timeout_seconds)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

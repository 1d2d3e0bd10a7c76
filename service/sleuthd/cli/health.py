"""`sleuthd health`: ask a server's gRPC health service, as a container HEALTHCHECK or a script would."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from sleuthd.client.channels import Dialer
from sleuthd.config import ConnectConfig


async def health_status(config: ConnectConfig, timeout_seconds: float, service: str = "") -> str:
    """The server's health status name for ``service`` ("" = the whole server), e.g. "SERVING".

    Raises grpc.aio.AioRpcError when the server cannot be reached or answered with an error, and
    CredentialsError when a TLS or token file is unusable.
    """
    async with Dialer.from_config(config).aio() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_seconds)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

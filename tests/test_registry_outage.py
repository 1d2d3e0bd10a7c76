"""A PostgreSQL voice registry that is down: at start-up `sleuthd serve` stops with one line (the URL without
its password, what to check; exit 2); while serving, requests that name a voice id get UNAVAILABLE and
everything else, health included, goes on (docs/registry.md)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.client import AsyncSleuthClient
from sleuthd.engine.facade import Engine
from sleuthd.registry.location import redact_url

from tests import pgcluster

from .ops_support import SLEUTHD
from .support import VOICE_A, Speech
from .test_voices import ann_turns, start_voice_server


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_with_registry(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLEUTHD, "serve", "--port", "0", "--metrics-port", "-1", "--registry", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def pg() -> Iterator[pgcluster.PgCluster]:
    """A cluster of this test's own: the test stops it."""
    try:
        cluster = pgcluster.start()
    except pgcluster.PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL backend not tested: {exc}")
    yield cluster
    cluster.stop()


def test_redacted_urls_keep_where_and_drop_the_password() -> None:
    assert (
        redact_url("postgresql://bob:s3cret@db.internal:5433/voices") == "postgresql://bob:***@db.internal:5433/voices"
    )
    assert redact_url("postgres://bob@[::1]/v?password=s3cret&sslmode=require") == (
        "postgres://bob@[::1]/v?password=***&sslmode=require"
    )
    assert redact_url("postgresql://:s3cret@[::1]:5432/v") == "postgresql://:***@[::1]:5432/v"
    assert (
        redact_url("postgresql://postgres@/db?host=/tmp/x&port=5432")
        == "postgresql://postgres@/db?host=/tmp/x&port=5432"
    )
    assert redact_url("postgresql://bob:s3cret@host:notaport/v") == "postgresql://*** (not a valid URL)"


@pytest.mark.parametrize(
    "url",
    ["postgresql://bob:s3cret@127.0.0.1:{port}/voices", "postgres://bob@127.0.0.1:{port}/voices?password=s3cret"],
)
def test_an_unreachable_registry_stops_serve_with_one_line(url: str) -> None:
    port = closed_port()
    done = serve_with_registry(url.format(port=port))
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr  # was: exit 1 and a 47-line traceback
    (line,) = lines
    assert line.startswith("error: voice registry postgres") and f"@127.0.0.1:{port}/voices" in line
    assert "s3cret" not in line and "***" in line
    assert "Connection refused" in line  # psycopg's reason, flattened onto the line
    assert "check that PostgreSQL runs at that host and port" in line and "PGPASSWORD" in line
    assert done.stdout == ""  # never got as far as "listening"


def test_a_missing_database_stops_serve_with_one_line_naming_it(pg: pgcluster.PgCluster) -> None:
    done = serve_with_registry(pg.url("no_such_db"))
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert f"voice registry {pg.url('no_such_db')} cannot be used" in lines[0]
    assert 'database "no_such_db" does not exist' in lines[0]


async def test_a_registry_outage_fails_voice_ids_only_and_health_stays_serving(
    engine: Engine, pg: pgcluster.PgCluster, speech: Speech
) -> None:
    server = await start_voice_server(engine, pg.create_database("outage"))
    try:
        async with AsyncSleuthClient(server.target, timeout=60) as c:
            await c.register_voice("ann", speech.clips[VOICE_A][5:6])
            turns = ann_turns(speech)
            by_id = await c.check(turns, voices={"Ann": "ann"}, method="reference")
            by_audio = await c.check(turns, references={"Ann": speech.clips[VOICE_A][5]}, method="reference")
            assert by_id == by_audio
            pg.halt()  # the database server goes away under the running sleuthd
            for _ in range(2):  # the pooled connection breaks, then a new one cannot be made
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.check(turns, voices={"Ann": "ann"}, method="reference")
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
                assert "PostgreSQL voice registry" in (err.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.get_voice("ann")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # A registry outage is not this server's failure: checks that name no voice id go on ...
            assert await c.check(turns, references={"Ann": speech.clips[VOICE_A][5]}, method="reference") == by_audio
            # ... and health stays SERVING, so load balancers keep sending those checks here.
            async with grpc.aio.insecure_channel(server.target) as ch:
                health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            pg.resume()  # back: the next call connects anew, nothing to restart
            assert await c.check(turns, voices={"Ann": "ann"}, method="reference") == by_id
    finally:
        await server.stop()

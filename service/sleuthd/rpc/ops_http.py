"""The operations HTTP port: Prometheus ``/metrics``, ``/healthz`` (live) and ``/readyz`` (ready); 404 elsewhere.

``/readyz`` answers 200 only while gRPC health says SERVING (warmed up, not draining, engine intact), so an
HTTP-only probe sees what a gRPC health check sees. ``/healthz`` answers 503 once the engine has failed
(restart the process) and 200 otherwise, draining included. With a token set, ``/metrics`` needs
``Authorization: Bearer <token>``; the probes stay open.

One thread serves every connection (an asyncio loop of its own, apart from the gRPC server's), one request
per connection: a connection must send its request head within ``request_timeout_s`` and at most
``max_connections`` are open at once (more are closed as they arrive), so clients that open connections
and send half a request cost a socket each for a few seconds, never a thread: before, the standard
library's threaded server kept one thread per such connection for as long as it stayed open (376
half-sent connections: 389 threads).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sleuthd.rpc.auth import TokenSet

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0  # to send the request line and headers, and then to take the answer
MAX_CONNECTIONS = 128  # open at once; a connection beyond it is closed at once
MAX_HEAD_BYTES = 8192  # request line and headers
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}  # fmt: skip


class OpsHttpServer:
    """A small HTTP server for probes and metrics on a thread of its own; ``start`` returns the bound port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        live: Callable[[], bool],
        tokens: TokenSet | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.live = live
        self.tokens = tokens
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self.open_connections = 0
        self.refused_connections = 0  # closed at once: max_connections were open
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 = any free port) and serve on a daemon thread; OSError if the port is taken."""
        loop = asyncio.new_event_loop()
        bound: concurrent.futures.Future[int] = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES, reuse_address=True)
                )
            except BaseException as exc:
                bound.set_exception(exc)
                loop.close()
                return
            bound.set_result(int(self._server.sockets[0].getsockname()[1]))
            try:
                loop.run_forever()
            finally:
                self._server.close()
                loop.run_until_complete(self._server.wait_closed())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="ops-http", daemon=True)
        self._thread.start()
        return bound.result()

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    # ------------------------------------------------------------------ one connection, one request

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.max_connections:
            self.refused_connections += 1
            writer.transport.abort()
            return
        self.open_connections += 1
        try:
            async with asyncio.timeout(self.request_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
            status, body, content_type, extra = self._answer(head)
            lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", f"Content-Type: {content_type}",
                     f"Content-Length: {len(body)}", "Connection: close", "Server: sleuthd",
                     *(f"{k}: {v}" for k, v in extra.items())]  # fmt: skip
            head_only = head.startswith(b"HEAD ")
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
            async with asyncio.timeout(self.request_timeout_s):
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # too slow, too long or gone: the connection is simply closed
        except Exception:
            logger.exception("ops HTTP request failed")
        finally:
            self.open_connections -= 1
            writer.transport.abort()

    def _answer(self, head: bytes) -> tuple[int, bytes, str, dict[str, str]]:
        text = "text/plain; charset=utf-8"
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, b"bad request\n", text, {}
        method, target = parts[0], parts[1]
        headers = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return 405, b"only GET\n", text, {"Allow": "GET, HEAD"}
        path = target.split("?", 1)[0]
        logger.debug("http %s %s", method, path)
        if path == "/metrics":
            if self.tokens is not None and not self.tokens.accepts(headers.get("authorization")):
                return 401, b"a bearer token is required\n", text, {"WWW-Authenticate": "Bearer"}
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            return 200, encoder(self.registry), content_type, {}
        if path == "/readyz":
            ready = self.ready()
            return (200 if ready else 503), (b"SERVING\n" if ready else b"NOT_SERVING\n"), text, {}
        if path == "/healthz":
            live = self.live()
            return (200 if live else 503), (b"ok\n" if live else b"engine failed\n"), text, {}
        return 404, b"not found: try /metrics, /healthz or /readyz\n", text, {}

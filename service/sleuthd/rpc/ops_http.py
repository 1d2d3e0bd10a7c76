"""The operations HTTP port: Prometheus ``/metrics``, ``/healthz`` (live) and ``/readyz`` (ready); 404 elsewhere.

``/readyz`` answers 200 only while gRPC health says SERVING (warmed up, not draining, engine intact), so an
HTTP-only probe sees what a gRPC health check sees. ``/healthz`` answers 503 once the engine has failed
(restart the process) and 200 otherwise, draining included. With a token set, ``/metrics`` needs
``Authorization: Bearer <token>``; the probes stay open.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sleuthd.rpc.auth import TokenSet

logger = logging.getLogger(__name__)


class OpsHttpServer:
    """A small threaded HTTP server for probes and metrics; ``start`` returns the bound port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        live: Callable[[], bool],
        tokens: TokenSet | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.live = live
        self.tokens = tokens
        self._httpd: ThreadingHTTPServer | None = None

    def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 = any free port) and serve in a daemon thread; OSError if the port is taken."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        self._httpd = server_class((host, port), _handler_for(self))
        threading.Thread(target=self._httpd.serve_forever, name="ops-http", daemon=True).start()
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def _handler_for(ops: OpsHttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sleuthd"
        sys_version = ""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if ops.tokens is not None and not ops.tokens.accepts(self.headers.get("Authorization")):
                    self._send(401, b"a bearer token is required\n", extra={"WWW-Authenticate": "Bearer"})
                    return
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, encoder(ops.registry), content_type)
            elif path == "/readyz":
                ready = ops.ready()
                self._send(200 if ready else 503, b"SERVING\n" if ready else b"NOT_SERVING\n")
            elif path == "/healthz":
                live = ops.live()
                self._send(200 if live else 503, b"ok\n" if live else b"engine failed\n")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _send(
            self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8", extra: dict | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("http %s", format % args)

    return Handler

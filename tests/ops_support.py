"""Helpers for the deploy/ops/security tests: a server of one's own on the shared engine, metric values,
raw HTTP, and a `sleuthd serve` subprocess."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from sleuthd.config import ServerConfig
from sleuthd.engine.facade import Engine
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer, create_server

SLEUTHD = [sys.executable, "-m", "sleuthd.cli"]


@asynccontextmanager
async def own_server(engine: Engine, **overrides: Any) -> AsyncIterator[tuple[RunningServer, ServiceMetrics]]:
    """A server on a free port with its own RPC metrics, on the session's engine."""
    metrics = ServiceMetrics()
    config = ServerConfig(**{"port": 0, "metrics_port": -1, **overrides})
    running = await create_server(engine, config, metrics)
    try:
        yield running, metrics
    finally:
        await running.close()


def rpc_count(metrics: ServiceMetrics, method: str, code: str) -> float:
    return metrics.registry.get_sample_value("sleuthd_rpc_total", {"method": method, "code": code}) or 0.0


async def settled_rpc_count(metrics: ServiceMetrics, method: str, code: str, want: float) -> float:
    """:func:`rpc_count` once it reaches ``want`` (or after 2 s): the gate books a call's outcome just after
    its status is sent, so a client that has the status may look a moment before the count moves."""
    for _ in range(100):
        if rpc_count(metrics, method, code) >= want:
            break
        await asyncio.sleep(0.02)
    return rpc_count(metrics, method, code)


async def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


async def wait_for(predicate: Any, timeout: float = 10.0, what: str = "a condition") -> None:
    """Poll ``predicate`` (sync or async) until it is true."""

    async def holds() -> bool:
        value = predicate()
        return bool(await value if inspect.isawaitable(value) else value)

    deadline = asyncio.get_running_loop().time() + timeout
    while not await holds():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class ServeProcess:
    """`sleuthd serve` in a subprocess, with the ports it printed; its stderr is read as it comes (a pipe
    left unread would fill up with the server's log)."""

    proc: subprocess.Popen[str]
    target: str
    metrics_url: str
    _err: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        stream = self.proc.stderr
        if stream is not None:
            self._reader = threading.Thread(target=lambda: self._err.extend(stream), daemon=True)
            self._reader.start()

    @classmethod
    def start(cls, models_dir: Path, *args: str, env: dict[str, str] | None = None) -> ServeProcess:
        proc = subprocess.Popen(
            [*SLEUTHD, "serve", "--port", "0", "--metrics-port", "0", "--models-dir", str(models_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert proc.stdout is not None
        listening = proc.stdout.readline()
        metrics = proc.stdout.readline()
        if not listening.startswith("sleuthd listening on"):
            proc.kill()
            raise AssertionError(listening + (proc.stderr.read() if proc.stderr else ""))
        port = metrics.strip().rsplit(":", 1)[-1].split("/")[0]
        return cls(proc, listening.split()[-1], f"http://127.0.0.1:{port}")

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Wait for the exit; returns (exit code, stderr)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        if self._reader is not None:
            self._reader.join(timeout)
        return self.proc.returncode, "".join(self._err)


def channel_to(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target)

"""What the engine and the micro-batcher report for monitoring, as protocols.

sleuthd.ops.metrics implements them with Prometheus; :class:`NullObserver` measures nothing (the in-process
API and tests that do not care about metrics).
"""

from __future__ import annotations

from typing import Protocol

from sleuthd.domain import TurnStatus


class BatchObserver(Protocol):
    """Receives the batcher's measurements (the metrics module implements it with Prometheus)."""

    def queue_depth(self, windows: int) -> None:
        """Windows now waiting in the queue; called whenever that number changes."""

    def queue_wait(self, seconds: float) -> None:
        """How long a request waited from arrival until its first windows were put in a batch."""

    def batch_executed(self, windows: int, requests: int, seconds: float) -> None:
        """One model call finished (whether it succeeded or raised) after ``seconds`` of work."""

    def batch_failed(self, windows: int, requests: int) -> None:
        """A model call raised or returned the wrong shape; its ``requests`` all failed."""

    def rejected(self) -> None:
        """A request was refused because the queue was full."""


class NullObserver:
    """The default observer: measures nothing."""

    def queue_depth(self, windows: int) -> None:
        pass

    def queue_wait(self, seconds: float) -> None:
        pass

    def batch_executed(self, windows: int, requests: int, seconds: float) -> None:
        pass

    def batch_failed(self, windows: int, requests: int) -> None:
        pass

    def rejected(self) -> None:
        pass

    def clip_embedded(self, audio_seconds: float, cached: bool) -> None:
        pass

    def verdict(self, status: TurnStatus) -> None:
        pass


class EngineObserver(BatchObserver, Protocol):
    """The batcher's measurements plus the engine's own."""

    def clip_embedded(self, audio_seconds: float, cached: bool) -> None:
        """A clip's embedding was delivered: computed (``cached`` False) or found cached or shared."""

    def verdict(self, status: TurnStatus) -> None:
        """A turn verdict was issued for the first time."""

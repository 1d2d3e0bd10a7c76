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
    """Measures nothing. Stands in for every observer protocol of this module (the in-process API and tests
    that do not care about metrics): each method takes whatever its protocol passes."""

    def queue_depth(self, *_: object) -> None:
        pass

    def queue_wait(self, *_: object) -> None:
        pass

    def batch_executed(self, *_: object) -> None:
        pass

    def batch_failed(self, *_: object) -> None:
        pass

    def batch_split(self, *_: object) -> None:
        pass

    def rejected(self) -> None:
        pass

    def clip_embedded(self, *_: object, **__: object) -> None:
        pass

    def kept_audio(self, *_: object) -> None:
        pass

    def verdict(self, *_: object) -> None:
        pass

    def batcher(self, encoder: str) -> NullObserver:
        return self


class EngineObserver(Protocol):
    """The engine's measurements, and an observer for each encoder's micro-batcher."""

    def batcher(self, encoder: str) -> BatchObserver:
        """The observer of ``encoder``'s micro-batcher (the fused default runs two: GE2E's and CAM++'s)."""

    def clip_embedded(self, audio_seconds: float, cached: bool) -> None:
        """A clip's embedding was delivered: computed (``cached`` False) or found cached or shared."""

    def kept_audio(self, held_bytes: int) -> None:
        """Streams now keep ``held_bytes`` of turn audio for band matching, all together (sleuthd.engine.memory
        .KeptAudio)."""

    def verdict(self, status: TurnStatus, reason: str) -> None:
        """A turn verdict was issued for the first time. ``reason``: why it was flagged or left uncertain
        (a FlagReason or UncertainReason value: "score_threshold", "speaker_confusion", "out_of_support",
        "own_turns_dissimilar", "low_answer_mass"), "none" for neither."""


class JudgeObserver(Protocol):
    """Receives the LALM judge's prompt batcher's measurements (sleuthd.lalm.batcher)."""

    def queue_depth(self, prompts: int) -> None:
        """Prompts now waiting."""

    def queue_wait(self, seconds: float) -> None:
        """How long a prompt waited before its batch started."""

    def batch_executed(self, prompts: int, padded_tokens: int, seconds: float) -> None:
        """One model call finished after ``seconds``; ``padded_tokens``: tokens sent, padding included."""

    def batch_failed(self, prompts: int) -> None:
        """A model call raised; its prompts all failed."""

    def batch_split(self, prompts: int) -> None:
        """A call ran out of memory and was split in halves."""

    def rejected(self) -> None:
        """A prompt was refused because the queue was full."""

"""The kinds of failure the engine reports. The servicer maps each to one gRPC status code."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request cannot be served as sent; the message says what to change (INVALID_ARGUMENT)."""


class UnknownName(InvalidRequest):
    """The request names an encoder, speaker or turn the server does not know (NOT_FOUND)."""


class Duplicate(InvalidRequest):
    """The request reuses an id that must be unique (ALREADY_EXISTS)."""


class OutOfSequence(InvalidRequest):
    """A stream message arrived when the stream's state does not allow it (FAILED_PRECONDITION)."""


class Unsupported(InvalidRequest):
    """The request needs something this server's models do not have, e.g. auto without a calibration
    (FAILED_PRECONDITION)."""


class LimitExceeded(InvalidRequest):
    """A per-request or per-stream bound was reached; send less (INVALID_ARGUMENT: retrying unchanged cannot help)."""


class RegistryFull(LimitExceeded):
    """The voice registry holds as much as it may (voices, or audio in all); delete voices first
    (FAILED_PRECONDITION: the registry's state, not the request, has to change)."""


class Overloaded(RuntimeError):
    """The server is at capacity; retry later with backoff (RESOURCE_EXHAUSTED)."""


class ShuttingDown(RuntimeError):
    """The server is draining (SIGTERM): what it cannot finish in its grace period is refused, and streams
    end once their finished turns have their verdicts; retry on another replica (UNAVAILABLE)."""


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before its embeddings were ready; queued work was dropped (DEADLINE_EXCEEDED)."""


class DependencyUnavailable(RuntimeError):
    """A service the server relies on (the voice registry's database) cannot be reached or stayed locked
    for now; retry later (UNAVAILABLE). Unlike EngineFailure it says nothing about this server's own health,
    so the health service stays SERVING."""


class EngineFailure(RuntimeError):
    """The engine itself is broken (a model failed to run); not the client's fault (UNAVAILABLE)."""

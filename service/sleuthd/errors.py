"""The two kinds of failure the engine reports. The servicer maps them to gRPC status codes."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request cannot be served as sent; the message says what to change (INVALID_ARGUMENT)."""


class UnknownName(InvalidRequest):
    """The request names an encoder, speaker or id the server does not know (NOT_FOUND)."""


class Overloaded(RuntimeError):
    """The server is at capacity; retry later with backoff (RESOURCE_EXHAUSTED)."""


class EngineFailure(RuntimeError):
    """The engine itself is broken (a model failed to run); not the client's fault (UNAVAILABLE)."""

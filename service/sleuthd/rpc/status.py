"""Which gRPC status each error of the product ends an RPC with: one table for the gate and the servicer.

A status code must say whether a retry helps: RESOURCE_EXHAUSTED only for "busy, retry later";
"send less" or "ask differently" is the client's to fix (INVALID_ARGUMENT, FAILED_PRECONDITION).
"""

from __future__ import annotations

import grpc

from sleuthd.errors import (
    DeadlineExceeded,
    DependencyUnavailable,
    Duplicate,
    InvalidRequest,
    LimitExceeded,
    OutOfSequence,
    Overloaded,
    RegistryFull,
    ShuttingDown,
    UnknownName,
    Unsupported,
)
from sleuthd.ops.logs import clip

# Most specific first: Duplicate, OutOfSequence, ... are InvalidRequest subclasses.
STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (UnknownName, grpc.StatusCode.NOT_FOUND),
    (Duplicate, grpc.StatusCode.ALREADY_EXISTS),
    (OutOfSequence, grpc.StatusCode.FAILED_PRECONDITION),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    (RegistryFull, grpc.StatusCode.FAILED_PRECONDITION),
    (LimitExceeded, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    # The registry's database is unreachable or locked: retry later, but this server is healthy.
    (DependencyUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status and message for an error the client can act on; None for anything else (an engine
    failure or a bug, which the servicer handles)."""
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            # Messages may echo client strings (names, ids): bounded, so the status trailer stays under
            # gRPC's metadata limit and the client gets this code, not RESOURCE_EXHAUSTED.
            return code, clip(str(exc))
    return None

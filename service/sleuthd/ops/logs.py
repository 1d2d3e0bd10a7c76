"""Log setup for the server: text or JSON lines, a request id on every line of an RPC, bounded text.

No request can make the server print unbounded text: every message is cut to ``MAX_MESSAGE_CHARS`` and
every traceback to ``MAX_TRACEBACK_CHARS``, and text lines escape control characters so a client string
cannot forge a log line. :func:`clip` bounds client strings echoed into error messages the same way.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, Literal

MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 8000
# gRPC sends status details in a trailer; beyond ~8 KiB of metadata the call fails with RESOURCE_EXHAUSTED
# instead of the real status, so error details are kept far below that (x3 for percent-encoding).
MAX_DETAILS_CHARS = 1000

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("sleuthd_request_id", default="")


def clip(text: str, limit: int = MAX_DETAILS_CHARS) -> str:
    """``text`` if short enough, else its head and tail around a marker saying how much was cut.

    Keeps both ends because an error message usually names the problem first and the fix last.
    """
    if len(text) <= limit:
        return text
    marker = f" …[{len(text) - limit} characters cut]… "
    keep = max(limit - len(marker), 2)
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]


def printable(text: str, limit: int) -> str:
    """A client string made safe for one log line: control characters escaped, then clipped."""
    if not text.isprintable():
        text = text.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    return clip(text, limit)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    if not record.exc_info:
        return ""
    return clip(formatter.formatException(record.exc_info), MAX_TRACEBACK_CHARS)


class TextFormatter(logging.Formatter):
    """``time level logger [request id]: message`` with the message escaped and bounded."""

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", "")
        line = (
            f"{self.formatTime(record)} {record.levelname} {record.name}{f' [{rid}]' if rid else ''}: "
            f"{printable(record.getMessage(), MAX_MESSAGE_CHARS)}"
        )
        exc = _exception_text(self, record)
        return f"{line}\n{exc}" if exc else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, the record's ``fields`` and ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": clip(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        if rid := getattr(record, "request_id", ""):
            out["request_id"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if exc := _exception_text(self, record):
            out["exc"] = exc
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: str = "info", fmt: Literal["text", "json"] = "text") -> None:
    """Route every logger to stderr in ``fmt``, at ``level`` (debug, info, warning, error)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())

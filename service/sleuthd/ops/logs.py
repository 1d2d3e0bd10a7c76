"""Log setup for the server: text or JSON lines, a request id on every line of an RPC, bounded text, and
no output path that can block the server.

No request can make the server print unbounded text: every message is cut to ``MAX_MESSAGE_CHARS`` and
every traceback to ``MAX_TRACEBACK_CHARS``, and text lines escape control characters so a client string
cannot forge a log line. :func:`clip` bounds client strings echoed into error messages the same way.

A reader that stops reading the server's stderr (a pipe nobody drains, a stuck log shipper) must not stop
the server. With :func:`configure` ``(capture=True)`` (``sleuthd serve``):

- records go through a bounded queue to one writer thread (:class:`_DroppingQueueHandler`); when the
  queue is full a record is dropped and counted (:func:`dropped`), never waited for, so logging never
  blocks the event loop or a worker thread; the writer reports the count once it can write again;
- file descriptor 2 itself is a pipe read by a thread (:class:`_NativeStderr`): what C libraries write
  there (libmpg123 prints a line per corrupt MP3 frame), and anything else written to ``sys.stderr``,
  becomes log records of the ``sleuthd.stderr`` logger, at most ``NATIVE_LINES_PER_SECOND`` (the rest
  dropped and counted), so ``--log-format json`` output stays all JSON and a C library never blocks on
  a full pipe. Before this, 33 mutated MP3s or 445 three-byte requests logged at info filled an undrained
  64 KiB pipe and froze the server.
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import os
import queue
import sys
import threading
import time
from typing import IO, Any, Literal

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


QUEUE_RECORDS = 10_000  # log records waiting for the writer thread; more are dropped and counted
NATIVE_LINES_PER_SECOND = 20.0  # stderr lines (C libraries, stray prints) turned into records, on average
NATIVE_BURST_LINES = 200  # ... and at once
_NATIVE_MAX_LINE = 4096  # longer stderr lines are cut (and clipped again by the formatter)

_dropped_lock = threading.Lock()
_dropped = {"queue": 0, "stderr": 0}  # records dropped: the queue was full / stderr lines over the rate
_active: _Capture | None = None


def dropped() -> dict[str, int]:
    """Log records dropped since the start, by reason: ``queue`` (the writer could not keep up: the reader
    of stderr is slow or gone) and ``stderr`` (lines written to file descriptor 2 beyond the rate)."""
    with _dropped_lock:
        return dict(_dropped)


def _count_drop(reason: str, n: int = 1) -> None:
    with _dropped_lock:
        _dropped[reason] += n


def configure(level: str = "info", fmt: Literal["text", "json"] = "text", capture: bool = False) -> None:
    """Route every logger to stderr in ``fmt``, at ``level`` (debug, info, warning, error).

    ``capture`` (the server): records pass a bounded queue to a writer thread, and file descriptor 2
    becomes a pipe whose lines are logged (see the module's docstring); :func:`shutdown` undoes it."""
    global _active
    shutdown()
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handler: logging.Handler
    if capture:
        _active = _Capture(formatter)
        handler = _active.handler
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def shutdown(timeout: float = 2.0) -> None:
    """Stop capturing (if :func:`configure` captured): file descriptor 2 is restored, the lines and
    records still waiting are written (for at most ``timeout`` seconds: a reader that never reads cannot
    hold the exit), and logging goes straight to stderr again."""
    global _active
    active, _active = _active, None
    if active is None:
        return
    active.close(timeout)
    root = logging.getLogger()
    if active.handler in root.handlers:
        root.removeHandler(active.handler)
        fallback = logging.StreamHandler(sys.stderr)
        fallback.setFormatter(active.formatter)
        fallback.addFilter(_RequestIdFilter())
        root.addHandler(fallback)


class _DroppingQueueHandler(logging.Handler):
    """Formats a record in the caller's thread (its request id and arguments as they are now) and hands
    the line to the writer thread through a bounded queue, without ever waiting: a full queue drops it."""

    def __init__(self, lines: queue.Queue[str | None]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        try:
            self.lines.put_nowait(line)
        except queue.Full:
            _count_drop("queue")


class _Capture:
    """The writer thread, the stderr pipe and its reader thread of one :func:`configure` (capture=True)."""

    def __init__(self, formatter: logging.Formatter) -> None:
        self.formatter = formatter
        self.lines: queue.Queue[str | None] = queue.Queue(QUEUE_RECORDS)
        self.handler = _DroppingQueueHandler(self.lines)
        self.handler.setFormatter(formatter)
        sys.stderr.flush()
        # Our own output goes to the real stderr (a duplicate of fd 2 taken before fd 2 becomes the pipe).
        self._saved_fd = os.dup(2)
        self._out: IO[str] = open(self._saved_fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._writer.start()
        self.native = _NativeStderr()

    def _write(self) -> None:
        reported = {"queue": 0, "stderr": 0}
        while True:
            line = self.lines.get()
            if line is None:
                return
            now = dropped()
            lost = {k: now[k] - reported[k] for k in now if now[k] > reported[k]}
            reported = now
            try:
                if lost:
                    self._out.write(self._dropped_line(lost) + "\n")
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):  # the reader went away: nothing more can be written
                pass

    def _dropped_line(self, lost: dict[str, int]) -> str:
        what = ", ".join(
            f"{n} log records (the reader of stderr was slow)" if k == "queue" else f"{n} stderr lines (over the rate)"
            for k, n in lost.items()
        )
        record = logging.LogRecord("sleuthd.logs", logging.WARNING, __file__, 0, "dropped %s", (what,), None)
        record.fields = {"dropped": lost}
        return self.formatter.format(record)

    def close(self, timeout: float) -> None:
        self.native.close(timeout / 2)
        try:
            self.lines.put(None, timeout=timeout / 2)
        except queue.Full:
            pass
        self._writer.join(timeout / 2)
        try:
            self._out.flush()
        except (OSError, ValueError):
            pass
        os.close(self._saved_fd)


class _NativeStderr:
    """File descriptor 2 as a pipe whose lines become records of the ``sleuthd.stderr`` logger, rate-limited.

    C libraries write to fd 2 directly (libmpg123: a line per corrupt MP3 frame); with the descriptor a
    pipe that a thread reads at once, they never block on the real stderr, and their lines reach the
    log in its format (JSON included). ``sys.stderr`` writes to the same descriptor, so stray prints and
    Python's own last-resort messages arrive the same way."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("sleuthd.stderr")
        read_fd, write_fd = os.pipe()
        self._restore = os.dup(2)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        self._tokens = float(NATIVE_BURST_LINES)
        self._at = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="stderr-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        pending = b""
        with io.FileIO(self._read_fd, "r", closefd=True) as pipe:
            while True:
                try:
                    chunk = pipe.read(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > _NATIVE_MAX_LINE:  # a line without end: log what there is
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    self._log(line)
        if pending:
            self._log(pending)

    def _log(self, raw: bytes) -> None:
        text = raw[:_NATIVE_MAX_LINE].decode("utf-8", errors="backslashreplace").rstrip()
        if not text:
            return
        now = time.monotonic()
        self._tokens = min(float(NATIVE_BURST_LINES), self._tokens + (now - self._at) * NATIVE_LINES_PER_SECOND)
        self._at = now
        if self._tokens < 1.0:
            _count_drop("stderr")
            return
        self._tokens -= 1.0
        self.logger.warning("%s", text)

    def close(self, timeout: float) -> None:
        """Put fd 2 back; the reader logs what is left in the pipe and ends."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self._restore, 2)  # the pipe's last write end closes: the reader sees its end
        os.close(self._restore)
        self._reader.join(timeout)

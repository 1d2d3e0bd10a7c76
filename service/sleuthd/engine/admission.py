"""Admission control: the process takes on only as much work as it can hold, and says "busy" at once.

Without a bound, a server offered more than it can do keeps accepting: every request's audio, its
decoded samples and its windows wait in memory until the request's deadline passes, and memory grows
with the offered load instead of with the work done. Here each kind of waiting work has a bound that
is checked before the work starts, and going over it raises :class:`~sleuthd.errors.Overloaded`
("busy, retry later": RESOURCE_EXHAUSTED) without doing anything:

- :class:`AudioBudget`: request audio bytes held across all RPCs, from before decoding until the
  verdict (unary requests whole, streams per buffered chunk), shared fairly: one connection, one token,
  all streams' unfinished turns each have a share (memory);
- :class:`WorkQueue`: every request's work by its estimated cost and its deadline (time): refused at once
  when it cannot finish in time, queued with little run at once, newest first under overload;
- :class:`Slots`: concurrent calls of one kind (StreamDialogue);
- :class:`RefusalPacer`: when a refusal is answered: late to a client that came straight back after one;
- :class:`BoundedThreadPool`: the decode pool's queue of jobs not yet started.

Memory handed back after work (the heap trimmer, the allocator's arenas) and the turn audio streams keep for band
matching (passive memory that never refuses) are sleuthd.engine.memory.

Each admits work larger than its whole bound when nothing else holds it (a request larger than the
budget is legitimate and would otherwise be told to retry for ever). Standard library only.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sleuthd.errors import Overloaded, ShuttingDown

logger = logging.getLogger(__name__)

T = TypeVar("T")


Client = tuple[tuple[str, str], ...]  # the shares a client's audio counts against: (kind, id), e.g. ("peer", ...)
# The client the current task serves, set by the RPC gate for each call (sleuthd.rpc.gate); a stream's
# session reads it once, so its chunks count against the client that opened it.
current_client: contextvars.ContextVar[Client] = contextvars.ContextVar("sleuthd_client", default=())


class AudioBudget:
    """Bytes of request audio held at once by the whole process, shared fairly. Used from the event loop only.

    - ``limit``: everything held together (unary requests from when they are read until their verdict;
      streams' buffered chunks; turns being judged);
    - ``shares``: what one client may hold, by kind of identity (``{"peer": ..., "token": ...}``: one
      connection, one bearer token), so one client cannot take the budget from the others;
    - ``buffer_limit``: what all streams together may buffer of turns not yet finished, so streams that
      trickle (or never finish) a turn can never take the room unary requests need.

    A request that finds nothing held is always let in, whatever its size (a request larger than the
    budget is legitimate and would otherwise be told to retry for ever), and so is one whose client holds
    nothing yet (its share then bounds only what it adds while it holds this). Before the shares, one stream
    holding 63.5 MiB of a turn it never finished made every other client's CheckDialogue RESOURCE_EXHAUSTED
    for as long as it trickled a chunk now and then.

    Unary requests (``borrow``: their audio leaves with their verdict, seconds later) may hold more than
    their share while fewer clients of that kind are active: the share is then the budget divided among
    those active (holding audio, or refused within the last ``contention_s``), never less than ``shares``.
    Why: one gRPC channel multiplexes a client's concurrent calls on one connection, so a strict share capped a
    lone client at a quarter of the budget. On a GPU (docs/research/gpu/) one channel with 32 concurrent
    CheckDialogues of ~0.5 MB was refused thousands of times per second while three quarters of the budget
    sat unused: 1,055 audio-s/s at 8 clients fell to 521 at 32 and 240 at 128. What streams hold (chunks of
    unfinished turns, references, a judge's audio) never borrows: a stream can hold it for an hour.
    """

    def __init__(
        self,
        limit_bytes: int,
        shares: Mapping[str, int] | None = None,
        buffer_limit: int | None = None,
        contention_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit_bytes
        self.shares = dict(shares or {})
        self.buffer_limit = limit_bytes if buffer_limit is None else buffer_limit
        self.held = 0
        self.buffered = 0  # of ``held``: streams' chunks of unfinished turns
        self.refused = 0  # acquisitions refused since the start
        self._by_client: dict[tuple[str, str], int] = {}
        self._refused_at: dict[tuple[str, str], float] = {}  # when each client was last refused: it waits, too
        self.contention_s = contention_s
        self._clock = clock

    def _active(self, share: tuple[str, str]) -> int:
        """Clients of ``share``'s kind holding audio or refused within ``contention_s``, ``share`` among them."""
        now, kind = self._clock(), share[0]
        if len(self._refused_at) > 4096:  # clients refused long ago need no entry
            self._refused_at = {k: t for k, t in self._refused_at.items() if now - t <= self.contention_s}
        active = {k for k in self._by_client if k[0] == kind}
        active.update(k for k, t in self._refused_at.items() if k[0] == kind and now - t <= self.contention_s)
        active.add(share)
        return len(active)

    def share_of(self, share: tuple[str, str], borrow: bool = False) -> int | None:
        """What ``share``'s client may hold now: its fixed share, or when ``borrow``, the budget divided among
        the clients of its kind active now if that is more. None: no share of that kind."""
        cap = self.shares.get(share[0])
        if cap is None or not borrow:
            return cap
        return max(cap, self.limit // self._active(share))

    def held_by(self, share: tuple[str, str]) -> int:
        return self._by_client.get(share, 0)

    def refusal(
        self, n: int, what: str = "this request", client: Client = (), buffered: bool = False, borrow: bool = False
    ) -> Overloaded | None:
        """Why ``n`` more bytes of ``client`` would be refused now (counted in ``refused``), or None.
        ``borrow``: a unary request's audio, which may go over the client's share while the budget is not
        contended (see the class)."""
        if n <= 0 or self.held == 0:
            return None
        why = None
        if self.held + n > self.limit:
            why = f"{self.held} bytes of audio are in flight and {what} would add {n}, over the limit of {self.limit}"
        elif buffered and self.buffered + n > self.buffer_limit:
            why = (
                f"streams buffer {self.buffered} bytes of unfinished turns and {what} would add {n}, over the "
                f"{self.buffer_limit} all streams may buffer"
            )
        else:
            for share in client:
                mine = self._by_client.get(share, 0)
                if mine == 0:
                    continue
                cap = self.share_of(share, borrow)
                if cap is not None and mine + n > cap:
                    why = (
                        f"this {share[0]} holds {mine} bytes of audio in requests and streams and {what} would add "
                        f"{n}, over the {cap} one {share[0]} may hold while others wait"
                    )
                    break
        if why is None:
            return None
        self.refused += 1
        now = self._clock()
        for share in client:
            self._refused_at[share] = now
        return Overloaded(f"the server is busy: {why}; retry with backoff")

    def acquire(
        self, n: int, what: str = "this request", client: Client = (), buffered: bool = False, borrow: bool = False
    ) -> None:
        """Hold ``n`` more bytes for ``client``, or raise the :meth:`refusal`."""
        refused = self.refusal(n, what, client, buffered, borrow)
        if refused is not None:
            try:
                raise refused
            finally:  # the traceback holds this frame: no name here may hold the exception (a cycle)
                refused = None
        if n > 0:
            self.held += n
            if buffered:
                self.buffered += n
            for share in client:
                self._by_client[share] = self._by_client.get(share, 0) + n

    def unbuffer(self, n: int) -> None:
        """``n`` buffered bytes of a stream became a finished turn: still held, no longer buffered."""
        self.buffered = max(0, self.buffered - n)

    def release(self, n: int, client: Client = (), buffered: bool = False) -> None:
        """Let go of ``n`` bytes of ``client`` (``buffered``: chunks of a turn that never finished)."""
        if n <= 0:
            return
        self.held -= n
        if buffered:
            self.buffered = max(0, self.buffered - n)
        for share in client:
            left = self._by_client.get(share, 0) - n
            if left > 0:
                self._by_client[share] = left
            else:
                self._by_client.pop(share, None)
        if self.held < 0:  # a bookkeeping bug must not turn into a server that refuses everything
            logger.error("audio budget released %d bytes more than it held", -self.held)
            self.held = 0

    @contextmanager
    def hold(self, n: int, what: str = "this request", client: Client = ()) -> Iterator[None]:
        """``n`` bytes held for the duration of the block (released however it ends)."""
        self.acquire(n, what, client)
        try:
            yield
        finally:
            self.release(n, client)


def _client_of(shares: Client) -> str:
    """Whose work a unit is, for the queue's fairness: its token when it has one, else its connection."""
    return next((i for k, i in shares if k == "token"), next((i for _, i in shares), ""))


# A unit is refused for its deadline only when at least this much work (seconds) is ahead of it: below
# that the estimate is within its own noise (batching waits, the pace's granularity).
_MIN_SHED_SECONDS = 1.0
_RECENT_COSTS = 32  # costs remembered per kind of unit, for estimates made before a request is read
# A unit alone is refused only when its estimate is this many times the time its deadline leaves.
_HOPELESS = 1.5
# A unit must be estimated done within this share of the time its deadline leaves: the estimate's error
# (the pace lags the machine's load by its half-life) otherwise turned a quarter of what was admitted under
# overload into work cut by its deadline.
_DEADLINE_SHARE = 0.8


@dataclass(eq=False)
class _Unit:
    cost: float  # estimated work, core-seconds
    deadline: float | None  # on the event loop's clock
    what: str
    arrived: float
    client: str = ""  # whose work (its token, else its connection): the queue is fair among clients
    tag: float = 0.0  # its virtual finish time in the fair queue: served in order of tags
    started: float | None = None
    waiter: asyncio.Future[None] | None = None


class WorkQueue:
    """Admission by estimated cost, aware of deadlines, with a queue that keeps the server completing work
    near its capacity under overload. Used from the event loop only.

    Every unit of work (a CheckDialogue, a RankCandidates, a streamed turn) comes with its estimated cost
    (core-seconds: decoding its clips, from their headers, plus embedding their audio with the encoders it
    asks for; sleuthd.engine.facade) and its deadline. The queue learns its pace (cost done per second of
    busy time, weighted to the last ``half_life_s``) and then:

    - **refuses at once** (Overloaded: RESOURCE_EXHAUSTED, retry later) a unit that, behind the work already
      admitted (running and queued), could not finish before its deadline, or that would take the queued work past
      ``max_queued_s``: refusing costs nothing, while work admitted and then cut by its deadline costs its
      share of the CPU and finishes nothing (64 clients x 3.66 MiB with 5 s deadlines, fused: 0 answered);
    - **runs little at once**: a unit starts when the work running has less than ``overlap_s`` left
      (enough to keep the decode threads and the model busy), so admitted units do not share the CPU
      among dozens and all finish late; the rest wait in the queue, holding no CPU;
    - **is fair among clients** (weighted fair queuing by cost): each unit gets a virtual finish time, its
      client's previous one (or the queue's virtual now, whichever is later) plus its cost, and the queue
      starts the smallest, and admits a unit on the work with smaller tags only; so 16 connections flooding
      it with requests cheap to send and dear to decode (2 x 300 s of 48 kHz stereo FLAC, 70 KiB) cannot
      delay another client's small request by more than the work running (it waited 15-33 s behind them);
    - **serves the newest first when congested** (the oldest waiter has waited ``lifo_after_s``): it has the
      most time left, and under overload the oldest are the ones that would miss their deadlines (adaptive
      LIFO); a waiting unit that could no longer finish in time even if started next is refused as soon as
      that is so (CoDel's drop), never started. Units without a deadline are never dropped.

    A unit that finds nothing running starts at once (that is how the pace is learnt, and an estimate
    is no reason to refuse an idle server's only work), unless even alone it would need more than
    ``_HOPELESS`` times what its deadline leaves (a fused 3.66 MiB dialogue takes 12-19 s on two loaded
    cores: with a 5 s deadline every one admitted was cut by its deadline, its CPU wasted)."""

    def __init__(
        self,
        max_queued_s: float = 30.0,
        overlap_s: float = 0.5,
        lifo_after_s: float = 0.5,
        half_life_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_queued_s = max_queued_s
        self.overlap_s = overlap_s
        self.lifo_after_s = lifo_after_s
        self.refused = 0  # units refused (at arrival or dropped from the queue) since the start
        self.running: list[_Unit] = []
        self.queue: deque[_Unit] = deque()  # in arrival order
        self._half_life = half_life_s
        self._clock = clock
        self._marked = clock()
        self._busy_s = 0.0  # decayed seconds during which something ran
        self._done = 0.0  # decayed cost of the units that finished
        self._last_done = -float("inf")  # when a unit last finished (the pace's freshest evidence)
        self._vnow = 0.0  # the fair queue's virtual time: the start (tag less cost) of the unit started last
        self._last_tag: dict[str, float] = {}  # client -> the tag of its latest unit
        self._recent: dict[str, deque[float]] = {}

    # ------------------------------------------------------------------ the pace

    @property
    def rate(self) -> float | None:
        """Cost done per second of busy time lately; None until a second of evidence."""
        self._mark()
        if self._busy_s < 1.0 or self._done <= 0:
            return None
        return self._done / self._busy_s

    def _mark(self) -> None:
        now = self._clock()
        dt = now - self._marked
        if dt > 0:
            decay = 0.5 ** (dt / self._half_life)
            self._busy_s = self._busy_s * decay + (dt if self.running else 0.0)
            self._done *= decay
            self._marked = now

    def running_left(self) -> float:
        """Estimated cost the running units still have to do (each counts at least a tenth of its cost)."""
        rate = self.rate or 0.0
        now = self._clock()
        share = rate / max(1, len(self.running))
        return sum(max(0.1 * u.cost, u.cost - (now - (u.started or now)) * share) for u in self.running)

    def seconds_left(self) -> float | None:
        """Estimated seconds until everything admitted (running and queued) is done; None without a pace."""
        rate = self.rate
        if rate is None:
            return None
        return (self.running_left() + sum(u.cost for u in self.queue)) / rate

    # ------------------------------------------------------------------ admission

    def refusal(
        self,
        cost: float,
        seconds_left: float | None,
        what: str = "this request",
        client: str | None = None,
        queued_too: bool = True,
    ) -> Overloaded | None:
        """Why a unit of ``cost`` for ``client`` (default: the current task's) with ``seconds_left`` to its
        deadline would be refused on arrival, or None. ``queued_too``: behind the queued work it would wait
        for as well as the running work (False: the running work only)."""
        rate = self.rate
        if rate is None:
            return None
        if not (self.running or self.queue):
            # Alone, a unit is let in unless it clearly cannot finish (the estimate is only an estimate), and
            # always when the pace has no recent evidence (a server that got faster must be able to show it).
            alone = cost / rate
            fresh = self._clock() - self._last_done < 2 * self._half_life
            if fresh and seconds_left is not None and alone > max(_HOPELESS * seconds_left, _MIN_SHED_SECONDS):
                return Overloaded(
                    f"{what} needs about {alone:.1f} s of work here (at the recent pace, with nothing else running) "
                    f"and its deadline leaves {seconds_left:.1f} s: give it a longer deadline, or send fewer or "
                    "shorter clips per call"
                )
            return None
        # Behind the running work and the queued work the fair queue would start before it (smaller tags).
        tag = self._tag(_client_of(current_client.get()) if client is None else client, cost)
        queued = sum(u.cost for u in self.queue if u.tag <= tag) / rate if queued_too else 0.0
        ahead = (self.running_left() + cost) / rate + queued
        if seconds_left is not None and ahead > max(_DEADLINE_SHARE * seconds_left, _MIN_SHED_SECONDS):
            return Overloaded(
                f"the server is busy: {what} would be done in about {ahead:.1f} s behind the work admitted (at the "
                f"recent pace), and its deadline leaves {seconds_left:.1f} s; retry with backoff or a longer deadline"
            )
        if queued + cost / rate > self.max_queued_s:
            return Overloaded(
                f"the server is busy: {queued:.1f} s of work is queued and {what} adds {cost / rate:.1f} s (at "
                f"the recent pace), the most it queues is {self.max_queued_s:g} s; retry with backoff"
            )
        return None

    def usual_seconds(self, kind: str) -> float | None:
        """How long a unit of ``kind`` of the smallest recent cost takes at the recent pace, alone."""
        costs, rate = self._recent.get(kind), self.rate
        return None if not costs or rate is None else min(costs) / rate

    def shed(self, seconds: float) -> int:
        """On SIGTERM: refuse (ShuttingDown: UNAVAILABLE, retry elsewhere) the queued units that would not be
        done within ``seconds`` if served in arrival order behind the running work, so their clients retry on
        another replica now instead of being cut at the end of the grace period. Units without a deadline
        (streamed turns) are kept: their streams end after their verdicts. Returns how many were refused."""
        rate = self.rate
        if rate is None:
            return 0
        ahead = self.running_left()
        kept: deque[_Unit] = deque()
        refused = 0
        for unit in self.queue:
            waiter = unit.waiter
            if waiter is None or waiter.done():
                continue
            if unit.deadline is not None and (ahead + unit.cost) / rate > seconds:
                refused += 1
                waiter.set_exception(
                    ShuttingDown(
                        f"the server is shutting down and could not finish {unit.what} in its {seconds:.0f} s grace "
                        "period: retry on another replica"
                    )
                )
                continue
            ahead += unit.cost
            kept.append(unit)
        self.queue = kept
        return refused

    def usual_refusal(self, kind: str, seconds_left: float | None) -> Overloaded | None:
        """:meth:`refusal` for a unit of ``kind`` of the smallest recent cost behind the running work only
        (before a request is read: refusing on it wrongs no request of the usual size, and whether this
        client's request would wait for the queued work depends on its own cost, known once it is read)."""
        costs = self._recent.get(kind)
        if not costs:
            return None
        refused = self.refusal(min(costs), seconds_left, f"a {kind} request of the usual cost", queued_too=False)
        if refused is not None:
            self.refused += 1
        return refused

    @asynccontextmanager
    async def admit(
        self, cost: float, deadline: float | None, what: str = "this request", kind: str = ""
    ) -> AsyncIterator[None]:
        """Run the block as a unit of ``cost`` (core-seconds) due by ``deadline`` (event-loop clock): at once,
        after waiting in the queue, or not at all (Overloaded)."""
        loop = asyncio.get_running_loop()
        if kind:
            self._recent.setdefault(kind, deque(maxlen=_RECENT_COSTS)).append(cost)
        seconds_left = None if deadline is None else deadline - loop.time()
        refused = self.refusal(cost, seconds_left, what)
        if refused is not None:
            self.refused += 1
            try:
                raise refused
            finally:  # the traceback holds this frame (and the request's above it): no cycle through it
                refused = None
        client = _client_of(current_client.get())
        unit = _Unit(cost, deadline, what, self._clock(), client, self._tag(client, cost))
        self._last_tag[client] = unit.tag
        self._sweep()
        if not self.queue and self._may_start():
            self._start(unit)
        else:
            unit.waiter = loop.create_future()
            self.queue.append(unit)
            try:
                await unit.waiter
            except BaseException:
                # The waiter holds the exception, whose traceback holds this frame, which holds the unit:
                # let go of the waiter, or the cycle keeps the request's frames (and audio) until a full
                # collection.
                unit.waiter = None
                if unit.started is None:
                    if unit in self.queue:
                        self.queue.remove(unit)
                else:  # started, then cancelled before this coroutine resumed
                    self._finish(unit, False)
                raise
        done = False
        try:
            yield
            done = True
        finally:
            self._finish(unit, done)

    def _may_start(self) -> bool:
        if not self.running:
            return True
        rate = self.rate
        if rate is None:
            # No pace learnt yet: the estimates' own scale (core-seconds timed at load) is the prior, and two
            # units may always run (with one, nothing overlaps its decoding). Two at most, whatever their
            # size, kept 16 small concurrent requests from ever sharing a model call on a fresh server.
            return len(self.running) < 2 or self.running_left() < self.overlap_s
        return self.running_left() / rate < self.overlap_s

    def _start(self, unit: _Unit) -> None:
        self._mark()
        unit.started = self._clock()
        self.running.append(unit)
        # The virtual now is the start of the unit just started (its tag less its cost): with its finish
        # instead, a small unit arriving now would be tagged after every unit already waiting.
        self._vnow = max(self._vnow, unit.tag - unit.cost)
        if len(self._last_tag) > 4 * _RECENT_COSTS:  # clients behind the virtual now need no entry
            self._last_tag = {c: t for c, t in self._last_tag.items() if t > self._vnow}

    def _tag(self, client: str, cost: float) -> float:
        """The virtual finish time a unit of ``client`` and ``cost`` arriving now would get."""
        return max(self._vnow, self._last_tag.get(client, 0.0)) + cost

    def _finish(self, unit: _Unit, done: bool) -> None:
        # The pace as of the last event, before the busy time this unit just took is counted.
        rate = self._done / self._busy_s if self._busy_s >= 1.0 and self._done > 0 else None
        self._mark()
        if unit in self.running:
            self.running.remove(unit)
            if done:
                # Credited at most twice its time at the pace so far: a unit far quicker than its estimate
                # (its clips were in the embedding cache) must not make every other estimate too small.
                took = self._clock() - (unit.started or self._clock())
                self._done += unit.cost if rate is None else min(unit.cost, 2 * took * rate + 1e-9)
                self._last_done = self._clock()
            elif rate is not None and unit.started is not None:
                # Cut short (its deadline, its client): credit what it did at the pace so far, so work thrown
                # away does not read as a slower server. (Uncredited, one cut unit halved the pace; everything
                # then looked hopeless and nothing ran again to correct it.)
                share = (self._clock() - unit.started) * rate / (len(self.running) + 1)
                self._done += min(unit.cost, share)
        self._sweep()
        self._dispatch()

    def _sweep(self) -> None:
        """Refuse the queued units that could no longer finish before their deadline even if they started
        next (CoDel's drop: waiting longer only makes it worse for them), and forget cancelled ones."""
        rate = self.rate
        if not self.queue:
            return
        ahead_of_any = self.running_left()
        now = self._clock()
        kept: deque[_Unit] = deque()
        for unit in self.queue:
            waiter = unit.waiter
            if waiter is None or waiter.done():  # its call was cancelled meanwhile
                continue
            if unit.deadline is not None and rate is not None:
                left = unit.deadline - asyncio.get_running_loop().time()
                ahead = (ahead_of_any + unit.cost) / rate
                if ahead > _DEADLINE_SHARE * left:  # started now it would likely finish late: its CPU wasted
                    self.refused += 1
                    waiter.set_exception(
                        Overloaded(
                            f"the server is busy: {unit.what} waited {now - unit.arrived:.1f} s and would now be done "
                            f"in about {ahead:.1f} s (at the recent pace), after its deadline; retry with backoff"
                        )
                    )
                    continue
            kept.append(unit)
        self.queue = kept

    def _dispatch(self) -> None:
        """Start queued units while there is room: the smallest tag first (so a client with many requests
        waiting cannot starve one with a single request), and when congested that client's newest unit
        in its place (it has the most time left)."""
        while self.queue and self._may_start():
            congested = self._clock() - self.queue[0].arrived > self.lifo_after_s
            first = min(self.queue, key=lambda u: u.tag)
            unit = first
            if congested:
                unit = next(u for u in reversed(self.queue) if u.client == first.client)  # the queue: arrival order
                unit.tag, first.tag = first.tag, unit.tag  # the client's order of tags is kept
            self.queue.remove(unit)
            waiter = unit.waiter
            if waiter is None or waiter.done():
                continue
            self._start(unit)
            waiter.set_result(None)


class RefusalPacer:
    """Clients told "busy, retry with backoff" that come straight back get their next refusal late. Used from
    the event loop only.

    A refusal costs the server little, but not nothing: under overload clients that resend at once kept the
    intake reading and refusing about 150 requests of 3.66 MiB a second (64 clients, fused, 5 s deadlines), and
    the reading, the refusing and the clients' own resending took CPU from the admitted work on a small
    machine: each admitted request needed 4.4-4.6 s instead of 2.5, against its 5 s deadline. So a refusal for a
    client whose previous refusal was answered less than ``window_s`` ago is held ``hold_s`` before it is
    answered, or until ``margin_s`` before its deadline, whichever is sooner; a client that resends at once can
    then send about one request per ``hold_s``. The first refusal of a client, and one that waited longer than
    ``window_s``, are answered at once. The window is a second, not the 0.25 s a retry policy's first backoff
    may be, because under overload the server itself may take a few hundred milliseconds to reach a call: a
    client's own backoff cannot be told from that, so a client retrying within the second is held too (its
    deadline still ends the hold). At most ``max_held`` refusals wait at once (beyond that they are answered
    at once); a held call keeps its gRPC state and whatever of its message gRPC has buffered, never the
    parsed request or its place in the audio budget (the gate lets go of both first). Measured in
    docs/research/intake-priority/ ("Refusals held")."""

    def __init__(
        self,
        hold_s: float,
        window_s: float = 1.0,
        max_held: int = 256,
        margin_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hold_s = hold_s
        self.window_s = window_s
        self.max_held = max_held
        self.margin_s = margin_s
        self.held = 0  # refusals waiting now
        self._answered: dict[str, float] = {}  # client -> when its latest refusal was (or will be) answered
        self._clock = clock

    def hold_for(self, shares: Client, seconds_left: float | None) -> float:
        """Seconds to hold this refusal of ``shares``'s client (0: answer at once); records when it will be
        answered."""
        now = self._clock()
        if len(self._answered) > 4096:  # clients answered long ago need no entry
            self._answered = {c: t for c, t in self._answered.items() if now - t <= self.window_s}
        client = _client_of(shares)
        last = self._answered.get(client)
        hold = 0.0
        if last is not None and now - last < self.window_s and self.held < self.max_held:
            hold = self.hold_s if seconds_left is None else min(self.hold_s, seconds_left - self.margin_s)
            hold = max(hold, 0.0)
        self._answered[client] = now + hold
        return hold

    async def pace(self, shares: Client, seconds_left: float | None) -> float:
        """Wait as long as :meth:`hold_for` says before a refusal is answered; returns the seconds held."""
        hold = self.hold_for(shares, seconds_left)
        if hold <= 0:
            return 0.0
        self.held += 1
        try:
            await asyncio.sleep(hold)
        finally:
            self.held -= 1
        return hold


class Slots:
    """At most ``limit`` holders at once (e.g. open streams). Used from the event loop only."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.taken = 0

    @property
    def full(self) -> bool:
        return self.taken >= self.limit

    def busy(self) -> Overloaded:
        return Overloaded(f"the server is busy: {self.taken} {self.what} are open, the limit; retry with backoff")

    @contextmanager
    def take(self) -> Iterator[None]:
        if self.full:
            raise self.busy()
        self.taken += 1
        try:
            yield
        finally:
            self.taken -= 1


class BoundedThreadPool(ThreadPoolExecutor):
    """A thread pool whose queue of jobs not yet started holds at most ``max_queued``; :meth:`submit`
    raises Overloaded beyond that instead of queueing without end. Thread-safe."""

    def __init__(self, max_workers: int, max_queued: int, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.max_queued = max_queued
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs submitted and not yet started (nor cancelled)."""
        return self._waiting

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._waiting >= self.max_queued:
                raise Overloaded(
                    f"the server is busy: {self._waiting} clips are waiting to be decoded, the limit; "
                    "retry with backoff"
                )
            self._waiting += 1
        left = [False]  # whether this job stopped counting as waiting (started, cancelled or refused)

        def leave() -> None:
            with self._lock:
                if not left[0]:
                    left[0] = True
                    self._waiting -= 1

        def run() -> T:
            leave()
            return fn(*args, **kwargs)

        try:
            future = super().submit(run)
        except BaseException:
            leave()
            raise
        # A job cancelled before it started never runs ``run``: it leaves the queue here.
        future.add_done_callback(lambda _: leave())
        return future

"""Locust load test for sleuthd: unary CheckDialogue and bidirectional StreamDialogue at a fixed rate.

Run from the repository root (the file imports ``loadtest.speech`` and ``sleuthd``)::

    .venv/bin/locust -f loadtest/locustfile.py --headless --host 127.0.0.1:50051 -u 8 -r 8 -t 60s

Every RPC is one locust request (type ``grpc``, name ``CheckDialogue`` or ``StreamDialogue``); a stream
counts from its first message to its final verdict. A request fails on any non-OK status and on a
reply that does not account for every turn sent. The options this file adds (``--tasks-per-second``,
``--check-weight``, ...) are described in loadtest/README.md; ``locust --help`` does not list them.
"""

from __future__ import annotations

import csv
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import gevent
import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User, constant_throughput, events, task
from locust.env import Environment
from locust.exception import LocustError
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest import speech

# Locust runs users as greenlets: without this the sync gRPC API blocks the whole process on every
# call. It must run before any channel exists, hence at import, before locust creates users.
grpc_gevent.init_gevent()


Req: TypeAlias = pb.StreamDialogueRequest
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the server's default --max-message-mb
TURN_IDS = tuple(f"t{k}" for k in range(speech.TURNS))

# Filled once per process by the init listener below (loading audio is work, not import-time work).
_dialogues: list[list[bytes]] = []


class VerdictError(Exception):
    """The server answered OK but its reply does not cover exactly the turns that were sent."""


class RpcFailure(Exception):
    """A non-OK status; its text is short and stable so locust groups failures by code and message."""

    def __init__(self, err: grpc.RpcError) -> None:
        code = err.code() if isinstance(err, grpc.Call) else None
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        super().__init__(f"{code.name if code else 'UNKNOWN'}: {details}")


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("sleuthd load", "what each simulated user sends, and how often")
    group.add_argument(
        "--tasks-per-second",
        type=float,
        default=0.1,
        env_var="LOCUST_TASKS_PER_SECOND",
        help="RPCs each user starts per second (constant_throughput); total rate = users x this (default: 0.1)",
    )
    group.add_argument(
        "--check-weight",
        type=int,
        default=1,
        env_var="LOCUST_CHECK_WEIGHT",
        help="share of CheckDialogue calls (default: 1)",
    )
    group.add_argument(
        "--stream-weight",
        type=int,
        default=1,
        env_var="LOCUST_STREAM_WEIGHT",
        help="share of StreamDialogue calls (default: 1)",
    )
    group.add_argument(
        "--stream-chunks",
        type=int,
        default=4,
        env_var="LOCUST_STREAM_CHUNKS",
        help="audio messages per turn in a stream (default: 4)",
    )
    group.add_argument(
        "--dialogues",
        type=int,
        default=8,
        env_var="LOCUST_DIALOGUES",
        help="distinct synthetic dialogues to cycle through (default: 8)",
    )
    group.add_argument(
        "--unique-audio",
        choices=("on", "off"),
        default="on",
        env_var="LOCUST_UNIQUE_AUDIO",
        help="tag each request's audio so the server's embedding cache never hits it (default: on)",
    )
    group.add_argument(
        "--rpc-timeout",
        type=float,
        default=60.0,
        env_var="LOCUST_RPC_TIMEOUT",
        help="deadline of one RPC, seconds (default: 60)",
    )


@events.init.add_listener
def _load_speech(environment: Environment, **_kwargs: Any) -> None:
    opts = environment.parsed_options
    if opts is None:  # locust used as a library without its command line
        return
    if opts.check_weight < 0 or opts.stream_weight < 0 or opts.check_weight + opts.stream_weight == 0:
        raise LocustError("--check-weight and --stream-weight must be >= 0 and not both 0")
    if opts.stream_chunks < 1 or opts.tasks_per_second <= 0:
        raise LocustError("--stream-chunks must be >= 1 and --tasks-per-second > 0")
    _dialogues[:] = speech.dialogues(opts.dialogues)
    # gevent timers count from the event loop's cached clock, which has not moved since the loop last
    # ran (before the imports and the speech above, which can take seconds when clips are synthesized).
    # Locust sets its --run-time timer right after this listener: without a refresh it fires that
    # much early and the run is cut short.
    gevent.get_hub().loop.update_now()


@events.quitting.add_listener
def _write_final_csv(environment: Environment, **_kwargs: Any) -> None:
    # Locust rewrites its --csv files once a second and not again at exit, so calls that finish in the
    # last second (those let through by --stop-timeout among them) are in its printed summary but not
    # in the CSV. Users are done by the time `quitting` fires: write the final numbers once more.
    prefix = environment.parsed_options.csv_prefix if environment.parsed_options else None
    if not prefix:
        return
    final = StatsCSV(environment, PERCENTILES_TO_REPORT)
    with open(f"{prefix}_stats.csv", "w", newline="", encoding="utf-8") as fh:
        final.requests_csv(csv.writer(fh))
    with open(f"{prefix}_failures.csv", "w", newline="", encoding="utf-8") as fh:
        final.failures_csv(csv.writer(fh))


def grpc_target(host: str | None) -> str:
    """``host:port`` from locust's ``--host``, which may carry a scheme (``grpc://h:p``) or none (``h:p``)."""
    target = (host or "").strip().rstrip("/")
    target = target.split("://", 1)[1] if "://" in target else target
    if not target:
        raise LocustError("no target: pass --host HOST:PORT (e.g. --host 127.0.0.1:50051)")
    return target


def weighted_schedule(weights: dict[str, int]) -> Iterator[str]:
    """Smooth weighted round robin: every ``sum(weights)`` consecutive picks hold each name exactly its
    weight times, spread out (weights a=2, b=1 give a b a a b a ...). Names of weight 0 never come up."""
    live = {name: w for name, w in weights.items() if w > 0}
    total = sum(live.values())
    current = dict.fromkeys(live, 0)
    while True:
        for name, w in live.items():
            current[name] += w
        pick = max(current, key=lambda n: current[n])
        current[pick] -= total
        yield pick


def split(data: bytes, n: int) -> list[bytes]:
    """``data`` in ``n`` consecutive pieces of near-equal size (the last ones may be empty if data is tiny)."""
    step = -(-len(data) // n)
    return [data[k * step : (k + 1) * step] for k in range(n)]


def stream_requests(dialogue_id: str, turns: Sequence[bytes], chunks: int) -> Iterator[Req]:
    """A whole dialogue as stream messages: open, then per turn a TurnStart and ``chunks`` audio pieces."""
    yield Req(open=pb.StreamOpen(dialogue_id=dialogue_id))
    for index, (turn_id, speaker, wav) in enumerate(zip(TURN_IDS, speech.SPEAKERS, turns, strict=True)):
        yield Req(turn_start=pb.TurnStart(turn_id=turn_id, speaker=speaker, index=index))
        pieces = split(wav, chunks)
        for k, piece in enumerate(pieces):
            yield Req(audio=pb.TurnAudio(turn_id=turn_id, data=piece, final=k == len(pieces) - 1))


def check_verdict(verdict: pb.DialogueVerdict) -> None:
    got = tuple(t.turn_id for t in verdict.turns)
    if got != TURN_IDS:
        raise VerdictError(f"verdict covers turns {list(got)}, expected {list(TURN_IDS)}")


class SleuthUser(User):
    """One client sending whole dialogues, alternating unary checks and streams by the configured weights."""

    # Order in which users are created in this process: each starts its schedule at a different
    # place, so even a run of a few seconds with two users exercises both RPCs.
    _ordinal = itertools.count()

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        opts = environment.parsed_options
        self.tasks_per_second: float = opts.tasks_per_second if opts else 0.1
        self.chunks: int = opts.stream_chunks if opts else 4
        self.unique_audio: bool = (opts.unique_audio == "on") if opts else True
        self.rpc_timeout: float = opts.rpc_timeout if opts else 60.0
        weights = {"check": opts.check_weight, "stream": opts.stream_weight} if opts else {"check": 1, "stream": 1}
        me = next(self._ordinal)
        self.schedule = itertools.islice(weighted_schedule(weights), me % sum(weights.values()), None)
        # constant_throughput keeps the start-to-start interval fixed (waiting less after a slow call),
        # so the offered rate stays users x tasks_per_second until calls take longer than the interval.
        self._pace: Callable[[User], float] = constant_throughput(self.tasks_per_second)
        self.picks = itertools.cycle(range(len(_dialogues))) if _dialogues else None
        self.channel = grpc.insecure_channel(
            grpc_target(self.host),
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.stub = pb_grpc.SleuthStub(self.channel)
        self.sent = 0

    def wait_time(self) -> float:
        return self._pace(self)

    def on_start(self) -> None:
        # Users spawned together would fire together every interval: bursts of `users` dialogues and
        # silence between them, which measures how the server drains a burst, not a steady rate. A
        # random phase within one interval spreads the calls, so the offered load is smooth.
        gevent.sleep(random.uniform(0, 1 / self.tasks_per_second))
        self._cp_last_run = time.perf_counter()  # constant_throughput's clock starts after the phase

    def on_stop(self) -> None:
        self.channel.close()

    def _next_dialogue(self) -> tuple[str, list[bytes]]:
        if self.picks is None:
            raise LocustError("no speech loaded: run locust with this locustfile's command-line options")
        d = next(self.picks)
        self.sent += 1
        turns = _dialogues[d]
        if self.unique_audio:
            nonce = random.getrandbits(48)
            turns = [speech.tag_wav(w, nonce) for w in turns]
        return f"lt-{d:02d}-{self.sent}", turns

    def _fire(self, name: str, start: float, length: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="grpc",
            name=name,
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=length,
            exception=exc,
            context={},
        )

    @task
    def next_rpc(self) -> None:
        if next(self.schedule) == "check":
            self.check_dialogue()
        else:
            self.stream_dialogue()

    def check_dialogue(self) -> None:
        dialogue_id, turns = self._next_dialogue()
        req = pb.CheckDialogueRequest(dialogue_id=dialogue_id)
        for turn_id, speaker, wav in zip(TURN_IDS, speech.SPEAKERS, turns, strict=True):
            req.turns.add(turn_id=turn_id, speaker=speaker, audio=pb.Audio(encoded=wav))
        start, length = time.perf_counter(), 0
        exc: Exception | None = None
        try:
            verdict = self.stub.CheckDialogue(req, timeout=self.rpc_timeout)
            length = verdict.ByteSize()
            check_verdict(verdict)
        except grpc.RpcError as err:
            exc = RpcFailure(err)
        except VerdictError as err:
            exc = err
        self._fire("CheckDialogue", start, length, exc)

    def stream_dialogue(self) -> None:
        dialogue_id, turns = self._next_dialogue()
        messages = stream_requests(dialogue_id, turns, self.chunks)
        start, length = time.perf_counter(), 0
        exc: Exception | None = None
        first_verdicts: list[str] = []
        final: pb.DialogueVerdict | None = None
        call = self.stub.StreamDialogue(messages, timeout=self.rpc_timeout)
        try:
            for reply in call:
                length += reply.ByteSize()
                if reply.HasField("turn") and not reply.turn.revision:
                    first_verdicts.append(reply.turn.verdict.turn_id)
                elif reply.HasField("final"):
                    final = reply.final
            if sorted(first_verdicts) != sorted(TURN_IDS):
                raise VerdictError(f"first verdicts for {first_verdicts}, expected one for each of {list(TURN_IDS)}")
            if final is None:
                raise VerdictError("stream ended OK without a final verdict")
            check_verdict(final)
        except grpc.RpcError as err:
            exc = RpcFailure(err)
        except VerdictError as err:
            exc = err
        finally:
            call.cancel()  # no-op after a clean end; frees the server's stream on any early exit
        self._fire("StreamDialogue", start, length, exc)

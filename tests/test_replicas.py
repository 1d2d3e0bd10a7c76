"""Three `sleuthd serve` replicas, one PostgreSQL registry, clients balancing over them, one replica killed.

The client library balances with gRPC's ``round_robin`` over every address of its target (here an ``ipv4:``
list; in Kubernetes the headless Service's DNS name) and retries UNAVAILABLE through the channel's service
config. Several clients run checks and registrations while one replica gets SIGKILL mid-run:

- every unary request succeeds: a call that was on the killed replica is retried by the channel on another
  one (the survivors' access logs show ``attempt`` 2 or more for exactly those);
- no acknowledged registration is lost: every voice whose RegisterVoice answered OK is in the registry and
  serves as a reference afterwards (registrations use ``replace``, so a retry of one whose first attempt had
  committed is answered OK instead of ALREADY_EXISTS);
- streams are not resumable: those on the killed replica end with UNAVAILABLE and the caller reopens the
  stream (on a live replica) and sends its turns again; the others finish normally.

Bounded: 4 clients x 12 requests and 6 streams; prints the counts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from sleuthd.client import channels
from sleuthd.v1 import sleuthd_pb2 as pb

from tests import pgcluster

from .support import VOICE_A, VOICE_B, VOICE_F, Speech, enc
from .test_stream import send_turn

CLIENTS, REQUESTS_PER_CLIENT, STREAMS = 4, 12, 6
KILL_AFTER = 14  # unary answers before the kill: mid-run


@dataclass
class Replica:
    proc: subprocess.Popen[str]
    address: str
    metrics_url: str
    log: Path

    def unary_in_flight(self) -> float:
        """Work RPCs running now that are not streams (from its /metrics)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
        gauges = dict(
            line.split()
            for line in text.splitlines()
            if line.startswith(("sleuthd_rpcs_in_flight ", "sleuthd_streams_active "))
        )
        return float(gauges["sleuthd_rpcs_in_flight"]) - float(gauges["sleuthd_streams_active"])

    def access_lines(self) -> list[dict[str, object]]:
        lines = []
        for raw in self.log.read_text(errors="replace").splitlines():
            if raw.startswith("{") and '"sleuthd.access"' in raw:
                lines.append(json.loads(raw))
        return lines


@dataclass
class Counts:
    requests: int = 0
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    try:
        cluster = pgcluster.start()
    except pgcluster.PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL for the shared registry: {exc}")
    yield cluster.create_database("replicas")
    cluster.stop()


@pytest.fixture
def replicas(models_dir: Path, registry_url: str, tmp_path: Path) -> Iterator[list[Replica]]:
    started = []
    for i in range(3):
        log = tmp_path / f"replica{i}.log"
        with open(log, "w") as err:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "sleuthd.cli", "serve", "--port", "0", "--metrics-port", "0",
                 "--models-dir", str(models_dir), "--registry", registry_url, "--log-format", "json",
                 "--workers", "1", "--shutdown-grace-seconds", "2", "--embedding-cache-entries", "0"],
                stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
            # No embedding cache: the clients reuse seven clips per voice, and with cache hits a request took a
            # few milliseconds, so the kill could land after the answer it was aimed at (no retry to see).
        started.append((proc, log))
    out = []
    try:
        for proc, log in started:
            assert proc.stdout is not None
            line, metrics = proc.stdout.readline(), proc.stdout.readline()
            assert line.startswith("sleuthd listening on"), line + log.read_text()[-2000:]
            out.append(Replica(proc, line.split()[-1], metrics.split()[-1], log))
        yield out
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def check_request(speech: Speech, tag: str, k: int) -> pb.CheckDialogueRequest:
    req = pb.CheckDialogueRequest(dialogue_id=tag, options=pb.CheckOptions(method=pb.METHOD_PAIRWISE))
    for n, voice in enumerate((VOICE_A, VOICE_A, VOICE_F if k % 2 else VOICE_A)):
        req.turns.add(turn_id=f"t{n}", speaker="A", audio=enc(speech.wav_bytes(voice, (k + n) % 7)))
    return req


async def client_loop(target: str, c: int, speech: Speech, counts: Counts, answered: asyncio.Event) -> None:
    async with channels.channel(target) as ch:
        stub = channels.stub(ch)
        for k in range(REQUESTS_PER_CLIENT):
            rid = f"c{c}-{k:02d}"
            metadata = (("x-request-id", rid),)
            counts.requests += 1
            try:
                if k % 3 == 2:
                    voice_id = f"voice-{rid}"
                    clip = enc(speech.wav_bytes((VOICE_A, VOICE_B, VOICE_F)[k % 3], k % 7))
                    req = pb.RegisterVoiceRequest(voice_id=voice_id, clips=[clip], replace=True)
                    await stub.RegisterVoice(req, timeout=60, metadata=metadata)
                    counts.acknowledged.append(voice_id)
                else:
                    verdict = await stub.CheckDialogue(check_request(speech, rid, k), timeout=60, metadata=metadata)
                    assert len(verdict.turns) == 3
                counts.ok += 1
            except grpc.aio.AioRpcError as exc:
                counts.failed.append(f"{rid}: {exc.code().name}: {exc.details()}")
            if counts.ok + len(counts.failed) >= KILL_AFTER:
                answered.set()


async def stream_dialogue(
    stub: object, speech: Speech, s: int, killed: asyncio.Event
) -> tuple[grpc.StatusCode, pb.DialogueVerdict | None]:
    """Two turns, wait for the kill, two more, half-close; the status the stream ended with and its final
    verdict. Verdicts (and revisions of earlier turns) are read as they come."""
    call = stub.StreamDialogue(timeout=120, metadata=(("x-request-id", f"stream-{s}"),))  # type: ignore[attr-defined]
    try:
        await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id=f"stream-{s}")))
        for index in range(4):
            if index == 2:
                await killed.wait()
                await asyncio.sleep(0.3)  # the replica's death has reached this connection
            await send_turn(call, f"t{index}", "A", index, speech.wav_bytes(VOICE_A, index))
            while True:  # until this turn's own verdict (revisions of earlier turns may come first)
                update = (await asyncio.wait_for(call.read(), 60)).turn
                if update.verdict.turn_id == f"t{index}" and not update.revision:
                    break
        await call.done_writing()
        final = None
        while (message := await asyncio.wait_for(call.read(), 60)) != grpc.aio.EOF:
            if message.HasField("final"):
                final = message.final
        return await call.code(), final
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        return await call.code(), None
    except grpc.aio.UsageError:  # writing to a call that has already ended
        return await call.code(), None


async def test_a_replica_killed_mid_run_loses_no_request_and_no_registration(
    replicas: list[Replica], speech: Speech
) -> None:
    target = "ipv4:" + ",".join(r.address for r in replicas)
    counts = Counts()
    answered, killed = asyncio.Event(), asyncio.Event()
    async with channels.channel(target) as stream_channel:
        stream_stub = channels.stub(stream_channel)
        await stream_channel.channel_ready()
        streams = [asyncio.ensure_future(stream_dialogue(stream_stub, speech, s, killed)) for s in range(STREAMS)]
        clients = [asyncio.ensure_future(client_loop(target, c, speech, counts, answered)) for c in range(CLIENTS)]
        await asyncio.wait_for(answered.wait(), 300)
        victim = replicas[0]
        # Mid-run: wait (at most 20 s) until unary requests are in flight on it, besides its streams.
        give_up = time.monotonic() + 20
        while victim.unary_in_flight() < 1 and time.monotonic() < give_up:
            await asyncio.sleep(0.005)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=30)
        killed.set()
        killed_at = time.monotonic()
        await asyncio.gather(*clients)
        ended = await asyncio.gather(*streams)

        survivors = [r for r in replicas if r is not victim]
        logged = [x for r in survivors for x in r.access_lines()]
        retried = sorted({str(x["request_id"]) for x in logged if int(x.get("attempt", 1)) > 1})
        served_streams = {str(x["dialogue_id"]) for x in logged if x["method"] == "StreamDialogue"}
        cut = [s for s, (code, _) in enumerate(ended) if code != grpc.StatusCode.OK]

        # The caller of a cut stream reopens it (round_robin puts it on a live replica) and sends it again.
        reopened = await asyncio.gather(*(stream_dialogue(stream_stub, speech, s, killed) for s in cut))

        # Every acknowledged registration is in the shared registry and serves as a reference.
        found = []
        for voice_id in counts.acknowledged:
            voice = await stream_stub.GetVoice(pb.GetVoiceRequest(voice_id=voice_id), timeout=30)
            found.append(voice.voice_id)
        listed = await stream_stub.ListVoices(pb.ListVoicesRequest(page_size=1000), timeout=30)
        check = check_request(speech, "by-voice", 0)
        check.references.add(speaker="A", voice_id=counts.acknowledged[0])
        assert (await stream_stub.CheckDialogue(check, timeout=60)).turns[0].HasField("reference_cosine")

    print(
        f"\nreplicas: {counts.requests} unary requests, {len(retried)} retried, {len(counts.failed)} failed; "
        f"registrations acknowledged {len(counts.acknowledged)}, found {len(found)} "
        f"(registry holds {len(listed.voices)}); streams {STREAMS}, {len(cut)} cut with "
        f"{sorted({ended[s][0].name for s in cut})}, reopened OK {sum(c == grpc.StatusCode.OK for c, _ in reopened)}; "
        f"clients finished {time.monotonic() - killed_at:.1f} s after the kill"
    )
    assert counts.requests == CLIENTS * REQUESTS_PER_CLIENT
    assert not counts.failed, counts.failed
    assert counts.ok == counts.requests
    assert set(retried) <= {f"c{c}-{k:02d}" for c in range(CLIENTS) for k in range(REQUESTS_PER_CLIENT)}
    assert sorted(found) == sorted(counts.acknowledged)
    assert {v.voice_id for v in listed.voices} >= set(counts.acknowledged)
    assert cut, "round_robin put no stream on the killed replica"
    assert retried, "no request was in flight on the killed replica"
    for s, (code, final) in enumerate(ended):
        if s in cut:
            assert code == grpc.StatusCode.UNAVAILABLE, code
            assert f"stream-{s}" not in served_streams  # it was on the killed replica
        else:
            assert final is not None and len(final.turns) == 4
    assert all(code == grpc.StatusCode.OK and final is not None for code, final in reopened)

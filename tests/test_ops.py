"""Operating the server: ports, the ops HTTP port, status codes, bounded errors, malformed requests,
truthful outcome labels, access logs with request ids, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.config import EngineConfig
from sleuthd.engine.facade import Engine
from sleuthd.ops import logs
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.ops_http import OpsHttpServer
from sleuthd.rpc.status import STATUS_OF
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest.abuse import noisy_mp3s

from .ops_support import SLEUTHD, ServeProcess, http_get, own_server, rpc_count, settled_rpc_count, wait_for
from .support import REPO, VOICE_A, VOICE_F, Speech, enc
from .test_serving import fresh_pcm

_VANISHING_CLIENT = """
import asyncio, sys, grpc
from sleuthd.v1 import sleuthd_pb2 as pb, sleuthd_pb2_grpc as pb_grpc
async def main():
    async with grpc.aio.insecure_channel(sys.argv[1]) as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue()
        await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="vanishing")))
        await call.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id="t0", speaker="A")))
        await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id="t0", data=bytes(100))))
        print("streaming", flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""
LONG = "é" * 5_000  # 10 kB of UTF-8, 30 kB percent-encoded: over gRPC's metadata limit once echoed in a trailer


async def test_a_second_server_on_the_same_port_fails_clearly(engine: Engine) -> None:
    async with own_server(engine) as (first, _):
        with pytest.raises(OSError, match=rf"cannot listen on 127.0.0.1:{first.port} for gRPC: Address already in use"):
            async with own_server(engine, port=first.port):
                pass


def test_a_taken_metrics_port_is_a_one_line_error(models_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [*SLEUTHD, "serve", "--port", "0", "--metrics-port", str(port), "--models-dir", str(models_dir)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} for metrics: Address already in use "
        "(another sleuthd? --metrics-port 0 picks a free port, -1 serves none)"
    ]


async def test_the_ops_port_answers_only_its_paths_and_readiness_follows_health(engine: Engine) -> None:
    async with own_server(engine, metrics_port=0) as (running, _):
        base = f"http://127.0.0.1:{running.metrics_port}"
        assert (await http_get(base + "/"))[0] == 404
        assert (await http_get(base + "/metrics/../x"))[0] == 404
        status, body = await http_get(base + "/metrics")
        assert status == 200 and "sleuthd_rpcs_in_flight" in body
        assert await http_get(base + "/readyz") == (200, "SERVING\n")
        assert await http_get(base + "/healthz") == (200, "ok\n")
        await running.set_serving(False)  # as when the engine fails
        assert await http_get(base + "/readyz") == (503, "NOT_SERVING\n")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_half_sent_ops_connections_cost_no_thread_and_are_closed_in_time(engine: Engine) -> None:
    # Issue 33, finding 8: 376 connections that sent half a request held 389 threads of the ops port, for as
    # long as they stayed open.
    ready = [True]
    ops = OpsHttpServer(ServiceMetrics().registry, lambda: ready[0], lambda: True, request_timeout_s=1.0,
                        max_connections=64)  # fmt: skip
    port = ops.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    threads = threading.active_count()
    sockets = []
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            sockets.append(s)
        await asyncio.sleep(0.3)
        assert threading.active_count() <= threads + 1, threading.active_count() - threads
        assert ops.open_connections <= 64 and ops.refused_connections == 36
        await asyncio.sleep(1.2)  # past the request timeout: every one of them was closed by the server
        assert all(_closed_by_peer(s) for s in sockets)
        assert ops.open_connections == 0
        assert await http_get(base + "/readyz") == (200, "SERVING\n")
        assert (await http_get(base + "/nope"))[0] == 404
    finally:
        for s in sockets:
            s.close()
        ops.close()


async def test_over_a_limit_is_invalid_argument_and_every_code_is_documented(
    stub: pb_grpc.SleuthStub, engine: Engine
) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="too-long")
    for k in range(engine.config.max_turns + 1):  # turns without audio are free to send
        req.turns.add(turn_id=f"t{k}", speaker="A")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "the limit is" in err.value.details()
    # The proto says what every code this server returns means, and which ones are worth a retry.
    proto = (REPO / "proto" / "sleuthd" / "v1" / "sleuthd.proto").read_text()
    codes = {code.name for _, code in STATUS_OF} | {
        "UNAVAILABLE", "INTERNAL", "UNAUTHENTICATED", "CANCELLED", "DEADLINE_EXCEEDED", "UNIMPLEMENTED",
    }  # fmt: skip
    table = proto[proto.index("// Status codes") : proto.index("service Sleuth")]
    for code in codes:
        assert re.search(rf"^//\s+{code}\b", table, re.MULTILINE), f"{code} is not documented in the proto"
    assert re.search(r"^//\s+RESOURCE_EXHAUSTED\b.*retry", table, re.MULTILINE)


async def test_echoed_client_strings_are_bounded(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    unknown_encoder = pb.CheckDialogueRequest(options=pb.CheckOptions(encoder=LONG))
    unknown_encoder.turns.add(turn_id="t", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
    unknown_speaker = pb.CheckDialogueRequest()
    unknown_speaker.turns.add(turn_id="t", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
    unknown_speaker.references.add(speaker=LONG, audio=enc(speech.wav_bytes(VOICE_A, 1)))
    for req, ending in (
        (unknown_encoder, "this server has: campplus, fused, ge2e"),
        (unknown_speaker, "in this dialogue"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CheckDialogue(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()[:200]
        assert len(err.value.details()) <= logs.MAX_DETAILS_CHARS and err.value.details().endswith(ending)
        assert "characters cut" in err.value.details()
    call = stub.StreamDialogue(timeout=30)
    await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="d")))
    await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=LONG, data=b"\0\0")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(err.value.details()) <= logs.MAX_DETAILS_CHARS


async def test_malformed_protobuf_is_invalid_argument_and_counted(engine: Engine) -> None:
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, with a length past the end
    async with own_server(engine) as (running, metrics), grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        unary = ch.unary_unary("/sleuthd.v1.Sleuth/CheckDialogue", request_serializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unary(garbage, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid" in err.value.details() and "CheckDialogueRequest message" in err.value.details()
        stream = ch.stream_stream("/sleuthd.v1.Sleuth/StreamDialogue", request_serializer=None)
        call = stream(iter([garbage]), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sleuthd.v1.StreamDialogueRequest" in err.value.details()
        assert await settled_rpc_count(metrics, "CheckDialogue", "INVALID_ARGUMENT", 1) == 1
        assert await settled_rpc_count(metrics, "StreamDialogue", "INVALID_ARGUMENT", 1) == 1


async def test_deadline_expiry_and_vanished_stream_clients_are_labelled_truthfully(
    models_dir: Path, speech: Speech
) -> None:
    # Every model call takes over a second, so a 0.3 s deadline passes while the request is in the encoder.
    slow = Engine.load(EngineConfig(models_dir=models_dir, device="cpu", embedding_cache_entries=0))
    batcher = slow.encoders["ge2e"]
    real_embed = batcher._embed  # type: ignore[attr-defined]

    def slow_embed(windows: Any) -> Any:
        time.sleep(1.2)
        return real_embed(windows)

    batcher._embed = slow_embed  # type: ignore[attr-defined]
    try:
        async with own_server(slow) as (running, metrics), grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = pb_grpc.SleuthStub(ch)
            req = pb.CheckDialogueRequest(dialogue_id="late")
            req.turns.add(turn_id="t", speaker="A", audio=fresh_pcm(speech, VOICE_F, 0, 4242))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.CheckDialogue(req, timeout=0.3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await wait_for(lambda: rpc_count(metrics, "CheckDialogue", "DEADLINE_EXCEEDED") == 1, 10, "the count")
            assert rpc_count(metrics, "CheckDialogue", "CANCELLED") == 0
            # A stream's requests just end at its deadline; the server must not blame the cut-off dialogue.
            # (2 s, not 0.3: the server has just gone idle, and its heap trimmer's collection in this large
            # test process can hold the interpreter long enough for 0.3 s to pass before the first write.)
            call = stub.StreamDialogue(timeout=2.0)
            await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="slow-client")))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await wait_for(lambda: running.gate.in_flight == 0, 10, "the stream to end")
            assert rpc_count(metrics, "StreamDialogue", "DEADLINE_EXCEEDED") == 1
            assert rpc_count(metrics, "StreamDialogue", "INVALID_ARGUMENT") == 0

            # A client process that dies with a turn still open: its request stream just ends, which looks
            # like a half-close with an open turn (FAILED_PRECONDITION) until the cancellation arrives.
            client = subprocess.Popen([sys.executable, "-c", _VANISHING_CLIENT, f"127.0.0.1:{running.port}"],
                                      stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert client.stdout is not None and client.stdout.readline().strip() == "streaming"
            await wait_for(lambda: running.gate.in_flight == 1, 10, "the stream to start")
            client.kill()
            client.wait()
            await wait_for(lambda: running.gate.in_flight == 0, 10, "the stream to end")
            assert rpc_count(metrics, "StreamDialogue", "CANCELLED") == 1
            assert rpc_count(metrics, "StreamDialogue", "FAILED_PRECONDITION") == 0
    finally:
        await slow.aclose()


async def test_access_log_has_one_bounded_line_per_rpc_with_its_request_id(
    stub: pb_grpc.SleuthStub, speech: Speech, engine: Engine
) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs._RequestIdFilter())
    access = logging.getLogger("sleuthd.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        async with own_server(engine) as (running, _), grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            s = pb_grpc.SleuthStub(ch)
            ok = pb.CheckDialogueRequest(dialogue_id="ok-1")
            ok.turns.add(turn_id="t", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
            call = s.CheckDialogue(ok, timeout=30, metadata=(("x-request-id", "pipeline-42"),))
            await call
            # With the answer (trailing), never in a header of its own: a header would commit the call, and a
            # replica killed before the answer would leave the client nothing to retry (sleuthd.rpc.gate).
            assert ("x-request-id", "pipeline-42") in tuple(await call.trailing_metadata())
            assert "x-request-id" not in dict(await call.initial_metadata())
            hostile = pb.CheckDialogueRequest(dialogue_id="evil\nFORGED LINE" + "y" * 100_000)
            bad = s.CheckDialogue(hostile, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError):
                await bad
            given = dict(await bad.trailing_metadata())["x-request-id"]
    finally:
        access.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["method"], x["code"]) for x in lines] == [("CheckDialogue", "OK"), ("CheckDialogue", "INVALID_ARGUMENT")]
    assert lines[0]["request_id"] == "pipeline-42" and lines[0]["dialogue_id"] == "ok-1" and lines[0]["ms"] > 0
    assert lines[1]["request_id"] == given and re.fullmatch(r"[0-9a-f]{16}", given)
    assert lines[1]["dialogue_id"].startswith("evil\\nFORGED LINE") and len(lines[1]["dialogue_id"]) <= 128
    assert max(len(line) for line in out.getvalue().splitlines()) < 1000
    # The text format escapes control characters too, so no client string can start a line of its own.
    record = logging.LogRecord("sleuthd.x", logging.INFO, __file__, 1, "stream %r ended", ("a\nb" * 10_000,), None)
    text = logs.TextFormatter().format(record)
    assert "\n" not in text and len(text) < logs.MAX_MESSAGE_CHARS + 200


async def test_a_server_whose_output_nobody_reads_keeps_serving_and_its_log_stays_json(
    models_dir: Path, speech: Speech
) -> None:
    # Issue 33, finding 4: stderr a pipe that nobody reads while the server runs. 1,500 three-byte requests
    # (an access-log line each at info) and 150 MP3s with corrupt frames (libmpg123 writes a line to fd 2
    # for each) are far more than the pipe's 64 KiB. Before, the server blocked writing its log on the event
    # loop (health included) and libmpg123 blocked the decode threads; the C library's lines were not JSON.
    proc = subprocess.Popen(
        [*SLEUTHD, "--log-level", "info", "serve", "--port", "0", "--metrics-port", "-1", "--log-format", "json",
         "--models-dir", str(models_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        listening = proc.stdout.readline()
        assert listening.startswith("sleuthd listening on"), listening
        target = listening.split()[-1]
        mp3s = noisy_mp3s(speech.wav_bytes(VOICE_A, 0), 150)
        async with grpc.aio.insecure_channel(target) as ch:
            garbage = ch.unary_unary("/sleuthd.v1.Sleuth/CheckDialogue", request_serializer=None)
            stub = pb_grpc.SleuthStub(ch)
            requests: list[tuple[Any, Any]] = [(garbage, b"\xff\xff\xff")] * 1500
            requests += [
                (stub.CheckDialogue, pb.CheckDialogueRequest(turns=[pb.Turn(turn_id="t", speaker="A", audio=enc(m))]))
                for m in mp3s
            ]
            codes: dict[str, int] = {}
            for start in range(0, len(requests), 50):  # 50 calls at a time: the connection allows 100
                batch = [call(request, timeout=20) for call, request in requests[start : start + 50]]
                for result in await asyncio.gather(*batch, return_exceptions=True):
                    code = result.code().name if isinstance(result, grpc.aio.AioRpcError) else "OK"
                    codes[code] = codes.get(code, 0) + 1
            assert set(codes) <= {"OK", "INVALID_ARGUMENT"}, codes
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            ok = pb.CheckDialogueRequest(
                turns=[pb.Turn(turn_id="t", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 1)))]
            )
            assert len((await stub.CheckDialogue(ok, timeout=30)).turns) == 1
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    records = [json.loads(line) for line in err.splitlines()]  # every line is JSON, the C library's included
    assert any(r["logger"] == "sleuthd.stderr" and "libmpg123" in r["msg"] for r in records), err[-2000:]
    assert any(r["logger"] == "sleuthd.access" for r in records)
    assert any(r["logger"] == "sleuthd.logs" and "dropped" in r["msg"] for r in records), err[-2000:]


async def test_sigterm_drains_in_flight_calls_and_streams_then_exits(models_dir: Path, speech: Speech) -> None:
    # Calls must still be running when SIGTERM is sent. An idle model cuts a batch at once (no max-wait), so one
    # short call was answered in ~0.1 s and the gauge poll could miss it (CI, stop 43). Several calls of fresh
    # audio queue behind one another on the encoder, which keeps some of them running for a second or more.
    server = ServeProcess.start(models_dir, "--shutdown-grace-seconds", "30", "--log-format", "json")
    clips = len(speech.clips[VOICE_A])
    try:
        async with grpc.aio.insecure_channel(server.target) as ch:
            s = pb_grpc.SleuthStub(ch)
            stream = s.StreamDialogue(timeout=60)
            await stream.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="draining")))
            await stream.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id="t0", speaker="A")))

            async def check(c: int) -> tuple[pb.DialogueVerdict | grpc.StatusCode, float]:
                req = pb.CheckDialogueRequest(dialogue_id=f"in-flight-{c}")
                for i in range(3 * clips):
                    req.turns.add(
                        turn_id=f"u{i}", speaker="A", audio=fresh_pcm(speech, VOICE_A, i % clips, 777 + 100 * c + i)
                    )
                try:
                    reply: pb.DialogueVerdict | grpc.StatusCode = await s.CheckDialogue(req, timeout=60)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (exc.details() or "")
                    reply = exc.code()
                return reply, time.perf_counter()

            calls = [asyncio.ensure_future(check(c)) for c in range(6)]

            async def calls_running() -> bool:
                body = (await http_get(server.metrics_url + "/metrics"))[1]
                found = re.search(r"^sleuthd_rpcs_in_flight (\S+)$", body, re.M)
                return found is not None and float(found.group(1)) >= 3  # the stream and at least two calls

            await wait_for(calls_running, 20, "the stream and the calls to be in flight")
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()
            health = health_pb2_grpc.HealthStub(ch)

            async def not_serving() -> bool:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # still answered
                return bool(reply.status == health_pb2.HealthCheckResponse.NOT_SERVING)

            await wait_for(not_serving, 10, "health to say NOT_SERVING")
            assert (await http_get(server.metrics_url + "/readyz"))[0] == 503
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.CheckDialogue(pb.CheckDialogueRequest(dialogue_id="late"), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in err.value.details()
            # Calls running at SIGTERM finish normally, every turn judged: at least one answered after the signal.
            outcomes = await asyncio.gather(*calls)
            answered = [(r, at) for r, at in outcomes if isinstance(r, pb.DialogueVerdict)]
            assert any(at > signalled for _, at in answered), [
                (r if isinstance(r, grpc.StatusCode) else "OK", at - signalled) for r, at in outcomes
            ]
            for verdict, _ in answered:
                assert len(verdict.turns) == 3 * clips
                assert all(t.speech_seconds > 1 and t.status in (pb.CONSISTENT, pb.INCONSISTENT) for t in verdict.turns)
            await stream.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id="t0",
                               data=speech.wav_bytes(VOICE_A, 2), final=True)))  # fmt: skip
            await stream.done_writing()
            replies = [r async for r in stream]
            assert replies[-1].HasField("final") and replies[-1].final.turns[0].speech_seconds > 1
        code, err_text = server.finish(timeout=20)  # well before the 30 s grace: nothing was left running
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code == 0, err_text
    access = [json.loads(line) for line in err_text.splitlines() if '"sleuthd.access"' in line]
    assert {(x["method"], x["code"]) for x in access} >= {
        ("CheckDialogue", "OK"), ("StreamDialogue", "OK"), ("CheckDialogue", "UNAVAILABLE"),
    }  # fmt: skip


async def test_the_grace_period_bounds_the_drain(models_dir: Path) -> None:
    server = ServeProcess.start(models_dir, "--shutdown-grace-seconds", "1")
    try:
        async with grpc.aio.insecure_channel(server.target) as ch:
            stream = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=60)
            await stream.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="never-finished")))
            await stream.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id="t0", speaker="A")))

            async def running() -> bool:
                return "sleuthd_rpcs_in_flight 1.0" in (await http_get(server.metrics_url + "/metrics"))[1]

            await wait_for(running, 20, "the stream to be in flight")
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(stream.read(), 20)
            # Told to end before the grace is over (its open turn never had a final chunk: nothing to judge).
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            assert "shutting down" in (err.value.details() or "")
            assert time.perf_counter() - signalled < 3.0
        code, err_text = server.finish(timeout=20)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code == 0, err_text


async def test_at_shutdown_queued_work_is_handed_back_and_streams_get_their_verdicts_first(
    models_dir: Path, speech: Speech
) -> None:
    # Issue 33, finding 9: at SIGTERM under load, 18 of 20 in-flight RPCs were cut (CANCELLED) at the end of
    # the grace period, and open streams were cut too, their pending verdicts unsent. Now what cannot finish
    # within the grace is refused at once (UNAVAILABLE: retry elsewhere), what can finishes, and a stream
    # stops reading near the end of the grace and ends (UNAVAILABLE) after the verdicts of every turn it read.
    server = ServeProcess.start(models_dir, "--shutdown-grace-seconds", "5", "--log-format", "json")
    outcomes: list[str] = []
    written: list[str] = []
    verdicts: list[str] = []
    try:
        async with grpc.aio.insecure_channel(server.target) as ch:
            s = pb_grpc.SleuthStub(ch)
            stop = asyncio.Event()

            async def unary(n: int) -> None:
                k = 0
                while not stop.is_set():
                    req = pb.CheckDialogueRequest(dialogue_id=f"u{n}")
                    for t in range(6):
                        req.turns.add(
                            turn_id=f"t{t}",
                            speaker="AB"[t % 2],
                            audio=fresh_pcm(speech, (VOICE_A, VOICE_F)[t % 2], t % 4, 1000 * n + 10 * k + t),
                        )
                    k += 1
                    try:
                        await s.CheckDialogue(req, timeout=120)
                        outcomes.append("OK")
                    except grpc.aio.AioRpcError as err:
                        outcomes.append(err.code().name)
                        if err.code() == grpc.StatusCode.UNAVAILABLE:
                            return

            async def streaming() -> str:
                call = s.StreamDialogue(timeout=120)

                async def write() -> None:
                    await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="live")))
                    for k in range(1000):
                        turn = f"t{k}"
                        await call.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(
                            turn_id=turn, speaker="A", index=k)))  # fmt: skip
                        await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(
                            turn_id=turn, data=speech.wav_bytes(VOICE_A, k % 4), final=True)))  # fmt: skip
                        written.append(turn)
                        await asyncio.sleep(0.3)

                writer = asyncio.ensure_future(write())
                try:
                    while True:
                        reply = await call.read()
                        if reply is grpc.aio.EOF:
                            break
                        if not reply.turn.revision:
                            verdicts.append(reply.turn.verdict.turn_id)
                except grpc.aio.AioRpcError:
                    pass
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, grpc.aio.UsageError,
                                         asyncio.InvalidStateError):  # fmt: skip
                    await writer
                return f"{(await call.code()).name}: {await call.details()}"

            clients = [asyncio.ensure_future(unary(n)) for n in range(6)]
            stream = asyncio.ensure_future(streaming())
            await wait_for(lambda: len(verdicts) >= 3 and len(outcomes) >= 2, 60, "the load to run")
            server.proc.send_signal(signal.SIGTERM)
            ended = await asyncio.wait_for(stream, 30)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*clients), 30)
        code, err_text = server.finish(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code == 0, err_text
    # The asyncio client reports a write after the server's answer as INTERNAL (grpc/grpc#36066): the
    # server's access log says how it ended the stream.
    access = [json.loads(line) for line in err_text.splitlines() if '"sleuthd.access"' in line]
    assert [x["code"] for x in access if x["method"] == "StreamDialogue"] == ["UNAVAILABLE"], ended
    assert ended.startswith(("UNAVAILABLE: the server is shutting down", "INTERNAL")), ended
    # Every turn the server read got its verdict; only one written as the stream was told to end may have none.
    assert len(verdicts) >= 3 and verdicts == written[: len(verdicts)], (written, verdicts)
    assert len(written) - len(verdicts) <= 1, (written, verdicts)
    assert "CANCELLED" not in outcomes and "DEADLINE_EXCEEDED" not in outcomes, outcomes
    assert "drain over" not in err_text

"""Registered voices through a real server: enrol once, check and rank against the voice by id, list and
delete, restart the server on the same SQLite file, and kill -9 a `sleuthd serve --registry` mid-registration."""

from __future__ import annotations

import json
import logging
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from sleuthd.client import AsyncSleuthClient, SleuthClient, Verdict, channels
from sleuthd.config import EngineConfig, RegistryConfig, ServerConfig
from sleuthd.engine.facade import Engine
from sleuthd.engine.loading import open_registry
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.registry import Embedding, open_store
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from tests.registry_support import WEIGHTS_B, clip_from_file, vector_for

from .support import VOICE_A, VOICE_B, VOICE_F, Speech, encode_wav

SLEUTHD = [sys.executable, "-m", "sleuthd.cli"]


@dataclass
class VoiceServer:
    engine: Engine
    running: RunningServer
    location: str

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    async def stop(self) -> None:
        await self.running.stop(grace=1.0)
        await self.engine.close_registry()


async def start_voice_server(
    shared: Engine, location: str, config: EngineConfig | None = None, **registry: object
) -> VoiceServer:
    """A server with a registry at ``location``, on the session's loaded models (as `serve --registry` builds
    it: the store opened by sleuthd.engine.loading, handed to the engine); ``config``: other engine options."""
    store = open_registry(RegistryConfig(registry=location, **registry))  # type: ignore[arg-type]
    metrics = ServiceMetrics()
    engine = Engine(shared.models, config or shared.config, metrics, store)
    running = await create_server(engine, ServerConfig(port=0, metrics_port=-1), metrics)
    return VoiceServer(engine, running, location)


@pytest_asyncio.fixture(loop_scope="session")
async def voices(engine: Engine, tmp_path: Path) -> AsyncIterator[VoiceServer]:
    server = await start_voice_server(engine, str(tmp_path / "voices.sqlite3"))
    yield server
    await server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def client(voices: VoiceServer) -> AsyncIterator[AsyncSleuthClient]:
    async with AsyncSleuthClient(voices.target, timeout=60) as c:
        yield c


def ann_turns(speech: Speech, foreign: str | None = None) -> list[tuple[str, Path]]:
    """Four turns of voice A as speaker Ann; the third by ``foreign`` when given."""
    return [("Ann", speech.clips[foreign or VOICE_A][2] if k == 2 else speech.clips[VOICE_A][k]) for k in range(4)]


async def test_check_against_a_registered_voice_flags_a_foreign_turn_and_passes_its_own(
    client: AsyncSleuthClient, speech: Speech
) -> None:
    voice = await client.register_voice("ann", speech.clips[VOICE_A][5:7], metadata={"tts": "espeak-ng"})
    assert (voice.voice_id, voice.revision, voice.audio_kept, len(voice.clips)) == ("ann", 1, True, 2)
    assert 2.0 < voice.speech_seconds < sum(c.audio_seconds for c in voice.clips)
    # One embedding per loaded encoder (make models exports GE2E and CAM++), and one per encoder of the clips'
    # narrowband copies, which band matching compares with (the fused encoder's auto).
    by_encoder = {e.encoder: e for e in voice.embeddings}
    assert set(by_encoder) == {"ge2e", "campplus", "ge2e+band3600", "campplus+band3600"}
    assert (by_encoder["ge2e"].dimension, by_encoder["ge2e"].loaded) == (256, True)
    assert by_encoder["campplus+band3600"].dimension == 192
    assert all(e.loaded for e in voice.embeddings) and len(by_encoder) == len(voice.embeddings)

    for method in ("reference", "auto"):
        own = await client.check(ann_turns(speech), voices={"Ann": "ann"}, method=method)
        assert own.consistent and own.inconsistent_turns == (), method
        assert all(t.reference_cosine is not None for t in own.turns)
        foreign = await client.check(ann_turns(speech, VOICE_F), voices={"Ann": "ann"}, method=method)
        assert not foreign.consistent and foreign.inconsistent_turns == ("t3",), method
        assert foreign.speaker("Ann").inconsistent_turns == ("t3",)


async def test_a_voice_from_one_clip_judges_exactly_as_that_clip_sent_as_reference(
    client: AsyncSleuthClient, speech: Speech
) -> None:
    await client.register_voice("ann-one", speech.clips[VOICE_A][5])
    turns = ann_turns(speech, VOICE_B)
    by_audio = await client.check(turns, references={"Ann": speech.clips[VOICE_A][5]}, method="reference")
    by_id = await client.check(turns, voices={"Ann": "ann-one"}, method="reference")
    assert by_id == by_audio  # every score, probability and status, to the last bit
    assert by_id.turn("t3").reference_cosine is not None


async def test_rank_and_stream_take_a_voice_id(client: AsyncSleuthClient, speech: Speech) -> None:
    await client.register_voice("ann-rank", speech.clips[VOICE_A][5:7])
    candidates = {"b": speech.clips[VOICE_B][4], "a": speech.clips[VOICE_A][4], "f": speech.clips[VOICE_F][4]}
    ranking = await client.rank(candidates, reference_voice="ann-rank", method="reference")
    assert ranking.best.candidate_id == "a" and ranking.best.rank == 1

    Req = pb.StreamDialogueRequest
    call = client.stub.StreamDialogue(timeout=60)
    ref = pb.SpeakerReference(speaker="Ann", voice_id="ann-rank")
    options = pb.CheckOptions(method=pb.METHOD_REFERENCE)
    await call.write(Req(open=pb.StreamOpen(dialogue_id="s", references=[ref], options=options)))
    for k, (speaker, path) in enumerate(ann_turns(speech, VOICE_F)):
        await call.write(Req(turn_start=pb.TurnStart(turn_id=f"t{k + 1}", speaker=speaker, index=k)))
        await call.write(Req(audio=pb.TurnAudio(turn_id=f"t{k + 1}", data=path.read_bytes(), final=True)))
    await call.done_writing()
    (final,) = [r.final async for r in call if r.HasField("final")]
    check = await client.check(ann_turns(speech, VOICE_F), voices={"Ann": "ann-rank"}, method="reference")
    assert Verdict.from_pb(final) == replace(check, dialogue_id="s")


async def test_list_get_replace_and_delete(client: AsyncSleuthClient, speech: Speech) -> None:
    for voice_id in ("v-c", "v-a", "v-b"):
        await client.register_voice(voice_id, speech.clips[VOICE_B][5])
    page = await client.list_voices(page_size=2)
    assert [v.voice_id for v in page.voices] == ["v-a", "v-b"] and page.next_page_token and page.total == 3
    assert [v.voice_id async for v in client.voices(page_size=2)] == ["v-a", "v-b", "v-c"]

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.register_voice("v-a", speech.clips[VOICE_A][5])
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "replace" in err.value.details()
    replaced = await client.register_voice("v-a", speech.clips[VOICE_A][5], metadata={"take": "2"}, replace=True)
    got = await client.get_voice("v-a")
    assert (got.revision, got.metadata, got.created_at) == (2, {"take": "2"}, replaced.created_at)
    assert got.updated_at > got.created_at and got.clips == replaced.clips

    await client.delete_voice("v-a")
    for call in (
        client.get_voice("v-a"),
        client.delete_voice("v-a"),
        client.check(ann_turns(speech), voices={"Ann": "v-a"}),
        client.rank([speech.clips[VOICE_A][3], speech.clips[VOICE_B][3]], reference_voice="v-a"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no voice 'v-a' is registered" in err.value.details()
    assert [v.voice_id for v in (await client.list_voices()).voices] == ["v-b", "v-c"]


async def test_bad_registrations_say_what_to_fix(client: AsyncSleuthClient, speech: Speech) -> None:
    silence = encode_wav(np.zeros(3 * 16_000, np.float32), 16_000)
    bad = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (("quiet", [speech.clips[VOICE_A][5], silence]), bad, "clip #1 cannot be enrolled"),
        (("bad id!", speech.clips[VOICE_A][5]), bad, "voice id 'bad id!' is not valid"),
        (("x" * 10_000, speech.clips[VOICE_A][5]), bad, "(10000 characters) is not valid"),
        (("none", []), bad, "at least one clip"),
    ]
    for (voice_id, clips), code, message in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.register_voice(voice_id, clips)
        assert err.value.code() == code and message in err.value.details(), err.value.details()
        assert len(err.value.details()) < 400
    assert (await client.list_voices()).total == 0  # nothing refused landed


async def test_server_info_describes_the_registry(client: AsyncSleuthClient) -> None:
    info = await client.stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.HasField("registry")
    assert (info.registry.backend, info.registry.keep_audio, info.registry.max_clips_per_voice) == ("sqlite", True, 32)
    assert info.registry.max_clip_bytes == 16 * 2**20


async def test_a_voice_enrolled_under_other_weights_is_re_embedded_or_refused(
    engine: Engine, tmp_path: Path, speech: Speech
) -> None:
    """Voices stored with an embedding of other GE2E weights only (as after a re-export): one with its clips
    kept is re-embedded from them on first use, the other (clips not kept) is refused with how to re-enrol."""
    location = str(tmp_path / "old.sqlite3")
    store = open_store(RegistryConfig(registry=location))
    assert store is not None
    clip = clip_from_file(speech.clips[VOICE_A][5])
    for voice_id, keep in (("kept", True), ("hashes-only", False)):
        foreign = Embedding("ge2e", WEIGHTS_B, vector_for(voice_id, WEIGHTS_B))
        store.register(voice_id, [clip], embeddings=[foreign], keep_audio=keep)
    store.close()

    server = await start_voice_server(engine, location)
    try:
        async with AsyncSleuthClient(server.target, timeout=60) as c:
            turns = ann_turns(speech, VOICE_F)
            by_id = await c.check(turns, voices={"Ann": "kept"}, method="reference")
            by_audio = await c.check(turns, references={"Ann": speech.clips[VOICE_A][5]}, method="reference")
            assert by_id == by_audio  # the stored clip was embedded now, the foreign vector never used
            kept = await c.get_voice("kept")
            found = {(e.weights_sha256 == WEIGHTS_B, e.loaded) for e in kept.embeddings}
            assert found == {(True, False), (False, True)}  # the old weights' embedding and the new one
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.check(turns, voices={"Ann": "hashes-only"}, method="reference")
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "enrolled under other ge2e weights" in err.value.details()
            assert "register it again with its clips and replace" in err.value.details()
    finally:
        await server.stop()


async def test_the_registry_survives_a_server_restart(engine: Engine, tmp_path: Path, speech: Speech) -> None:
    location = str(tmp_path / "restart.sqlite3")
    first = await start_voice_server(engine, location)
    async with AsyncSleuthClient(first.target, timeout=60) as c:
        registered = await c.register_voice("ann", speech.clips[VOICE_A][5:7])
        before = await c.check(ann_turns(speech, VOICE_F), voices={"Ann": "ann"})
    await first.stop()

    second = await start_voice_server(engine, location)  # a new server object on the same SQLite file
    try:
        async with AsyncSleuthClient(second.target, timeout=60) as c:
            assert await c.get_voice("ann") == registered
            assert await c.check(ann_turns(speech, VOICE_F), voices={"Ann": "ann"}) == before
    finally:
        await second.stop()


async def test_a_locked_registry_is_unavailable_for_now_and_the_server_stays_healthy(
    engine: Engine, tmp_path: Path, speech: Speech, caplog: pytest.LogCaptureFixture
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from sleuthd.ops import logs

    location = tmp_path / "locked.sqlite3"
    server = await start_voice_server(engine, str(location), registry_busy_timeout_ms=200)
    try:
        async with AsyncSleuthClient(server.target, timeout=60) as c:
            await c.register_voice("ann", speech.clips[VOICE_A][5:6])
            holder = sqlite3.connect(location, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")  # another process holds the database's write lock
            try:
                caplog.clear()
                with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.register_voice("bob", speech.clips[VOICE_B][5:6])
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                # The failure itself is logged with its cause, not only the access line (issue 32), in both formats,
                # once per attempt: the client's channel retries UNAVAILABLE (channels.RETRY_POLICY), since
                # nothing of the answer reaches it before the status (sleuthd.rpc.gate, "request id").
                failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(failures) == channels.RETRY_POLICY["maxAttempts"], [r.getMessage() for r in failures]
                failure = failures[0]
                assert failure.levelname == "WARNING" and "database is locked" in failure.getMessage()
                text = logs.TextFormatter().format(failure)
                assert " WARNING sleuthd.rpc.servicer" in text
                assert f"voice registry {location}: database is locked" in text
                as_json = json.loads(logs.JsonFormatter().format(failure))
                assert as_json["level"] == "warning" and "database is locked" in as_json["msg"]
                assert as_json["error"] == "RegistryUnavailable" and "OperationalError" in as_json["cause"]
                async with grpc.aio.insecure_channel(server.target) as ch:
                    health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert health.status == health_pb2.HealthCheckResponse.SERVING  # not the server's own failure
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            assert (await c.register_voice("bob", speech.clips[VOICE_B][5:6])).voice_id == "bob"
    finally:
        await server.stop()


async def test_registration_bounds_refuse_before_any_work(engine: Engine, tmp_path: Path, speech: Speech) -> None:
    server = await start_voice_server(engine, str(tmp_path / "small.sqlite3"), registry_max_clips_per_voice=2)
    try:
        async with AsyncSleuthClient(server.target, timeout=60) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.register_voice("many", speech.clips[VOICE_A][:3])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # send less; not "busy"
            assert "registry_max_clips_per_voice" in err.value.details()
    finally:
        await server.stop()


async def test_without_a_registry_voice_calls_say_how_to_get_one(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert not info.HasField("registry")
    req = pb.CheckDialogueRequest(dialogue_id="d", references=[pb.SpeakerReference(speaker="Ann", voice_id="ann")])
    for k in range(2):
        req.turns.add(turn_id=f"t{k}", speaker="Ann", audio=pb.Audio(encoded=speech.wav_bytes(VOICE_A, k)))
    for call in (
        stub.RegisterVoice(pb.RegisterVoiceRequest(voice_id="ann", clips=[pb.Audio(encoded=b"x")])),
        stub.ListVoices(pb.ListVoicesRequest()),
        stub.CheckDialogue(req),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "start it with --registry" in err.value.details()


# ---------------------------------------------------------------------------------------------- subprocesses


def serve(models_dir: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    # stderr goes to a file: a pipe nobody reads would fill up with the server's log.
    proc = subprocess.Popen(
        [*SLEUTHD, "--log-level", "warning", "serve", "--port", "0", "--metrics-port", "-1",
         "--models-dir", str(models_dir), *args],
        stdout=subprocess.PIPE, stderr=(log := tempfile.TemporaryFile("w+")), text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    log.seek(0)
    assert line.startswith("sleuthd listening on"), line + log.read()
    return proc, line.split()[-1]


@pytest.fixture
def killed_server_registry(models_dir: Path, speech: Speech, tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """`sleuthd serve --registry FILE` killed with SIGKILL while two clients register voices in a loop; the
    registry file and the ids whose RegisterVoice was answered OK."""
    path = tmp_path / "voices.sqlite3"
    proc, target = serve(models_dir, "--registry", str(path))
    acked: list[str] = []
    errors: list[grpc.StatusCode] = []

    def register_forever(prefix: str) -> None:
        with SleuthClient(target, timeout=30) as c:
            for i in range(10_000):
                clips = [speech.clips[v][(i + k) % 7] for k, v in enumerate((VOICE_A, VOICE_B, VOICE_F))]
                try:
                    c.register_voice(f"{prefix}-{i:04d}", clips, metadata={"n": str(i)})
                except grpc.RpcError as exc:
                    errors.append(exc.code())
                    return
                acked.append(f"{prefix}-{i:04d}")

    threads = [threading.Thread(target=register_forever, args=(p,)) for p in ("a", "b")]
    for t in threads:
        t.start()
    enough = random.Random().randint(4, 10)
    while len(acked) < enough and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(random.Random().uniform(0, 0.05))  # somewhere inside the next registrations
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    for t in threads:
        t.join(timeout=60)
    assert errors and all(e == grpc.StatusCode.UNAVAILABLE for e in errors), errors
    print(f"killed after {len(acked)} acknowledged registrations")
    yield path, list(acked)


def test_kill_9_mid_registration_loses_no_acknowledged_voice(
    killed_server_registry: tuple[Path, list[str]], models_dir: Path, speech: Speech
) -> None:
    path, acked = killed_server_registry
    loaded_encoders = {p.parent.name for p in models_dir.glob("*/manifest.json") if p.parent.name != "silero_vad"}
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store = open_store(RegistryConfig(registry=str(path)))
    assert store is not None
    stored = [v.voice_id for v in store.list_voices(page_size=1000).voices]
    assert set(acked) <= set(stored)
    assert len(stored) - len(acked) <= 2  # at most the two in flight landed without their answer
    for voice_id in stored:  # every voice there is whole: no registration landed in part
        voice = store.get(voice_id, with_audio=True)
        assert len(voice.clips) == 3 and all(c.data for c in voice.clips)
        # One per encoder and one of the clips' narrowband copies (band matching), all or none.
        narrow = {f"{e}+band3600" for e in loaded_encoders}
        assert {e.encoder for e in voice.embeddings} == loaded_encoders | narrow
    store.close()

    proc, target = serve(models_dir, "--registry", str(path))  # and a restarted server finds them
    try:
        with SleuthClient(target, timeout=60) as c:
            assert [v.voice_id for v in c.voices(page_size=3)] == stored
            verdict = c.check(ann_turns(speech, VOICE_F), voices={"Ann": acked[0]})
            assert verdict.judged
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_a_bad_registry_location_stops_serve_with_one_line(tmp_path: Path) -> None:
    start = time.monotonic()
    r = subprocess.run(
        [*SLEUTHD, "serve", "--port", "0", "--metrics-port", "-1", "--registry", str(tmp_path / "no" / "v.db")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: registry ")
    assert "does not exist; create it first" in r.stderr
    assert time.monotonic() - start < 60

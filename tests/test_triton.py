"""Encoders on a real NVIDIA Triton server (sleuthd.encoders.triton, sleuthd.export.triton_repo).

``tritonserver`` comes from the nvidia-pytriton wheel (Python backend only), so the repository is the
``--python-backend`` one: Triton's dynamic batcher in front of the same ONNX files run with ONNX Runtime. The
GPU repository (onnxruntime backend, padded to one batch shape) is checked by parsing its config with
Triton's own ModelConfig message, and its padder runs for real behind the Python runner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.config import BatcherConfig, ConfigError, EncoderBackendConfig, EngineConfig, ServerConfig
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.encoders.triton import SHA256_PARAMETER, EncoderUnavailable, check_served_model, load_triton_encoder
from sleuthd.engine.facade import Engine
from sleuthd.errors import DeadlineExceeded
from sleuthd.export.triton_models.batch_padder import pad_rows
from sleuthd.export.triton_models.onnx_runner import split_rows, stack_requests
from sleuthd.export.triton_repo import RepoOptions, write_repository
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.encoder_health import health_name
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc
from sleuthd_bench import tritonserver
from tritonclient.grpc import model_config_pb2

from .support import VOICE_A, VOICE_B, VOICE_F, Speech, enc

PROBE_S = 0.2  # the tests' probe interval: recovery is seen within a fraction of a second


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def dialogue(speech: Speech, tag: str, intruder: str | None = None) -> pb.CheckDialogueRequest:
    """Two speakers, four turns each; A's turn a2 is ``intruder``'s voice when given. Fused, method auto."""
    req = pb.CheckDialogueRequest(dialogue_id=f"triton-{tag}", options=pb.CheckOptions(encoder="fused"))
    for k in range(4):
        a = speech.wav_bytes(intruder, 0) if (intruder and k == 2) else speech.wav_bytes(VOICE_A, k)
        req.turns.add(turn_id=f"a{k}", speaker="A", audio=enc(a))
        req.turns.add(turn_id=f"b{k}", speaker="B", audio=enc(speech.wav_bytes(VOICE_B, k)))
    return req


def assert_same_verdict(got: pb.DialogueVerdict, want: pb.DialogueVerdict) -> None:
    """Statuses, flagged turns and every score equal; probabilities and cosines within 1e-5."""
    assert [t.status for t in got.turns] == [t.status for t in want.turns]
    flagged = [list(s.inconsistent_turn_ids) for s in want.speakers]
    assert [list(s.inconsistent_turn_ids) for s in got.speakers] == flagged
    for g, w in zip(got.turns, want.turns, strict=True):
        for field in ("score", "inconsistency_probability", "pairwise_mean_cosine", "centroid_cosine_distance",
                      "reference_cosine"):  # fmt: skip
            assert g.HasField(field) == w.HasField(field), field
            if w.HasField(field):
                assert getattr(g, field) == pytest.approx(getattr(w, field), abs=1e-5), (g.turn_id, field)


async def health(channel: grpc.aio.Channel, service: str) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


# ---------------------------------------------------------------------------------------------- no server


def test_gpu_repository_pads_every_call_to_one_shape(models_dir: Path, tmp_path: Path) -> None:
    """The production layout, parsed by Triton's own ModelConfig: the client-facing model batches dynamically
    (preferred size, queue delay, bounded queue, per-request timeouts) and pads; the ONNX model behind it runs
    on the onnxruntime backend, GPU instances, one fixed shape, warmed up at that shape."""
    write_repository(models_dir, tmp_path, RepoOptions(max_batch_windows=64, instances=2, max_queue_delay_us=2000))
    for name in ("ge2e", "campplus"):
        manifest = load_encoder_manifest(models_dir / name)
        front, inner = _config(tmp_path / name / "config.pbtxt"), _config(tmp_path / f"{name}_onnx" / "config.pbtxt")
        assert (front.backend, front.max_batch_size) == ("python", 64)
        assert list(front.dynamic_batching.preferred_batch_size) == [64]
        assert front.dynamic_batching.max_queue_delay_microseconds == 2000
        policy = front.dynamic_batching.default_queue_policy
        assert policy.allow_timeout_override and policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
        assert front.parameters["inner_model"].string_value == f"{name}_onnx"
        assert front.parameters["rows"].string_value == "64"
        assert check_served_model(manifest, front, name).max_batch_size == 64
        assert (inner.backend, inner.max_batch_size) == ("onnxruntime", 0)
        assert list(inner.input[0].dims) == [64, manifest.window.window_samples]
        assert list(inner.output[0].dims) == [64, manifest.embedding_size]
        assert [(g.kind, g.count) for g in inner.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_GPU, 2)]
        assert list(inner.model_warmup[0].inputs[manifest.input_name].dims) == [64, manifest.window.window_samples]
        assert (tmp_path / f"{name}_onnx" / "1" / "model.onnx").read_bytes() == manifest.path.read_bytes()
    cpu = tmp_path / "cpu"
    write_repository(models_dir, cpu, RepoOptions(python_backend=True))
    assert _config(cpu / "campplus" / "config.pbtxt").max_batch_size == 8  # the card's CPU cap, as the batcher's
    assert not (cpu / "campplus_onnx").exists()


def test_served_model_must_match_the_manifest(models_dir: Path, tmp_path: Path) -> None:
    manifest = load_encoder_manifest(models_dir / "ge2e")
    write_repository(models_dir, tmp_path, RepoOptions(python_backend=True))
    config = _config(tmp_path / "ge2e" / "config.pbtxt")
    assert check_served_model(manifest, config, "ge2e").max_batch_size == 64
    other = model_config_pb2.ModelConfig()
    other.CopyFrom(config)
    other.parameters[SHA256_PARAMETER].string_value = "0" * 64
    with pytest.raises(ConfigError, match="serves ONNX sha256 000000000000…, the manifest's is"):
        check_served_model(manifest, other, "ge2e")
    other.CopyFrom(config)
    other.input[0].dims[0] = 16000
    with pytest.raises(ConfigError, match=r"input 'audio_windows' is \[16000\] .* expected \[25840\]"):
        check_served_model(manifest, other, "ge2e")


def test_padding_and_splitting_are_exact() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 1, 3)]
    batch, counts = stack_requests(parts)
    padded = pad_rows(batch, 8)
    assert padded.shape == (8, 3) and (padded[6:] == batch[-1]).all() and (padded[:6] == batch).all()
    back = split_rows(padded[: len(batch)] * 2, counts)
    assert [p.shape[0] for p in back] == [2, 1, 3] and all((b == 2 * p).all() for b, p in zip(back, parts, strict=True))
    with pytest.raises(ValueError, match="cannot be padded"):
        pad_rows(batch, 5)
    with pytest.raises(ValueError, match="returned 5 rows for 6 windows"):
        split_rows(batch[:5], counts)


async def test_unreachable_triton_starts_not_serving_and_fails_fast(models_dir: Path) -> None:
    manifest = load_encoder_manifest(models_dir / "ge2e")
    config = EncoderBackendConfig("triton", f"127.0.0.1:{tritonserver.free_port()}", triton_connect_timeout_s=0.3,
                                  triton_probe_interval_s=PROBE_S)  # fmt: skip
    encoder = load_triton_encoder(manifest, config, BatcherConfig())
    await encoder.start()
    try:
        assert not encoder.health.serving
        started = time.perf_counter()
        with pytest.raises(EncoderUnavailable, match=r"encoder ge2e is unavailable: its Triton server at 127\.0\.0\.1"):
            await encoder.encode(np.zeros((2, manifest.window.window_samples), np.float32))
        assert time.perf_counter() - started < 0.5  # refused at once, never a made-up embedding
    finally:
        await encoder.close()


# ---------------------------------------------------------------------------------------------- real Triton


@pytest.fixture(scope="module")
def triton(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tritonserver.TritonProcess]:
    repo = tmp_path_factory.mktemp("triton-repo")
    write_repository(models_dir, repo, RepoOptions(python_backend=True, intra_op_threads=2))
    try:
        server = tritonserver.start(repo, startup_timeout_s=90, workdir=tmp_path_factory.mktemp("triton-run"))
    except tritonserver.TritonUnavailable as exc:
        pytest.fail(f"cannot start Triton: {exc}")
    yield server
    server.kill()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def triton_server(triton: tritonserver.TritonProcess, models_dir: Path) -> AsyncIterator[RunningServer]:
    """sleuthd with every encoder on Triton (the fusion by default), embedding cache off so every request
    reaches Triton."""
    backend = EncoderBackendConfig("triton", triton.url, triton_probe_interval_s=PROBE_S, triton_connect_timeout_s=30)
    config = EngineConfig(models_dir=models_dir, device="cpu", backend=backend, embedding_cache_entries=0)
    metrics = ServiceMetrics()
    engine = Engine.load(config, observer=metrics)
    running = await create_server(engine, ServerConfig(port=0, metrics_port=-1), metrics)
    yield running
    await running.stop(grace=1.0)
    await engine.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def triton_channel(triton_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{triton_server.port}") as ch:
        yield ch


async def test_fused_check_through_triton_equals_in_process(
    triton_channel: grpc.aio.Channel, stub: pb_grpc.SleuthStub, speech: Speech
) -> None:
    remote = pb_grpc.SleuthStub(triton_channel)
    info = await remote.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    providers = {e.name: e.execution_provider for e in info.encoders}
    assert providers["ge2e"].startswith("triton(127.0.0.1:") and providers["fused"] == providers["ge2e"]
    for intruder in (VOICE_F, None):
        got = await remote.CheckDialogue(dialogue(speech, "parity", intruder), timeout=120)
        want = await stub.CheckDialogue(dialogue(speech, "parity", intruder), timeout=120)  # in-process ONNX
        assert got.encoder == want.encoder == "fused"
        assert_same_verdict(got, want)
        assert list(got.speakers[0].inconsistent_turn_ids) == (["a2"] if intruder else [])
    for name in ("ge2e", "campplus", "fused"):
        assert await health(triton_channel, health_name(name)) == health_pb2.HealthCheckResponse.SERVING


async def test_deadline_reaches_triton_and_is_not_an_outage(
    triton: tritonserver.TritonProcess, models_dir: Path
) -> None:
    manifest = load_encoder_manifest(models_dir / "campplus")
    config = EncoderBackendConfig("triton", triton.url, triton_probe_interval_s=PROBE_S)
    encoder = load_triton_encoder(manifest, config, BatcherConfig())
    await encoder.start()
    try:
        windows = (0.1 * np.random.default_rng(1).standard_normal((24, manifest.window.window_samples))).astype(
            np.float32
        )
        loop = asyncio.get_running_loop()
        with pytest.raises(DeadlineExceeded):  # 24 CAM++ windows take far longer than 20 ms on this CPU
            await encoder.encode(windows, deadline=loop.time() + 0.02)
        assert encoder.health.serving  # a deadline says nothing about Triton's health
        got = await encoder.encode(windows[:3], deadline=loop.time() + 60)
        np.testing.assert_array_equal(got, OnnxEncoder(manifest, device="cpu").embed(windows[:3]))
    finally:
        await encoder.close()


async def test_triton_killed_mid_run_gives_unavailable_then_recovers(
    triton: tritonserver.TritonProcess, triton_channel: grpc.aio.Channel, stub: pb_grpc.SleuthStub, speech: Speech
) -> None:
    remote = pb_grpc.SleuthStub(triton_channel)
    want = await stub.CheckDialogue(dialogue(speech, "kill", VOICE_F), timeout=120)

    async def check(tag: str) -> pb.DialogueVerdict | grpc.aio.AioRpcError:
        try:
            return await remote.CheckDialogue(dialogue(speech, tag, VOICE_F), timeout=60)
        except grpc.aio.AioRpcError as exc:
            return exc

    wave = [asyncio.ensure_future(check(f"kill-{k}")) for k in range(6)]
    await asyncio.sleep(0.3)
    triton.kill()  # SIGKILL: an outage, mid-run
    outcomes = await asyncio.gather(*wave)
    after = await asyncio.gather(*(check(f"after-{k}") for k in range(3)))
    failed = [o for o in [*outcomes, *after] if isinstance(o, grpc.aio.AioRpcError)]
    assert len(failed) >= 3
    for exc in failed:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
        assert "is unavailable: its Triton server at" in (exc.details() or "")
    for verdict in outcomes:  # whatever finished before the kill is the true verdict, never a made-up one
        if isinstance(verdict, pb.DialogueVerdict):
            assert_same_verdict(verdict, want)
    for name in ("ge2e", "campplus", "fused"):
        assert await health(triton_channel, health_name(name)) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await health(triton_channel, "") == health_pb2.HealthCheckResponse.SERVING  # the replica itself is fine

    triton.restart()  # same port: the probe finds it
    give_up = time.monotonic() + 30
    while await health(triton_channel, health_name("fused")) != health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() < give_up, triton.log_tail()
        await asyncio.sleep(PROBE_S)
    assert_same_verdict(await remote.CheckDialogue(dialogue(speech, "back", VOICE_F), timeout=120), want)

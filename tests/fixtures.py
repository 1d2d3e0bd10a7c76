"""Shared fixtures: the real models, real synthesized speech, and a real in-process gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from sleuthd.api import SpeakerEncoder
from sleuthd.config import EngineConfig, ServerConfig
from sleuthd.engine.facade import Engine
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc
from sleuthd_bench import synth

from tests.support import (
    CLIPS_PER_VOICE,
    MODELS_DIR,
    SPEECH_CACHE,
    TEST_MAX_MESSAGE_BYTES,
    VOICE_A,
    VOICE_B,
    VOICE_C,
    VOICE_F,
    Speech,
)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    for name in ("ge2e", "campplus", "silero_vad"):
        if not (MODELS_DIR / name / "manifest.json").exists():
            pytest.fail(f"models/{name}/manifest.json is missing: run `make models` first")
    return MODELS_DIR


@pytest.fixture(scope="session")
def speech() -> Speech:
    """Real synthetic speech from espeak-ng/flite, cached under data/test-speech/."""
    texts = synth.sentences(CLIPS_PER_VOICE * 4, seed=11)
    clips: dict[str, list[Path]] = {}
    for v, name in enumerate((VOICE_A, VOICE_B, VOICE_F, VOICE_C)):
        voice = synth.get_voice(name)
        out = []
        for k in range(CLIPS_PER_VOICE):
            path = SPEECH_CACHE / name / f"{k:02d}.wav"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                synth.synthesize(voice, texts[v * CLIPS_PER_VOICE + k], path)
            out.append(path)
        clips[name] = out
    return Speech(clips)


@pytest.fixture(scope="session")
def metrics() -> ServiceMetrics:
    return ServiceMetrics()


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def engine(models_dir: Path, metrics: ServiceMetrics) -> AsyncIterator[Engine]:
    # GE2E by default, as most tests were written for it (and it is the cheapest); tests/test_fusion.py names
    # the fusion, and test_fusion.test_default_encoder_auto checks what `--encoder auto` picks.
    eng = Engine.load(EngineConfig(models_dir=models_dir, device="cpu", default_encoder="ge2e"), observer=metrics)
    yield eng
    await eng.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def speaker_encoder(models_dir: Path) -> AsyncIterator[SpeakerEncoder]:
    """GE2E through the public in-process API (sleuthd.api), as the tools use it."""
    encoder = SpeakerEncoder.load(models_dir)
    yield encoder
    await encoder.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def server(engine: Engine, metrics: ServiceMetrics) -> AsyncIterator[RunningServer]:
    config = ServerConfig(port=0, max_message_mb=TEST_MAX_MESSAGE_BYTES / 2**20, metrics_port=0)
    running = await create_server(engine, config, metrics)
    yield running
    await running.stop(grace=1.0)


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def channel(server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    limit = 4 * TEST_MAX_MESSAGE_BYTES
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{server.port}",
        options=[("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)],
    ) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.SleuthStub:
    return pb_grpc.SleuthStub(channel)

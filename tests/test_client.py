"""The client library against real servers: the README's example, audio as paths, bytes and NumPy samples,
sync and asyncio clients, deadlines, retries on UNAVAILABLE only, a bearer token, TLS, streams (turns in,
verdict updates out) and the server's description."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf
from sleuthd.client import (
    AsyncSleuthClient,
    DialogueFileError,
    ServerInfo,
    SleuthClient,
    Turn,
    TurnUpdate,
    Verdict,
    dialogue_request,
    dialogue_request_from_dict,
)
from sleuthd.rpc.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import REPO, VOICE_A, VOICE_C, VOICE_F, Speech


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: RunningServer) -> AsyncIterator[AsyncSleuthClient]:
    async with AsyncSleuthClient(f"127.0.0.1:{server.port}", timeout=60) as c:
        yield c


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"<!-- client-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its client example (marked <!-- client-example -->)"
    return match.group(1)


async def test_the_readme_client_example_runs_as_written(server: RunningServer, speech: Speech, tmp_path: Path) -> None:
    code = readme_example()
    assert len([line for line in code.splitlines() if line.strip() and not line.startswith("print")]) == 3
    # The files it names: Maya's third turn is another voice.
    for name, path in {"m1": speech.clips[VOICE_A][0], "t1": speech.clips[VOICE_C][0], "m2": speech.clips[VOICE_A][1],
                       "m3": speech.clips[VOICE_F][2]}.items():  # fmt: skip
        shutil.copy(path, tmp_path / f"{name}.wav")
    code = code.replace("127.0.0.1:50051", f"127.0.0.1:{server.port}")
    # A subprocess (the server shares this test's event loop, which a blocking client would stall).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "False ('t4',)"


def four_turns(speech: Speech) -> list[Path]:
    return [speech.clips[VOICE_A][0], speech.clips[VOICE_A][1], speech.clips[VOICE_F][2], speech.clips[VOICE_A][3]]


async def test_paths_bytes_and_numpy_samples_give_the_same_verdict(client: AsyncSleuthClient, speech: Speech) -> None:
    paths = four_turns(speech)
    by_path = await client.check([("Ann", p) for p in paths])
    assert by_path.inconsistent_turns == ("t3",)
    by_str = await client.check([("Ann", str(p)) for p in paths])
    by_bytes = await client.check([("Ann", p.read_bytes()) for p in paths])
    floats = [sf.read(p, dtype="float32") for p in paths]
    assert {rate for _, rate in floats} == {16_000}
    by_float = await client.check([("Ann", x) for x, _ in floats], sample_rate=16_000)
    by_int16 = await client.check([Turn("Ann", sf.read(p, dtype="int16")[0], sample_rate=16_000) for p in paths])
    # Two identical channels downmix to the same samples.
    by_stereo = await client.check([("Ann", np.stack([x, x], axis=1)) for x, _ in floats], sample_rate=16_000)
    for other in (by_str, by_bytes, by_float, by_int16, by_stereo):
        assert other == by_path


async def test_results_are_typed_and_sync_and_async_clients_agree(
    client: AsyncSleuthClient, server: RunningServer, speech: Speech
) -> None:
    turns = [Turn("Ann", p, turn_id=f"a{k}", text="hi") for k, p in enumerate(four_turns(speech))]
    turns.append(Turn("Bob", speech.clips[VOICE_C][0], turn_id="b0"))
    turns.append(Turn("Bob", None, turn_id="b1", text="not synthesized yet"))
    verdict = await client.check(turns, dialogue_id="typed")

    def sync_check() -> Verdict:
        with SleuthClient(f"127.0.0.1:{server.port}", timeout=60) as c:
            return c.check(turns, dialogue_id="typed")

    assert await asyncio.to_thread(sync_check) == verdict
    assert (verdict.dialogue_id, verdict.method, verdict.encoder, verdict.threshold_set) == (
        "typed", "auto", "ge2e", "default",
    )  # fmt: skip
    assert verdict.judged and not verdict.consistent and verdict.inconsistent_turns == ("a2",)
    assert [t.turn_id for t in verdict.turns] == ["a0", "a1", "a2", "a3", "b0"]  # b1 has no audio
    flagged = verdict.turn("a2")
    assert flagged.inconsistent and flagged.status == "inconsistent" and flagged.score_scale == "probability"
    assert flagged.inconsistency_probability is not None and flagged.inconsistency_probability > 0.5
    assert set(verdict.probabilities) == {"a0", "a1", "a2", "a3"} and verdict.probabilities["a2"] > 0.5
    bob = verdict.speaker("Bob")  # one turn, nothing to compare it with
    assert (bob.judged, bob.consistent, bob.unscored_turns) == (False, False, 1)
    assert verdict.turn("b0").status == "insufficient_context" and verdict.turn("b0").score is None


async def test_bad_input_is_refused_before_any_request(client: AsyncSleuthClient, speech: Speech) -> None:
    samples = np.zeros(16_000, np.float32)
    cases = [
        (ValueError, "give its sample rate", lambda: client.check([("Ann", samples)])),
        (FileNotFoundError, "audio file nope.wav does not exist", lambda: client.check([("Ann", "nope.wav")])),
        (ValueError, "transpose a (channels, frames) array",
         lambda: client.check([("Ann", np.zeros((2, 16_000), np.float32))], sample_rate=16_000)),
        (ValueError, "samples of dtype int32 are not supported",
         lambda: client.check([("Ann", np.zeros(16_000, np.int32))], sample_rate=16_000)),
        (ValueError, "both reference audio and a voice id",
         lambda: client.check([("Ann", samples)], sample_rate=16_000, references={"Ann": samples},
                              voices={"Ann": "x"})),
        (ValueError, "either reference audio or reference_voice",
         lambda: client.rank([samples, samples], reference=samples, reference_voice="v", sample_rate=16_000)),
        (TypeError, "is a int", lambda: client.check([("Ann", 7)])),
    ]  # fmt: skip
    for kind, message, call in cases:
        with pytest.raises(kind, match=re.escape(message)):
            await call()


async def test_an_unknown_method_is_a_value_error_naming_the_valid_ones(client: AsyncSleuthClient) -> None:
    """Issue 32: check(method="bogus") raised DialogueFileError, as if a file were at fault."""
    for call in (lambda: client.check([("Ann", b"x")], method="bogus"), lambda: client.rank([b"x", b"y"], method="x")):
        with pytest.raises(ValueError, match="choose from pairwise, centroid, reference, auto, lalm") as err:
            await call()
        assert not isinstance(err.value, DialogueFileError)
    with pytest.raises(ValueError, match="thresholds must be one of default, paper") as err:
        await client.check([("Ann", b"x")], thresholds="strict")
    assert not isinstance(err.value, DialogueFileError)
    # In a dialogue file it is the file's error, naming where.
    doc = {"turns": [{"speaker": "Ann"}], "options": {"method": "bogus"}}
    with pytest.raises(DialogueFileError, match=r"^d\.json: options: unknown method 'bogus'; choose from pairwise"):
        dialogue_request_from_dict(doc, Path("."), "d.json")


def test_dialogue_files_number_turns_as_the_client_library_does() -> None:
    """Issue 32: a dialogue file without turn ids was refused although the client library numbers turns."""
    doc = {"turns": [{"speaker": "Ann"}, {"speaker": "Bob", "turn_id": "b"}, {"speaker": "Ann", "turn_id": ""}]}
    from_file = dialogue_request_from_dict(doc, Path("."), "d.json")
    from_code = dialogue_request([("Ann", None), Turn("Bob", None, turn_id="b"), ("Ann", None)])
    assert [t.turn_id for t in from_file.turns] == [t.turn_id for t in from_code.turns] == ["t1", "b", "t3"]


async def test_stream_sends_turns_as_they_come_and_yields_updates_then_the_final_verdict(
    client: AsyncSleuthClient, server: RunningServer, speech: Speech
) -> None:
    whole = await client.check([("Ann", p) for p in four_turns(speech)], dialogue_id="live")
    heard = {f"t{k}": asyncio.Event() for k in range(1, 5)}

    async def turns() -> AsyncIterator[tuple[str, Path]]:
        """A pipeline that makes each turn after hearing the verdict of the one before: a stream that read
        all its turns before sending any would wait here for ever."""
        for k, path in enumerate(four_turns(speech)):
            if k:
                await asyncio.wait_for(heard[f"t{k}"].wait(), 60)
            yield ("Ann", path)

    results: list[TurnUpdate | Verdict] = []
    async for result in client.stream(turns(), dialogue_id="live"):
        results.append(result)
        if isinstance(result, TurnUpdate):
            heard[result.verdict.turn_id].set()
    *updates, final = results
    assert isinstance(final, Verdict) and final == whole  # the stream's final verdict is CheckDialogue's
    assert all(isinstance(u, TurnUpdate) for u in updates)
    firsts = [u for u in updates if isinstance(u, TurnUpdate) and not u.revision]
    assert [u.verdict.turn_id for u in firsts] == ["t1", "t2", "t3", "t4"]
    assert all(u.trigger_turn_id == u.verdict.turn_id for u in firsts)
    last = {u.verdict.turn_id: u.verdict for u in updates if isinstance(u, TurnUpdate)}  # revisions replace
    assert {t: v.status for t, v in last.items()} == {t.turn_id: t.status for t in final.turns}
    assert final.inconsistent_turns == ("t3",)

    def sync_stream() -> list[TurnUpdate | Verdict]:  # the blocking client: a plain generator in and out
        done = {f"t{k}": threading.Event() for k in range(1, 5)}

        def made() -> Iterator[tuple[str, Path]]:
            for k, path in enumerate(four_turns(speech)):
                if k:
                    assert done[f"t{k}"].wait(60)
                yield ("Ann", path)

        out = []
        with SleuthClient(f"127.0.0.1:{server.port}", timeout=60) as c:
            for r in c.stream(made(), dialogue_id="live"):
                out.append(r)
                if isinstance(r, TurnUpdate):
                    done[r.verdict.turn_id].set()
        return out

    assert await asyncio.to_thread(sync_stream) == results
    # NumPy samples go as headerless PCM and give the same verdict.
    floats = [sf.read(p, dtype="float32")[0] for p in four_turns(speech)]
    pcm = [r async for r in client.stream([("Ann", x) for x in floats], sample_rate=16_000,
                                          dialogue_id="live")]  # fmt: skip
    assert pcm[-1] == whole


async def test_server_info_is_typed(client: AsyncSleuthClient, server: RunningServer) -> None:
    info = await client.server_info()
    assert isinstance(info, ServerInfo) and info.version and info.default_encoder == "ge2e"
    ge2e = info.encoder("ge2e")
    assert ge2e.embedding_size == 256 and ge2e.execution_provider == "CPUExecutionProvider"
    assert set(ge2e.default_thresholds) == {"pairwise", "centroid", "reference"}
    assert info.encoder("fused").components == ("ge2e", "campplus")
    assert info.paper_thresholds == {"pairwise": pytest.approx(0.4), "centroid": pytest.approx(0.3),
                                     "reference": pytest.approx(0.4)}  # fmt: skip
    assert info.registry is None and info.judge is None  # this server runs neither
    with pytest.raises(KeyError, match="has no encoder 'nope'"):
        info.encoder("nope")

    def sync_info() -> ServerInfo:
        with SleuthClient(f"127.0.0.1:{server.port}") as c:
            return c.server_info()

    assert await asyncio.to_thread(sync_info) == info


async def test_a_deadline_that_passes_ends_the_call(client: AsyncSleuthClient, speech: Speech) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.check([("Ann", p) for p in four_turns(speech)], timeout=0.001)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# ---------------------------------------------------------------------------------------------- channel behaviour


class FlakyVoices(pb_grpc.SleuthServicer):
    """A server whose GetVoice fails with ``code`` a given number of times before it answers, and which
    records each attempt's metadata: what a client sees from a server that is starting or draining."""

    def __init__(self, failures: int, code: grpc.StatusCode) -> None:
        self.failures = failures
        self.code = code
        self.metadata: list[dict[str, str]] = []

    async def GetVoice(self, request: pb.GetVoiceRequest, context: grpc.aio.ServicerContext) -> pb.Voice:
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        if len(self.metadata) <= self.failures:
            await context.abort(self.code, f"attempt {len(self.metadata)} fails")
        return pb.Voice(voice_id=request.voice_id, revision=1)


async def start_flaky(
    servicer: FlakyVoices, credentials: grpc.ServerCredentials | None = None
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_SleuthServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    return server, port


async def test_unavailable_is_retried_and_nothing_else(tmp_path: Path) -> None:
    flaky = FlakyVoices(2, grpc.StatusCode.UNAVAILABLE)
    busy = FlakyVoices(1, grpc.StatusCode.RESOURCE_EXHAUSTED)
    servers = [await start_flaky(flaky), await start_flaky(busy)]
    try:
        async with AsyncSleuthClient(f"127.0.0.1:{servers[0][1]}", timeout=30) as c:
            assert (await c.get_voice("v")).voice_id == "v"
        assert len(flaky.metadata) == 3  # two UNAVAILABLE, retried, then the answer

        def sync_get() -> None:
            with SleuthClient(f"127.0.0.1:{servers[1][1]}", timeout=30) as c:
                c.get_voice("v")

        with pytest.raises(grpc.RpcError) as err:
            await asyncio.to_thread(sync_get)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        assert len(busy.metadata) == 1  # "busy" is the caller's decision, never retried by the channel
    finally:
        for server, _ in servers:
            await server.stop(None)


async def test_the_token_reaches_the_server_in_plaintext_and_over_tls(tmp_path: Path) -> None:
    plain = FlakyVoices(0, grpc.StatusCode.OK)
    server, port = await start_flaky(plain)
    try:
        async with AsyncSleuthClient(f"127.0.0.1:{port}", token="s3cret") as c:
            await c.get_voice("v")
        assert plain.metadata[0]["authorization"] == "Bearer s3cret"
    finally:
        await server.stop(None)

    if shutil.which("openssl") is None:
        pytest.skip("TLS half not tested: the openssl command is not installed")
    ca, cert, key = make_certificates(tmp_path)
    secure = FlakyVoices(0, grpc.StatusCode.OK)
    server, port = await start_flaky(secure, grpc.ssl_server_credentials([(key, cert)]))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        async with AsyncSleuthClient(f"localhost:{port}", credentials=credentials, token="t0ken", timeout=10) as c:
            assert (await c.get_voice("v")).voice_id == "v"
        assert secure.metadata[0]["authorization"] == "Bearer t0ken"
        other_ca, _, _ = make_certificates(tmp_path / "other")
        untrusted = grpc.ssl_channel_credentials(root_certificates=other_ca)
        async with AsyncSleuthClient(f"localhost:{port}", credentials=untrusted, token="t0ken", timeout=10) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.get_voice("v")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and len(secure.metadata) == 1
    finally:
        await server.stop(None)


def make_certificates(folder: Path) -> tuple[bytes, bytes, bytes]:
    """A throwaway CA and a server certificate it signed for localhost: (CA PEM, certificate PEM, key PEM)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=sleuthd test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")  # fmt: skip
    return tuple((folder / name).read_bytes() for name in ("ca.pem", "server.pem", "server.key"))  # type: ignore[return-value]

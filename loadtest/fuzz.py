"""Fuzz sleuthd over gRPC: malformed and adversarial requests on every RPC, counted by status code.

Cases are built from real speech encoded as WAV, FLAC, OGG/Vorbis, OGG/Opus and MP3, then truncated,
bit-flipped, spliced or given crafted headers; raw PCM with absurd specs and out-of-range, NaN, infinite
and denormal floats; dialogues and rankings with empty, duplicate, over-long and (within the limits)
very many fields; streams in the wrong order, with empty or 1-byte chunks. The same seed gives the same
cases. A status of INTERNAL or UNKNOWN (or UNAVAILABLE: the server is down) is a bug; every other code
is an answer. While the requests run, a probe calls gRPC health every 0.2 s with a 1 s deadline.

``tests/test_fuzz.py`` runs a few thousand cases through the in-process test server in CI. The long
run starts a ``sleuthd serve`` subprocess (or uses ``--target``) and reports the server's RSS from
/proc/<pid>/status before, at its peak (sampled every 0.1 s) and after:

    python -m loadtest.fuzz --requests 10000 --clients 64 --seed 1
    python -m loadtest.fuzz --target 127.0.0.1:50051 --requests 2000   # an existing server (no RSS)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import itertools
import logging
import random
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import soundfile as sf
import soxr
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SPEECH_CACHE = REPO / "data" / "test-speech"  # synthesized by the tests' `speech` fixture
# Codes that mean the server broke (or is gone), not that it refused the request.
BROKEN = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS", "UNIMPLEMENTED"})
MAX_SEED_SECONDS = 1.5  # seed clips are cut to this, so decodable mutants cost little to embed

Req = pb.StreamDialogueRequest


@dataclass(frozen=True)
class Case:
    """One fuzzed call: ``request`` is a request message, or the message list of a stream."""

    rpc: str  # "CheckDialogue", "RankCandidates" or "StreamDialogue"
    name: str  # what kind of case, e.g. "audio/flac/bitflip" or "stream/audio-before-open"
    request: object


@dataclass(frozen=True)
class Seeds:
    """Real speech to mutate: ``encoded[format]`` is a list of complete files, ``pcm16`` raw s16le mono 16 kHz."""

    encoded: dict[str, list[bytes]]
    pcm16: list[bytes]
    good: list[bytes]  # untouched 16 kHz WAV clips: the valid turns around a mutated one
    tiny: list[bytes]  # their first 0.3 s as WAV (about 10 KB): for fields repeated up to their limits
    bomb: bytes  # 300 s of 8-channel 48 kHz silence: about 115 KiB of FLAC, 439 MiB once decoded

    @classmethod
    def from_wavs(cls, paths: Sequence[Path]) -> Seeds:
        encoded: dict[str, list[bytes]] = collections.defaultdict(list)
        pcm16, good, tiny = [], [], []
        for path in paths:
            samples, rate = sf.read(path, dtype="float32")
            good.append(path.read_bytes())
            cut = samples[: int(MAX_SEED_SECONDS * rate)]
            at48 = soxr.resample(cut, rate, 48_000).astype(np.float32)
            for name, fmt, subtype, x, r in (
                ("wav", "WAV", "PCM_16", cut, rate),
                ("wav-float", "WAV", "FLOAT", cut, rate),
                ("flac", "FLAC", None, cut, rate),
                ("ogg", "OGG", "VORBIS", cut, rate),
                ("opus", "OGG", "OPUS", at48, 48_000),
                ("mp3", "MP3", None, at48, 48_000),
            ):
                buf = io.BytesIO()
                sf.write(buf, x, r, format=fmt, subtype=subtype)
                encoded[name].append(buf.getvalue())
            pcm16.append((np.clip(cut, -1, 1) * 32767).astype("<i2").tobytes())
            buf = io.BytesIO()
            sf.write(buf, samples[: int(0.3 * rate)], rate, format="WAV", subtype="PCM_16")
            tiny.append(buf.getvalue())
        buf = io.BytesIO()
        with sf.SoundFile(buf, "w", 48_000, 8, format="FLAC", subtype="PCM_16") as f:
            for _ in range(300):
                f.write(np.zeros((48_000, 8), np.int16))
        return cls(dict(encoded), pcm16, good, tiny, buf.getvalue())


def _flip_bits(data: bytes, rng: random.Random, n: int, lo: int = 0, hi: int | None = None) -> bytes:
    out = bytearray(data)
    hi = len(out) if hi is None else min(hi, len(out))
    for _ in range(n):
        if hi > lo:
            out[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
    return bytes(out)


def _wav_field(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


# Canonical 44-byte WAV header (soundfile writes one): channels @22 (u16), rate @24 (u32), bits @34 (u16).
_WAV_FIELDS = (
    (22, "<H", (0, 3, 9, 1000, 65535)),
    (24, "<I", (0, 1, 7999, 48001, 10**9, 2**32 - 1)),
    (34, "<H", (0, 1, 7, 64, 65535)),
    (4, "<I", (0, 36, 2**31, 2**32 - 1)),
    (40, "<I", (0, 1, 2**31, 2**32 - 1)),
)


def _flac_streaminfo(data: bytes, rng: random.Random) -> bytes:
    """Rewrite the rate (20 bits), channels-1 (3), bits-1 (5) or total samples (36) of FLAC's STREAMINFO."""
    out = bytearray(data)
    word = int.from_bytes(out[18:26], "big")
    shift, width = rng.choice(((44, 20), (41, 3), (36, 5), (0, 36)))
    value = rng.choice((0, 1, (1 << width) - 1, rng.getrandbits(width)))
    word = (word & ~(((1 << width) - 1) << shift)) | (value << shift)
    out[18:26] = word.to_bytes(8, "big")
    return bytes(out)


class CaseFactory:
    """Seeded stream of fuzz cases over all three scoring RPCs."""

    def __init__(self, seeds: Seeds, seed: int) -> None:
        self.seeds = seeds
        self.rng = random.Random(seed)
        self._serial = 0
        kinds: list[tuple[float, Callable[[], Case]]] = [
            (0.30, self._audio_case),
            (0.12, self._pcm_case),
            (0.13, self._dialogue_case),
            (0.15, self._rank_case),
            (0.30, self._stream_case),
        ]
        self._weights = [w for w, _ in kinds]
        self._makers = [m for _, m in kinds]

    def cases(self, n: int) -> Iterator[Case]:
        for _ in range(n):
            yield self.rng.choices(self._makers, self._weights)[0]()

    # ---------------------------------------------------------------- audio

    def _id(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}{self._serial}"

    def mutant(self) -> tuple[str, bytes]:
        """A damaged or crafted encoded file: (kind, bytes)."""
        rng = self.rng
        fmt = rng.choice(sorted(self.seeds.encoded))
        data = rng.choice(self.seeds.encoded[fmt])
        how = rng.choice(
            ("truncate", "bitflip", "header-bitflip", "zero-run", "insert", "delete", "splice", "magic-garbage",
             "garbage", "concat", "field", "bomb")
        )  # fmt: skip
        if how == "bomb":
            fmt, data = "flac", _flip_bits(self.seeds.bomb, rng, rng.choice((0, 0, 1, 8)), 64)
        elif how == "truncate":
            data = data[: rng.randrange(len(data))]
        elif how == "bitflip":
            data = _flip_bits(data, rng, rng.choice((1, 4, 32, 256)))
        elif how == "header-bitflip":
            data = _flip_bits(data, rng, rng.randint(1, 8), 0, 128)
        elif how == "zero-run":
            a = rng.randrange(len(data))
            data = data[:a] + bytes(rng.randint(1, 4096)) + data[a + rng.randint(1, 4096) :]
        elif how == "insert":
            a = rng.randrange(len(data))
            data = data[:a] + rng.randbytes(rng.randint(1, 512)) + data[a:]
        elif how == "delete":
            a = rng.randrange(len(data))
            data = data[:a] + data[a + rng.randint(1, 2048) :]
        elif how == "splice":
            other = rng.choice(self.seeds.encoded[rng.choice(sorted(self.seeds.encoded))])
            data = data[: rng.randrange(len(data))] + other[rng.randrange(len(other)) :]
        elif how == "magic-garbage":
            data = data[: rng.randint(4, 64)] + rng.randbytes(rng.randint(0, 8192))
        elif how == "garbage":
            data = rng.randbytes(rng.randint(0, 8192))
        elif how == "concat":
            data = data * rng.randint(2, 3)
        elif fmt.startswith("wav"):
            offset, code, values = rng.choice(_WAV_FIELDS)
            data = _wav_field(data, offset, code, rng.choice(values))
        elif fmt == "flac":
            data = _flac_streaminfo(data, rng)
        else:
            data = _flip_bits(data, rng, 2, 0, 64)
        return f"{fmt}/{how}", data

    def pcm(self) -> tuple[str, pb.PcmAudio]:
        rng = self.rng
        base = np.frombuffer(rng.choice(self.seeds.pcm16), "<i2").astype(np.float32) / 32768
        how = rng.choice(("s16", "f32", "int16-as-f32", "huge", "denormal", "nan", "inf", "random-bits", "odd-length",
                          "empty"))  # fmt: skip
        encoding = pb.PCM_F32LE
        if how == "s16":
            data, encoding = (base * 32767).astype("<i2").tobytes(), pb.PCM_S16LE
        elif how == "f32":
            data = base.astype("<f4").tobytes()
        elif how == "int16-as-f32":
            data = (base * 32768).astype("<f4").tobytes()
        elif how == "huge":
            data = (base * np.float32(3e38)).astype("<f4").tobytes()
        elif how == "denormal":
            data = (base * np.float32(1e-40)).astype("<f4").tobytes()
        elif how in ("nan", "inf"):
            x = base.copy()
            x[rng.randrange(len(x)) :: rng.randint(50, 5000)] = np.nan if how == "nan" else -np.inf
            data = x.astype("<f4").tobytes()
        elif how == "random-bits":
            data = rng.randbytes(4 * rng.randint(1, 20_000))
        elif how == "odd-length":
            data = base.astype("<f4").tobytes()[: rng.randint(1, 4000) * 4 + rng.randint(1, 3)]
        else:
            data = b""
        rate = rng.choice((16_000, 16_000, 44_100, 0, 1, 7_999, 48_001, 10**9, 2**32 - 1))
        channels = rng.choice((1, 1, 2, 8, 0, 9, 1000, 2**32 - 1))
        if rng.random() < 0.1:
            encoding = rng.choice((0, 3, 99, 2**31 - 1))
        spec = pb.PcmAudio(data=data, encoding=encoding, sample_rate_hz=rate, channels=channels)  # type: ignore[arg-type]
        return f"pcm/{how}/rate={rate}/ch={channels}", spec

    def any_audio(self) -> tuple[str, pb.Audio]:
        r = self.rng.random()
        if r < 0.6:
            kind, data = self.mutant()
            return kind, pb.Audio(encoded=data)
        if r < 0.95:
            kind, spec = self.pcm()
            return kind, pb.Audio(pcm=spec)
        return "audio/unset", pb.Audio()

    def _good(self) -> pb.Audio:
        return pb.Audio(encoded=self.rng.choice(self.seeds.good))

    def _seed_wav(self) -> pb.Audio:
        """A valid 1.5 s WAV (about 48 KB)."""
        return pb.Audio(encoded=self.rng.choice(self.seeds.encoded["wav"]))

    def _short(self) -> pb.Audio:
        """A valid 0.3 s WAV: for fields repeated up to their limit, so requests stay within the size limit."""
        return pb.Audio(encoded=self.rng.choice(self.seeds.tiny))

    def _audio_case(self) -> Case:
        kind, bad = self.mutant()
        return self._with_bad_turn(f"audio/{kind}", pb.Audio(encoded=bad))

    def _pcm_case(self) -> Case:
        kind, spec = self.pcm()
        return self._with_bad_turn(kind, pb.Audio(pcm=spec))

    def _with_bad_turn(self, name: str, bad: pb.Audio) -> Case:
        req = pb.CheckDialogueRequest(dialogue_id=self._id("d"))
        req.turns.add(turn_id="g1", speaker="A", audio=self._good())
        req.turns.add(turn_id="g2", speaker="A", audio=self._good())
        req.turns.add(turn_id="bad", speaker=self.rng.choice("AB"), audio=bad)
        return Case("CheckDialogue", name, req)

    # ---------------------------------------------------------------- request structure

    def _options(self) -> pb.CheckOptions:
        rng = self.rng
        o = pb.CheckOptions()
        if rng.random() < 0.5:
            o.method = rng.choice((0, 1, 2, 3, 4, 5, 99, -1))  # type: ignore[assignment]
        if rng.random() < 0.3:
            o.threshold_set = rng.choice((0, 1, 2, 7))  # type: ignore[assignment]
        if rng.random() < 0.3:
            o.threshold = rng.choice((0.5, -1.0, 2.5, float("nan"), float("inf"), -1e308, 1e-320))
        if rng.random() < 0.2:
            o.encoder = rng.choice(("ge2e", "", "wavlm", "x" * 10_000, "ge2e\x00", "\u202e2eg"))
        o.detect_drift = rng.random() < 0.1
        return o

    def _label(self) -> str:
        return self.rng.choice(("A", "B", "", " ", "x" * 128, "y" * 129, "z" * 20_000, "\u00e9\u202e\U0001f600", "A"))

    def _dialogue_case(self) -> Case:
        rng = self.rng
        req = pb.CheckDialogueRequest(dialogue_id=rng.choice(("", "d", "q" * 5000)))
        shape = rng.choice(("empty", "many-text-turns", "labels", "duplicates", "references", "options"))
        if shape == "many-text-turns":  # up to the 1000-turn limit, and one over it
            for k in range(rng.choice((999, 1000, 1001))):
                req.turns.add(turn_id=f"t{k}", speaker="AB"[k % 2], text="hi")
            req.turns[rng.randrange(len(req.turns))].audio.CopyFrom(self._good())
        elif shape == "labels":
            for _ in range(rng.randint(1, 4)):
                req.turns.add(turn_id=self._label(), speaker=self._label(), audio=self._good())
        elif shape == "duplicates":
            for _ in range(3):
                req.turns.add(turn_id="same", speaker="A", audio=self._good())
        elif shape == "references":
            for k in range(3):
                req.turns.add(turn_id=f"t{k}", speaker="A", audio=self._good())
            for _ in range(rng.randint(1, 6)):
                audio = self._good() if rng.random() < 0.5 else self.any_audio()[1]
                req.references.add(speaker=rng.choice(("A", "A", "B", "", "Zed")), audio=audio)
        elif shape == "options":
            for k in range(3):
                req.turns.add(turn_id=f"t{k}", speaker="A", audio=self._good())
        if rng.random() < 0.5 or shape == "options":
            req.options.CopyFrom(self._options())
        return Case("CheckDialogue", f"dialogue/{shape}", req)

    def _rank_case(self) -> Case:
        rng = self.rng
        req = pb.RankCandidatesRequest(speaker=self._label())
        shape = rng.choice(("counts", "bad-candidate", "bad-context", "reference", "duplicates"))
        n_ctx = rng.choice((0, 1, 3, 256, 257)) if shape == "counts" else 2
        n_cand = rng.choice((0, 1, 2, 64, 65)) if shape == "counts" else 3
        for k in range(n_ctx):  # a few usable clips, then short unusable ones up to the limit
            audio = self._seed_wav() if k < 3 else self._short()
            req.context.append(audio if rng.random() < 0.95 else pb.Audio())
        for k in range(n_cand):
            req.candidates.add(candidate_id="c" if shape == "duplicates" else f"c{k}", audio=self._seed_wav())
        if shape == "bad-candidate":
            req.candidates.add(candidate_id="bad", audio=self.any_audio()[1])
        elif shape == "bad-context":
            req.context.append(self.any_audio()[1])
        elif shape == "reference":
            req.reference.CopyFrom(self.any_audio()[1] if rng.random() < 0.5 else self._good())
        if rng.random() < 0.5:
            req.options.CopyFrom(self._options())
        return Case("RankCandidates", f"rank/{shape}", req)

    # ---------------------------------------------------------------- streams

    def _stream_case(self) -> Case:
        rng = self.rng
        opened = Req(open=pb.StreamOpen(dialogue_id=self._id("s"), options=pb.CheckOptions(method=pb.METHOD_PAIRWISE)))

        def start(tid: str, index: int, pcm: pb.PcmFormat | None = None) -> pb.StreamDialogueRequest:
            ts = pb.TurnStart(turn_id=tid, speaker="A", index=index)
            if pcm is not None:
                ts.pcm.CopyFrom(pcm)
            return Req(turn_start=ts)

        def chunks(tid: str, data: bytes, n: int, final: bool = True) -> list[pb.StreamDialogueRequest]:
            cuts = sorted({0, len(data), *(rng.randrange(len(data) + 1) for _ in range(n - 1))})
            out = [Req(audio=pb.TurnAudio(turn_id=tid, data=data[a:b])) for a, b in itertools.pairwise(cuts)]
            if not out:
                out = [Req(audio=pb.TurnAudio(turn_id=tid))]
            out[-1].audio.final = final
            return out

        good = rng.choice(self.seeds.good)
        shape = rng.choice(
            ("audio-before-open", "start-before-open", "two-opens", "unknown-turn", "after-final", "left-open",
             "index-order", "nothing-complete", "empty-message", "bad-pcm-format", "mutant-chunks", "tiny-chunks",
             "empty-chunks", "good", "bad-reference")
        )  # fmt: skip
        msgs: list[pb.StreamDialogueRequest]
        if shape == "audio-before-open":
            msgs = [*chunks("t", good, 2), opened]
        elif shape == "start-before-open":
            msgs = [start("t", 0), opened]
        elif shape == "two-opens":
            msgs = [opened, opened]
        elif shape == "unknown-turn":
            msgs = [opened, *chunks("nobody", good, 1)]
        elif shape == "after-final":
            msgs = [opened, start("t", 0), *chunks("t", good, 2), *chunks("t", good, 1)]
        elif shape == "left-open":
            msgs = [opened, start("t", 0), *chunks("t", good, 2, final=False)]
        elif shape == "index-order":
            msgs = [opened, start("a", 5), start("b", 5 - rng.randint(0, 5))]
        elif shape == "nothing-complete":
            msgs = [opened]
        elif shape == "empty-message":
            msgs = [opened, Req()]
        elif shape == "bad-pcm-format":
            _, spec = self.pcm()
            fmt = pb.PcmFormat(encoding=spec.encoding, sample_rate_hz=spec.sample_rate_hz, channels=spec.channels)
            msgs = [opened, start("p", 0, fmt), *chunks("p", spec.data, rng.randint(1, 4))]
        elif shape == "mutant-chunks":
            _, data = self.mutant()
            msgs = [opened, start("m", 0), *chunks("m", data, rng.randint(1, 8))]
        elif shape == "tiny-chunks":  # 1-byte chunks, bounded in count
            data = good[: rng.randint(1, 300)]
            ones = [Req(audio=pb.TurnAudio(turn_id="t", data=data[i : i + 1])) for i in range(len(data))]
            msgs = [opened, start("t", 0), *ones, Req(audio=pb.TurnAudio(turn_id="t", final=True))]
        elif shape == "empty-chunks":
            msgs = [opened, start("t", 0), *[Req(audio=pb.TurnAudio(turn_id="t")) for _ in range(rng.randint(1, 500))]]
        elif shape == "good":
            msgs = [opened]
            for k in range(rng.randint(1, 3)):
                msgs += [start(f"t{k}", k), *chunks(f"t{k}", rng.choice(self.seeds.good), rng.randint(1, 4))]
        else:
            o = Req()
            o.open.CopyFrom(opened.open)
            o.open.references.add(speaker=rng.choice(("A", "", "Zed")), audio=self.any_audio()[1])
            msgs = [o, start("t", 0), *chunks("t", good, 2)]
        return Case("StreamDialogue", f"stream/{shape}", msgs)


# -------------------------------------------------------------------- running cases


async def call(stub: pb_grpc.SleuthStub, case: Case, timeout: float, streams: _SyncStreams | None = None) -> str:
    """Run one case; the status code's name ("OK" when it succeeded). Streams go through ``streams``
    (the sync API) when given, see :class:`_SyncStreams`."""
    try:
        if case.rpc == "StreamDialogue":
            messages: list[pb.StreamDialogueRequest] = list(case.request)  # type: ignore[call-overload]
            if streams is not None:
                return await streams.call(messages, timeout)
            async for _ in stub.StreamDialogue(iter(messages), timeout=timeout):
                pass
        else:
            await getattr(stub, case.rpc)(case.request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return str(err.code().name)
    return "OK"


class _SyncStreams:
    """StreamDialogue calls through the sync API on worker threads. The asyncio client reports
    INTERNAL ("Internal error from Core") instead of the server's status when it is still writing as
    the server ends the stream (grpc/grpc#36066, open), which fuzzed streams do all the time; the sync
    client reports what the server sent."""

    def __init__(self, target: str, threads: int, options: Sequence[tuple[str, int]]) -> None:
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.SleuthStub(self._channel)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fuzz-stream")

    def _run(self, messages: list[pb.StreamDialogueRequest], timeout: float) -> str:
        try:
            for _ in self._stub.StreamDialogue(iter(messages), timeout=timeout):
                pass
        except grpc.RpcError as err:
            return str(err.code().name)  # type: ignore[attr-defined]
        return "OK"

    async def call(self, messages: list[pb.StreamDialogueRequest], timeout: float) -> str:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, messages, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._channel.close()


@dataclass
class HealthProbe:
    """Calls gRPC health every ``interval`` seconds with a ``deadline``; records every miss (an error,
    not SERVING, or an answer slower than the deadline)."""

    channel: grpc.aio.Channel
    interval: float = 0.2
    deadline: float = 1.0
    checks: int = 0
    misses: list[str] = field(default_factory=list)
    slowest: float = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        while not stop.is_set():
            started = time.perf_counter()
            miss = ""
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=self.deadline)
                if resp.status != health_pb2.HealthCheckResponse.SERVING:
                    miss = f"health status {resp.status}"
            except grpc.aio.AioRpcError as err:
                miss = f"health {err.code().name}"
            took = time.perf_counter() - started
            # The deadline timer runs on the caller's event loop; with an in-process server a blocked
            # loop delays both, so an answer can count as "in time" long after the deadline.
            if miss or took > self.deadline:
                self.misses.append(f"{miss or 'health answered'} after {took:.2f} s")
            self.checks += 1
            self.slowest = max(self.slowest, took)
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except TimeoutError:
                pass


@dataclass
class FuzzResult:
    counts: collections.Counter[str]  # status code -> requests
    broken: list[tuple[str, str]]  # (case name, code) for every BROKEN answer
    by_case: dict[str, collections.Counter[str]]  # case kind (name up to the second '/') -> codes
    health_checks: int
    health_misses: list[str]
    health_slowest_s: float
    seconds: float
    peak_rss_mib: float  # highest reading of the ``rss`` callback (sampled every 0.1 s); NaN without one
    slowest: list[tuple[float, str, str]]  # the 10 longest calls: (seconds, case name, code)


CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
)


async def _peak(read: Callable[[], float], stop: asyncio.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], read())
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except TimeoutError:
            pass


async def run_cases(
    channel: grpc.aio.Channel,
    target: str,
    cases: Iterable[Case],
    clients: int,
    timeout: float = 60.0,
    rss: Callable[[], float] | None = None,
) -> FuzzResult:
    """Send ``cases`` to the server at ``target`` (``channel`` is connected to it) with ``clients``
    calls in flight at once, probing health throughout and sampling the server's memory with ``rss``
    (MiB). Pass a generator (:meth:`CaseFactory.cases`): cases are built as they are sent, so the
    client holds only the requests in flight."""
    stub = pb_grpc.SleuthStub(channel)
    streams = _SyncStreams(target, clients, CHANNEL_OPTIONS)
    counts: collections.Counter[str] = collections.Counter()
    by_case: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    broken: list[tuple[str, str]] = []
    queue = iter(cases)

    slowest: list[tuple[float, str, str]] = []

    async def client() -> None:
        for case in queue:
            t0 = time.perf_counter()
            code = await call(stub, case, timeout, streams)
            slowest.append((time.perf_counter() - t0, case.name, code))
            if len(slowest) > 100:
                slowest.sort(reverse=True)
                del slowest[10:]
            counts[code] += 1
            by_case["/".join(case.name.split("/")[:2])][code] += 1
            if code in BROKEN:
                broken.append((case.name, code))

    probe = HealthProbe(channel)
    stop = asyncio.Event()
    peak = [float("nan")]
    started = time.perf_counter()
    watchers = [asyncio.create_task(probe.run(stop))]
    if rss is not None:
        peak[0] = rss()
        watchers.append(asyncio.create_task(_peak(rss, stop, peak)))
    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        stop.set()
        await asyncio.gather(*watchers)
        streams.close()
    seconds = time.perf_counter() - started
    slowest.sort(reverse=True)
    return FuzzResult(
        counts, broken, dict(by_case), probe.checks, probe.misses, probe.slowest, seconds, peak[0], slowest[:10]
    )


# -------------------------------------------------------------------- the long run


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_server(models_dir: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`sleuthd serve` on a free loopback port (``extra``: more serve flags); (process, target)."""
    cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", "serve", "--host", "127.0.0.1",
           "--port", "0", "--metrics-port", "-1", "--models-dir", str(models_dir), *extra]  # fmt: skip
    # stderr goes to a file, never an undrained pipe: libmpg123 writes a line per corrupt MP3 frame.
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 180)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("sleuthd listening on "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}; see {log}")
    # Whatever else it prints on stdout is read and dropped, so no pipe of the server ever fills up.
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    return proc, line.split()[-1]


async def _long_run(args: argparse.Namespace) -> int:
    wavs = sorted(SPEECH_CACHE.glob("*/0[0-4].wav"))
    if not wavs:
        raise SystemExit(f"no speech under {SPEECH_CACHE}: run `pytest tests/test_fuzz.py` once to synthesize it")
    cases = CaseFactory(Seeds.from_wavs(wavs), args.seed).cases(args.requests)
    proc = None
    target = args.target
    if not target:
        proc, target = start_server(args.models_dir, args.server_log)
    try:
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            pid = proc.pid if proc else 0
            before = rss_mib(pid) if proc else float("nan")
            read = (lambda: rss_mib(pid)) if proc else None
            result = await run_cases(channel, target, cases, args.clients, args.timeout, read)
            await asyncio.sleep(2.0)  # let cancelled work drain before the "after" reading
            after = rss_mib(proc.pid) if proc else float("nan")
            ok_after = await call(pb_grpc.SleuthStub(channel), _valid_case(wavs), args.timeout)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
    print(f"{args.requests} requests, {args.clients} clients, seed {args.seed}: {result.seconds:.1f} s")
    print("status counts: " + ", ".join(f"{k} {v}" for k, v in result.counts.most_common()))
    for kind, codes in sorted(result.by_case.items()):
        print(f"  {kind:32s} " + ", ".join(f"{k} {v}" for k, v in codes.most_common()))
    print(f"health: {result.health_checks} checks, {len(result.health_misses)} missed the 1 s deadline, "
          f"slowest {result.health_slowest_s:.3f} s")  # fmt: skip
    if proc:
        print(f"server RSS MiB: before {before:.0f}, peak {result.peak_rss_mib:.0f}, after {after:.0f}")
    print("slowest calls: " + ", ".join(f"{name} {code} {t:.1f} s" for t, name, code in result.slowest[:5]))
    print(f"valid request afterwards: {ok_after}")
    for name, code in result.broken[:20]:
        print(f"BROKEN {code}: {name}")
    return 1 if result.broken or result.health_misses or ok_after != "OK" else 0


def _valid_case(wavs: Sequence[Path]) -> Case:
    voice = sorted(wavs)[0].parent
    req = pb.CheckDialogueRequest(dialogue_id="after")
    for k, path in enumerate(sorted(voice.glob("0[0-2].wav"))):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=pb.Audio(encoded=path.read_bytes()))
    return Case("CheckDialogue", "valid", req)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000, help="fuzzed requests to send (default 10000)")
    parser.add_argument("--clients", type=int, default=64, help="calls in flight at once (default 64)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline of each call, seconds")
    parser.add_argument("--target", default="", help="HOST:PORT of a running server; default: start one")
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--server-log", type=Path, default=REPO / "data" / "fuzz-server.log", help="server stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(_long_run(args))


if __name__ == "__main__":
    sys.exit(main())

"""What length matching costs a long stream, at its worst: two speakers (espeak-ng m3 and f2) alternating over N
turns, every 25th turn of each a 1.2-1.4 s cut of the *other* voice (short intruders: flagged, so each is judged again
against cuts of its speaker's other clips at every later turn, never cleared, and every later turn of the speaker is
cut once per such intruder), clips cached as a TTS regeneration loop sends them; the verdict time of the last 20
turns, --length-match-ratio 0 against 0.5, two rounds.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/length/stream_cost.py [N]
"""
import asyncio
import io
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, ".")
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd.domain import AudioInput, CheckOptions  # noqa: E402
from sleuthd.engine.facade import Engine  # noqa: E402
from sleuthd.judgment.dialogue import TurnAudio  # noqa: E402
from sleuthd.ops.metrics import ServiceMetrics  # noqa: E402
from tests.support import SPEECH_CACHE, VOICE_A, VOICE_F  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300


def cut(data: bytes, seconds: float) -> bytes:
    x, rate = sf.read(io.BytesIO(data), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, x[int(0.3 * rate) : int((0.3 + seconds) * rate)], rate, format="WAV")
    return buf.getvalue()


raw = {v: [(SPEECH_CACHE / v / f"{k:02d}.wav").read_bytes() for k in range(7)] for v in (VOICE_A, VOICE_F)}
clips = {v: [AudioInput(b) for b in raw[v]] for v in raw}
shorts = {v: [AudioInput(cut(b, s)) for b in raw[v] for s in (1.2, 1.4)] for v in raw}


async def run(ratio: float) -> tuple[float, int, int]:
    config = EngineConfig(models_dir=Path("models"), device="cpu", default_encoder="fused", length_match_ratio=ratio)
    eng = Engine.load(config, observer=ServiceMetrics())
    opts = eng.resolve(CheckOptions(encoder="fused"))
    d = await eng.open_dialogue("d", {}, opts, None, stream=True)
    times = []
    for k in range(N):
        v = (VOICE_A, VOICE_F)[k % 2]
        other = VOICE_F if v == VOICE_A else VOICE_A
        audio = shorts[other][(k // 50) % len(shorts[other])] if k % 50 in (6, 7) else clips[v][k % 7]
        t0 = time.perf_counter()
        await d.finish_turn(TurnAudio(f"t{k}", "AF"[k % 2], k, audio), None)
        times.append(time.perf_counter() - t0)
    final = await d.result()
    flagged = sum(t.status.name == "INCONSISTENT" for t in final.turns)
    matched = sum("length matched" in t.detail for t in final.turns)
    d.close()
    await eng.aclose()
    return float(np.median(times[-20:]) * 1e3), flagged, matched


async def main() -> None:
    for rnd in range(2):
        for ratio in (0.0, 0.5):
            ms, flagged, matched = await run(ratio)
            print(f"round {rnd} length_match_ratio {ratio}: median of the last 20 turns at turn {N}: {ms:.1f} ms; "
                  f"{flagged} turns flagged at the end, {matched} cleared by length matching", flush=True)


asyncio.run(main())

import asyncio, time, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, ".")
from sleuthd.config import EngineConfig
from sleuthd.engine.facade import Engine
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.domain import AudioInput, CheckOptions
from sleuthd.judgment.dialogue import TurnAudio
from tests.support import VOICE_A, VOICE_F, SPEECH_CACHE

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
clips = {v: [AudioInput((SPEECH_CACHE / v / f"{k:02d}.wav").read_bytes()) for k in range(7)] for v in (VOICE_A, VOICE_F)}
async def run(octaves):
    eng = Engine.load(EngineConfig(models_dir=Path("models"), device="cpu", default_encoder="fused", pitch_match_octaves=octaves), observer=ServiceMetrics())
    opts = eng.resolve(CheckOptions(encoder="fused"))
    d = await eng.open_dialogue("d", {}, opts, None, stream=True)
    times = []
    for k in range(N):
        v = (VOICE_A, VOICE_F)[k % 2]
        # a turn of the other voice now and then, so a speaker has a flagged turn (pitch matching looks at it)
        if k % 50 == 7:
            v = VOICE_F if v == VOICE_A else VOICE_A
        t0 = time.perf_counter()
        await d.finish_turn(TurnAudio(f"t{k}", "AF"[k % 2], k, clips[v][k % 7]), None)
        times.append(time.perf_counter() - t0)
    d.close()
    await eng.aclose()
    return np.median(times[-20:]) * 1e3
async def main():
    for rnd in range(2):
        for o in (0.0, 0.15):
            print(f"round {rnd} pitch_match_octaves {o}: median of last 20 turns at turn {N}: {await run(o):.1f} ms", flush=True)
asyncio.run(main())

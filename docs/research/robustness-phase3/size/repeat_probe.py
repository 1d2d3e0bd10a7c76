"""A long dialogue of repeated short lines (espeak-ng m3's 7 test sentences cut to 1.2-1.6 s, repeated) with one 1.2 s
cut of f2 at turn 3, no reference: the served probability of the f2 turn as the dialogue grows, and with today's
auto's log_turns held at 10 turns."""
import io, sys
import numpy as np
import soundfile as sf
sys.path.insert(0, ".")
import sleuthd.judgment.calibration as C
from sleuthd.api import Judge
from sleuthd.config import EngineConfig
from tests.support import SPEECH_CACHE, VOICE_A, VOICE_F

def cut(data, seconds, start=0.3):
    x, rate = sf.read(io.BytesIO(data), dtype="float32")
    buf = io.BytesIO(); sf.write(buf, x[int(start * rate): int((start + seconds) * rate)], rate, format="WAV")
    return buf.getvalue()

raw = {v: [(SPEECH_CACHE / v / f"{k:02d}.wav").read_bytes() for k in range(7)] for v in (VOICE_A, VOICE_F)}
own = [cut(raw[VOICE_A][k % 7], 1.2 + 0.1 * ((k // 7) % 5)) for k in range(120)]
intruder = cut(raw[VOICE_F][2], 1.2)
orig = C.own_evidence
def capped(*a, **k):
    o = orig(*a, **k)
    if "log_turns" in o.columns:
        o.columns["log_turns"] = np.minimum(o.columns["log_turns"], np.log(10))
    return o
with Judge.from_config(EngineConfig(default_encoder="fused")) as judge:
    for cap in (False, True):
        C.own_evidence = capped if cap else orig
        for n in (5, 10, 30, 50, 75, 100):
            turns = list(own[:n]); turns[3] = intruder
            v = judge.check([("A", a) for a in turns])
            t = v.turns[3]
            others = [x for k, x in enumerate(v.turns) if k != 3 and x.status == "inconsistent"]
            print(f"cap={cap} n={n:3d}: f2 turn {t.status} p={t.score:.3f} ({t.detail[:90]}); own turns flagged {len(others)}", flush=True)

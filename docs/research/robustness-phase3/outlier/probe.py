import io, sys
import soundfile as sf
from sleuthd.api import Judge
from sleuthd.config import EngineConfig
def wav(v,k): return open(f"data/test-speech/{v}/{k:02d}.wav","rb").read()
def cut(b, secs, start):
    x, r = sf.read(io.BytesIO(b), dtype="float32")
    buf = io.BytesIO(); sf.write(buf, x[int(start*r): int((start+secs)*r)], r, format="WAV"); return buf.getvalue()
segs = [(k, st) for st in (0.3, 1.8, 3.3) for k in range(7)]
for target, intr in (("espeak-m3", "espeak-f2"), ("espeak-m7", "espeak-f2"), ("espeak-f2", "espeak-m3"), ("espeak-f2", "espeak-m7")):
    for margin in (0.0, 0.2):
        with Judge.from_config(EngineConfig(default_encoder="fused", outlier_margin=margin)) as judge:
            turns = [("A", cut(wav(target, k), 1.2 + 0.1 * (n % 5), st)) for n, (k, st) in enumerate(segs)]
            turns[3] = ("A", cut(wav(intr, 0), 1.2, 0.3))
            out = judge.check(turns)
            t = out.turns[3]
            fl = [x.turn_id for x in out.turns if x.status == "inconsistent"]
            print(target, intr, margin, t.status, t.reason, round(t.score or 0, 3), fl, t.detail[:100], flush=True)

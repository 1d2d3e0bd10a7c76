"""CPU seconds per WORLD prosody copy of a 3 s clip (one core, OMP_NUM_THREADS=1): analysis (harvest or dio+stonemask,
cheaptrick, d4c), synthesis at a +0.5 octave F0 scale, and embedding the copy with ge2e and campplus through
sleuthd.api.SpeakerEncoder. 12 clips of eval-b-espeak-expressive, cropped to their first 3.0 s."""
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/prosody")
import world  # noqa: E402
from sleuthd.api import SpeakerEncoder  # noqa: E402
from sleuthd.domain import AudioInput  # noqa: E402

root = Path("data/robustness")
lines = [json.loads(l) for l in open(root / "eval-b-espeak-expressive.jsonl")][:3]
paths = [root / p for d in lines for p in d["target_turns"]][:12]
xs = [world.decode(p)[: 3 * world.SR] for p in paths]
print("clip seconds", [round(len(x) / world.SR, 2) for x in xs])
encs = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ("ge2e", "campplus")}
for e in encs.values():
    e.embed_sync([AudioInput(world.wav_bytes(xs[0] / (np.max(np.abs(xs[0])) or 1) * 0.5))])
for method in ("harvest", "dio"):
    t = dict(analysis=0.0, synth=0.0, ge2e=0.0, campplus=0.0)
    for x in xs:
        t0 = time.process_time()
        f0, sp, ap = world.analyse(x, method)
        t["analysis"] += time.process_time() - t0
        t0 = time.process_time()
        y = world.synth(f0, sp, ap, 0.5, float(np.max(np.abs(x))))
        b = AudioInput(world.wav_bytes(y))
        t["synth"] += time.process_time() - t0
        for e, enc in encs.items():
            t0 = time.process_time()
            enc.embed_sync([b])
            t[e] += time.process_time() - t0
    t = {k: v / len(xs) for k, v in t.items()}
    print(f"{method}: per 3 s copy, CPU s: analysis {t['analysis']:.3f}, synthesis {t['synth']:.3f}, "
          f"embed ge2e {t['ge2e']:.3f} + campplus {t['campplus']:.3f}; total {sum(t.values()):.3f}")
for e in encs.values():
    e.close()

import sys, io
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd.audio.noise import snr_db
from sleuthd.audio.decode import decode_encoded
from pathlib import Path
import json
root = common.ROOT
for cond in ("c-long-short", "c-short", "ctrl-espeak"):
    paths = set()
    for l in open(root / f"eval-{cond}.jsonl"):
        d = json.loads(l); paths.update(d["target_turns"])
    paths = sorted(paths)[:300]
    v = []
    for p in paths:
        a = decode_encoded((root / p).read_bytes(), max_seconds=60.0)
        s = snr_db(a.samples)
        v.append(np.nan if s is None else s)
    v = np.array(v)
    print(f"{cond}: {len(v)} clean turn clips: SNR estimate median {np.nanmedian(v):.1f} dB, under 17 dB {np.mean(v < 17)*100:.0f} %, 5th pct {np.nanpercentile(v, 5):.1f}")

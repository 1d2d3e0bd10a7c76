"""Narrowband (0-3.6 kHz: sleuthd.audio.bandwidth.low_pass, the zero-phase 8th-order Butterworth at 16 kHz) copies of the clips of
some eval conditions, as 16 kHz WAV, then embedded by both encoders into runs/nbnp/emb/ (the first screen used SciPy sosfiltfilt into runs/nb/: the same response)."""
import json, sys
from pathlib import Path
import numpy as np, soundfile as sf
from sleuthd.audio.bandwidth import low_pass
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd_bench.robustness import embed
root = Path("data/robustness"); out = Path("runs/nbnp")
conds = sys.argv[1].split(",")
split = sys.argv[2] if len(sys.argv) > 2 else "eval"
paths = embed.manifest_paths([root / f"{split}-{c}.jsonl" for c in conds])

for p in paths:
    dst = out / (p + ".wav")
    if dst.exists():
        continue
    x = np.asarray(to_model_rate(decode_encoded((root / p).read_bytes(), 600.0)).samples, np.float64)
    y = low_pass(x)
    dst.parent.mkdir(parents=True, exist_ok=True)
    sf.write(dst, y.astype(np.float32), 16000, subtype="FLOAT")
print("written", len(paths))
embed.embed_all(out, [p + ".wav" for p in paths], progress=lambda n, d, t: print(n, d, t, flush=True) if d % 320 == 0 or d == t else None)

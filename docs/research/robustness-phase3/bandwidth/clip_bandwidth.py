"""Effective bandwidth of every clip of the robustness matrix (sleuthd.audio.bandwidth.effective_bandwidth_hz,
at the product's 16 kHz): runs/f0/bw.npz."""
from pathlib import Path

import numpy as np
from sleuthd.audio.bandwidth import effective_bandwidth_hz
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd_bench.robustness import embed

root = Path("data/robustness")
paths = embed.load(root, "ge2e").paths
out = np.full(len(paths), np.nan)
for k, p in enumerate(paths):
    try:
        x = to_model_rate(decode_encoded((root / p).read_bytes(), 600.0)).samples
    except Exception:
        continue
    bw = effective_bandwidth_hz(x)
    out[k] = np.nan if bw is None else bw
Path("runs/f0").mkdir(parents=True, exist_ok=True)
np.savez("runs/f0/bw.npz", paths=np.array(paths), bw=out)
print("done", np.nanpercentile(out, [5, 25, 50, 75, 95]))

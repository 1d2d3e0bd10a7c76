import sys
from pathlib import Path
import numpy as np
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
root = Path("data/robustness")
def plateau(p):
    x = decode(AudioInput((root / p).read_bytes()), 60.0).samples
    peak = float(np.abs(x).max()); return 0.0 if peak <= 0 else float(np.mean(np.abs(x) >= 0.99 * peak))
for cond in sys.argv[1].split(","):
    spreads = {"S1": [], "S2": [], "S3": []}
    for line in read_manifest(root / f"train-{cond}.jsonl")[:40]:
        for s in spreads:
            fr = [plateau(p) for p in [*scenario_turns(line, s), line.reference]]
            spreads[s].append(max(fr) - min(fr))
    print(cond, {s: np.round(np.percentile(v, [10, 50, 90]), 4).tolist() for s, v in spreads.items()}, flush=True)

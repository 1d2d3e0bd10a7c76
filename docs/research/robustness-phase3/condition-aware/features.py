import time, numpy as np
from pathlib import Path
from sleuthd_bench.robustness import embed
import lib

t0 = time.time()
for dev in (False, True):
    C = lib.load_cache(dev)
    embs = {e: embed.load(Path("data/devlarge" if dev else "data/robustness"), e) for e in lib.ENC}
    # cohort: always the robustness TRAIN split's clips (dev clips use their own embedding cache: embed cohort clips from
    # the robustness cache via vectors, so pass both)
    spk = lib.cohort()
    if dev:
        # build a combined embedding set: dev clips + robustness train clips as cohort
        rob = {e: embed.load(Path("data/robustness"), e) for e in lib.ENC}
        for e in lib.ENC:
            base = embs[e]
            keep = [k for k, p in enumerate(rob[e].paths) if p in spk]
            n0 = len(base.paths)
            newp = list(base.paths) + ["COH:" + rob[e].paths[k] for k in keep]
            base.vectors = np.vstack([base.vectors, rob[e].vectors[keep]]); base.paths = newp
        spk = {"COH:" + p: s for p, s in spk.items()}
    F = lib.instance_stats(C, embs, spk)
    np.savez_compressed(lib.OUT / ("feat-dev.npz" if dev else "feat.npz"), **F)
    print("done", dev, time.time() - t0, flush=True)

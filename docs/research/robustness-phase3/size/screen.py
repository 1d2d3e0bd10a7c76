"""Subset judging offline: a speaker with more than K turns judged as windows of K turns (cyclic windows over R seeded
permutations), each turn's logit averaged over the windows containing it."""
import sys, time
from dataclasses import replace
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.instances import Turns

split = sys.argv[1]; conds = sys.argv[2].split(","); K = int(sys.argv[3]); R = int(sys.argv[4])
_, insts = common.load(split, conds)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()

def sub(inst, keep):
    views = {}
    for e, v in inst.views.items():
        m = np.isin(v.index, keep)
        views[e] = Turns(v.index[m], v.emb[m], v.seconds[m], v.reference)
    return replace(inst, views=views)

def logit(p):
    p = np.clip(p, 1e-12, 1 - 1e-12); return np.log(p / (1 - p))

res = {}
t0 = time.time()
for i in insts:
    idx = i.views["fused"].index
    n = len(idx)
    f_full, _, p_full = judges.evidence_flags(i, ev, fcal)
    if n <= K:
        f_sub = f_full
    else:
        tot = np.zeros(n); cnt = np.zeros(n)
        rng = np.random.default_rng(n)
        for r in range(R):
            perm = rng.permutation(n)
            for s in range(n):
                w = perm[(s + np.arange(K)) % n]
                t = sub(i, idx[w])
                _, _, p = judges.evidence_flags(t, ev, fcal)
                ti = t.views["fused"].index
                pos = np.searchsorted(idx, ti)
                tot[pos] += logit(p); cnt[pos] += 1
        z = tot / cnt
        f_sub = frozenset(idx[z > 0].tolist())
    res.setdefault(i.condition, []).append((i, f_full, f_sub))
print(f"{time.time()-t0:.0f} s")
from sleuthd_bench import paired
for c, rows in res.items():
    a = [judges.record(i, f) for i, f, _ in rows]; b = [judges.record(i, f) for i, _, f in rows]
    ma, mb = judges.metrics(a), judges.metrics(b)
    d = paired.compare("sub", b, "full", a).bal
    print(f"{c}: full {ma['bal']:.1f} ({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) -> subsets K={K} R={R} {mb['bal']:.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")

"""Size matching offline: a speaker with more than K turns judged as groups of K turns (groups.py), flagged where the
mean log-odds is over A * log(n / K) (A = 0: the plain rule; eval.txt's afterthought raises it with n).

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/size/screen.py SPLIT CONDITIONS K R [A]
"""
import sys, time
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
sys.path.insert(0, "docs/research/robustness-phase3/size")
import common
from groups import group_logits
from sleuthd_bench.robustness import judges

split = sys.argv[1]; conds = sys.argv[2].split(","); K = int(sys.argv[3]); R = int(sys.argv[4])
A = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
_, insts = common.load(split, conds)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()

res = {}
t0 = time.time()
for i in insts:
    idx = i.views["fused"].index
    n = len(idx)
    f_full, _, p_full = judges.evidence_flags(i, ev, fcal)
    if n <= K:
        f_sub = f_full
    else:
        z = group_logits(i, ev, fcal, K, R)
        f_sub = frozenset(idx[z > A * np.log(n / K)].tolist())
    res.setdefault(i.condition, []).append((i, f_full, f_sub))
print(f"{time.time()-t0:.0f} s")
from sleuthd_bench import paired
for c, rows in res.items():
    a = [judges.record(i, f) for i, f, _ in rows]; b = [judges.record(i, f) for i, _, f in rows]
    ma, mb = judges.metrics(a), judges.metrics(b)
    d = paired.compare("sub", b, "full", a).bal
    print(f"{c}: full {ma['bal']:.1f} ({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) -> subsets K={K} R={R} {mb['bal']:.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")

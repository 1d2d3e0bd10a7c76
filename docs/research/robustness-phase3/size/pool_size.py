"""How the served blend's probability of the altered turn moves with the speaker's pool size (c-long-allshort)."""
import sys
from dataclasses import replace
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.instances import Turns

split = sys.argv[1] if len(sys.argv) > 1 else "train"
cond = sys.argv[2] if len(sys.argv) > 2 else "c-long-allshort"
_, insts = common.load(split, [cond])
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
metas = common.metas(split, [cond])

def truncate(inst, keep):
    keep = np.asarray(sorted(keep))
    views = {}
    for e, v in inst.views.items():
        m = np.isin(v.index, keep)
        views[e] = Turns(v.index[m], v.emb[m], v.seconds[m], v.reference)
    return replace(inst, views=views)

rows = {}
for i in insts:
    alt = metas[i.dialogue_id]["altered_turn"]
    n = i.n_turns
    others = [k for k in range(n) if k != alt]
    for k in (5, 10, 20, 30):
        keep = [alt] + others[: k - 1]
        t = truncate(i, keep)
        flagged, unc, p = judges.evidence_flags(t, ev, fcal)
        idx = t.views["fused"].index
        d = common.decompose(t, ev, fcal)
        j = int(np.where(idx == alt)[0][0]) if alt in idx else None
        if j is None:
            continue
        pa = float(p[j])
        pmax_other = float(np.max(np.delete(p, j)))
        feats = {name: float(d["x"][j, c]) for c, name in enumerate(d["inputs"])}
        rows.setdefault((i.scenario, k), []).append((pa, pmax_other, alt in flagged, bool(flagged - {alt}), feats, d["inside"], float(d["zev"][j]), float(d["auto"][j])))

for sc in ("S1", "S2", "S3"):
    for k in (5, 10, 20, 30):
        r = rows.get((sc, k), [])
        if not r:
            continue
        pa = np.array([x[0] for x in r]); po = np.array([x[1] for x in r])
        fl = np.mean([x[2] for x in r]); fo = np.mean([x[3] for x in r]); inside = np.mean([x[5] for x in r])
        zev = np.median([x[6] for x in r]); au = np.median([x[7] for x in r])
        fs = r[0][4].keys()
        fmed = " ".join(f"{f.replace('campplus','c').replace('ge2e','g')}={np.median([x[4][f] for x in r]):.3f}" for f in fs)
        print(f"{sc} k={k:2d} n={len(r)} p(alt) med {np.median(pa):.3f} flagged {fl:.2f} | others flagged {fo:.2f} | inside {inside:.2f} zev {zev:+.2f} auto {au:+.2f}")
        print(f"     {fmed}")

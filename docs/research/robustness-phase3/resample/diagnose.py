"""Is the flagged turn of a consistent sox-prosody speaker its pitch-shift outlier?"""
import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common as C
from sleuthd_bench.robustness import judges

cal, ev = C.load_models()
for split, cond in [("eval", "f-fsdd-prosody"), ("train", "b-espeak-sox"), ("eval", "b-espeak-sox")]:
    _, insts = C.load(split, [cond])
    metas = C.metas(split, [cond])
    rows = []
    for inst in insts:
        m = metas[inst.dialogue_id]["meta"]["specs"]
        cents = np.array([s["fx"][0][1] for s in m])
        tempo = np.array([s["fx"][0][2] for s in m])
        fl, un, p = judges.evidence_flags(inst, ev, cal, *C.MATCH)
        n = inst.n_turns
        pieces = list(range(n)) + [n]  # target turns + reference (spec index n)
        if inst.scenario != "S1":
            alt = next(iter(inst.gold))
            cents_t = cents.copy()
            cents_t[alt] = cents[6 if inst.scenario == "S2" else 7]
        else:
            cents_t = cents
        dev = np.array([cents_t[i] - np.median([cents_t[j] for j in pieces if j != i]) for i in range(n)])
        rows.append((inst.scenario, fl, dev, inst.gold))
    s1 = [r for r in rows if r[0] == "S1"]
    nflag = sum(bool(r[1]) for r in s1)
    top = sum(1 for r in s1 if r[1] and int(np.argmax(np.abs(r[2]))) in r[1])
    print(f"{split} {cond}: S1 {len(s1)} flagged {nflag}; flagged turn is the |cents| outlier in {top}")
    devs_f = [abs(r[2][i]) for r in s1 for i in r[1]]
    devs_a = [abs(d) for r in s1 for d in r[2]]
    print("  |dev cents| of flagged turns: median %.0f; all turns median %.0f" % (np.median(devs_f) if devs_f else -1, np.median(devs_a)))
    bins = [0, 100, 200, 300, 400, 800]
    for lo, hi in zip(bins[:-1], bins[1:]):
        ds = [(i in r[1]) for r in s1 for i, d in enumerate(r[2]) if lo <= abs(d) < hi]
        print(f"   |dev| {lo}-{hi}: {len(ds)} turns, flagged {np.mean(ds)*100 if ds else 0:.1f} %")
    for sc in ("S2", "S3"):
        ss = [r for r in rows if r[0] == sc]
        caught = sum(1 for r in ss if r[3] & r[1])
        print(f"  {sc}: {caught}/{len(ss)} caught; intruder |dev| median %.0f" % np.median([abs(r[2][next(iter(r[3]))]) for r in ss]))

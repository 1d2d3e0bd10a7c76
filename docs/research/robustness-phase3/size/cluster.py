"""Size matching (K=5, R=2) against the served blend (no matching) on eval's long conditions, with the paired bootstrap
resampling target speakers (every dialogue of a voice shares ~28 of its 32 clips) beside the one resampling dialogues."""
import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
sys.path.insert(0, "docs/research/robustness-phase3/size")
from groups import K, R, group_logits, load_long_eval
from sleuthd_bench.robustness import judges
insts, metas, fcal, ev = load_long_eval()
def groups_flags(i):
    return frozenset(i.views["fused"].index[group_logits(i, ev, fcal, K, R) > 0].tolist())
rows = {}
for i in insts:
    if i.refused: continue
    full = judges.evidence_flags(i, ev, fcal)[0]
    grp = groups_flags(i)
    ok = lambda f: (not f) if i.scenario == "S1" else (bool(f))  # detection: flagged at all
    rows.setdefault(i.condition, []).append((metas[i.dialogue_id]["target_speaker"], i.dialogue_id, i.scenario, ok(full), ok(grp)))
def bal(r):
    s = {sc: np.mean([x for (_, _, c, x) in r if c == sc]) for sc in ("S1", "S2", "S3")}
    return 50 * (s["S1"] + (s["S2"] + s["S3"]) / 2)
rng = np.random.default_rng(0)
for c, r in rows.items():
    base = [(a, b, sc, x) for a, b, sc, x, _ in r]; var = [(a, b, sc, y) for a, b, sc, _, y in r]
    d = bal(var) - bal(base)
    for unit, key in (("dialogues", 1), ("speakers", 0)):
        units = sorted({x[key] for x in r})
        by = {u: [k for k, x in enumerate(r) if x[key] == u] for u in units}
        boot = []
        for _ in range(2000):
            pick = rng.choice(units, len(units))
            ids = [k for u in pick for k in by[u]]
            boot.append(bal([var[k] for k in ids]) - bal([base[k] for k in ids]))
        lo, hi = np.percentile(boot, [2.5, 97.5])
        print(f"{c}: groups of 5 against the whole speaker {d:+.2f}; resampling {len(units)} {unit}: [{lo:+.2f}, {hi:+.2f}]")

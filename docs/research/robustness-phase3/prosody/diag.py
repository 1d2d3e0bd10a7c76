"""Per candidate instance: the moved turn's mean cosine to the speaker's other pieces, as sent and on the copies.

    python diag.py SPLIT [--root R]

Rows: S1 false alarm (flagged genuine turn), S2 intruder, S3 intruder (the flagged turn of a candidate instance).
Columns, per encoder: as sent (orig), WORLD identity copies of all pieces (id: the flagged turn at its own F0 too),
design id (moved turn among identity copies), raw (moved turn among the pieces as sent). Medians over the rows."""
import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--root", type=Path, default=common.ROOT)
args = ap.parse_args()
root = args.root
plan = pickle.loads(Path(f"runs/prosody/plan_{args.split}_{root.name}.pkl").read_bytes())
copies = pickle.loads(Path(f"runs/prosody/copies_{root.name}.pkl").read_bytes())
wmed = pickle.loads(Path(f"runs/prosody/world_{root.name}.pkl").read_bytes())
embs, _ = common.load(args.split, [plan["names"][0]], root)
E = {"ge2e": 0, "campplus": 1}
rows = {}
for it in plan["items"]:
    pieces = [it["turns"][u] for u in it["usable"]] + [it["reference"]]
    meds = [wmed.get(p, np.nan) for p in pieces]
    if not all(np.isfinite(meds)):
        continue
    k = int(round(24 * float(np.median(meds))))
    for pos in it["flagged"]:
        if not np.isfinite(it["devs"][pos]):
            continue
        p = it["turns"][pos]
        others = [q for q in pieces if q != p]
        kind = "S1 false alarm" if not it["gold"] else ("intruder " + it["scenario"]) if pos in it["gold"] else "other"
        rec = {}
        ok = True
        for e, j in E.items():
            def orig(q):
                v, _ = embs[e].get(q)
                return v
            def cp(key):
                c = copies.get(key)
                return None if c is None else c[j]
            o = [orig(q) for q in others]
            oid = [cp(f"{q}#id") for q in others]
            me, mid, mmv = orig(p), cp(f"{p}#id"), cp(f"{p}#f0{k}")
            if any(x is None for x in o + oid + [me, mid, mmv]):
                ok = False
                break
            cos = lambda a, bs: float(np.mean([a @ b for b in bs]))
            rec[e] = (cos(me, o), cos(mid, oid), cos(mmv, oid), cos(mmv, o),
                      float(np.mean([o[a] @ o[b] for a in range(len(o)) for b in range(a + 1, len(o))])),
                      float(np.mean([oid[a] @ oid[b] for a in range(len(o)) for b in range(a + 1, len(o))])))
        if ok:
            rows.setdefault((kind, it["devs"][pos] >= 0.5), []).append(rec)
print(f"{args.split}: moved turn's mean cosine to the speaker's other pieces (median over rows)")
print("| turn | F0 dev | n | GE2E orig | GE2E id | GE2E moved/id | GE2E moved/raw | CAM++ orig | CAM++ id | CAM++ moved/id | CAM++ moved/raw | CAM++ others' level orig / id |")
print("| :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |")
for (kind, big), rs in sorted(rows.items()):
    g = np.median([r["ge2e"] for r in rs], axis=0)
    c = np.median([r["campplus"] for r in rs], axis=0)
    print(f"| {kind} | {'>= 0.5' if big else '0.3-0.5'} | {len(rs)} | {g[0]:.3f} | {g[1]:.3f} | {g[2]:.3f} | {g[3]:.3f} | {c[0]:.3f} | {c[1]:.3f} | "
          f"{c[2]:.3f} | {c[3]:.3f} | {c[4]:.3f} / {c[5]:.3f} |")

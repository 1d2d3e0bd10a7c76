"""Design 1 on top of 2c: per-train-condition thresholds on the learned turn model's score (fitted on its
train OUT-OF-FOLD scores), selected per instance by the descriptor condition classifier (soft: p-weighted
threshold). Optionally gated to the served blend out of descriptor support."""
import sys, pickle, numpy as np, warnings
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
import lib, design1
from gate import ood_distance
warnings.filterwarnings("ignore")

main = sys.argv[1] if len(sys.argv) > 1 else "full-big"
tag = sys.argv[2] if len(sys.argv) > 2 else "all"
C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
orc = lib.oracle_table(C, ex)
excl = {"all": set(), "wo-a": {"a", "x"}, "wo-b": {"b", "x"}}[tag]
tc = [c for c in lib.TRAIN_CONDS if lib.GROUP[c] not in excl]
d = pickle.load(open(lib.OUT / f"learned-turn-{main}-{tag}.pkl", "rb"))
score = np.where(C["split"] == "train", d["oof"], d["score"])
tr = (C["split"] == "train") & np.isin(C["cond"], tc)
cands = np.linspace(0.02, 0.98, 97)
tau_c = {}
for c in tc:
    m = tr & (C["cond"] == c)
    b = [lib.rates(C["scen"][m], score[m] > t)[3] for t in cands]
    tau_c[c] = cands[int(np.argmax(b))]
Z, trm, y, _ = design1.fit(C, F, ex, tc)
res = {}
for cn, clf in (("logreg", LogisticRegression(C=1.0, max_iter=2000)), ("knn", KNeighborsClassifier(30, weights="distance"))):
    clf.fit(Z[trm], y)
    P = clf.predict_proba(Z)
    tau = P @ np.array([tau_c[c] for c in clf.classes_])
    flag = score > tau
    dist, _ = ood_distance(C, F, tc)
    cut = np.quantile(dist[tr], 0.95)
    fb = C["blend"] if tag == "all" else C[f"blend_wo_{tag[-1]}"]
    for gname, fl in (("nogate", flag), ("gate.95", np.where(dist > cut, fb, flag))):
        rows = lib.evaluate(C, fl, orc)
        sm = lib.summary(rows)
        print(main, tag, cn, gname, {k: (round(float(v), 2) if not isinstance(v, str) else v) for k, v in sm.items()})
        held = [c for c in lib.EVAL_CONDS if lib.GROUP[c] in excl]
        for r in rows:
            if r["cond"] in held:
                print(f"   held-out {r['cond']:22s} {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) oracle {r['obal']:.1f} bar={r['ok_bal'] and r['ok_s2']}")
        res[(cn, gname)] = dict(rows=rows, summary=sm, flag=fl)
print({c: round(t, 2) for c, t in tau_c.items()})
pickle.dump(res, open(lib.OUT / f"hybrid-{main}-{tag}.pkl", "wb"))

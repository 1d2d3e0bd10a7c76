"""Design 2c/3 + support gate: use the condition-aware (descriptor) model only where the instance's descriptor lies
inside the TRAIN split's descriptor support (mean distance to the 10 nearest train instances of OTHER target speakers,
cut at the q-quantile of train's own out-of-speaker distances); elsewhere fall back (served blend, or a model without
descriptors)."""
import sys, pickle, numpy as np, warnings
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler
import lib, os
MAIN = os.environ.get("MAIN", "full")
from design1 import descriptors
warnings.filterwarnings("ignore")


def ood_distance(C, F, train_conds, k=10, folds=5):
    X = descriptors(F, C)
    tr = (C["split"] == "train") & np.isin(C["cond"], train_conds)
    med = np.nanmedian(X[tr], 0); X = np.where(np.isnan(X), med, X)
    Z = StandardScaler().fit(X[tr]).transform(X)
    spk = np.unique(C["target"][tr]); rng = np.random.default_rng(0); rng.shuffle(spk)
    fo = {s: i % folds for i, s in enumerate(spk)}
    f = np.array([fo.get(s, -1) for s in C["target"]])
    d = np.full(len(Z), np.nan)
    for i in range(folds):
        nn = NearestNeighbors(n_neighbors=k).fit(Z[tr & (f != i)])
        q = tr & (f == i)
        d[q] = nn.kneighbors(Z[q])[0].mean(1)
    nn = NearestNeighbors(n_neighbors=k).fit(Z[tr])
    o = ~tr
    d[o] = nn.kneighbors(Z[o])[0].mean(1)
    return d, tr


if __name__ == "__main__":
    tag = sys.argv[1] if len(sys.argv) > 1 else "all"
    q = float(sys.argv[2]) if len(sys.argv) > 2 else 0.99
    C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
    orc = lib.oracle_table(C, ex)
    excl = {"all": set(), "wo-a": {"a", "x"}, "wo-b": {"b", "x"}}[tag]
    tc = [c for c in lib.TRAIN_CONDS if lib.GROUP[c] not in excl]
    d, tr = ood_distance(C, F, tc)
    cut = np.quantile(d[tr], q)
    ood = d > cut
    for c in lib.EVAL_CONDS:
        m = (C["cond"] == c) & (C["split"] == "eval")
        print(f"  {c:22s} out-of-support {100 * ood[m].mean():5.1f} %")
    main = pickle.load(open(lib.OUT / f"learned-turn-{MAIN}-{tag}.pkl", "rb"))["flag"]
    fb = {"blend": C["blend"] if tag == "all" else C[f"blend_wo_{tag[-1]}"],
          "nocoh_nodesc": pickle.load(open(lib.OUT / f"learned-turn-nocoh_nodesc-{tag}.pkl", "rb"))["flag"]}
    for name, alt in fb.items():
        flag = np.where(ood, alt, main)
        rows = lib.evaluate(C, flag, orc)
        sm = lib.summary(rows)
        print(f"gate q={q} -> {name}", tag, {k: (round(float(v), 2) if not isinstance(v, str) else v) for k, v in sm.items()})
        held = [c for c in lib.EVAL_CONDS if lib.GROUP[c] in excl]
        for r in rows:
            if r["cond"] in held:
                print(f"   held-out {r['cond']:22s} {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) oracle {r['obal']:.1f} bar={r['ok_bal'] and r['ok_s2']}")
        pickle.dump(dict(rows=rows, summary=sm, flag=flag, ood=ood, cut=cut), open(lib.OUT / f"gate-{MAIN}-{name}-q{q}-{tag}.pkl", "wb"))

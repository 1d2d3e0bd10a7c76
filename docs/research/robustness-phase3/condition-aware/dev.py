"""The best design (turn model full/big + descriptor-support gate q=0.95 -> served blend) on the dev benchmark's
splits (data/devlarge eval-dev-{fit,transfer,fsdd}); fitted on the robustness TRAIN split only."""
import os, pickle, numpy as np, warnings
os.environ.setdefault("HP", "big"); os.environ.setdefault("VARIANT", "full")
import lib, learned
from gate import ood_distance
warnings.filterwarnings("ignore")
C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz"))
Cd = lib.load_cache(True); Fd = dict(np.load(lib.OUT / "feat-dev.npz"))
keys = [k for k in Cd if k in C]
Cc = {}
for k in keys:
    a, b = C[k], Cd[k]
    if a.dtype.kind == "U" or b.dtype.kind == "U":
        Cc[k] = np.concatenate([a.astype(object), b.astype(object)]).astype(str)
    else:
        Cc[k] = np.concatenate([a, b])
Fc = {k: np.concatenate([F[k], Fd[k]]) for k in F}
ex = lib.extremes(Fc)
dn = ["dev-fit", "dev-transfer", "dev-fsdd"]
score, tau, tb, _ = learned.run("turn", Cc, Fc, ex, lib.TRAIN_CONDS, dn)
print("tau", tau, "train OOF", tb)
d, tr = ood_distance(Cc, Fc, lib.TRAIN_CONDS)
ood = d > np.quantile(d[tr], 0.95)
orc = lib.oracle_table(Cc, ex, conds=dn)
ins = np.zeros(len(Cc["cond"]), bool); ins[len(C["cond"]):] = np.load(lib.OUT / "inside.npz")["dev"]
gated = np.where(ood, Cc["blend"], score > tau)
out = {}
for name, fl in (("auto-gate hybrid", np.where(ins, Cc["blend"], gated)), ("turn model, no gate", score > tau), ("gated (q=.95) -> blend", np.where(ood, Cc["blend"], score > tau)),
                 ("served blend", Cc["blend"].astype(bool))):
    rows = lib.evaluate(Cc, fl, orc, conds=dn)
    out[name] = rows
    for r in rows:
        m = (Cc["cond"] == r["cond"]) & (Cc["split"] == "eval")
        print(f"{name:24s} {r['cond']:13s} {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) oracle {r['obal']:.1f} "
              f"ood {100 * ood[m].mean():.0f}%")
ci = {c: lib.bootstrap_delta(Cc, gated, Cc["blend"].astype(bool), c) for c in dn}
print("gated - blend:", {c: tuple(round(float(x), 2) for x in v) for c, v in ci.items()})
ci2 = {c: lib.bootstrap_delta(Cc, np.where(ins, Cc["blend"], gated), Cc["blend"].astype(bool), c) for c in dn}
print("auto-gate hybrid - blend:", {c: tuple(round(float(x), 2) for x in v) for c, v in ci2.items()})
print("inside auto support:", {c: round(float(ins[(Cc['cond'] == c)].mean()), 3) for c in dn})
pickle.dump(dict(out=out, ci=ci, ci_autogate=ci2, ood={c: float(ood[(Cc['cond'] == c)].mean()) for c in dn}), open(lib.OUT / "dev.pkl", "wb"))

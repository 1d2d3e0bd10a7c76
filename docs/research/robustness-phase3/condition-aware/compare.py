import glob, pickle, numpy as np, lib
C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
orc = lib.oracle_table(C, ex)
seen = set(lib.TRAIN_CONDS)
def grp(rows):
    a = [r for r in rows if r["cond"] in seen]; b = [r for r in rows if r["cond"] not in seen]
    f = lambda R: f"bar {sum(r['ok_bal'] and r['ok_s2'] for r in R)}/{len(R)} short {np.mean([r['short'] for r in R]):5.2f} S2miss {sum(not r['ok_s2'] for r in R)}"
    return f"ALL {f(rows)} | seen(19) {f(a)} | unseen(6) {f(b)}"
print(f"{'served blend':28s}", grp(lib.evaluate(C, C["blend"], orc)))
for p in sorted(glob.glob(str(lib.OUT / "learned-*-all.pkl"))):
    d = pickle.load(open(p, "rb")); print(f"{p.split('/')[-1][8:-8]:28s}", grp(d["rows"]))
for p in ("design1.pkl",):
    d = pickle.load(open(lib.OUT / p, "rb"))
    for k, (rows, s) in d.items():
        if k != "known-condition": print(f"{'d1 ' + k:28s}", grp(rows))
d = pickle.load(open(lib.OUT / "design2a.pkl", "rb"))
for k in ("campplus:gap", "both:z", "both:snorm-gap"):
    print(f"{'d2a ' + k:28s}", grp(d[k][0]))

"""Shared: load the cache, compute per-instance / per-turn statistics, metrics, oracle, bootstrap."""
import json
from pathlib import Path
import numpy as np

from sleuthd_bench.robustness import embed
from sleuthd_bench.robustness.build import CONDITIONS

OUT = Path("runs/screen27")
ENC = ("ge2e", "campplus")
METH = ("pairwise", "centroid", "reference")
RULES = [(e, m) for e in ENC for m in METH]
GROUP = {c.name: c.group for c in CONDITIONS}
EVAL_CONDS = [c.name for c in CONDITIONS]
TRAIN_CONDS = [n for n in EVAL_CONDS if Path(f"data/robustness/train-{n}.jsonl").is_file()]
K_COH = 50


def load_cache(dev=False):
    z = np.load(OUT / ("cache-dev.npz" if dev else "cache.npz"))
    return {k: z[k] for k in z.files}


def cohort(root="data/robustness"):
    """Train-split clips (unique, usable) per encoder with their speaker label."""
    root = Path(root)
    spk = {}
    for n in TRAIN_CONDS:
        for l in (root / f"train-{n}.jsonl").read_text().splitlines():
            d = json.loads(l)
            for p in [d["reference"], *d["target_turns"]]:
                spk[p] = d["target_speaker"]
            spk[d["s2_audio"]] = d["meta"]["s2_speaker"]
            spk[d["s3_audio"]] = d["meta"]["s3_speaker"]
    return spk


def instance_stats(C, embs, cohort_spk):
    """Per instance (N) and turn (5): per encoder the paper scores (NaN unusable) and normalised statistics;
    per instance descriptors. Returns dict of arrays."""
    N = len(C["cond"])
    out = {}
    for e in ENC:
        V = embs[e].vectors.astype(np.float64)
        # cohort stats per clip: top-K cosines to train clips of other speakers
        paths = embs[e].paths
        cidx = np.array([k for k, p in enumerate(paths) if p in cohort_spk and not np.isnan(V[k, 0])])
        cspk = np.array([cohort_spk[paths[k]] for k in cidx])
        usable = ~np.isnan(V[:, 0])
        Vz = np.where(usable[:, None], V, 0.0)
        S = Vz @ Vz[cidx].T  # (nclips, ncohort)
        # top-200 per clip with speaker ids, to exclude the dialogue's speakers later
        top = np.argsort(-S, axis=1)[:, :300]
        topv = np.take_along_axis(S, top, 1)
        topspk = cspk[top]
        pw = np.full((N, 5), np.nan); cd = np.full((N, 5), np.nan); rf = np.full((N, 5), np.nan)
        gap = np.full((N, 5), np.nan); zz = np.full((N, 5), np.nan); rgap = np.full((N, 5), np.nan)
        sn = np.full((N, 5), np.nan); snr = np.full((N, 5), np.nan); snz = np.full((N, 5), np.nan)
        desc = np.full((N, 9), np.nan)
        for i in range(N):
            ti = C[f"ti_{e}"][i]; ri = int(C[f"ri_{e}"][i])
            pos = np.where(ti >= 0)[0]
            ids = ti[pos]
            n = len(pos)
            excl = {C["target"][i], C["intr"][i]}
            def coh(k):
                m = ~np.isin(topspk[k], list(excl))
                v = topv[k][m][:K_COH]
                return v.mean(), max(v.std(), 1e-3)
            X = V[ids]
            r = V[ri] if ri >= 0 else None
            if n >= 1 and r is not None:
                rf[i, pos] = X @ r
            mus = np.array([coh(k) for k in ids]) if n else np.zeros((0, 2))
            if r is not None:
                rmu, rsd = coh(ri)
            if n >= 2:
                g = X @ X.T
                rows = g.sum(1)
                pw[i, pos] = (rows - 1.0) / (n - 1)
                cd[i, pos] = 1.0 - (rows / n) / max(np.sqrt(max(rows.sum(), 0)) / n, 1e-12)
                off = g[~np.eye(n, dtype=bool)]
                # s-norm matrix
                SN = 0.5 * ((g - mus[:, 0:1]) / mus[:, 1:2] + (g - mus[:, 0:1].T) / mus[:, 1:2].T)
                np.fill_diagonal(SN, 0)
                sn[i, pos] = SN.sum(1) / (n - 1)
                if r is not None:
                    snr[i, pos] = 0.5 * ((rf[i, pos] - mus[:, 0]) / mus[:, 1] + (rf[i, pos] - rmu) / rsd)
                for a in range(n):
                    others = [b for b in range(n) if b != a]
                    own = g[a, others].mean()
                    if n >= 3:
                        lo = np.array([g[b, [c for c in others if c != b]].mean() for b in others])
                        med = np.median(lo)
                        gap[i, pos[a]] = med - own
                        zz[i, pos[a]] = (med - own) / max(lo.std(), 0.02)
                        snz[i, pos[a]] = np.median(SN[others][:, others].sum(1) / (n - 2)) - SN[a, others].mean()
                    if r is not None:
                        rgap[i, pos[a]] = np.median(rf[i, pos[others]]) - rf[i, pos[a]]
                desc[i, :] = [np.median(off), np.quantile(off, 0.75), np.quantile(off, 0.25),
                              np.nanmedian(rf[i]) if r is not None else np.nan,
                              np.median(mus[:, 0]), np.median(mus[:, 1]), n,
                              np.median(off) - np.median(mus[:, 0]), off.std()]
        for k, v in dict(pw=pw, cd=cd, rf=rf, gap=gap, z=zz, rgap=rgap, sn=sn, snr=snr, snz=snz, desc=desc).items():
            out[f"{e}_{k}"] = v
    return out


def extremes(F):
    """Dialogue extreme value per rule, oriented: flagged iff value > tau. -inf when unscored."""
    ex = {}
    for e in ENC:
        for m, key, sign in (("pairwise", "pw", -1), ("centroid", "cd", 1), ("reference", "rf", -1)):
            a = sign * F[f"{e}_{key}"]
            with np.errstate(all="ignore"):
                v = np.nanmax(a, axis=1)
            v[np.all(np.isnan(a), axis=1)] = -np.inf
            ex[(e, m)] = v
    return ex


def rates(scen, flag):
    s1 = 100 * (1 - flag[scen == "S1"].mean()); s2 = 100 * flag[scen == "S2"].mean(); s3 = 100 * flag[scen == "S3"].mean()
    return s1, s2, s3, 0.5 * (s1 + (s2 + s3) / 2)


def oracle_tau(vals, scen):
    """Best threshold (flag iff v > tau) and its Bal on these instances (as judges.oracle)."""
    fin = vals[np.isfinite(vals)]
    if not len(fin):
        return np.inf, 50.0, (100, 0, 0)
    u = np.unique(fin)
    cands = np.concatenate([[u[0] - 1e-6], (u[:-1] + u[1:]) / 2, [u[-1] + 1e-6]])
    r = {}
    for s in ("S1", "S2", "S3"):
        a = np.sort(vals[scen == s])
        r[s] = 1.0 - np.searchsorted(a, cands, side="right") / max(len(a), 1)
    bal = 50 * ((1 - r["S1"]) + (r["S2"] + r["S3"]) / 2)
    b = int(np.argmax(bal))
    return cands[b], bal[b], (100 * (1 - r["S1"][b]), 100 * r["S2"][b], 100 * r["S3"][b])


def oracle_table(C, ex, split="eval", conds=None):
    out = {}
    for c in conds or (EVAL_CONDS if split == "eval" else TRAIN_CONDS):
        m = (C["cond"] == c) & (C["split"] == split)
        best = None
        s2bar = False
        for r in RULES:
            tau, bal, (s1, s2, s3) = oracle_tau(ex[r][m], C["scen"][m])
            s2bar |= s2 >= 99.0
            if best is None or bal > best[1] + 1e-12:
                best = (r, bal, tau, (s1, s2, s3))
        out[c] = dict(rule=best[0], bal=best[1], tau=best[2], s=best[3], s2bar=s2bar)
    return out


def evaluate(C, flag, orc, split="eval", conds=None, label=""):
    """Per-condition rows and summary vs oracle."""
    rows = []
    for c in conds or EVAL_CONDS:
        m = (C["cond"] == c) & (C["split"] == split)
        s1, s2, s3, bal = rates(C["scen"][m], flag[m])
        o = orc[c]
        ok_bal = bal >= o["bal"] - 1e-9
        ok_s2 = (not o["s2bar"]) or s2 >= 99.0
        rows.append(dict(cond=c, s1=s1, s2=s2, s3=s3, bal=bal, obal=o["bal"], orule=":".join(o["rule"]),
                         ok_bal=ok_bal, ok_s2=ok_s2, s2bar=o["s2bar"], short=o["bal"] - bal))
    return rows


def summary(rows):
    n_bar = sum(r["ok_bal"] and r["ok_s2"] for r in rows)
    n_bal = sum(r["ok_bal"] for r in rows)
    n_s2 = sum(r["ok_s2"] for r in rows if r["s2bar"]); n_s2b = sum(r["s2bar"] for r in rows)
    sh = np.mean([r["short"] for r in rows])
    return dict(n=len(rows), n_bar=n_bar, n_bal=n_bal, s2=f"{n_s2}/{n_s2b}", mean_short=sh,
                mean_bal=np.mean([r["bal"] for r in rows]), worst=max(r["short"] for r in rows))


def bootstrap_delta(C, fa, fb, cond, split="eval", B=2000, seed=0):
    """Paired bootstrap over dialogues of Bal(a) - Bal(b) in one condition."""
    m = (C["cond"] == cond) & (C["split"] == split)
    did = C["did"][m]; sc = C["scen"][m]; a = fa[m].astype(float); b = fb[m].astype(float)
    ud = np.unique(did)
    idx = {d: k for k, d in enumerate(ud)}
    D = len(ud)
    A = np.zeros((D, 3)); Bm = np.zeros((D, 3))
    for k in range(len(did)):
        j = ("S1", "S2", "S3").index(sc[k])
        A[idx[did[k]], j] = a[k]; Bm[idx[did[k]], j] = b[k]
    def bal(X, w):
        s1 = 1 - (X[:, 0] * w).sum() / w.sum(); s2 = (X[:, 1] * w).sum() / w.sum(); s3 = (X[:, 2] * w).sum() / w.sum()
        return 50 * (s1 + (s2 + s3) / 2)
    rng = np.random.default_rng(seed)
    ds = []
    w0 = np.ones(D)
    for _ in range(B):
        w = np.bincount(rng.integers(0, D, D), minlength=D).astype(float)
        ds.append(bal(A, w) - bal(Bm, w))
    return bal(A, w0) - bal(Bm, w0), np.quantile(ds, 0.025), np.quantile(ds, 0.975)


def md_table(rows, blend_rows=None, ci=None):
    h = "| condition | Bal (S1/S2/S3) | oracle Bal (rule) | Bal bar | S2 bar | shortfall |"
    sep = "| :--- | :--- | :--- | :--- | :--- | ---: |"
    if blend_rows:
        h += " served blend Bal | Δ vs blend [95 % CI] |"; sep += " ---: | :--- |"
    L = [h, sep]
    for k, r in enumerate(rows):
        s = (f"| {r['cond']} | {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) | {r['obal']:.1f} ({r['orule']}) | "
             f"{'yes' if r['ok_bal'] else 'no'} | {('yes' if r['ok_s2'] else 'NO') if r['s2bar'] else 'n/a'} | {r['short']:+.1f} |")
        if blend_rows:
            b = blend_rows[k]
            s += f" {b['bal']:.1f} |"
            s += (f" {ci[k][0]:+.1f} [{ci[k][1]:+.1f}, {ci[k][2]:+.1f}] |" if ci else " |")
        L.append(s)
    return "\n".join(L)

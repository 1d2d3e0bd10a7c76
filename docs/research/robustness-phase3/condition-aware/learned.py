"""Designs 2c / 3: learned condition-aware judgments (monotone gradient-boosted trees, sklearn HGB).

2c (turn): per turn, both encoders' raw and dialogue-normalised evidence (paper scores, leave-one-out gap / z,
    reference gap, AS-norm scores) + dialogue descriptors (context, no monotone constraint) -> P(turn altered);
    dialogue flagged when max over turns > tau.
3 (dialogue): per dialogue, the six paper rules' extreme values + dialogue maxima of the normalised evidence
    + descriptors -> P(dialogue inconsistent) > tau.
Every evidence feature is monotone in its direction; descriptors are free (this is what makes it condition-aware).
Fitted on the TRAIN split only (conditions weighted equally, S1 = 1/2, S2 = S3 = 1/4 as in Bal);
tau chosen by 5-fold out-of-fold predictions grouped by target speaker (max mean per-condition Bal).
"""
import os, sys, numpy as np, warnings, pickle
from sklearn.ensemble import HistGradientBoostingClassifier
import lib
from design1 import descriptors
warnings.filterwarnings("ignore")

TURN_FEATS = [("pw", -1), ("cd", 1), ("rf", -1), ("gap", 1), ("z", 1), ("rgap", 1), ("sn", -1), ("snr", -1), ("snz", 1)]


def turn_matrix(C, F, D):
    N = len(C["cond"])
    cols, mono = [], []
    for e in lib.ENC:
        for k, s in TURN_FEATS:
            cols.append(F[f"{e}_{k}"]); mono.append(s)
    X = np.stack(cols, -1)  # (N,5,f)
    sec = np.log(C["sec"].astype(float) + 0.5)[..., None]
    Dd = np.repeat(D[:, None, :], 5, 1)
    X = np.concatenate([X, sec, Dd], -1)
    mono += [0] + [0] * D.shape[1]
    return X, mono


def dlg_matrix(C, F, ex, D):
    cols, mono = [], []
    for r in lib.RULES:
        v = ex[r].copy(); v[~np.isfinite(v)] = np.nan; cols.append(v); mono.append(1)
    for e in lib.ENC:
        for k, s in TURN_FEATS[3:]:
            a = s * F[f"{e}_{k}"]
            v = np.nanmax(a, 1); cols.append(v); mono.append(1)
    X = np.column_stack(cols + [D]); mono += [0] * D.shape[1]
    return X, mono


def weights(C, m):
    w = np.zeros(len(C["cond"]))
    for c in np.unique(C["cond"][m]):
        for s, ws in (("S1", .5), ("S2", .25), ("S3", .25)):
            mm = m & (C["cond"] == c) & (C["scen"] == s)
            w[mm] = ws / max(mm.sum(), 1)
    return w / w[m].mean()


HP = dict(small=(300, 7, 80), base=(300, 15, 40), big=(600, 31, 20))[os.environ.get("HP", "base")]


def model(mono, seed=0):
    return HistGradientBoostingClassifier(max_iter=HP[0], learning_rate=0.05, max_leaf_nodes=HP[1], min_samples_leaf=HP[2],
                                          l2_regularization=1.0, monotonic_cst=mono, random_state=seed)


def fit_predict(kind, C, Xt, mono, trm, predm):
    """Fit on instances trm; predict dialogue scores for instances predm."""
    NT = 2 * len(TURN_FEATS)
    w = weights(C, trm)
    if kind == "turn":
        gold = C["gold"]
        ii = np.where(trm)[0]
        rows, y, ww = [], [], []
        for t in range(5):
            ok = ii[~np.all(np.isnan(Xt[ii, t, :NT]), 1)]
            rows.append(Xt[ok, t]); y.append(gold[ok] == t)
            # altered turn carries the instance weight; consistent turns share S1's weight; S2/S3's others: 1/5
            wt = np.where(gold[ok] == t, w[ok], np.where(gold[ok] < 0, w[ok] / 5, w[ok] / 20))
            ww.append(wt)
        m = model(mono).fit(np.vstack(rows), np.concatenate(y), sample_weight=np.concatenate(ww))
        pj = np.where(predm)[0]
        P = np.full((len(pj), 5), np.nan)
        for t in range(5):
            ok = ~np.all(np.isnan(Xt[pj, t, :NT]), 1)
            P[ok, t] = m.predict_proba(Xt[pj[ok], t])[:, 1]
        s = np.nanmax(P, 1); s[np.isnan(s)] = -1
    else:
        m = model(mono).fit(Xt[trm], C["scen"][trm] != "S1", sample_weight=w[trm])
        s = m.predict_proba(Xt[predm])[:, 1]
    out = np.full(len(C["cond"]), np.nan); out[predm] = s
    return out


def choose_tau(C, score, m, conds):
    cands = np.linspace(0.02, 0.98, 97)
    masks = [m & (C["cond"] == c) for c in conds]
    bals = [np.mean([lib.rates(C["scen"][mm], score[mm] > t)[3] for mm in masks]) for t in cands]
    k = int(np.argmax(bals)); return cands[k], bals[k]


import os
VARIANT = os.environ.get("VARIANT", "full")
COH_T = {"sn", "snr", "snz"}
COH_D = {4, 5, 6}  # desc columns per encoder (of 8) that use the cohort


def add_excess(F):
    for e in lib.ENC:
        for k in ("gap", "z", "rgap"):
            a = F[f"{e}_{k}"]
            ex_ = np.full_like(a, np.nan)
            for t in range(5):
                others = np.delete(a, t, 1)
                with np.errstate(all="ignore"):
                    mo = np.nanmax(others, 1)
                ex_[:, t] = a[:, t] - mo
            F[f"{e}_x{k}"] = ex_
    return F


def select(F, D):
    """Feature-set variants: full | nocoh (no AS-norm cohort anywhere) | nodesc (no descriptors) | nocoh_nodesc."""
    global TURN_FEATS
    base = [("pw", -1), ("cd", 1), ("rf", -1), ("gap", 1), ("z", 1), ("rgap", 1), ("sn", -1), ("snr", -1), ("snz", 1)]
    if "excess" in VARIANT:
        base += [("xgap", 1), ("xz", 1), ("xrgap", 1)]
    TURN_FEATS = [f for f in base if not ("nocoh" in VARIANT and f[0] in COH_T)]
    keep = []
    for e in range(2):
        keep += [8 * e + k for k in range(8) if not ("nocoh" in VARIANT and k in COH_D)]
    keep += [16, 17, 18]
    D = D[:, keep]
    if "nodesc" in VARIANT:
        D = D[:, :0]
    return D


def run(kind, C, F, ex, train_conds, eval_conds, folds=5):
    F = add_excess(dict(F))
    D = select(F, descriptors(F, C))
    if kind == "turn":
        X, mono = turn_matrix(C, F, D)
    else:
        X, mono = dlg_matrix(C, F, ex, D)
    trm = (C["split"] == "train") & np.isin(C["cond"], train_conds)
    # out-of-fold on train, folds by target speaker
    spk = np.unique(C["target"][trm]); rng = np.random.default_rng(0); rng.shuffle(spk)
    fold_of = {s: k % folds for k, s in enumerate(spk)}
    fo = np.array([fold_of.get(s, -1) for s in C["target"]])
    oof = np.full(len(C["cond"]), np.nan)
    for k in range(folds):
        s = fit_predict(kind, C, X, mono, trm & (fo != k), trm & (fo == k))
        oof[trm & (fo == k)] = s[trm & (fo == k)]
    tau, tb = choose_tau(C, oof, trm, train_conds)
    evm = (C["split"] == "eval") & np.isin(C["cond"], eval_conds)
    score = fit_predict(kind, C, X, mono, trm, evm)
    return score, tau, tb, oof


if __name__ == "__main__":
    kind = sys.argv[1]; tag = sys.argv[2] if len(sys.argv) > 2 else "all"
    C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
    orc = lib.oracle_table(C, ex)
    excl = {"all": set(), "wo-a": {"a", "x"}, "wo-b": {"b", "x"}}[tag]
    tc = [c for c in lib.TRAIN_CONDS if lib.GROUP[c] not in excl]
    score, tau, tb, oof = run(kind, C, F, ex, tc, lib.EVAL_CONDS)
    flag = score > tau
    rows = lib.evaluate(C, flag, orc)
    sm = lib.summary(rows)
    print(kind, VARIANT, tag, f"tau={tau:.2f} train OOF meanBal={tb:.2f}", {k: (round(float(v), 2) if not isinstance(v, str) else v) for k, v in sm.items()})
    held = [c for c in lib.EVAL_CONDS if lib.GROUP[c] in excl]
    if held:
        hr = [r for r in rows if r["cond"] in held]
        for r in hr:
            print(f"   held-out {r['cond']:22s} {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) oracle {r['obal']:.1f} bar={r['ok_bal'] and r['ok_s2']}")
    pickle.dump(dict(rows=rows, summary=sm, tau=tau, train_oof=tb, score=score, flag=flag, oof=oof),
                open(lib.OUT / f"learned-{kind}-{VARIANT}{os.environ.get('HPTAG', '')}-{tag}.pkl", "wb"))

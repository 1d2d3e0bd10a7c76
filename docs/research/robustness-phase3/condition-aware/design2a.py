"""Design 2a: condition-normalised single scores (AS-norm vs a TRAIN-clip cohort; within-dialogue z / gap),
one global threshold chosen on the TRAIN split (max mean per-condition Bal)."""
import numpy as np, warnings, pickle
import lib
warnings.filterwarnings("ignore")


def dmax(a):
    v = np.nanmax(a, 1); v[np.all(np.isnan(a), 1)] = -np.inf; return v


def global_tau(C, score, conds, split="train"):
    m0 = C["split"] == split
    fin = score[m0 & np.isfinite(score)]
    cands = np.unique(np.quantile(fin, np.linspace(0.0, 1.0, 801)))
    masks = [(m0 & (C["cond"] == c)) for c in conds]
    best = None
    for t in cands:
        f = score > t
        b = np.mean([lib.rates(C["scen"][m], f[m])[3] for m in masks])
        if best is None or b > best[1]:
            best = (t, b)
    return best


def candidates(F):
    S = {}
    for e in lib.ENC:
        S[f"{e}:snorm-pairwise"] = dmax(-F[f"{e}_sn"])
        S[f"{e}:snorm-reference"] = dmax(-F[f"{e}_snr"])
        S[f"{e}:z"] = dmax(F[f"{e}_z"])
        S[f"{e}:gap"] = dmax(F[f"{e}_gap"])
        S[f"{e}:snorm-gap"] = dmax(F[f"{e}_snz"])
    S["both:snorm-pairwise"] = dmax(-(F["ge2e_sn"] + F["campplus_sn"]))
    S["both:snorm-pw+ref"] = dmax(-(F["ge2e_sn"] + F["campplus_sn"] + np.nan_to_num(F["ge2e_snr"] + F["campplus_snr"])))
    S["both:z"] = dmax(F["ge2e_z"] + F["campplus_z"])
    S["both:snorm-gap"] = dmax(F["ge2e_snz"] + F["campplus_snz"])
    return S


if __name__ == "__main__":
    C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
    orc = lib.oracle_table(C, ex)
    res = {}
    for name, s in candidates(F).items():
        t, tb = global_tau(C, s, lib.TRAIN_CONDS)
        rows = lib.evaluate(C, s > t, orc)
        sm = lib.summary(rows)
        res[name] = (rows, sm, t, tb)
        print(f"{name:24s} trainBal={tb:5.2f} tau={t:+.3f}  eval: bar {sm['n_bar']}/25 (bal {sm['n_bal']}) S2 {sm['s2']} mean short {sm['mean_short']:.2f} worst {sm['worst']:.1f} meanBal {sm['mean_bal']:.2f}", flush=True)
    pickle.dump(res, open(lib.OUT / "design2a.pkl", "wb"))

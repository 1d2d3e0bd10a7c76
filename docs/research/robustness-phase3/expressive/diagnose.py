"""Diagnosis: why the served fused `auto` flags consistent speakers on an expressive condition.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/expressive/diagnose.py [SPLIT] [CONDITION]

Per instance: the served verdict (bit-identical to judges.evidence_flags, checked), which turn is flagged, its
emotion preset (nearest to its espeak-ng pitch/rate/amplitude), its per-encoder leave-one-out evidence and the
blend's logit split into today's `auto` part, the evidence model's bias and each feature's ramp term (main + level
curves), each times the stack's evidence weight. Compared with the intruder turns of the same dialogues (S2, S3)."""
import sys
from collections import Counter, defaultdict

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402

split = sys.argv[1] if len(sys.argv) > 1 else "eval"
cond = sys.argv[2] if len(sys.argv) > 2 else "b-espeak-expressive"
fcal, ev = common.load_models()
embs, insts = common.load(split, [cond])
meta = common.metas(split, [cond])
oc = judges.oracle(insts, "campplus", "pairwise")
og = judges.oracle(insts, "ge2e", "pairwise")
print(f"{split} {cond}: {len(insts)} instances; hindsight campplus:pairwise tau {oc.threshold:.3f} Bal {oc.bal:.1f} "
      f"({oc.S1:.0f}/{oc.S2:.0f}/{oc.S3:.0f}); ge2e:pairwise tau {og.threshold:.3f} Bal {og.bal:.1f} "
      f"({og.S1:.0f}/{og.S2:.0f}/{og.S3:.0f})")


def turn_spec(m, scen, pos):
    specs = m["meta"].get("specs") or []
    if scen != "S1" and pos == m["altered_turn"]:
        return specs[6 if scen == "S2" else 7] if len(specs) > 7 else None
    return specs[pos] if pos < len(specs) else None


rows = []  # one row per usable turn
for inst in insts:
    d = common.decompose(inst, ev, fcal)
    if d is None:
        continue
    m = meta[inst.dialogue_id]
    pw = {e: judges.paper_scores(inst.views[e], "pairwise") for e in ("ge2e", "campplus")}
    p = 1 / (1 + np.exp(-d["final"]))
    flagged_any = bool((p > 0.5).any())
    for k, pos in enumerate(d["index"]):
        spec = turn_spec(m, inst.scenario, int(pos))
        src = spec["src"] if spec else None
        ent = dict(
            dialogue=inst.dialogue_id, scen=inst.scenario, pos=int(pos), gold=int(pos) in inst.gold,
            flag=bool(p[k] > 0.5), inst_flag=flagged_any, p=float(p[k]), inside=d["inside"], final=float(d["final"][k]),
            auto_part=float(d["aclip"][k] * d["aw"][k]), aw=float(d["aw"][k]), ew=float(d["ew"][k]),
            sbias=float(d["sbias"][k]), zev=float(d["zev"][k]), model_bias=d["model_bias"],
            emo=common.emotion_of(src), ref_emo=common.emotion_of((m["meta"]["specs"][5] or {}).get("src")) if m["meta"].get("specs") else "?",
            pitch=(src or {}).get("p"), rate=(src or {}).get("s"), amp=(src or {}).get("a"),
        )
        for f, t in d["terms"].items():
            ent["T." + f] = float(t[k] * d["ew"][k])
        for e in ("ge2e", "campplus"):
            for f in ("own", "gap", "z", "excess", "ref", "ref_gap", "level"):
                if f in d["evidence"][e]:
                    ent[f"{e}.{f}"] = float(d["evidence"][e][f][k])
            v = inst.views[e]
            j = np.searchsorted(v.index, pos)
            ent[f"{e}.pairwise"] = float(pw[e][j]) if pw[e] is not None else np.nan
            ent[f"{e}.slevel"] = d["levels"][e]
        rows.append(ent)

S1 = [r for r in rows if r["scen"] == "S1"]
s1_inst = {r["dialogue"] for r in S1}
fa_inst = {r["dialogue"] for r in S1 if r["flag"]}
print(f"\nS1 instances {len(s1_inst)}, flagged {len(fa_inst)} ({100 * len(fa_inst) / len(s1_inst):.1f} %); "
      f"inside the gate: {sum(r['inside'] for r in S1) / max(len(S1), 1) * 100:.0f} % of S1 turns")
fa = [r for r in S1 if r["flag"]]
print(f"flagged turns in S1: {len(fa)} (per flagged instance {len(fa) / max(len(fa_inst), 1):.2f})")

# Which turn: rank of the flagged turn by each encoder's pairwise score within its dialogue.
by_dlg = defaultdict(list)
for r in S1:
    by_dlg[r["dialogue"]].append(r)
rank_c, rank_g, below_c = Counter(), Counter(), 0
for r in fa:
    others = by_dlg[r["dialogue"]]
    rank_c[sum(o["campplus.pairwise"] < r["campplus.pairwise"] for o in others)] += 1
    rank_g[sum(o["ge2e.pairwise"] < r["ge2e.pairwise"] for o in others)] += 1
    below_c += r["campplus.pairwise"] < oc.threshold
print("rank of the flagged turn among its speaker's turns (0 = lowest pairwise cosine): CAM++", dict(sorted(rank_c.items())),
      " GE2E", dict(sorted(rank_g.items())))
print(f"flagged S1 turns whose CAM++ pairwise is below the oracle's tau ({oc.threshold:.3f}): {below_c} of {len(fa)}")

# Emotion of the flagged turns against all S1 turns.
all_e = Counter(r["emo"] for r in S1)
fa_e = Counter(r["emo"] for r in fa)
print("\nemotion preset: S1 turns, flagged, rate flagged")
for e in sorted(all_e, key=lambda e: -fa_e[e] / all_e[e]):
    print(f"  {e:8s} {all_e[e]:4d} {fa_e[e]:4d} {100 * fa_e[e] / all_e[e]:5.1f} %")
# The flagged turn's emotion vs the reference's / the speaker's other turns'.
same_ref = sum(r["emo"] == r["ref_emo"] for r in fa)
print(f"flagged turn shares the reference's preset: {same_ref} of {len(fa)}")
uniq = 0
for r in fa:
    emos = [o["emo"] for o in by_dlg[r["dialogue"]]] + [r["ref_emo"]]
    uniq += emos.count(r["emo"]) == 1
print(f"flagged turn's preset appears nowhere else in its pool: {uniq} of {len(fa)}")
pitch_dev = []
for r in S1:
    others = [o for o in by_dlg[r["dialogue"]] if o is not r]
    r["pitch_dev"] = abs(r["pitch"] - np.median([o["pitch"] for o in others])) if r["pitch"] is not None else np.nan
    r["rate_dev"] = abs(r["rate"] - np.median([o["rate"] for o in others])) if r["rate"] is not None else np.nan
for key in ("pitch_dev", "rate_dev"):
    print(f"|{key}| from the speaker's other turns: flagged median {np.nanmedian([r[key] for r in fa]):.1f}, "
          f"unflagged S1 {np.nanmedian([r[key] for r in S1 if not r['flag']]):.1f}")

# Intruder turns of the same dialogues.
intr = {s: [r for r in rows if r["scen"] == s and r["gold"]] for s in ("S2", "S3")}
groups = {
    "S1 flagged (false alarm)": fa,
    "S1 not flagged, min-CAM++ turn": [min(v, key=lambda o: o["campplus.pairwise"]) for dlg, v in by_dlg.items() if dlg not in fa_inst],
    "S2 intruder": intr["S2"],
    "S3 intruder caught": [r for r in intr["S3"] if r["flag"]],
    "S3 intruder missed": [r for r in intr["S3"] if not r["flag"]],
    "S3 intruder, same dialogues as S1 FA": [r for r in intr["S3"] if r["dialogue"] in fa_inst],
}
feats = ["ge2e.own", "ge2e.gap", "ge2e.z", "ge2e.excess", "ge2e.ref", "ge2e.level", "campplus.own", "campplus.gap",
         "campplus.z", "campplus.excess", "campplus.ref", "campplus.level", "ge2e.pairwise", "campplus.pairwise"]
print("\nmedians of per-turn evidence (leave-one-out, cosine units)")
print(f"  {'group':38s} {'n':>4s} " + " ".join(f"{f:>17s}" for f in feats))
for name, g in groups.items():
    print(f"  {name:38s} {len(g):4d} " + " ".join(f"{np.nanmedian([r.get(f, np.nan) for r in g]):17.3f}" for f in feats))

tkeys = sorted({k for r in rows for k in r if k.startswith("T.")})
print("\nmean contribution to the blend's logit (final = stack bias + auto part + ew * (model bias + sum of terms))")
cols = ["final", "sbias", "auto_part", "ew", "zev"] + tkeys
print(f"  {'group':38s} " + " ".join(f"{c.replace('T.', ''):>14s}" for c in cols))
for name, g in groups.items():
    print(f"  {name:38s} " + " ".join(f"{np.mean([r.get(c, 0.0) for r in g]):14.2f}" for c in cols))
print(f"  (model bias {rows[0]['model_bias']:.2f}, times ew; variant context_reference for all with a reference)")
# Per encoder sums
for name, g in groups.items():
    ge = np.mean([sum(v for k, v in r.items() if k.startswith("T.ge2e")) for r in g])
    cp = np.mean([sum(v for k, v in r.items() if k.startswith("T.campplus")) for r in g])
    sec = np.mean([r.get("T.log_speech_seconds", 0.0) for r in g])
    print(f"  {name:38s} GE2E terms {ge:6.2f}  CAM++ terms {cp:6.2f}  seconds {sec:6.2f}")

print("\nflagged S1 turns, one per line")
for r in fa:
    print(f"  {r['dialogue']} turn {r['pos']} {r['emo']:8s} (ref {r['ref_emo']:8s}) p {r['p']:.2f} "
          f"GE2E own {r['ge2e.own']:.3f} gap {r['ge2e.gap']:+.3f} lvl {r['ge2e.level']:.3f} | CAM++ own {r['campplus.own']:.3f} "
          f"gap {r['campplus.gap']:+.3f} lvl {r['campplus.level']:.3f} pw {r['campplus.pairwise']:.3f} | "
          f"terms GE2E {sum(v for k, v in r.items() if k.startswith('T.ge2e')):+.2f} "
          f"CAM++ {sum(v for k, v in r.items() if k.startswith('T.campplus')):+.2f} auto {r['auto_part']:+.2f}")
import pickle, os  # noqa: E402
os.makedirs("runs/expressive", exist_ok=True)
pickle.dump(rows, open(f"runs/expressive/rows_{split}_{cond}.pkl", "wb"))

"""Screen: rules that clear a served flag on a turn whose CAM++ evidence stays high in absolute cosine units.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/expressive/screen.py SPLIT [CONDITIONS] [--root R]
        [--grid]  [--variant NAME:PARAM ...]

The served fused `auto` (the blend with every channel matching at the server's defaults, bit-identical to
judges.evidence_flags) judges each instance; a variant then UNFLAGS some of its flagged turns (it never adds a flag):

- ``abs:TAU``      clear a flagged turn whose CAM++ pairwise cosine (mean cosine to the speaker's other usable turns,
                   the hindsight oracle's statistic; on the views the blend judged, channel-matched copies included)
                   is >= TAU;
- ``absin:TAU``    the same, only for speakers inside the blend's gate (judged by today's `auto`);
- ``gap:D``        clear a flagged turn whose CAM++ evidence gap (``level - own``, leave-one-out, cosine units, the
                   evidence model's own feature) is < D;
- ``f0abs:DELTA:TAU``  clear a flagged turn whose median F0 (../bandwidth/f0_extract.py, the clip as sent) lies >= DELTA octaves from
                   the median F0 of the speaker's other usable turns and reference (a prosodic outlier) AND whose
                   CAM++ pairwise cosine is >= TAU;
- ``f0gap:DELTA:D``    the same with the CAM++ evidence gap < D instead of the absolute cosine;
- ``f0band:LO:HI:TAU``  as f0abs with the F0 deviation in [LO, HI) octaves: a jump of about an octave (another
                   gender's typical distance) is never cleared;
- ``f0both:DELTA:TAU:TAUG``  as f0abs, and also GE2E's pairwise cosine >= TAUG (both encoders must still find the
                   turn close to the speaker in absolute terms).

Per-turn statistics are cached in runs/expressive/turns_<split>_<root>.pkl. --grid prints mean Bal over the
conditions for each parameter (choose on train); --variant prints each condition against the served judgment,
paired over dialogues (sleuthd_bench.paired, 2000 resamples, 95 %).
"""
import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("conditions", nargs="?")
ap.add_argument("--root", type=Path, default=common.ROOT)
ap.add_argument("--grid", action="store_true")
ap.add_argument("--f0grid", action="store_true", help="with --grid: the F0-guarded rules' grids instead")
ap.add_argument("--bandgrid", action="store_true", help="with --grid: the f0band grid instead")
ap.add_argument("--bothgrid", action="store_true", help="with --grid: the f0both grid instead")
ap.add_argument("--dump", help="VARIANT: list every flag it clears (scenario, gold, F0 deviation, cosines)")
ap.add_argument("--variant", action="append", default=[])
args = ap.parse_args()
root = args.root
names = args.conditions.split(",") if args.conditions else [
    n for n in _conditions(None) if (root / f"{args.split}-{n}.jsonl").is_file()]
cache = Path(f"runs/expressive/turns_{args.split}_{root.name}.pkl")
table = pickle.loads(cache.read_bytes()) if cache.exists() else {}
todo = [n for n in names if n not in table]
if todo:
    fcal, ev = common.load_models()
    embs, insts = common.load(args.split, todo, root)
    for inst in insts:
        flagged, _, _ = judges.evidence_flags(inst, ev, fcal, *common.MATCH)
        d = common.decompose(inst, ev, fcal)
        turns = {}
        if d is not None:
            mi = judges.channel_matched(inst, *common.MATCH)
            pw = judges.paper_scores(mi.views["campplus"], "pairwise")
            cidx = mi.views["campplus"].index
            gpw = judges.paper_scores(mi.views["ge2e"], "pairwise")
            gidx = mi.views["ge2e"].index
            for k, pos in enumerate(d["index"]):
                j = int(np.searchsorted(cidx, pos))
                cam = float(pw[j]) if pw is not None and j < len(cidx) and cidx[j] == pos else np.nan
                j = int(np.searchsorted(gidx, pos))
                ge = float(gpw[j]) if gpw is not None and j < len(gidx) and gidx[j] == pos else np.nan
                turns[int(pos)] = dict(cam=cam, ge=ge, gap=float(d["evidence"]["campplus"]["gap"][k]),
                                       inside=bool(d["inside"]), flag=int(pos) in flagged)
        assert {p for p, t in turns.items() if t["flag"]} == set(flagged), inst.dialogue_id
        table.setdefault(inst.condition, []).append(dict(
            dialogue=inst.dialogue_id, scenario=inst.scenario, gold=inst.gold, flagged=flagged, turns=turns,
            cond=inst.condition))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(pickle.dumps(table))


from sleuthd_bench.instances import scenario_turns  # noqa: E402
from sleuthd_bench.manifest import read_manifest  # noqa: E402

_f0 = np.load(f"runs/expressive/f0_{root.name}.npz")
F0 = dict(zip(_f0["paths"].tolist(), _f0["f0"][:, 0].tolist()))
LINES = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{args.split}-{n}.jsonl")}


def f0_dev(rec, pos):
    """|F0 of the turn - median F0 of the speaker's other usable turns and reference|, octaves (NaN: unvoiced)."""
    line = LINES[rec["dialogue"]]
    turns = scenario_turns(line, rec["scenario"])
    mine = F0.get(turns[pos], np.nan)
    others = [F0.get(turns[p], np.nan) for p in rec["turns"] if p != pos] + [F0.get(line.reference, np.nan)]
    others = [o for o in others if np.isfinite(o)]
    return abs(mine - float(np.median(others))) if others and np.isfinite(mine) else np.nan


def apply(rec, kind, tau):
    keep = set()
    delta = None
    hi = np.inf
    if kind == "f0both":
        delta, tau = tau[0], tau[1:]
    elif kind == "f0band":
        delta, hi, tau = tau
    elif kind.startswith("f0"):
        delta, tau = tau
    for pos in rec["flagged"]:
        t = rec["turns"][pos]
        clear = False
        if delta is not None:
            dev = t.get("f0dev")
            if dev is None:
                dev = t["f0dev"] = f0_dev(rec, pos)
            if not (delta <= dev < hi):
                keep.add(pos)
                continue
        if kind in ("f0abs", "f0band"):
            clear = t["cam"] >= tau
        elif kind == "f0both":
            clear = t["cam"] >= tau[0] and t["ge"] >= tau[1]
        elif kind == "f0gap":
            clear = t["gap"] < tau
        if kind == "abs":
            clear = t["cam"] >= tau
        elif kind == "absin":
            clear = t["inside"] and t["cam"] >= tau
        elif kind == "gap":
            clear = t["gap"] < tau
        if not clear:
            keep.add(pos)
    return frozenset(keep)


def records(cond, flags_of):
    from sleuthd_bench.metrics import DetectionRecord
    return [DetectionRecord(r["dialogue"], cond, r["scenario"], r["gold"], f, bool(f))
            for r in table[cond] for f in [flags_of(r)]]


served = {c: records(c, lambda r: r["flagged"]) for c in names}
mserved = {c: judges.metrics(served[c]) for c in names}
if args.grid:
    grids = {"abs": np.round(np.arange(0.50, 0.86, 0.025), 3), "absin": np.round(np.arange(0.50, 0.86, 0.025), 3),
             "gap": np.round(np.arange(0.10, 0.42, 0.02), 3)}
    if args.bandgrid:
        grids = {"f0band": [(lo, hi, t) for lo in (0.3, 0.4, 0.5) for hi in (0.6, 0.65, 0.7, 0.75, 0.8, 0.9)
                            for t in (0.5, 0.55, 0.6, 0.65) if hi > lo]}
    elif args.bothgrid:
        grids = {"f0both": [(d, t, g) for d in (0.3, 0.4, 0.5) for t in (0.55, 0.6, 0.65)
                            for g in np.round(np.arange(0.70, 0.86, 0.025), 3)]}
    elif args.f0grid:
        grids = {"f0abs": [(d, t) for d in (0.1, 0.2, 0.3, 0.4, 0.5) for t in np.round(np.arange(0.45, 0.81, 0.05), 3)],
                 "f0gap": [(d, g) for d in (0.1, 0.2, 0.3, 0.4, 0.5) for g in np.round(np.arange(0.10, 0.42, 0.04), 3)]}
    base = np.mean([mserved[c]["bal"] for c in names])
    print(f"{args.split}: {len(names)} conditions; served mean Bal {base:.2f}")
    for kind, grid in grids.items():
        for tau in grid:
            ms = {c: judges.metrics(records(c, lambda r: apply(r, kind, tau))) for c in names}
            d = {c: ms[c]["bal"] - mserved[c]["bal"] for c in names}
            worst = min(d, key=d.get)
            label = ":".join(f"{v:g}" for v in tau) if isinstance(tau, tuple) else f"{tau:g}"
            print(f"  {kind}:{label:<9s} mean Bal {np.mean([m['bal'] for m in ms.values()]):6.2f} "
                  f"({np.mean(list(d.values())):+.2f}); worst {worst} {d[worst]:+.2f}; "
                  f"mean S1/S2/S3 {np.mean([m['S1'] for m in ms.values()]):.1f}/{np.mean([m['S2'] for m in ms.values()]):.1f}/"
                  f"{np.mean([m['S3'] for m in ms.values()]):.1f}", flush=True)
if args.dump:
    kind, _, tau = args.dump.partition(":")
    tau = tuple(float(v) for v in tau.split(":")) if kind.startswith("f0") else float(tau)
    print(f"{args.split}: flags cleared by {args.dump}")
    for c in names:
        for r in table[c]:
            for pos in sorted(r["flagged"] - apply(r, kind, tau)):
                t = r["turns"][pos]
                print(f"  {c:20s} {r['dialogue']:32s} {r['scenario']} turn {pos} {'INTRUDER' if pos in r['gold'] else 'genuine '}"
                      f" F0 dev {t.get('f0dev', np.nan):.2f} oct  CAM++ {t['cam']:.3f}  GE2E {t['ge']:.3f}  CAM++ gap {t['gap']:.3f}")
for spec in args.variant:
    kind, _, tau = spec.partition(":")
    tau = tuple(float(v) for v in tau.split(":")) if kind.startswith("f0") else float(tau)
    print(f"\n{args.split}: variant {spec} against the served fused `auto` (paired over dialogues, 95 % bootstrap)")
    print(f"| condition | served Bal (S1/S2/S3) | {spec} Bal (S1/S2/S3) | Δ Bal [95 % CI] | flags cleared |")
    print("| :--- | :--- | :--- | :--- | ---: |")
    means = []
    for c in names:
        rv = records(c, lambda r: apply(r, kind, tau))
        m, b = judges.metrics(rv), mserved[c]
        cmp = paired.compare(spec, rv, "served", served[c])
        cleared = sum(len(r["flagged"]) - len(apply(r, kind, tau)) for r in table[c])
        means.append((b["bal"], m["bal"]))
        print(f"| {c} | {b['bal']:.1f} ({b['S1']:.1f}/{b['S2']:.1f}/{b['S3']:.1f}) | {m['bal']:.1f} ({m['S1']:.1f}/"
              f"{m['S2']:.1f}/{m['S3']:.1f}) | {cmp.bal.difference:+.2f} [{cmp.bal.low:+.2f}, {cmp.bal.high:+.2f}] | {cleared} |",
              flush=True)
    b, v = np.array(means).T
    # The mean over the conditions, paired: each condition's dialogues resampled on their own (2000 times, seed 0).
    lo, hi = common.paired_mean_interval([(served[c], records(c, lambda r: apply(r, kind, tau))) for c in names])
    print(f"| mean of {len(names)} | {b.mean():.2f} | {v.mean():.2f} | {v.mean() - b.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] | |")

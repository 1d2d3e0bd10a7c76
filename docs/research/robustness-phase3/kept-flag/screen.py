"""Screen: may channel matching clear a turn pitched another gender away? The served judgment (channel and pitch
matching at the server's defaults) with one change: a turn the blend flags on the clips as sent, that channel matching
then clears, stays flagged when its median pitch lies TAU octaves or more from the median of the speaker's other pieces
(usable turns and reference). Why: f-fsdd-drift misses 10 % of its opposite-gender intruders (the only miss of the S2
bar), and the intruder's evidence is there as sent and lost in the channel-matched copies; a jump of half an octave or
more is what pitch matching already treats as another gender's voice (its ceiling). Unlike Screen 2 (F0 OR-ed with the
blend everywhere), the rule can only act where channel matching cleared an as-sent flag.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/kept-flag/screen.py train|eval [--tau 0.5,0.6,...]

Refused instances (an unusable reference) are left out, as the report does. Paired bootstrap over dialogues, 2000
resamples, 95 %."""
import argparse
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import embed, judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions, pitch_matching  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--tau", default="0.5,0.6,0.7,0.8,1.0")
ap.add_argument("--dump", type=float)
args = ap.parse_args()
names = [n for n in _conditions(None) if (common.ROOT / f"{args.split}-{n}.jsonl").is_file()]
_, insts = common.load(args.split, names)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
pitch = pitch_matching(common.ROOT, EngineConfig().pitch_match_octaves)
pitches = embed.load_pitches(common.ROOT)
rows = []
for i in insts:
    served = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch)[0]
    sent = judges.evidence_flags(i, ev, fcal)[0]
    index = i.views["fused"].index.tolist()
    pieces = [i.paths[k] for k in index] + [i.reference_path]
    pv = [pitches.get(p, np.nan) for p in pieces]
    dist = {}
    for j, pos in enumerate(index):
        others = [v for k, v in enumerate(pv) if k != j and np.isfinite(v)]
        if np.isfinite(pv[j]) and others:
            dist[pos] = abs(pv[j] - float(np.median(others)))
    rows.append((i, served, sent - served, dist))


def flags(tau):
    return {(i.dialogue_id, i.scenario): served | {t for t in cleared if dist.get(t, 0.0) >= tau}
            for i, served, cleared, dist in rows}


base = flags(np.inf)


def records(f, cond):
    return [judges.record(i, f[(i.dialogue_id, i.scenario)]) for i, *_ in rows if i.condition == cond]


print(f"{args.split}: {len(names)} conditions, {len(rows)} instances; instances where channel matching cleared an "
      f"as-sent flag: {sum(bool(c) for _, _, c, _ in rows)}")
for tau in [float(t) for t in args.tau.split(",")]:
    f = flags(tau)
    changed = [c for c in names if any(f[k] != base[k] for k in f if k[0].startswith(c + "-"))]
    out = []
    for c in names:
        a, b = records(f, c), records(base, c)
        if a == b or all(x.pred_turns == y.pred_turns for x, y in zip(a, b)):
            continue
        d = paired.compare("tau", a, "served", b).bal
        ma, mb = judges.metrics(a), judges.metrics(b)
        out.append(f"{c} {mb['bal']:.1f}->{ma['bal']:.1f} (S1 {mb['S1']:.1f}->{ma['S1']:.1f}, S2 {mb['S2']:.1f}->"
                   f"{ma['S2']:.1f}, S3 {mb['S3']:.1f}->{ma['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    mean = np.mean([judges.metrics(records(f, c))["bal"] for c in names])
    mean0 = np.mean([judges.metrics(records(base, c))["bal"] for c in names])
    print(f"\ntau {tau:g}: mean Bal {mean0:.2f} -> {mean:.2f} ({mean - mean0:+.2f})")
    for line in out:
        print("  " + line)
if args.dump is not None:
    f = flags(args.dump)
    for i, served, cleared, dist in rows:
        k = (i.dialogue_id, i.scenario)
        if f[k] != served:
            print(f"  {i.condition:18s} {i.dialogue_id:24s} {i.scenario} gold {sorted(i.gold)} served {sorted(served)} "
                  f"-> {sorted(f[k])}  dist {{{', '.join(f'{t}: {dist.get(t, np.nan):.2f}' for t in sorted(cleared))}}}")

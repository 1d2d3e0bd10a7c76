"""Screen: a turn that is a clear CAM++ outlier of its speaker is flagged whatever the blend says. Why: in long
dialogues of short turns (25-50 turns of 1.2-1.6 s, espeak-ng m3, one 1.2 s turn of f2) the served judgment calls the
opposite-gender turn consistent (probability 0.44-0.46) while its mean CAM++ cosine to the speaker's other turns lies
0.36 under their own level (genuine turns: at worst 0.13 under); the matrix (5 turns a speaker) never shows this. The
rule: on the views the server judges (channel-matched where it channel matches), a usable turn whose CAM++ guard
margin (pitch matching's guard_margin: its mean cosine to the other pieces minus the median of their mean cosines to
each other; reference included) is under -TAU is flagged too. Only adds flags. Nothing fitted but TAU.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/outlier/screen.py train|eval [--tau ...]
"""
import argparse
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.api import GUARD_ENCODER, guard_margin  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import embed, judges  # noqa: E402
from sleuthd_bench.robustness.cli import length_matching, pitch_matching  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--tau", default="0.2,0.25,0.3,0.35,0.4")
ap.add_argument("--root", default=str(common.ROOT))
ap.add_argument("--skip-pitch-band", action="store_true",
                help="not for a turn pitched 0.25-0.5 octave from the speaker's other pieces (pitch matching's band)")
args = ap.parse_args()
from pathlib import Path  # noqa: E402

ROOT = Path(args.root)
names = sorted(p.name[len(args.split) + 1 : -len(".jsonl")] for p in ROOT.glob(f"{args.split}-*.jsonl"))
_, insts = common.load(args.split, names, ROOT)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
cfg = EngineConfig()
pitch = pitch_matching(ROOT, cfg.pitch_match_octaves)
length = length_matching(ROOT, cfg.length_match_ratio)
pitches = embed.load_pitches(ROOT)
rows = []
for i in insts:
    served = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch, length)[0]
    m = judges.channel_matched(i, *common.MATCH)
    grams, has_ref, seconds, index = judges.evidence_inputs(m)
    g = grams[GUARD_ENCODER]
    margins = {}
    pieces = [i.paths[k] for k in index.tolist()] + ([i.reference_path] if has_ref else [])
    pv = [pitches.get(p, np.nan) for p in pieces]
    if len(g) >= 3:
        for j, pos in enumerate(index.tolist()):
            others = [v for k, v in enumerate(pv) if k != j and np.isfinite(v)]
            dist = abs(pv[j] - float(np.median(others))) if np.isfinite(pv[j]) and others else np.nan
            if args.skip_pitch_band and 0.25 <= dist < 0.5:
                continue
            margins[pos] = guard_margin(g, [int(has_ref) + j])
    rows.append((i, served, margins))


def flags(tau):
    return {(i.dialogue_id, i.scenario): served | {p for p, v in margins.items() if v < -tau}
            for i, served, margins in rows}


base = flags(np.inf)


def records(f, cond):
    return [judges.record(i, f[(i.dialogue_id, i.scenario)]) for i, *_ in rows if i.condition == cond]


print(f"{args.split}: {len(names)} conditions, {len(rows)} instances")
for tau in [float(t) for t in args.tau.split(",")]:
    f = flags(tau)
    out = []
    for c in names:
        a, b = records(f, c), records(base, c)
        if all(x.pred_turns == y.pred_turns for x, y in zip(a, b)):
            continue
        d = paired.compare("rule", a, "served", b).bal
        ma, mb = judges.metrics(a), judges.metrics(b)
        out.append(f"{c} {mb['bal']:.1f}->{ma['bal']:.1f} (S1 {mb['S1']:.1f}->{ma['S1']:.1f}, S2 {mb['S2']:.1f}->"
                   f"{ma['S2']:.1f}, S3 {mb['S3']:.1f}->{ma['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    mean = np.mean([judges.metrics(records(f, c))["bal"] for c in names])
    mean0 = np.mean([judges.metrics(records(base, c))["bal"] for c in names])
    print(f"\ntau {tau:g}: mean Bal {mean0:.2f} -> {mean:.2f} ({mean - mean0:+.2f})")
    for line in out:
        print("  " + line)

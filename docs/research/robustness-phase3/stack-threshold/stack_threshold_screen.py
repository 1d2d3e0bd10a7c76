"""Screen 7 (2026-11-27, session 20): the stack's own decision threshold (outside the gate; inside it today's 0.5
stays), swept on a split; with MATCHED_ONLY=1, for channel-matched speakers only (the others keep 0.5). Run from the
repository root:

    [MATCHED_ONLY=1] PYTHONPATH=service:tools:. python docs/research/robustness-phase3/stack-threshold/stack_threshold_screen.py train [TAU]
"""
import os
import sys, numpy as np
from pathlib import Path
from sleuthd.api import SpeakerEncoder
from sleuthd.config import EngineConfig
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all
ROOT = Path("data/robustness")
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
auto = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw); cfg = EngineConfig()
TAUS = [0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]

def per_instance(split):
    conds = sorted(f.name.removeprefix(f"{split}-").removesuffix(".jsonl") for f in ROOT.glob(f"{split}-*.jsonl"))
    _, insts = _load_all(ROOT, split, conds)
    out = []
    for inst in insts:
        i = judges.channel_matched(inst, cfg.band_match_octaves, cfg.clip_match_spread, cfg.noise_match_db)
        matched = i is not inst
        grams, has_ref, seconds, index = judges.evidence_inputs(i)
        logits = judges.auto_logits(i.views["fused"], auto) if len(seconds) and (len(seconds) > 1 or has_ref) else None
        v = ev.judge(grams, has_ref, seconds, auto_logit=logits)
        out.append((inst, v, index, matched))
    return conds, out

MATCHED_ONLY = os.environ.get("MATCHED_ONLY") == "1"

def flags_at(v, index, tau, matched):
    if v is None: return frozenset()
    t = 0.5 if v.inside or (MATCHED_ONLY and not matched) else tau
    return frozenset(int(k) for k in index[v.probability > t])

def table(conds, rows, tau):
    recs = {c: [] for c in conds}
    for inst, v, index, matched in rows:
        recs[inst.condition].append(judges.record(inst, flags_at(v, index, tau, matched)))
    return recs

res = {}
for split in sys.argv[1].split(","):
    conds, rows = per_instance(split)
    base = table(conds, rows, 0.5)
    print(f"\n{split}: mean Bal / min S2 over conditions with S2<100 / conditions by tau")
    for tau in TAUS:
        recs = table(conds, rows, tau)
        ms = {c: judges.metrics(recs[c]) for c in conds}
        line = f"tau {tau:.2f}: mean Bal {np.mean([m['bal'] for m in ms.values()]):.2f} mean S1 {np.mean([m['S1'] for m in ms.values()]):.1f} mean S2 {np.mean([m['S2'] for m in ms.values()]):.1f} mean S3 {np.mean([m['S3'] for m in ms.values()]):.1f}"
        print(line, flush=True)
    if len(sys.argv) > 2:
        tau = float(sys.argv[2]); recs = table(conds, rows, tau)
        print(f"\n{split} at tau {tau} vs 0.5, per condition:")
        for c in conds:
            a, b = judges.metrics(base[c]), judges.metrics(recs[c])
            if a == b: continue
            d = paired.compare("tau", recs[c], "served", base[c], resamples=2000).bal
            print(f"| {c} | {a['bal']:.1f} ({a['S1']:.0f}/{a['S2']:.0f}/{a['S3']:.0f}) | {b['bal']:.1f} ({b['S1']:.0f}/{b['S2']:.0f}/{b['S3']:.0f}) | {d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}] |")

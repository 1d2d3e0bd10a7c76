"""Clip matching served (session 19): the offline judges (verified equal to the server, verify.txt) with and without
clip matching, paired over dialogues per condition (2000 resamples), and the mean balanced accuracy. Run from the
repository root after `sleuthd-bench robustness embed --clipped --split eval`:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/clip/served/paired.py
"""
import numpy as np
from pathlib import Path
from sleuthd.api import SpeakerEncoder
from sleuthd.config import EngineConfig
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _conditions, _load_all

names = _conditions(None)
_, instances = _load_all(Path("data/robustness"), "eval", names)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal, blend = Calibration.from_manifest(raw, "fused"), EvidenceCalibration.from_manifest(raw)
octaves, spread = EngineConfig().band_match_octaves, EngineConfig().clip_match_spread
means = {"off": [], "on": []}
print(f"{'condition':20s} {'band only':>24s} {'band + clip':>24s}  delta [95 % CI]  clip-matched")
for c in names:
    insts = [i for i in instances if i.condition == c]
    off = [judges.record(i, judges.evidence_flags(i, blend, fcal, octaves, 0.0)[0]) for i in insts]
    on = [judges.record(i, judges.evidence_flags(i, blend, fcal, octaves, spread)[0]) for i in insts]
    matched = sum(i.clip_matched(spread, 0 < octaves < i.band_octaves) is not None for i in insts)
    a, b = judges.metrics(off), judges.metrics(on)
    d = paired.compare("on", on, "off", off)
    means["off"].append(a["bal"]); means["on"].append(b["bal"])
    fmt = lambda m: f"{m['bal']:5.1f} ({m['S1']:.1f}/{m['S2']:.1f}/{m['S3']:.1f})"
    print(f"{c:20s} {fmt(a):>24s} {fmt(b):>24s}  {d.bal.difference:+.1f} [{d.bal.low:+.1f}, {d.bal.high:+.1f}]  {matched}")
print(f"mean Bal over {len(names)} conditions: band only {np.mean(means['off']):.2f}, band + clip {np.mean(means['on']):.2f}")

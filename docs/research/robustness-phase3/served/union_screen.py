"""Screen: keep band matching's verdicts, and also keep a full-band flag on a turn that is NOT its speaker's
bandwidth outlier (more than D octaves from the median of the speaker's other pieces): the codec false alarms band
matching removes are on outlier turns, while intruders sit at ~0 octave from the others. Offline, eval split."""
import json, sys
from dataclasses import replace
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.cli import _conditions, _load_all
from sleuthd_bench.robustness.report import ORACLE_ENCODERS

root = Path("data/robustness")
split = sys.argv[1] if len(sys.argv) > 1 else "eval"
ds = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0.2,0.3,0.5").split(",")]
bw = embed.load_bandwidths(root)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
names = [n for n in _conditions(None) if (root / f"{split}-{n}.jsonl").is_file()]
embs, instances = _load_all(root, split, names)
lines = {(l.dialogue_id): l for n in names for l in read_manifest(root / f"{split}-{n}.jsonl")}
rows = {d: [] for d in ds}
base_all, band_all = [], []
for cond in names:
    insts = [i for i in instances if i.condition == cond]
    wide = [judges.evidence_flags(i, ev, fcal, 0.0)[0] for i in insts]
    band = [judges.evidence_flags(i, ev, fcal, 0.3)[0] for i in insts]
    rb = [judges.record(i, f) for i, f in zip(insts, band)]
    mb = judges.metrics(rb)
    out = f"{cond:20s} band {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f})"
    for d in ds:
        mixed = []
        for i, w, b in zip(insts, wide, band):
            if not i.band_matched(0.3):
                mixed.append(b); continue
            line = lines[i.dialogue_id]
            turns = scenario_turns(line, i.scenario)
            logs = np.log2([bw[p] if np.isfinite(bw[p]) and bw[p] > 0 else np.nan for p in [*turns, line.reference]])
            keep = set(b)
            for k in w:
                others = np.delete(logs, k)
                if np.isfinite(logs[k]) and abs(logs[k] - np.nanmedian(others)) <= d:
                    keep.add(k)  # flagged at full band, and not a bandwidth outlier: the flag stands
            mixed.append(frozenset(keep))
        rm = [judges.record(i, f) for i, f in zip(insts, mixed)]
        m = judges.metrics(rm)
        c = paired.compare("union", rm, "band", rb)
        rows[d].append(m["bal"])
        out += f" | D{d}: {m['bal']:5.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) {c.bal.difference:+.1f} [{c.bal.low:+.1f},{c.bal.high:+.1f}]"
    band_all.append(mb["bal"])
    print(out, flush=True)
print("mean Bal: band", round(float(np.mean(band_all)), 2), {d: round(float(np.mean(v)), 2) for d, v in rows.items()})

"""Paired comparison, eval split, both served with band matching: the blend refitted on band-matched training
dialogues (refit_band.py's output, argv[1]) against the shipped blend."""
import json, sys
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.cli import _conditions, _load_all

root = Path("data/robustness")
names = [n for n in _conditions(None) if (root / f"eval-{n}.jsonl").is_file()]
embs, instances = _load_all(root, "eval", names)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); shipped = EvidenceCalibration.from_manifest(raw)
sha = {e: embs[e].weights_sha256 for e in embed.ENCODERS}
refit = EvidenceCalibration.from_json(json.loads(Path(sys.argv[1]).read_text()), sha)
means = {"shipped": [], "refit": []}
for cond in names:
    insts = [i for i in instances if i.condition == cond]
    a = [judges.record(i, judges.evidence_flags(i, refit, fcal, 0.3)[0]) for i in insts]
    b = [judges.record(i, judges.evidence_flags(i, shipped, fcal, 0.3)[0]) for i in insts]
    ma, mb = judges.metrics(a), judges.metrics(b)
    c = paired.compare("refit", a, "shipped", b)
    means["refit"].append(ma["bal"]); means["shipped"].append(mb["bal"])
    print(f"{cond:20s} shipped {mb['bal']:5.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) | refit {ma['bal']:5.1f} "
          f"({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) | d {c.bal.difference:+.1f} [{c.bal.low:+.1f}, {c.bal.high:+.1f}]", flush=True)
print("mean Bal:", {k: round(float(np.mean(v)), 2) for k, v in means.items()})

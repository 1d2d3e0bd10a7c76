"""Screen: judge a dialogue whose pieces' bandwidths differ by more than SPREAD octaves on narrowband copies of
every piece (compare at the common bandwidth); otherwise as served. The served blend judges both."""
import json, sys
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.metrics import SCENARIOS
from sleuthd_bench import paired
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.embed import Embeddings
from sleuthd_bench.robustness.instances import load_instances
from sleuthd_bench.robustness.report import ORACLE_ENCODERS
root = Path("data/robustness")
z = np.load("runs/f0/bw.npz"); BW = dict(zip(z["paths"], z["bw"]))
embs = {e: embed.load(root, e) for e in embed.ENCODERS}
nb = {}
for e in embed.ENCODERS:
    x = embed.load(Path(__import__("os").environ.get("NB", "runs/nb")), e)
    nb[e] = Embeddings(e, x.weights_sha256, [p.removesuffix(".wav") for p in x.paths], x.vectors, x.speech_seconds, x.audio_seconds)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused")
ev = EvidenceCalibration.from_json(json.loads(Path("service/sleuthd/cards/evidence.json").read_text()),
                                   {e: embs[e].weights_sha256 for e in embed.ENCODERS})
conds = sys.argv[1].split(",")
spreads = [float(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [0.3, 0.5]
split = sys.argv[3] if len(sys.argv) > 3 else "eval"
cap = float(sys.argv[4]) if len(sys.argv) > 4 else 99.0  # also require the narrowest piece below cap kHz
means = {s: [] for s in spreads}; means_base = []
for cond in conds:
    a = load_instances(root, split, [cond], embs)
    b = load_instances(root, split, [cond], nb)
    spread = []
    for line in read_manifest(root / f"{split}-{cond}.jsonl"):
        for sc in SCENARIOS:
            bw = np.log2([BW[p] for p in scenario_turns(line, sc)] + [BW[line.reference]])
            spread.append(float(np.nanmax(bw) - np.nanmin(bw)) if 2 ** np.nanmin(bw) < cap * 1000 else 0.0)
    fa = [judges.evidence_flags(i, ev, fcal)[0] for i in a]
    fb = [judges.evidence_flags(i, ev, fcal)[0] for i in b]
    best = max((judges.oracle(a, e, m) for e in ORACLE_ENCODERS for m in judges.PAPER), key=lambda o: o.bal if o else -1)
    base = [judges.record(i, f) for i, f in zip(a, fa)]
    allnb = [judges.record(i, f) for i, f in zip(a, fb)]
    mb, mn = judges.metrics(base), judges.metrics(allnb)
    row = f"{cond:16s} oracle {best.bal:5.1f} | served {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f}) | all narrowband {mn['bal']:5.1f} ({mn['S1']:.0f}/{mn['S2']:.0f}/{mn['S3']:.0f})"
    for s in spreads:
        mix = [judges.record(i, fbb if sp > s else faa) for i, faa, fbb, sp in zip(a, fa, fb, spread)]
        m = judges.metrics(mix)
        means[s].append(m["bal"])
        c = paired.compare("mix", mix, "served", base)
        row += f" | swap>{s}: {m['bal']:5.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) d {c.bal.difference:+.1f} [{c.bal.low:+.1f},{c.bal.high:+.1f}] swapped {np.mean([sp > s for sp in spread]):.2f}"
    means_base.append(mb["bal"])
    print(row, flush=True)
print("mean Bal over these conditions: served", round(float(np.mean(means_base)), 2),
      {s: round(float(np.mean(v)), 2) for s, v in means.items()})

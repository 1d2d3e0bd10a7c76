import json
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.metrics import SCENARIOS
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.instances import load_instances
root = Path("data/robustness")
z = np.load("runs/f0/bw.npz"); BW = dict(zip(z["paths"], z["bw"]))
embs = {e: embed.load(root, e) for e in embed.ENCODERS}
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused")
ev = EvidenceCalibration.from_json(json.loads(Path("service/sleuthd/cards/evidence.json").read_text()),
                                   {e: embs[e].weights_sha256 for e in embed.ENCODERS})
for cond in ["d-opus", "d-noise", "e-drift", "f-fsdd-drift", "d-clip", "d-loud", "d-mp3", "b-espeak-expressive", "g-kokoro-drift", "ctrl-espeak"]:
    insts = load_instances(root, "eval", [cond], embs)
    bws = []
    for line in read_manifest(root / f"eval-{cond}.jsonl"):
        for sc in SCENARIOS:
            turns = scenario_turns(line, sc)
            bws.append(np.log2(np.array([BW.get(p, np.nan) for p in turns] + [BW.get(line.reference, np.nan)])))
    s1_hit, s1_fl, dev_fl, dev_all, intr_dev = 0, 0, [], [], []
    for inst, b in zip(insts, bws):
        flagged, _, _ = judges.evidence_flags(inst, ev, fcal)
        d = np.array([abs(b[i] - np.nanmedian(np.delete(b, i))) for i in range(len(b) - 1)])
        if inst.scenario == "S1":
            dev_all += list(d)
            if flagged:
                s1_fl += 1
                k = next(iter(flagged))
                s1_hit += int(np.nanargmax(d) == k)
                dev_fl += [d[k] for k in flagged]
        else:
            intr_dev += [d[k] for k in inst.gold]
    print(f"{cond:20s} S1 flagged {s1_fl:3d}, flagged turn is the bandwidth outlier {s1_hit:3d}; "
          f"octave dev: flagged S1 turns median {np.median(dev_fl) if dev_fl else float('nan'):.2f}, all S1 turns {np.median(dev_all):.2f} (p90 {np.percentile(dev_all,90):.2f}), intruders {np.median(intr_dev):.2f}")

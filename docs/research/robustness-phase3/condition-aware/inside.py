"""Per instance: is the speaker inside the served blend's gate (today's `auto` calibration judges it)?
Saved to runs/screen27/inside.npz (eval rows of cache.npz order; dev rows of cache-dev.npz order)."""
import json, numpy as np
from pathlib import Path
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.instances import load_instances
from sleuthd.api import SpeakerEncoder
from sleuthd.config import default_models_dir
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
import lib

enc = SpeakerEncoder.load(default_models_dir(), encoder="fused"); raw = enc.manifest.raw; enc.close()
auto = Calibration.from_manifest(raw, "fused")
out = {}
for key, root, conds in (("eval", Path("data/robustness"), lib.EVAL_CONDS), ("dev", Path("data/devlarge"), ["dev-fit", "dev-transfer", "dev-fsdd"])):
    embs = {e: embed.load(root, e) for e in embed.ENCODERS}
    cal = EvidenceCalibration.from_json(json.loads(Path("service/sleuthd/cards/evidence.json").read_text()),
                                        {e: embs[e].weights_sha256 for e in embed.ENCODERS})
    ins = []
    for inst in load_instances(root, "eval", conds, embs):
        grams, has_ref, seconds, index = judges.evidence_inputs(inst)
        if not len(seconds) or (len(seconds) < 2 and not has_ref):
            ins.append(True); continue
        v = cal.judge(grams, has_ref, seconds, auto_logit=judges.auto_logits(inst.views["fused"], auto))
        ins.append(True if v is None else bool(v.inside))
    out[key] = np.array(ins)
    print(key, out[key].mean())
np.savez(lib.OUT / "inside.npz", **out)

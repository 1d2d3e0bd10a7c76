"""Screen: the evidence model and the blend refitted on band-matched training dialogues (every train instance that
band matching judges on narrowband copies is fitted on those copies, as it will be judged), as
`sleuthd-bench calibrate fit-evidence` fits them otherwise. Writes the calibration to argv[1]."""
import dataclasses, json, sys
from pathlib import Path
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd_bench.robustness import fit
from sleuthd_bench.robustness.cli import _conditions, _load_all, _progress

import sleuthd_bench.manifest as manifest_module
from sleuthd_bench.robustness import instances as instances_module
# The support set's embeddings are cached in its folder; its audio need not be on disk for a fit (this machine's
# dev corpus audio was lost on 2026-11-27; the manifests and embeddings remain).
instances_module.read_manifest = lambda path: manifest_module.read_manifest(path, check_audio=False)
out = Path(sys.argv[1]); octaves = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
data = Path("data/robustness"); support_path = Path("data/devlarge/eval-dev-fit.jsonl")
names = [n for n in _conditions(None) if (data / f"train-{n}.jsonl").is_file()]
_, support = _load_all(support_path.parent, "eval", ["dev-fit"])
embs, instances = _load_all(data, "train", names)
matched = 0
for k, inst in enumerate(instances):
    if inst.band_matched(octaves):
        instances[k] = dataclasses.replace(inst, views=inst.narrow_views); matched += 1
print(f"{matched} of {len(instances)} train instances fitted on their narrowband copies", flush=True)
models, extra = fit.fit(instances, seed=0)
encoder = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = encoder.manifest.raw; encoder.close()
auto = Calibration.from_manifest(raw, "fused")
blend, stats = fit.fit_blend(instances, auto, raw["calibration"], support, 0, _progress("blend"))
extra["fit_stats"]["blend"] = stats
block = fit.calibration_block(models, extra, {e: embs[e].weights_sha256 for e in embs},
                              f"{data} train split, band-matched at {octaves} octave", 0, blend, "as fit-evidence")
out.write_text(json.dumps(block, indent=1) + "\n")
print("wrote", out)

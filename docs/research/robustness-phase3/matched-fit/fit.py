"""The evidence model and blend refitted on what the server judges: every train instance through channel matching at
the server's defaults (judges.channel_matched) before its rows are made, as `sleuthd-bench calibrate fit-evidence`
does otherwise (same code, same seed, same support).

    python fit.py OUT.json [--exclude-groups a]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.api import SpeakerEncoder  # noqa: E402
from sleuthd.judgment.calibration import Calibration  # noqa: E402
from sleuthd_bench.robustness import fit, judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions, _load_all  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out", type=Path)
ap.add_argument("--exclude-groups")
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
data = Path("data/robustness")
names = [n for n in _conditions(None, args.exclude_groups or "") if (data / f"train-{n}.jsonl").is_file()]
_, support = _load_all(Path("data/devlarge"), "eval", ["dev-fit"])
embs, instances = _load_all(data, "train", names)
matched = [judges.channel_matched(i, *common.MATCH) for i in instances]
print(f"{sum(m is not i for m, i in zip(matched, instances))} of {len(instances)} train instances judged on copies",
      flush=True)
models, extra = fit.fit(matched, seed=args.seed)
encoder = SpeakerEncoder.load(Path("models"), encoder="fused")
raw = encoder.manifest.raw
encoder.close()
auto = Calibration.from_manifest(raw, "fused")
blend, stats = fit.fit_blend(matched, auto, raw["calibration"], support, args.seed, None)
extra["fit_stats"]["blend"] = stats
label = f"{data} train split, channel-matched views" + (f", groups {args.exclude_groups} left out" if args.exclude_groups else "")
block = fit.calibration_block(models, extra, {e: embs[e].weights_sha256 for e in embs}, label, args.seed, blend,
                              "as the served card, with every train instance judged on its channel-matched views")
args.out.parent.mkdir(parents=True, exist_ok=True)
args.out.write_text(json.dumps(block, indent=1) + "\n")
print(f"wrote {args.out}")

"""Leave one condition group out, judged as served (channel and pitch matching at the server's defaults): the
evidence model and blend refitted on the current train split with every group, without group (a), without group (b)
(`sleuthd-bench calibrate fit-evidence [--exclude-groups a|b] --out runs/robustness/evidence-blend-{all,without-a,
without-b}.json`), each judged on the eval split; per condition Bal (S1/S2/S3) and the paired bootstrap (over
dialogues, 2000 resamples, 95 %) of each refit left without a group against the refit with every group.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/loco/loco.py > .../loco.txt
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd.judgment.evidence import EvidenceCalibration  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions, pitch_matching  # noqa: E402

names = [n for n in _conditions(None) if (common.ROOT / f"eval-{n}.jsonl").is_file()]
embs, insts = common.load("eval", names)
insts = [i for i in insts if not i.refused]  # the server answers these with INVALID_ARGUMENT (unusable reference)
fcal, served = common.load_models()
sha = {e: embs[e].weights_sha256 for e in ("ge2e", "campplus")}
fits = {"served": served}
for label in ("all", "without-a", "without-b"):
    block = json.loads(Path(f"runs/robustness/evidence-blend-{label}.json").read_text())
    fits[label] = EvidenceCalibration.from_json(block, sha)
pitch = pitch_matching(common.ROOT, EngineConfig().pitch_match_octaves)
records = {k: {c: [] for c in names} for k in fits}
for inst in insts:
    for label, cal in fits.items():
        flags = judges.evidence_flags(inst, cal, fcal, *common.MATCH, pitch)[0]
        records[label][inst.condition].append(judges.record(inst, flags))
left_out = {"without-a": ("a-espeak-lang", "a-kokoro-lang", "x-de-expressive-2s"),
            "without-b": ("b-espeak-expressive", "b-espeak-sox", "b-kokoro-speed", "x-de-expressive-2s")}


def cell(rs):
    m = judges.metrics(rs)
    return f"{m['bal']:.1f} ({m['S1']:.1f}/{m['S2']:.1f}/{m['S3']:.1f})"


print("| condition | served card | refit, all groups | without (a) | Δ vs all [95 % CI] | without (b) | Δ vs all [95 % CI] |")
print("| :--- | :--- | :--- | :--- | :--- | :--- | :--- |")
for c in names:
    row = [cell(records["served"][c]), cell(records["all"][c])]
    for label in ("without-a", "without-b"):
        d = paired.compare(label, records[label][c], "all", records["all"][c]).bal
        held = c in left_out[label]
        mark = "**" if held else ""
        row += [f"{mark}{cell(records[label][c])}{mark}", f"{d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"]
    print(f"| {c} | " + " | ".join(row) + " |")
means = {k: np.mean([judges.metrics(v[c])["bal"] for c in names]) for k, v in records.items()}
print("\nmean Bal over the 25 conditions: " + ", ".join(f"{k} {v:.2f}" for k, v in means.items()))
print("bold: the conditions the refit never saw (x-de-expressive-2s is left out of both: another language, expressive)")

"""Screen 9: which turn of a consistent speaker (S1) the served judgment with Screen 8 (band, clip, noise matching;
noise composed at 6 dB; no telephone band) flags under channel drift, by the channel the turn went through (eval)."""
import json, collections
from pathlib import Path
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all
root = Path("data/robustness")
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
for cond in ["e-drift", "g-kokoro-drift", "f-fsdd-drift"]:
    metas = {json.loads(l)["dialogue_id"]: json.loads(l)["meta"] for l in (root / f"eval-{cond}.jsonl").read_text().splitlines()}
    _, insts = _load_all(root, "eval", [cond])
    flagged_ch, all_ch = collections.Counter(), collections.Counter()
    kinds = collections.Counter()
    for i in insts:
        if i.scenario != "S1": continue
        f, _, _ = judges.evidence_flags(i, ev, fcal, 0.3, 0.005, 3.0, 6.0)
        ch = metas[i.dialogue_id]["channels"][:5]
        all_ch.update(ch)
        matched = "composed" if i.composed_matched(6.0, i.band_mixed(0.3), i.clip_mixed(0.005)) is not None else ("clip" if i.clip_matched(0.005, i.band_mixed(0.3)) is not None else ("band" if i.band_matched(0.3) else ("noise" if (not i.band_mixed(0.3) and not i.clip_mixed(0.005) and i.noise_matched(3.0) is not None) else "none")))
        kinds[(matched, bool(f))] += 1
        for k in f:
            flagged_ch[ch[k]] += 1
    print(cond, "flagged turns by channel:", dict(flagged_ch.most_common()))
    print("   share of turns of that channel flagged:", {c: f"{flagged_ch[c]/all_ch[c]:.2f}" for c in all_ch})
    print("   S1 speakers by matching (kind, flagged):", dict(sorted(kinds.items())))

"""Cache per-instance clip indices (per encoder), speaker labels, and the served blend's flags.

Output: runs/screen27/cache.npz (robustness train+eval) and cache-dev.npz (data/devlarge eval-dev-*).
Instance order = tools/sleuthd_bench/robustness/instances.load_instances order (cond, line, S1/S2/S3).
"""
import json, sys, time
from pathlib import Path
import numpy as np

from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.build import CONDITIONS
from sleuthd_bench.robustness.instances import load_instances
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd.api import SpeakerEncoder
from sleuthd.config import default_models_dir
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration

OUT = Path("runs/screen27")
SC = ("S1", "S2", "S3")


def rows(root, split, conds, embs):
    R = {k: [] for k in ("cond", "split", "scen", "did", "target", "intr", "gold",
                         "ti_ge2e", "ti_campplus", "ri_ge2e", "ri_campplus", "sec", "clip_ids")}
    for cond in conds:
        path = root / f"{split}-{cond}.jsonl"
        metas = [json.loads(l).get("meta") or {} for l in path.read_text().splitlines()]
        for line, meta in zip(read_manifest(path), metas, strict=True):
            for s in SC:
                turns = scenario_turns(line, s)
                R["cond"].append(cond); R["split"].append(split); R["scen"].append(s)
                R["did"].append(line.dialogue_id); R["target"].append(line.target_speaker)
                R["intr"].append({"S1": "", "S2": meta.get("s2_speaker", ""), "S3": meta.get("s3_speaker", "")}[s])
                R["gold"].append(-1 if s == "S1" else line.altered_turn)
                for e in embed.ENCODERS:
                    E = embs[e]
                    ti = []
                    for p in turns:
                        k = E.index[p]
                        ti.append(k if not np.isnan(E.vectors[k, 0]) else -1)
                    R[f"ti_{e}"].append(ti)
                    k = E.index[line.reference]
                    R[f"ri_{e}"].append(k if not np.isnan(E.vectors[k, 0]) else -1)
                R["sec"].append([embs["ge2e"].get(p)[1] for p in turns])
    return R


def served(root, split, conds, embs, ev_path):
    instances = load_instances(root, split, conds, embs)
    enc = SpeakerEncoder.load(default_models_dir(), encoder="fused")
    raw = enc.manifest.raw
    enc.close()
    auto = Calibration.from_manifest(raw, "fused")
    cal = EvidenceCalibration.from_json(json.loads(Path(ev_path).read_text()),
                                        {e: embs[e].weights_sha256 for e in embed.ENCODERS})
    blend, fauto = [], []
    for i, inst in enumerate(instances):
        f, _, _ = judges.evidence_flags(inst, cal, auto)
        blend.append(bool(f))
        fauto.append(bool(judges.auto_flags(inst.views["fused"], auto)))
    return np.array(blend), np.array(fauto), [(x.dialogue_id, x.scenario) for x in instances]


def main():
    t0 = time.time()
    root = Path("data/robustness")
    embs = {e: embed.load(root, e) for e in embed.ENCODERS}
    names = [c.name for c in CONDITIONS]
    trn = [n for n in names if (root / f"train-{n}.jsonl").is_file()]
    R = {}
    for split, conds in (("train", trn), ("eval", names)):
        r = rows(root, split, conds, embs)
        for k, v in r.items():
            R.setdefault(k, []).extend(v)
    print("rows", len(R["cond"]), time.time() - t0, flush=True)
    b, fa, keys = served(root, "eval", names, embs, "service/sleuthd/cards/evidence.json")
    ev_mask = np.array([s == "eval" for s in R["split"]])
    assert keys == [(d, s) for d, s, m in zip(R["did"], R["scen"], ev_mask) if m]
    blend = np.zeros(len(ev_mask), bool); blend[ev_mask] = b
    fauto = np.zeros(len(ev_mask), bool); fauto[ev_mask] = fa
    print("served eval", time.time() - t0, flush=True)
    # LOGO blends (refit without a / without b), as in robustness.md, for the comparison column
    extra = {}
    for tag in ("a", "b"):
        p = Path(f"runs/robustness/evidence-blend-without-{tag}.json")
        if p.is_file():
            bb, _, _ = served(root, "eval", names, embs, p)
            x = np.zeros(len(ev_mask), bool); x[ev_mask] = bb
            extra[f"blend_wo_{tag}"] = x
    np.savez_compressed(OUT / "cache.npz", **{k: np.array(v) for k, v in R.items() if k != "clip_ids"},
                        blend=blend, fauto=fauto, **extra)
    print("saved", time.time() - t0, flush=True)
    # dev benchmark
    droot = Path("data/devlarge")
    if (droot / "emb" / "ge2e.npz").is_file():
        dembs = {e: embed.load(droot, e) for e in embed.ENCODERS}
        dn = ["dev-fit", "dev-transfer", "dev-fsdd"]
        r = rows(droot, "eval", dn, dembs)
        b, fa, _ = served(droot, "eval", dn, dembs, "service/sleuthd/cards/evidence.json")
        np.savez_compressed(OUT / "cache-dev.npz", **{k: np.array(v) for k, v in r.items() if k != "clip_ids"},
                            blend=b, fauto=fa)
        print("dev saved", time.time() - t0, flush=True)


if __name__ == "__main__":
    main()

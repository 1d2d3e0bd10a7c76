"""Screen, step 2: the evidence model and the blend refitted on WCCN-whitened per-encoder embeddings (the fused view,
which today's `auto` calibration reads, stays raw), judged on the eval split and the dev splits at the server's
channel matching, paired against the served judgment.

Every view of every instance (the clips as sent and every channel-matched copy) is whitened with the same transform,
fitted on the matrix's TRAIN clips (screen.py's within_cov; FSDD never, b-espeak-sox left out: its labels contradict
the transfer split's). ``--alpha 0`` whitens nothing: the control, which must reproduce the served figures.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/lda/refit.py --alpha 1 [--out runs/lda/alpha1.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "expressive"))
from common import MATCH, load_models, paired_table  # noqa: E402
from oracle_proxy import ROOT, labelled_paths, transform_of, whiten_views, within_cov  # noqa: E402
from sleuthd_bench.robustness import embed, fit, judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions, _load_all  # noqa: E402

VIEW_DICTS = ("narrow_views", "noise_views")
NESTED = ("clip_views", "composed_views", "telephone_views")


def whiten(inst, Ts):
    changes = {"views": whiten_views(inst.views, Ts)}
    for name in VIEW_DICTS:
        changes[name] = whiten_views(getattr(inst, name), Ts)
    for name in NESTED:
        changes[name] = {k: whiten_views(v, Ts) for k, v in getattr(inst, name).items()}
    return replace(inst, **changes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha", type=float, required=True)
    ap.add_argument("--exclude", default="f-,b-espeak-sox")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    Ts = {}
    if args.alpha > 0:
        embs = {e: embed.load(ROOT, e) for e in embed.ENCODERS}
        labels = labelled_paths("train", tuple(args.exclude.split(",")))
        Ts = {e: transform_of(within_cov(embs[e], labels)[0], args.alpha) for e in embed.ENCODERS}
    fcal, shipped = load_models()

    def loaded(root, split, names):
        embs, insts = _load_all(root, split, names)
        return embs, [whiten(i, Ts) for i in insts] if Ts else insts

    train_names = [n for n in _conditions(None) if (ROOT / f"train-{n}.jsonl").is_file()]
    embs, train = loaded(ROOT, "train", train_names)
    _, support = loaded(Path("data/devlarge"), "eval", ["dev-fit"])
    print(f"fitting on {len(train)} train instances ...", file=sys.stderr, flush=True)
    models, extra = fit.fit(train, seed=0)
    from sleuthd.api import SpeakerEncoder
    from sleuthd.judgment.calibration import Calibration
    from sleuthd.judgment.evidence import EvidenceCalibration

    enc = SpeakerEncoder.load(Path("models"), encoder="fused")
    raw = enc.manifest.raw
    enc.close()
    auto = Calibration.from_manifest(raw, "fused")
    blend, _ = fit.fit_blend(train, auto, raw["calibration"], support, 0, lambda *a, **k: None)
    block = fit.calibration_block(models, extra, {e: embs[e].weights_sha256 for e in embs}, "lda screen", 0, blend, "")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(block, indent=1) + "\n")
    refit = EvidenceCalibration.from_json(block)
    for root, names in ((ROOT, [n for n in _conditions(None) if (ROOT / f"eval-{n}.jsonl").is_file()]),
                        (Path("data/devlarge"), ["dev-fit", "dev-transfer", "dev-fsdd"])):
        _, raw_insts = _load_all(root, "eval", names)
        w_insts = [whiten(i, Ts) for i in raw_insts] if Ts else raw_insts
        by_raw, by_w = {}, {}
        for i, w in zip(raw_insts, w_insts):
            by_raw.setdefault(i.condition, []).append(i)
            by_w.setdefault(i.condition, []).append(w)
        served = {c: [judges.record(i, judges.evidence_flags(i, shipped, fcal, *MATCH)[0]) for i in by_raw[c]]
                  for c in names}
        mserved = {c: judges.metrics(served[c]) for c in names}
        variant = {c: [judges.record(i, judges.evidence_flags(i, refit, fcal, *MATCH)[0]) for i in by_w[c]]
                   for c in names}
        print(f"\n## {root}: whitened alpha {args.alpha:g} (exclude {args.exclude}) against the served judgment\n")
        paired_table(f"wccn{args.alpha:g}", names, by_raw, served, mserved, lambda c: variant[c])
        sys.stdout.flush()


if __name__ == "__main__":
    main()

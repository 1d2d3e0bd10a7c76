"""Shared loading and per-turn decomposition of the served fused `auto` (blend) for the expressive screen.

Run from the repository root with PYTHONPATH=service:tools:. (see REPORT.md)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.config import EngineConfig
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration, RampModel, feature_matrix, pool_evidence, variant_of
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.build import EMOTIONS
from sleuthd_bench.robustness.cli import _load_all

ROOT = Path("data/robustness")
_cfg = EngineConfig()
MATCH = (
    _cfg.band_match_octaves,
    _cfg.clip_match_spread,
    _cfg.noise_match_db,
    _cfg.noise_compose_db,
    _cfg.telephone_band_db,
)
AS_SENT = (0.0,) * len(MATCH)  # channel matching off


def load_models():
    enc = SpeakerEncoder.load(Path("models"), encoder="fused")
    raw = enc.manifest.raw
    enc.close()
    return Calibration.from_manifest(raw, "fused"), EvidenceCalibration.from_manifest(raw)


def load(split, names, root=ROOT):
    return _load_all(root, split, names)


def metas(split, names, root=ROOT):
    out = {}
    for n in names:
        for line in (root / f"{split}-{n}.jsonl").read_text().splitlines():
            d = json.loads(line)
            out[d["dialogue_id"]] = d
    return out


def emotion_of(src):
    """Nearest preset to a clip's (pitch, rate, amplitude), in units of its jitter (+-8, +-15, +-15)."""
    if not src or src.get("kind") != "espeak":
        return "?"
    p, s, a = src["p"], src["s"], src["a"]
    best = min(EMOTIONS, key=lambda e: ((p - EMOTIONS[e][0]) / 8) ** 2 + ((s - EMOTIONS[e][1]) / 15) ** 2
               + ((a - EMOTIONS[e][2]) / 15) ** 2)
    return best


def decompose(inst, ev, fcal):
    """Per usable turn of the (channel-matched) instance: dict with the blend's pieces. None when nothing to judge."""
    mi = judges.channel_matched(inst, *MATCH)
    grams, has_ref, seconds, index = judges.evidence_inputs(mi)
    if not len(seconds) or (len(seconds) < 2 and not has_ref):
        return None
    a = judges.auto_logits(mi.views["fused"], fcal)
    evidence = {e: pool_evidence(grams[e], has_ref) for e in ev.encoders}
    variant = variant_of(len(seconds), has_ref, False)
    model = ev.models[variant]
    x = feature_matrix(model.inputs, evidence, seconds)
    r, pr = model.design(x)
    k = len(model.features)
    terms = {f: r[:, i, :] @ model.weights[i] for i, f in enumerate(model.features)}
    for q, (fi, ci) in enumerate(model.pairs):
        terms[model.features[fi]] = terms[model.features[fi]] + np.einsum("njl,jl->n", pr[:, q], model.pair_weights[q])
    zev = model.logit(x)
    b = ev.blend
    lvl = evidence[b.level_encoder]["level"]
    h = RampModel.hats(np.asarray(lvl, np.float64)[:, None], b.knots[None, :])[:, 0, :]
    ew, aw, bias = h @ b.evidence_weights, h @ b.auto_weights, h @ b.bias
    aclip = np.clip(a, -b.auto_logit_clip, b.auto_logit_clip)
    levels = {e: float(np.median(evidence[e]["level"])) if not np.isnan(evidence[e]["level"]).any() else np.nan
              for e in ev.encoders}
    inside = b.inside(levels)
    final = a if inside else bias + aclip * aw + zev * ew
    return dict(index=index, inside=inside, auto=a, aclip=aclip, aw=aw, ew=ew, sbias=bias, zev=zev, model_bias=model.bias,
                terms=terms, final=final, evidence=evidence, levels=levels, variant=variant, x=x,
                inputs=model.inputs)


def paired_mean_interval(pairs, n=2000, seed=0):
    """95 % interval of the difference in mean Bal over conditions, paired: each condition's dialogues resampled on
    their own (n times). ``pairs``: per condition, (baseline records, variant records)."""
    rng = np.random.default_rng(seed)
    boot = np.zeros(n)
    for base, variant in pairs:
        rb, vb = paired._per_dialogue(base), paired._per_dialogue(variant)
        ids = sorted(rb)
        B = np.array([[rb[d][x][0] for x in ("S1", "S2", "S3")] for d in ids])
        V = np.array([[vb[d][x][0] for x in ("S1", "S2", "S3")] for d in ids])
        idx = rng.integers(0, len(ids), size=(n, len(ids)))
        boot += paired._balanced(V[idx].mean(axis=1)) - paired._balanced(B[idx].mean(axis=1))
    boot /= len(pairs)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return lo, hi


def paired_table(spec, names, keep, served, mserved, records_of):
    """Print the paired table of one variant against the served judgment: per condition Bal (S1/S2/S3) both ways,
    the paired bootstrap of the difference, and how many instances moved each way; then the mean over conditions.
    ``served``/``mserved``: condition -> served records / metrics; ``records_of(condition)``: the variant's records."""
    print("| condition | n dial | served Bal (S1/S2/S3) | variant Bal (S1/S2/S3) | Δ Bal [95 % CI] | S1 won / S2 lost / S3 lost / S2,S3 won |")
    print("| :--- | ---: | :--- | :--- | :--- | :--- |")
    means, tot = [], np.zeros(4, int)
    for c in names:
        rv = records_of(c)
        m, b = judges.metrics(rv), mserved[c]
        cmp = paired.compare(spec, rv, "served", served[c])
        ch = np.zeros(4, int)
        for a, r in zip(served[c], rv):
            ok_a, ok_r = (a.pred_inconsistent == bool(a.gold_turns)), (r.pred_inconsistent == bool(r.gold_turns))
            if ok_a != ok_r:
                if a.scenario == "S1":
                    ch[0] += ok_r - ok_a
                elif ok_a:
                    ch[1 if a.scenario == "S2" else 2] += 1
                else:
                    ch[3] += 1
        tot += ch
        means.append((b["bal"], m["bal"]))
        bold = "**" if cmp.bal.low > 0 or cmp.bal.high < 0 else ""
        print(f"| {c} | {len(keep[c])} | {b['bal']:.1f} ({b['S1']:.1f}/{b['S2']:.1f}/{b['S3']:.1f}) | {m['bal']:.1f} ("
              f"{m['S1']:.1f}/{m['S2']:.1f}/{m['S3']:.1f}) | {bold}{cmp.bal.difference:+.2f} [{cmp.bal.low:+.2f}, "
              f"{cmp.bal.high:+.2f}]{bold} | {ch[0]:+d} / {ch[1]} / {ch[2]} / {ch[3]} |", flush=True)
    b, vv = np.array(means).T
    lo, hi = paired_mean_interval([(served[c], records_of(c)) for c in names])
    print(f"| mean of {len(names)} | | {b.mean():.2f} | {vv.mean():.2f} | {vv.mean() - b.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] | "
          f"{tot[0]:+d} / {tot[1]} / {tot[2]} / {tot[3]} |")


def threshold_screen_args(*extra):
    """The command line of a threshold screen (SPLIT [--root R] [--conditions ...] [--grid] [--variant T ...]), with
    ``extra`` (name, kwargs) options: (args, the conditions of that split that have a manifest)."""
    import argparse

    from sleuthd_bench.robustness.cli import _conditions

    ap = argparse.ArgumentParser()
    ap.add_argument("split")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--conditions")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--variant", action="append", default=[], type=float)
    for name, kwargs in extra:
        ap.add_argument(name, **kwargs)
    args = ap.parse_args()
    names = args.conditions.split(",") if args.conditions else [
        n for n in _conditions(None) if (args.root / f"{args.split}-{n}.jsonl").is_file()]
    return args, names


def load_served(split, names, root=ROOT):
    """(the split's instances the server answers, a judge) where judge(inst) is the served default's
    judges.evidence_flags: the blend with channel, pitch and length matching at the server's defaults."""
    from sleuthd_bench.robustness.cli import length_matching, pitch_matching

    _, insts = load(split, names, root)
    fcal, ev = load_models()
    pitch = pitch_matching(root, _cfg.pitch_match_octaves)
    length = length_matching(root, _cfg.length_match_ratio)

    def judge(inst, match=MATCH, rejudging=True):
        """``match``: the channel-matching options in MATCH's order (AS_SENT: all off); ``rejudging`` False: pitch and
        length matching off."""
        again = (pitch, length) if rejudging else (None, None)
        return judges.evidence_flags(inst, ev, fcal, *match, *again)

    return [i for i in insts if not i.refused], judge


def kept_records(insts, judged, cond, kept=None):
    """The condition's records from cached verdicts (``judged``: (dialogue, scenario) -> (served flags, as-sent flags or
    None where not channel matched, copies' probability by position)); ``kept(inst, sent, p)``: the as-sent flags a
    rule keeps beside the served ones (None: the served verdicts alone)."""
    out = []
    for i in insts:
        if i.condition != cond:
            continue
        served, sent, p = judged[(i.dialogue_id, i.scenario)]
        flags = served if kept is None or sent is None else served | frozenset(kept(i, sent, p))
        out.append(judges.record(i, flags))
    return out

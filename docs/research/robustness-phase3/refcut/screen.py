"""Screen: a long reference beside short turns, cut to the turns' length. Why: in the all-short conditions (c-short,
f-fsdd-short, g-kokoro-short: every turn 1-2 s, the reference whole since session 26) the served judgment is a little
worse with a whole reference than with a cut one (resample/whole_refs.txt: -0.9 to -1.3 points, through S1 or S3), and
length matching cannot help there (no turn is short against the median of the speaker's pieces). The rule screened:
for an instance judged on its clips as sent, whose reference's trimmed speech is more than RATIO times the median of
its usable turns' (in samples), the reference is replaced by its copy cut to that median (the middle of its trimmed
speech, sleuthd.encoders.clips.speech_cut) and the whole instance is judged on it (the blend; nothing else matched);
any other instance keeps the served verdict. Nothing fitted.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/refcut/screen.py train|eval [--ratio 2,3]

Cut copies cached in runs/refcut/cuts-<split>.npz. Refused instances left out. Paired bootstrap over dialogues."""
import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.api import SpeakerEncoder  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd.domain import AudioInput  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import embed, judges  # noqa: E402
from sleuthd_bench.robustness.cli import length_matching, pitch_matching  # noqa: E402
from sleuthd_bench.robustness.instances import ENCODERS, FUSED, Turns  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--ratio", default="1.5,2,3")
args = ap.parse_args()
ROOT = common.ROOT
names = sorted(p.name[len(args.split) + 1 : -len(".jsonl")] for p in ROOT.glob(f"{args.split}-*.jsonl"))
_, insts = common.load(args.split, names, ROOT)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
cfg = EngineConfig()
pitch = pitch_matching(ROOT, cfg.pitch_match_octaves)
length = length_matching(ROOT, cfg.length_match_ratio)
encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
kept = embed.load_kept(ROOT)
cache_file = Path(f"runs/refcut/cuts-{args.split}.npz")
cache: dict = {}
if cache_file.is_file():
    z = np.load(cache_file, allow_pickle=True)
    cache = z["cache"].item()


def n_kept(path: str) -> int:
    if path not in kept:
        kept[path] = encoders[ENCODERS[0]].kept_samples(AudioInput((ROOT / path).read_bytes()))
    return kept[path]


def cut(e: str, path: str, n: int):
    key = (e, path, n)
    if key not in cache:
        enc = encoders[e]
        audio = enc.speech_cut(AudioInput((ROOT / path).read_bytes()), n)
        r = enc.embed_sync([audio])[0]
        cache[key] = r.embedding
    return cache[key]


rows = []
for k, i in enumerate(insts):
    served = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch, length)[0]
    joint = i.views[FUSED]
    alt = None
    ratio = 0.0
    if judges.channel_matched(i, *common.MATCH) is i and joint.reference is not None and len(joint.index):
        m = int(np.median([n_kept(i.paths[p]) for p in joint.index.tolist()]))
        ratio = n_kept(i.reference_path) / m
        if ratio > 1.25:
            refs = {e: cut(e, i.reference_path, m) for e in ENCODERS}
            if all(v is not None for v in refs.values()):
                views = {e: Turns(i.views[e].index, i.views[e].emb, i.views[e].seconds, refs[e]) for e in ENCODERS}
                views[FUSED] = Turns(joint.index, joint.emb, joint.seconds, embed.fused([refs[e] for e in ENCODERS]))
                alt = judges._judged(replace(i, views=views), ev, fcal)[0]
    rows.append((i, served, ratio, alt))
    if k % 1000 == 0:
        print(f"  {k}/{len(insts)}", file=sys.stderr)
cache_file.parent.mkdir(parents=True, exist_ok=True)
np.savez(cache_file, cache=np.array(cache, dtype=object))


def flags(r):
    return {(i.dialogue_id, i.scenario): (alt if alt is not None and ratio > r else served)
            for i, served, ratio, alt in rows}


base = flags(np.inf)


def records(f, cond):
    return [judges.record(i, f[(i.dialogue_id, i.scenario)]) for i, *_ in rows if i.condition == cond]


print(f"{args.split}: {len(names)} conditions, {len(rows)} instances")
for r in [float(x) for x in args.ratio.split(",")]:
    f = flags(r)
    out = []
    for c in names:
        a, b = records(f, c), records(base, c)
        if all(x.pred_turns == y.pred_turns for x, y in zip(a, b)):
            continue
        d = paired.compare("cut", a, "served", b).bal
        ma, mb = judges.metrics(a), judges.metrics(b)
        out.append(f"{c} {mb['bal']:.1f}->{ma['bal']:.1f} (S1 {mb['S1']:.1f}->{ma['S1']:.1f}, S2 {mb['S2']:.1f}->"
                   f"{ma['S2']:.1f}, S3 {mb['S3']:.1f}->{ma['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    mean = np.mean([judges.metrics(records(f, c))["bal"] for c in names])
    mean0 = np.mean([judges.metrics(records(base, c))["bal"] for c in names])
    n = sum(1 for i, _, ratio, alt in rows if alt is not None and ratio > r)
    print(f"\nratio {r:g} ({n} instances judged on a cut reference): mean Bal {mean0:.2f} -> {mean:.2f} ({mean - mean0:+.2f})")
    for line in out:
        print("  " + line)
for e in encoders.values():
    e.close()

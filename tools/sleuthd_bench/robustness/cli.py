"""``sleuthd-bench robustness build|embed|report`` and ``sleuthd-bench calibrate fit-evidence``.

Kept apart from ``sleuthd_bench/cli.py``, which registers them with one call each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_ROOT = Path("data/robustness")
DEFAULT_EVIDENCE = Path("service/sleuthd/cards/evidence.json")


def _conditions(text: str | None, exclude_groups: str = "") -> list[str]:
    from sleuthd_bench.robustness.build import CONDITIONS

    names = [c.name for c in CONDITIONS] if not text else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in {c.name for c in CONDITIONS}]
    if unknown:
        raise ValueError(f"unknown condition(s) {', '.join(unknown)}; see `sleuthd-bench robustness build --help`")
    groups = {g.strip() for g in exclude_groups.split(",") if g.strip()}
    if groups & {"a", "b"}:
        groups.add("x")  # the emulated outside failure is another language AND expressive: it goes with both
    by = {c.name: c for c in CONDITIONS}
    return [n for n in names if by[n].group not in groups]


def _progress(label: str) -> Any:
    last = [0.0]

    def show(*args: Any) -> None:
        done, total = args[-2], args[-1]
        if time.monotonic() - last[0] > 5 or done == total:
            last[0] = time.monotonic()
            print(
                f"\r{label} {' '.join(str(a) for a in args[:-2])} {done}/{total}", end="", file=sys.stderr, flush=True
            )
            if done == total:
                print(file=sys.stderr)

    return show


def cmd_build(args: argparse.Namespace) -> int:
    from sleuthd_bench.robustness import build

    try:
        names = _conditions(args.conditions)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    conds = [build.CONDITION_BY_NAME[n] for n in names]
    result = build.build(
        args.out,
        conds,
        eval_dialogues=args.eval_dialogues,
        train_dialogues=args.train_dialogues,
        fsdd_dir=args.fsdd_dir,
        seed=args.seed,
        workers=args.workers,
        progress=None if args.quiet else _progress("render"),
    )
    print(f"wrote {len(result.manifests)} manifests under {args.out}: {result.clips} clips, {result.rendered} rendered")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from sleuthd_bench.robustness import embed

    manifests = sorted(args.out.glob(f"{args.split or '*'}-*.jsonl"))
    if not manifests:
        print(f"error: no manifests under {args.out}: run `sleuthd-bench robustness build` first", file=sys.stderr)
        return 2
    paths = [p for p in embed.manifest_paths(manifests) if (args.out / p).is_file()]
    progress = None if args.quiet else _progress("embed")
    if args.narrowband + args.clipped + args.pitched + args.cut > 1:
        print("error: --narrowband, --clipped, --pitched and --cut are separate runs, in that order", file=sys.stderr)
        return 2
    if args.narrowband:
        paths = _mixed_clips(args.out, manifests, paths, args.band_match_octaves, progress)
        print(f"{len(paths)} clips belong to instances spanning more than {args.band_match_octaves:g} octave")
    if args.clipped:
        paths = _clipped_copies(args.out, manifests, paths, *_channel_options(args), progress)
        print(f"{len(paths)} clipped or noisy copies belong to instances whose clips differ in clipping or noise")
    if args.pitched:
        paths = _pitched_copies(args.out, manifests, paths, _channel_options(args), args.pitch_match_octaves, progress)
        print(f"{len(paths)} copies moved in pitch belong to turns {args.pitch_match_octaves:g} octave or more from "
              "their speaker")  # fmt: skip
    if args.cut:
        paths = _cut_copies(
            args.out, manifests, paths, _channel_options(args), args.length_match_ratio, args.models_dir, progress
        )
        print(f"{len(paths)} cut copies belong to instances with a turn under {args.length_match_ratio:g} of its "
              "speaker's median speech")  # fmt: skip
    done = embed.embed_all(
        args.out,
        paths,
        args.encoders.split(","),
        args.models_dir,
        progress=progress,
        narrowband=args.narrowband,
        clipped=args.clipped or args.pitched or args.cut,
    )
    for name, e in done.items():
        usable = int((~__import__("numpy").isnan(e.vectors[:, 0])).sum())
        print(f"{name}: {len(e.paths)} clips cached ({usable} usable)")
    return 0


def _mixed_clips(root: Path, manifests: list[Path], paths: list[str], octaves: float, progress: Any) -> list[str]:
    """The clips of every instance (both splits) whose clips span more than ``octaves`` of bandwidth (measuring
    the bandwidths the cache lacks first): the ones band matching judges on narrowband copies."""
    from sleuthd_bench.robustness import embed
    from sleuthd_bench.robustness.instances import load_instances

    bandwidths = embed.measure_channels(root, paths, progress).bandwidths
    embs = {e: embed.load(root, e) for e in embed.ENCODERS}
    mixed: dict[str, None] = {}
    for m in manifests:
        split, _, condition = m.stem.partition("-")
        lines = [json.loads(raw) for raw in m.read_text().splitlines()]
        clips = {x["dialogue_id"]: [*x["target_turns"], x["reference"], x["s2_audio"], x["s3_audio"]] for x in lines}
        for inst in load_instances(root, split, [condition], embs, bandwidths):
            if inst.band_octaves > octaves:
                mixed.update(dict.fromkeys(clips[inst.dialogue_id]))
    return [p for p in paths if p in mixed]


def _clipped_copies(
    root: Path,
    manifests: list[Path],
    paths: list[str],
    octaves: float,
    spread: float,
    noise_db: float,
    compose_db: float,
    telephone_db: float,
    progress: Any,
) -> list[str]:
    """The copy keys (embed.copy_key) of the clips of every instance (both splits) whose clips differ in plateau
    fraction by more than ``spread`` (measuring the channels the cache lacks first), at the instance's target and
    band (low-passed too where it spans more than ``octaves``): what clip matching judges it on; and the noisy copy
    keys (embed.noise_key) of the instances matched neither way whose clips differ in SNR by more than
    ``noise_db``: what noise matching judges them on; and, of the instances matched by band or clipping whose clips
    also differ in SNR by more than ``compose_db``, the composed copy keys (embed.composed_key); and, of the band-mixed
    instances with a telephone clip (low band level below ``telephone_db``) among clips that kept their low band, the
    keys of the telephone-band copies the server judges them on or falls back to (embed.telephone_key)."""
    from sleuthd_bench.instances import scenario_turns
    from sleuthd_bench.manifest import read_manifest
    from sleuthd_bench.robustness import embed
    from sleuthd_bench.robustness.instances import load_instances, telephone_kinds

    hz, plateaus, snrs, lows = embed.measure_channels(root, paths, progress)
    embs = {e: embed.load(root, e) for e in embed.ENCODERS}
    keys: dict[str, None] = {}
    for m in manifests:
        split, _, condition = m.stem.partition("-")
        lines = {x.dialogue_id: x for x in read_manifest(m)}
        for inst in load_instances(root, split, [condition], embs, hz, None, plateaus, None, snrs, lows):
            line = lines[inst.dialogue_id]
            turns = scenario_turns(line, inst.scenario)
            band = inst.band_mixed(octaves)
            target = inst.clip_target()
            clip = target is not None and inst.clip_mixed(spread)
            noise_too = (band or clip) and inst.noise_mixed(compose_db)
            if noise_too:
                composed = inst.composed_copy_keys(turns, line.reference, band, clip)
                keys.update(dict.fromkeys(composed.values() if composed else ()))
            if band and inst.telephone_mixed(telephone_db):
                for kind in telephone_kinds(clip, noise_too):
                    keys.update(dict.fromkeys(inst.telephone_copy_keys(turns, line.reference, *kind).values()))
            if clip and target is not None:
                for p in (*turns, line.reference):
                    keys.setdefault(embed.copy_key(p, band, target), None)
            elif not band and inst.noise_mixed(noise_db):
                noisy = inst.noise_copy_keys(turns, line.reference)
                keys.update(dict.fromkeys(noisy.values() if noisy else ()))
    return list(keys)


def _pitched_copies(
    root: Path,
    manifests: list[Path],
    paths: list[str],
    channel: tuple[float, float, float, float, float],
    octaves: float,
    progress: Any,
) -> list[str]:
    """The keys (embed.pitch_key) of the copies pitch matching at ``octaves`` may judge on (measuring the clips'
    pitches the cache lacks first): of every instance (both splits) that channel matching (``channel``:
    _channel_options) judges on its clips as sent or on their narrowband copies, each usable turn pitched
    ``octaves`` .. the ceiling from its speaker's other pieces, moved to their median. Every such turn, flagged or
    not, so that the copies do not depend on a calibration (the server moves only the flagged ones)."""
    from sleuthd_bench.robustness import embed, judges

    if octaves <= 0:
        return []
    pitches = embed.measure_pitches(root, paths, progress)
    by_split: dict[str, list[str]] = {}
    for m in manifests:
        split, _, condition = m.stem.partition("-")
        by_split.setdefault(split, []).append(condition)
    keys: dict[str, None] = {}
    for split, conditions in by_split.items():  # the caches loaded once a split, not once a manifest
        for inst in _load_all(root, split, conditions)[1]:
            matched = judges.channel_matched(inst, *channel)
            if matched is not inst and matched.views is not inst.narrow_views:
                continue
            index = matched.views["fused"].index
            moves = judges.pitch_moves(inst, index, frozenset(index.tolist()), octaves, pitches)
            narrow = matched is not inst
            keys.update(dict.fromkeys(embed.pitch_key(inst.paths[pos], k, narrow) for pos, k in moves.items()))
    return list(keys)


def _cut_copies(
    root: Path,
    manifests: list[Path],
    paths: list[str],
    channel: tuple[float, float, float, float, float],
    ratio: float,
    models_dir: Path | None,
    progress: Any,
) -> list[str]:
    """The keys (embed.cut_key) of the copies length matching at ``ratio`` may judge on (measuring the trimmed lengths
    the cache lacks first): of every instance (both splits) that channel matching judges on its clips as sent, for
    each usable turn with less speech than ``ratio`` of the median of its speaker's other pieces, those pieces' copies
    cut to its trimmed length. Every such turn, flagged or not, so that the copies do not depend on a calibration."""
    from sleuthd.api import short_turns

    from sleuthd_bench.robustness import embed, judges

    if ratio <= 0:
        return []
    speech = embed.load(root, embed.ENCODERS[0])
    by_split: dict[str, list[str]] = {}
    for m in manifests:
        split, _, condition = m.stem.partition("-")
        by_split.setdefault(split, []).append(condition)
    short: list[tuple[list[str], list[int]]] = []  # (pieces, short rows) of each instance with a short turn
    for split, conditions in by_split.items():  # the caches loaded once a split, not once a manifest
        for inst in _load_all(root, split, conditions)[1]:
            if judges.channel_matched(inst, *channel) is not inst or inst.refused:
                continue
            joint = inst.views["fused"]
            has_ref = joint.reference is not None
            pieces = [inst.paths[k] for k in joint.index.tolist()] + ([inst.reference_path] if has_ref else [])
            seconds = joint.seconds.tolist() + ([speech.get(inst.reference_path)[1]] if has_ref else [])
            rows = short_turns(seconds, range(len(joint.index)), ratio)
            if rows:
                short.append((pieces, rows))
    kept = embed.measure_kept(root, list(dict.fromkeys(p for pieces, _ in short for p in pieces)), models_dir, progress)
    keys: dict[str, None] = {}
    for pieces, rows in short:
        for j in rows:
            n = kept[pieces[j]]
            keys.update(dict.fromkeys(embed.cut_key(p, n) for k, p in enumerate(pieces) if k != j and kept[p] > n))
    return list(keys)


def _rejudging(args: argparse.Namespace) -> tuple[Any, Any]:
    """(judges.PitchMatching, judges.LengthMatching) at the command's settings, over one load of the copies' cache."""
    copies = copies_cache(args.out)
    return (
        pitch_matching(args.out, args.pitch_match_octaves, copies),
        length_matching(args.out, args.length_match_ratio, copies),
    )


def _channel_options(args: argparse.Namespace) -> tuple[float, float, float, float, float]:
    """The channel-matching options (add_matching_options), in judges.evidence_flags's order."""
    return (
        args.band_match_octaves,
        args.clip_match_spread,
        args.noise_match_db,
        args.noise_compose_db,
        args.telephone_band_db,
    )


def copies_cache(root: Path) -> Any:
    """encoder -> the embeddings of the copies' cache under ``root`` (clipped, noisy, moved in pitch, cut: `robustness
    embed --clipped/--pitched/--cut`), None when none were made: what pitch and length matching judge again on."""
    from sleuthd_bench.robustness import embed

    at = embed.clipped_root(root)
    return {e: embed.load(at, e) for e in embed.ENCODERS} if embed.cache_path(at, "ge2e").is_file() else None


def pitch_matching(root: Path, octaves: float, copies: Any = None) -> Any:
    """judges.PitchMatching at ``octaves`` over the measured pitches and the copies' cache under ``root`` (None: 0);
    ``copies``: that cache when the caller has loaded it (:func:`copies_cache`)."""
    from sleuthd_bench.robustness import embed, judges

    if octaves <= 0:
        return None
    return judges.PitchMatching(octaves, embed.load_pitches(root), copies or copies_cache(root))


def length_matching(root: Path, ratio: float, copies: Any = None) -> Any:
    """judges.LengthMatching at ``ratio`` over the measured trimmed lengths and the copies' cache under ``root`` (None:
    0); ``copies`` as for :func:`pitch_matching`."""
    from sleuthd_bench.robustness import embed, judges

    if ratio <= 0:
        return None
    copies = copies or copies_cache(root)
    return judges.LengthMatching(ratio, embed.load(root, embed.ENCODERS[0]), embed.load_kept(root), copies)


def _load_all(root: Path, split: str, conditions: list[str]) -> tuple[Any, Any]:
    """The embeddings and the split's instances, with what channel matching reads when it was made (`robustness
    embed --narrowband`, `--clipped`): the clips' bandwidths and plateau fractions, the copies' embeddings."""
    from sleuthd_bench.robustness import embed
    from sleuthd_bench.robustness.instances import load_instances

    embs = {e: embed.load(root, e) for e in embed.ENCODERS}

    def copies(at: Path) -> dict[str, Any] | None:
        if all(embed.cache_path(at, e).is_file() for e in embed.ENCODERS):
            return {e: embed.load(at, e) for e in embed.ENCODERS}
        return None

    hz, plateaus, snrs, lows = embed.load_channels(root)
    narrow, clipped = copies(embed.narrow_root(root)), copies(embed.clipped_root(root))
    return embs, load_instances(root, split, conditions, embs, hz, narrow, plateaus, clipped, snrs, lows)


def cmd_report(args: argparse.Namespace) -> int:
    from sleuthd.api import SpeakerEncoder
    from sleuthd.encoders.manifest import PAPER_THRESHOLDS
    from sleuthd.judgment.calibration import Calibration
    from sleuthd.judgment.evidence import EvidenceCalibration

    from sleuthd_bench.robustness import judges, report
    from sleuthd_bench.robustness.instances import load_instances

    # Any eval manifest in the folder may be named (e.g. the dev benchmark's splits copied as eval-dev-fsdd.jsonl).
    names = [t.strip() for t in args.conditions.split(",")] if args.conditions else _conditions(None)
    missing = [n for n in names if args.conditions and not (args.out / f"eval-{n}.jsonl").is_file()]
    if missing:
        print(f"error: no eval manifest for {', '.join(missing)} under {args.out}", file=sys.stderr)
        return 2
    names = [n for n in names if (args.out / f"eval-{n}.jsonl").is_file()]
    embs, loaded = _load_all(args.out, "eval", names)
    # As a replay through the server: an instance whose reference is unusable gets INVALID_ARGUMENT, not a verdict,
    # so every run (the oracle too) is scored on the instances the server answers; the refused share is reported.
    instances = [i for i in loaded if not i.refused]
    refused = {c: sum(i.refused for i in loaded if i.condition == c) for c in names}
    thresholds, calibrations = {}, {}
    for enc in ("ge2e", "campplus", "fused"):
        encoder = SpeakerEncoder.load(args.models_dir, encoder=enc)
        manifest = encoder.manifest
        encoder.close()
        thresholds[enc] = {"paper": dict(PAPER_THRESHOLDS), "default": dict(manifest.default_thresholds)}
        calibrations[enc] = Calibration.from_manifest(manifest.raw, enc)
    evidence = {}
    for spec in args.evidence or []:
        label, _, path = spec.rpartition("=")
        block = json.loads(Path(path).read_text())
        evidence[label or "evidence"] = EvidenceCalibration.from_json(
            block, {e: embs[e].weights_sha256 for e in ("ge2e", "campplus")}
        )
    runs, uncertain = judges.judge_all(
        instances,
        thresholds,
        calibrations,
        evidence,
        *_channel_options(args),
        *_rejudging(args),
    )
    choices: dict[str, Any] = {}
    with_train = [n for n in names if (args.out / f"train-{n}.jsonl").is_file()]
    if with_train and not args.no_train_chosen:
        # Only the paper scores of the train instances are read: the rule is an encoder, a method and a threshold.
        train = [i for i in load_instances(args.out, "train", with_train, embs) if not i.refused]
        runs[report.TRAIN_CHOSEN], choices = report.train_chosen(train, instances, with_train)
    focus = next(iter(evidence), None)
    out = {
        "conditions": {
            c: report.condition_report(c, instances, runs, uncertain, focus, refused=refused[c], chosen=choices.get(c))
            for c in names
        }
    }
    shown = [
        *(f"{e}:{m}@{s}" for e in ("ge2e", "campplus", "fused") for s in ("paper", "default") for m in judges.PAPER),
        "ge2e:auto",
        "campplus:auto",
        "fused:auto",
        report.TRAIN_CHOSEN,
        *evidence,
    ]
    md = report.markdown(out, focus, shown)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.md:
        args.md.write_text(md)
    print(md.split("\n## ")[0])
    return 0


def cmd_fit_evidence(args: argparse.Namespace) -> int:
    from sleuthd_bench.robustness import fit
    from sleuthd_bench.robustness.build import CONDITION_BY_NAME

    names = _conditions(args.conditions, args.exclude_groups)
    if not args.conditions:  # the default fitting set: the conditions the served card was fitted on
        names = [n for n in names if CONDITION_BY_NAME[n].fitted]
    names = [n for n in names if (args.data / f"train-{n}.jsonl").is_file()]
    if not names:
        print("error: no train manifests for those conditions: run `sleuthd-bench robustness build`", file=sys.stderr)
        return 2
    support = None
    if not args.no_blend:
        split, _, cond = args.support.name.removesuffix(".jsonl").partition("-")
        if not args.support.is_file() or not cond:
            print(
                f"error: no support manifest {args.support} (SPLIT-CONDITION.jsonl of today's calibration's fitting "
                "dialogues, embedded with `sleuthd-bench robustness embed --out` its folder; "
                "docs/research/robustness.md), or pass --no-blend",
                file=sys.stderr,
            )
            return 2
        _, support = _load_all(args.support.parent, split, [cond])
    embs, instances = _load_all(args.data, "train", names)
    models, extra = fit.fit(instances, seed=args.seed)
    label = f"{args.data} train split" + (f", groups {args.exclude_groups} left out" if args.exclude_groups else "")
    blend, how = None, ""
    if support is not None:
        from sleuthd.api import SpeakerEncoder
        from sleuthd.judgment.calibration import Calibration

        encoder = SpeakerEncoder.load(args.models_dir, encoder="fused")
        raw = encoder.manifest.raw
        encoder.close()
        auto = Calibration.from_manifest(raw, "fused")
        blend, stats = fit.fit_blend(instances, auto, raw["calibration"], support, args.seed, _progress("blend"))
        extra["fit_stats"]["blend"] = stats
        how = (
            f"gate: per encoder, the {fit.GATE_QUANTILE} quantile of the speaker level (median of the turns' level) "
            f"over {stats['support_dialogues']} dialogues (S1/S2/S3) of today's calibration's fitting corpus "
            f"({args.support}); stack: {stats['stack_turns']} benchmark-like turns of the same train split, evidence "
            f"logits out of fold ({fit.BLEND_FOLDS} folds by target speaker), today's fused `auto` logit clipped to "
            f"+-{fit.AUTO_LOGIT_CLIP:g}, hat functions of the turn's {fit.BLEND_LEVEL_ENCODER} level, L2 "
            f"{fit.BLEND_L2:g} per row, weights of both logits >= 0."
        )
    block = fit.calibration_block(
        models, extra, {e: embs[e].weights_sha256 for e in embs}, label, args.seed, blend, how
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(block, indent=1) + "\n")
    print(json.dumps(extra["fit_stats"], indent=1))
    if blend is not None:
        print(json.dumps(blend.to_json(), indent=1))
    print(f"wrote {args.out}")
    return 0


def add_parsers(sub: Any, calibrate_sub: Any) -> None:
    from sleuthd.config import default_models_dir

    r = sub.add_parser(
        "robustness",
        help="the robustness matrix: generated speech under conditions x S1/S2/S3, and every judgment on it",
        description="build: render the conditions' clips and write train/eval manifests under --out; embed: embed "
        "every clip once per encoder through sleuthd.api (cached); report: judge the eval split offline with every "
        "method, the oracle thresholds and (with --evidence) the evidence model. docs/research/robustness.md.",
    )
    rsub = r.add_subparsers(dest="robustness_command", required=True)
    b = rsub.add_parser("build", help="render clips and write the manifests")
    e = rsub.add_parser("embed", help="embed every clip of the manifests once per encoder (cached)")
    rep = rsub.add_parser("report", help="judge the eval split offline and print the report table")
    for sp in (b, e, rep):
        sp.add_argument("--out", type=Path, default=DEFAULT_ROOT, help="data folder (default: data/robustness)")
        sp.add_argument("--quiet", action="store_true")
    for sp in (b, rep):
        sp.add_argument("--conditions", help="comma-separated condition names (default: all)")
    b.add_argument("--eval-dialogues", type=int, default=110, help="dialogues per condition, eval (default: 110)")
    b.add_argument("--train-dialogues", type=int, default=160, help="dialogues per condition, train (default: 160)")
    b.add_argument("--fsdd-dir", type=Path, default=Path("../shared/data/fsdd"), help="FSDD folder with fsdd.csv")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--workers", type=int, default=2, help="render threads (default: 2)")
    b.set_defaults(func=cmd_build)
    for sp in (e, rep):
        sp.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    e.add_argument("--encoders", default="ge2e,campplus", help="encoders to embed with (default: ge2e,campplus)")
    e.add_argument(
        "--narrowband",
        action="store_true",
        help="measure every clip's bandwidth, and embed the narrowband copies of the clips of instances that band "
        "matching judges on them (into <out>/narrow/)",
    )
    e.add_argument(
        "--split", choices=("train", "eval"), help="only the clips of this split's manifests (default: both)"
    )
    e.add_argument(
        "--clipped",
        action="store_true",
        help="measure every clip's plateau fraction and SNR, and embed the clipped and noisy copies of the clips of "
        "instances that clip or noise matching judges on them (into <out>/clipped/)",
    )
    e.add_argument(
        "--pitched",
        action="store_true",
        help="measure every clip's median pitch, and embed the copies moved in pitch of the turns pitch matching may "
        "move (into <out>/clipped/; after --narrowband and --clipped)",
    )
    e.add_argument(
        "--cut",
        action="store_true",
        help="measure the trimmed lengths of the clips of instances with a short turn, and embed the other clips' "
        "copies cut to each short turn's length that length matching may judge on (into <out>/clipped/; last)",
    )
    e.set_defaults(func=cmd_embed)
    rep.add_argument("--evidence", action="append", help="LABEL=FILE of an evidence calibration to judge with (repeat)")
    rep.add_argument(
        "--no-train-chosen",
        action="store_true",
        help="leave out the train-chosen rule (by default, each condition with a train manifest gets the encoder x "
        "paper method x threshold best on its train split, applied unchanged to eval, beside the hindsight oracle)",
    )
    rep.add_argument("--json", type=Path, help="write the report as JSON")
    rep.add_argument("--md", type=Path, help="write the report as markdown")
    rep.set_defaults(func=cmd_report)
    for sp in (e, rep):
        add_matching_options(sp)
    add_verify_parser(rsub)

    f = calibrate_sub.add_parser(
        "fit-evidence",
        help="fit the evidence model on the robustness matrix's train split (never FSDD)",
        description="Reads the train manifests and cached embeddings under --data and writes an evidence calibration "
        "(sleuthd.judgment.evidence) to --out.",
    )
    f.add_argument("--data", type=Path, default=DEFAULT_ROOT, help="robustness data folder (default: data/robustness)")
    f.add_argument("--out", type=Path, default=DEFAULT_EVIDENCE, help="calibration file to write")
    f.add_argument(
        "--conditions",
        help="comma-separated conditions to fit on (default: every fitted condition with a train split, which leaves "
        "out the long-dialogue conditions the served card predates)",
    )
    f.add_argument("--exclude-groups", default="", help="leave out conditions of these groups, e.g. a or b")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument(
        "--support",
        type=Path,
        default=Path("data/devlarge/eval-dev-fit.jsonl"),
        help="manifest of the dialogues today's fused auto calibration was fitted on (the dev benchmark's fit split, "
        "embedded in its folder): the blend's gate is its support (default: data/devlarge/eval-dev-fit.jsonl)",
    )
    f.add_argument("--no-blend", action="store_true", help="the evidence model alone, without the blend")
    f.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    f.set_defaults(func=cmd_fit_evidence)


def cmd_verify(args: argparse.Namespace) -> int:
    """Compare a server replay of one eval manifest with the offline judges, instance by instance."""
    from sleuthd.api import SpeakerEncoder
    from sleuthd.encoders.manifest import PAPER_THRESHOLDS
    from sleuthd.judgment.calibration import Calibration
    from sleuthd.judgment.evidence import EvidenceCalibration

    from sleuthd_bench import paired
    from sleuthd_bench.robustness import judges

    predictions = args.replay / "predictions.jsonl"
    served = paired.detection_records(json.loads(line) for line in predictions.read_text().splitlines())
    _, loaded = _load_all(args.out, "eval", [args.condition])
    instances = [i for i in loaded if not i.refused]  # the server answers these with INVALID_ARGUMENT
    answered = {(r.dialogue_id, r.scenario) for recs in served.values() for r in recs}
    print(
        f"{len(loaded) - len(instances)} of {len(loaded)} instances have an unusable reference (refused); the replay "
        f"answered {len(answered)}, {len(answered - {(i.dialogue_id, i.scenario) for i in instances})} of them refused "
        "offline"
    )
    encoder = SpeakerEncoder.load(args.models_dir, encoder=args.encoder)
    manifest = encoder.manifest
    encoder.close()
    thresholds = {args.encoder: {"paper": dict(PAPER_THRESHOLDS), "default": dict(manifest.default_thresholds)}}
    calibrations = {args.encoder: Calibration.from_manifest(manifest.raw, args.encoder)}
    # The server's fused `auto` judges with the blend when the fusion carries one (sleuthd.judgment.evidence):
    # the offline `auto` compared with it is then the blend too, not today's calibration alone.
    served_blend = EvidenceCalibration.from_manifest(manifest.raw)
    blend = {"blend": served_blend} if served_blend is not None else {}
    offline, _ = judges.judge_all(
        instances,
        thresholds,
        calibrations,
        blend,
        *_channel_options(args),
        *_rejudging(args),
    )
    if blend:
        offline[f"{args.encoder}:auto"] = offline["blend"]
    worst = 0
    for run, recs in served.items():
        mine = {(r.dialogue_id, r.scenario): r for r in offline[f"{args.encoder}:{run}"]}
        differ = [
            r for r in recs if (k := (r.dialogue_id, r.scenario)) not in mine or mine[k].pred_turns != r.pred_turns
        ]
        a, b = judges.metrics(recs), judges.metrics(list(mine.values()))
        print(
            f"{run}: {len(recs)} instances, {len(differ)} judged differently; server Bal {a['bal']:.2f} "
            f"(S1 {a['S1']:.1f} S2 {a['S2']:.1f} S3 {a['S3']:.1f}), offline Bal {b['bal']:.2f}"
        )
        worst = max(worst, len(differ))
    return 0 if worst == 0 else 1


def add_matching_options(parser: argparse.ArgumentParser) -> None:
    """The server's channel-matching options, for the offline judges (default: the server's defaults)."""
    from sleuthd.config import EngineConfig

    defaults = EngineConfig()
    for flag, kind in (
        ("--band-match-octaves", "band"),
        ("--clip-match-spread", "clip"),
        ("--noise-match-db", "noise"),
        ("--noise-compose-db", "composed noise"),
        ("--telephone-band-db", "telephone-band"),
    ):
        value = getattr(defaults, flag.removeprefix("--").replace("-", "_"))
        parser.add_argument(
            flag,
            type=float,
            default=value,
            help=f"the blends' {kind} matching, as the server's {flag} (default: the server's, {value:g}; 0 = off)",
        )
    parser.add_argument(
        "--pitch-match-octaves",
        type=float,
        default=defaults.pitch_match_octaves,
        help="the blends' pitch matching, as the server's --pitch-match-octaves (default: the server's, "
        f"{defaults.pitch_match_octaves:g}; 0 = off; needs `robustness embed --pitched`)",
    )
    parser.add_argument(
        "--length-match-ratio",
        type=float,
        default=defaults.length_match_ratio,
        help="the blends' length matching, as the server's --length-match-ratio (default: the server's, "
        f"{defaults.length_match_ratio:g}; 0 = off; needs `robustness embed --cut`)",
    )


def add_verify_parser(rsub: Any) -> None:
    from sleuthd.config import default_models_dir

    v = rsub.add_parser(
        "verify",
        help="check the offline judges against a server replay of one eval manifest (instance by instance)",
    )
    v.add_argument("replay", type=Path, help="the replay's report folder (with predictions.jsonl)")
    v.add_argument("--condition", required=True, help="the condition whose eval manifest was replayed")
    v.add_argument("--encoder", default="fused", help="the encoder the replay used (default: fused)")
    v.add_argument("--out", type=Path, default=DEFAULT_ROOT, help="data folder (default: data/robustness)")
    v.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    add_matching_options(v)
    v.set_defaults(func=cmd_verify)

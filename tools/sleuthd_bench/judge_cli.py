"""The ``sleuthd-bench judge`` commands: the LALM judge's benchmark and its calibration fit.

    sleuthd-bench judge bench DIR [--batches 1,2,4,8,16,32]     # prompts/s, encoder padded vs real frames
    sleuthd-bench judge bench --random-7b --device cuda          # the same at Qwen2-Audio-7B's sizes (GPU)
    sleuthd-bench judge calibrate REPLAY_DIR... --out FILE       # fit the judge's calibration from replays

Kept apart from ``cli.py`` so that the commands are registered there with one call to :func:`add_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``judge bench`` and ``judge calibrate`` on the ``sleuthd-bench`` subparsers ``sub``."""
    judge = sub.add_parser("judge", help="the LALM judge: throughput benchmark, calibration fit")
    jsub = judge.add_subparsers(dest="judge_command", required=True)

    b = jsub.add_parser(
        "bench",
        help="prompts/s of a judge at batch sizes 1-32, its audio encoder padded to 30 s vs on real frames",
        description="Detection prompts (reference, one context turn, the turn; synthetic voices) through the "
        "in-process judge, one model call per batch, the encoder cache off; per batch size the encoder padded to "
        "the 30 s window (before), on real frames 8 clips per pass, and on real frames batched by a frame budget "
        "(now), alternating within each repeat. Only ratios mean much on a shared machine.",
    )
    b.add_argument("dir", type=Path, nargs="?", help="a judge model folder (e.g. `sleuthd models tiny-judge DIR`)")
    b.add_argument(
        "--random-7b",
        action="store_true",
        help="instead of a folder: Qwen2-Audio at the 7B checkpoint's sizes with random weights (timing only; GPU)",
    )
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    b.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    b.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes (default: 1,2,4,8,16,32)")
    b.add_argument("--repeats", type=int, default=3, help="timed rounds per batch size and mode (default: 3)")
    b.add_argument("--clip-seconds", type=float, default=3.0, help="length of every clip, seconds (default: 3)")
    b.add_argument("--json", type=Path, help="also write the rows here")
    b.set_defaults(func=cmd_judge_bench)

    c = jsub.add_parser(
        "calibrate",
        help="fit the judge's calibration (Platt or temperature, by cross-validation) from lalm replays",
        description="Reads replays of dev manifests through an uncalibrated judge (`sleuthd-bench replay MANIFEST "
        "--methods lalm`), fits detection (Platt or temperature scaling, whichever cross-validates better by "
        "dialogue) and discrimination (temperature) and the answer-mass floor, and adds the entry, keyed by the "
        "weights' hash and prompt version, to --out, the file `sleuthd serve --judge-calibration` reads. Writes "
        "judge_calibration_report.json (ECE before and after) and judge_reliability.png beside it. Fit on dev "
        "splits only, never on the split a report is measured on.",
    )
    c.add_argument("replay_dir", type=Path, nargs="+", help="replay output folders (replay.json, predictions.jsonl)")
    c.add_argument("--out", type=Path, required=True, help="calibration file to add the entry to (created if missing)")
    c.add_argument("--folds", type=int, default=5, help="cross-validation folds, by dialogue (default: 5)")
    c.add_argument(
        "--mass-quantile",
        type=float,
        default=0.01,
        help="the answer-mass floor is this quantile of the dev turns' answer mass (default: 0.01)",
    )
    c.add_argument("--fitted-on", default="", help="what the dev data is, in words (default: the replay folders)")
    c.add_argument("--weights-sha256", default="", help="the weights hash, when the replayed remote judge had none")
    c.set_defaults(func=cmd_judge_calibrate)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def cmd_judge_bench(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 on a bad folder or a missing extra."""
    from sleuthd.config import ConfigError

    from sleuthd_bench import judge_bench

    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        return _error("--batches takes positive integers, e.g. 1,2,4,8")
    if not batches or min(batches) < 1 or args.repeats < 1:
        return _error("--batches takes positive integers and --repeats at least 1")
    try:
        if args.random_7b:
            from sleuthd.lalm.tiny import random_full_size_judge

            dtype = "bfloat16" if args.dtype == "auto" else args.dtype
            device = "cuda" if args.device == "auto" else args.device
            model = random_full_size_judge(device, dtype)
        elif args.dir is None:
            return _error("judge bench needs a judge model folder, or --random-7b")
        else:
            from sleuthd.lalm.local import LocalModel

            model = LocalModel.load(args.dir, device=args.device, dtype=args.dtype, encoder_cache_entries=0)
    except ConfigError as exc:
        return _error(str(exc))
    about = {
        "model": model.name,
        "architecture": model.arch,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "clip_seconds": args.clip_seconds,
        "repeats": args.repeats,
    }
    print(f"judge {about['model']} ({about['architecture']}) on {about['device']} in {about['dtype']}, "
          f"{args.clip_seconds:g} s clips, {args.repeats} repeats")  # fmt: skip
    rows = judge_bench.measure(model, batches, args.repeats, args.clip_seconds)
    print(judge_bench.table(rows))
    if args.json:
        args.json.write_text(json.dumps(judge_bench.to_json(rows, about), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def cmd_judge_calibrate(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 when the replays cannot be fitted."""
    from sleuthd.config import ConfigError

    from sleuthd_bench.judge_calibrate import JudgeCalibrationError, fit

    if not 0 <= args.mass_quantile < 1 or args.folds < 2:
        return _error("--mass-quantile takes 0 to 1 (exclusive) and --folds at least 2")
    try:
        result = fit(args.replay_dir, args.out, args.folds, args.mass_quantile, args.fitted_on, args.weights_sha256)
    except (JudgeCalibrationError, ConfigError) as exc:
        return _error(str(exc))
    det = result.report["detection"]
    print(
        f"{result.report['model']}: {result.report['turns']} turns; detection {det['chosen']} "
        f"(a={det['a']}, b={det['b']}; cross-validated log-loss {det['cv_log_loss']}); ECE {det['before']['ece']} "
        f"raw -> {det['after_cross_validated']['ece']} cross-validated; answer-mass floor "
        f"{result.entry.min_answer_mass}"
    )
    rank = result.report["discrimination"]
    if rank["rankings"]:
        print(f"discrimination: temperature {rank['temperature']} over {rank['rankings']} rankings "
              f"(NLL {rank['nll_before']} -> {rank['nll_after']})")  # fmt: skip
    print(f"wrote {result.calibration_path}, {result.report_path}, {result.plot_path}")
    return 0

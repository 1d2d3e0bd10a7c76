"""The ``sleuthd-bench`` command line: build benchmarks, replay them through a server, fit `auto`.

Research tooling, kept out of the product: it uses sleuthd's public in-process API and client only.
Heavy imports (encoders, grpc stubs, matplotlib) happen inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sleuthd.api import SpeakerEncoder

    from sleuthd_bench import calibrate

logger = logging.getLogger("sleuthd")

# Exit codes: 0 success, 1 some instances failed (replay without --allow-failures), 2 bad input or
# unreachable server.
EXIT_FAILURES = 1
EXIT_ERROR = 2


REPO = Path(__file__).resolve().parents[2]  # the checkout: default output folders live under it


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _load_encoder(args: argparse.Namespace) -> SpeakerEncoder:
    """The encoder a command embeds with, through sleuthd's public in-process API."""
    from sleuthd.api import SpeakerEncoder

    return SpeakerEncoder.load(args.models_dir, encoder=args.encoder, device=args.device)


# ---------------------------------------------------------------------------------------------- make


def cmd_bench_cut(args: argparse.Namespace) -> int:
    from sleuthd_bench.corpus import CorpusError
    from sleuthd_bench.turn_lengths import MIXED_SHORT_SHARE, SHORT_TURN_SECONDS, cut_corpus

    share = MIXED_SHORT_SHARE if args.share is None else args.share
    try:
        result = cut_corpus(args.corpus, args.out, share, args.seed)
    except (CorpusError, ValueError, OSError) as exc:
        return _error(str(exc))
    low, high = SHORT_TURN_SECONDS
    print(f"wrote {result.csv_path}: {result.cut} of {result.clips} clips cut to {low:g}-{high:g} s, the others whole")
    return 0


def cmd_bench_make(args: argparse.Namespace) -> int:
    from sleuthd.audio.decode import AudioError
    from sleuthd.encoders.manifest import ManifestError as ModelManifestError

    from sleuthd_bench.corpus import CorpusError
    from sleuthd_bench.make import MakeError, MakeOptions, make_manifest

    try:
        options = MakeOptions(
            turns=args.turns,
            dialogues_per_speaker=args.dialogues_per_speaker,
            source=args.source or args.corpus.resolve().parent.name,
            seed=args.seed,
        )
        encoder = _load_encoder(args)
    except (MakeError, ModelManifestError, OSError) as exc:
        return _error(str(exc))
    try:
        result = asyncio.run(make_manifest(args.corpus, args.out, options, encoder, show_progress=not args.quiet))
    except (CorpusError, MakeError, AudioError) as exc:
        return _error(str(exc))
    finally:
        encoder.close()
    print(
        f"wrote {result.path}: {len(result.lines)} dialogues, {result.n_targets} target speakers, "
        f"{result.n_skipped} of {result.n_clips} clips skipped (too little speech)"
    )
    return 0


# ---------------------------------------------------------------------------------------------- synth


def cmd_bench_synth(args: argparse.Namespace) -> int:
    from sleuthd.encoders.manifest import ManifestError as ModelManifestError

    from sleuthd_bench.corpus import CorpusError
    from sleuthd_bench.devsets import PRESETS, DevSetError, build_devsets
    from sleuthd_bench.make import MakeError
    from sleuthd_bench.synth import SynthesisError

    out = args.out or Path("data") / "dev" / args.size
    started = time.monotonic()
    try:
        encoder = _load_encoder(args)
    except (ModelManifestError, OSError) as exc:
        return _error(str(exc))
    try:
        result = asyncio.run(
            build_devsets(
                out,
                PRESETS[args.size],
                encoder,
                seed=args.seed,
                turns=args.turns,
                fsdd_dir=args.fsdd_dir,
                splits=args.splits.split(","),
                workers=args.workers,
                show_progress=not args.quiet,
            )
        )
    except (DevSetError, CorpusError, MakeError, SynthesisError, FileNotFoundError) as exc:
        return _error(str(exc))
    finally:
        encoder.close()
    for split, path in result.manifests.items():
        print(f"{split:9s} {result.dialogues[split]:4d} dialogues  {path}")
    print(f"built in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------- replay


def cmd_replay(args: argparse.Namespace) -> int:
    from sleuthd_bench.instances import METHOD_CHOICES, THRESHOLD_SETS, parse_choices
    from sleuthd_bench.manifest import ManifestError
    from sleuthd_bench.replay import ReplayConfig, ReplayError, replay
    from sleuthd_bench.report import markdown_table

    try:
        methods = parse_choices(args.methods, METHOD_CHOICES, "--methods")
        thresholds = parse_choices(args.thresholds, THRESHOLD_SETS, "--thresholds")
    except ValueError as exc:
        return _error(str(exc))
    out = args.out or Path("runs") / args.manifest.stem
    if args.busy_retries < 0:
        return _error("--busy-retries takes 0 or more")
    config = ReplayConfig(
        manifest=args.manifest,
        target=args.target,
        out_dir=out,
        methods=methods,
        thresholds=thresholds,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        shuffle_seed=args.seed,
        encoder=args.encoder,
        show_progress=not args.quiet,
        busy_retries=args.busy_retries,
    )
    try:
        result = asyncio.run(replay(config))
    except (ManifestError, ReplayError) as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted: no report written", file=sys.stderr)
        return 130
    print(markdown_table(result.report), end="")
    summary = result.failure_summary()
    if summary:
        print(summary, file=sys.stderr)
    if result.incomplete_runs:
        print(
            f"runs without a score (too few answered instances): {', '.join(result.incomplete_runs)}", file=sys.stderr
        )
    print(
        f"replayed {result.report['n_dialogues']} dialogues ({result.rpcs} RPCs) in {result.wall_s:.1f} s wall time; "
        f"report in {out}",
        file=sys.stderr,
    )
    if (result.failures or result.incomplete_runs) and not args.allow_failures:
        return EXIT_FAILURES
    return 0


def cmd_bench_compare(args: argparse.Namespace) -> int:
    from sleuthd_bench import paired

    paths = [d / "predictions.jsonl" if d.is_dir() else d for d in args.run_dir]
    rows = []
    for path in paths:
        if not path.is_file():
            return _error(f"{path}: no such file; give a replay's report folder or its predictions.jsonl")
        try:
            with path.open(encoding="utf-8") as fh:
                found = [json.loads(line) for line in fh if line.strip()]
        except json.JSONDecodeError as exc:
            return _error(f"{path}: not a replay's predictions.jsonl ({exc})")
        if len(paths) > 1:
            # Replays of one manifest with different servers or encoders: runs are told apart by folder.
            label = _compare_label(path, paths)
            for row in found:
                row["run"] = f"{label}:{row['run']}"
        rows += found
    groups = None
    if args.by_speaker is not None:
        from sleuthd_bench.manifest import ManifestError, read_manifest

        try:
            groups = {line.dialogue_id: line.target_speaker for line in read_manifest(args.by_speaker, False)}
        except (OSError, ManifestError) as exc:
            return _error(f"--by-speaker: {exc}")
    try:
        records = paired.detection_records(rows)
        comparisons = paired.compare_with_all(records, args.run, args.resamples, args.seed, args.level, groups)
    except (KeyError, TypeError) as exc:
        return _error(f"{', '.join(map(str, paths))}: not a replay's predictions.jsonl ({exc})")
    except ValueError as exc:
        return _error(f"{', '.join(map(str, paths))}: {exc}")
    if not comparisons:
        return _error(f"{args.run} is the only run; nothing to compare it with")
    print(paired.explanation(comparisons) + "\n")
    print(paired.markdown_table(comparisons), end="")
    _write_json(args.json, {"predictions": [str(p) for p in paths], "comparisons": [c.to_json() for c in comparisons]})
    return 0


def _compare_label(path: Path, paths: Sequence[Path]) -> str:
    """The nearest folder name that tells ``path``'s replay apart from the others
    (runs/fusion/ge2e/fsdd and runs/fusion/fused/fsdd -> "ge2e" and "fused")."""
    for n in range(1, len(path.parent.parts) + 1):
        names = [p.parent.parts[-n] if len(p.parent.parts) >= n else "" for p in paths]
        if len(set(names)) == len(names):
            return path.parent.parts[-n]
    return str(path.parent)


# ---------------------------------------------------------------------------------------------- throughput


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    from sleuthd_bench import throughput

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        return _error("--concurrency takes positive integers, e.g. 1,8,32,128")

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    encoders = [e.strip() for e in args.encoders.split(",") if e.strip()]
    reports = {}
    try:
        for encoder in encoders:
            reports[encoder] = throughput.run(
                levels, args.seconds, args.dialogues, args.cache, args.device, args.server_arg or [], progress, modes,
                encoder, args.replicas,
            )  # fmt: skip
            print(throughput.table(reports[encoder]) + "\n", flush=True)
    except (ValueError, RuntimeError) as exc:
        return _error(str(exc))
    if args.json:
        throughput.write_json(reports[encoders[0]] if len(encoders) == 1 else reports, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_bench_side_by_side(args: argparse.Namespace) -> int:
    from sleuthd_bench import side_by_side

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    try:
        report = side_by_side.main_args(args, progress)
    except (ValueError, RuntimeError) as exc:
        return _error(str(exc))
    print(side_by_side.table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def cmd_bench_latency(args: argparse.Namespace) -> int:
    from sleuthd_bench import latency

    try:
        checkpoints = [int(c) for c in args.stream_turns.split(",") if c.strip()]
        check_turns = [int(c) for c in args.check_turns.split(",") if c.strip()]
    except ValueError:
        return _error("--stream-turns and --check-turns take positive integers, e.g. 10,100,500,1000")
    if min(checkpoints + check_turns, default=1) < 1:
        return _error("--stream-turns and --check-turns take positive integers, e.g. 10,100,500,1000")

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    report = latency.run(
        checkpoints, check_turns, args.repeats, args.cache, args.target, args.server_arg or [], progress
    )
    print(latency.table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def cmd_bench_report_paint(args: argparse.Namespace) -> int:
    from sleuthd_bench import report_paint
    from sleuthd_bench.browser import BrowserUnavailable

    try:
        sizes = sorted({int(n) for n in args.dialogues.split(",") if n.strip()})
        if not sizes or sizes[0] < 1:
            raise ValueError
    except ValueError:
        return _error("--dialogues takes positive integers, e.g. 10,1000")

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    try:
        results = report_paint.run(sizes, args.clips, args.out, args.runs, args.target, args.seed, progress)
    except (BrowserUnavailable, ValueError, RuntimeError, OSError) as exc:
        return _error(str(exc))
    print(report_paint.table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- drift


def cmd_bench_drift(args: argparse.Namespace) -> int:
    """``sleuthd-bench drift``: exit 0 on success, 2 on bad input or a missing tool/model."""
    from sleuthd.encoders.manifest import ManifestError

    from sleuthd_bench import drift_eval, synth
    from sleuthd_bench.driftset import PRESETS, DriftSetError

    out = Path(args.out) if args.out else REPO / "data" / "drift" / args.size
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
        drift_eval.embedding_rates(rates)
        encoder = _load_encoder(args)
    except (ValueError, ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        result = asyncio.run(
            drift_eval.run_drift_bench(
                out,
                PRESETS[args.size],
                encoder,
                seed=args.seed,
                rates=rates,
                workers=args.workers,
                show_progress=not args.quiet,
            )
        )
    except (DriftSetError, synth.SynthesisError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        encoder.close()
    print(drift_eval.markdown_report(result.report), end="")
    print("\ndrift block for the model card:")
    print(json.dumps(result.block, indent=2))
    print(f"report in {out} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------- calibrate


def _embed_calibration_corpus(
    args: argparse.Namespace, short_crop_seed: int | None = None
) -> tuple[dict[str, Any], list[calibrate.Clip], list[calibrate.Clip]] | int:
    """(encoder manifest, embedded clips, embedded short crops: empty unless ``short_crop_seed``) for
    the calibrate commands, or an exit code on a bad corpus."""
    import asyncio

    from sleuthd_bench import calibrate
    from sleuthd_bench.corpus import CorpusError, read_corpus
    from sleuthd_bench.progress import Progress

    try:
        clips = read_corpus(args.corpus)
    except CorpusError as exc:
        return _error(str(exc))
    encoder = _load_encoder(args)

    async def embed(label: str, seed: int | None) -> list[calibrate.Clip]:
        bar = Progress(len(clips), label, enabled=not args.quiet)
        try:
            return await calibrate.embed_corpus(encoder, clips, bar.update_to, short_crop_seed=seed)
        finally:
            bar.close()

    async def embed_all() -> tuple[list[calibrate.Clip], list[calibrate.Clip]]:
        try:
            whole = await embed("embedding", None)
            short = [] if short_crop_seed is None else await embed("embedding short crops", short_crop_seed)
            return whole, short
        finally:
            await encoder.aclose()

    embedded, short = asyncio.run(embed_all())
    return encoder.manifest.raw, embedded, short


def _progress_printer(args: argparse.Namespace) -> Callable[[str], None]:
    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    return progress


def _write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"}


def cmd_calibrate_fit(args: argparse.Namespace) -> int:
    from sleuthd_bench import calibrate

    if not 0.0 <= args.short_share <= 1.0:
        return _error(f"--short-share must be between 0 and 1, not {args.short_share:g}")
    if args.train_length_profiles and args.short_share > 0:
        return _error("--train-length-profiles replaces --short-share: use one or the other")
    needs_crops = args.short_share > 0 or args.train_length_profiles
    loaded = _embed_calibration_corpus(args, short_crop_seed=args.seed if needs_crops else None)
    if isinstance(loaded, int):
        return loaded
    manifest_raw, embedded, short = loaded
    models, stats = calibrate.fit(
        embedded,
        args.dialogues,
        args.seed,
        short_clips=short,
        short_share=args.short_share,
        length_profiles=args.train_length_profiles,
    )
    block = calibrate.calibration_block(models, stats, manifest_raw, args.corpus_label or str(args.corpus), args.seed)
    calibrate.write_into_card(args.card, block, make_default=args.make_default)
    print(json.dumps(stats, indent=2))
    print(f"wrote the calibration into {args.card}; run `make models` to rebuild the manifest")
    return 0


def cmd_calibrate_cv(args: argparse.Namespace) -> int:
    from sleuthd_bench import calibrate_cv

    try:
        jitter_sets = [tuple(float(v) for v in part.split(",")) for part in args.jitter_sets.split(";") if part.strip()]
        l2_values = [float(v) for v in args.l2.split(",") if v.strip()]
        shares = [float(v) for v in args.train_short_shares.split(",") if v.strip()]
    except ValueError:
        return _error(
            "--jitter-sets takes sets like '0;0,0.01,0.02', --l2 numbers like '1e-3,1e-2' and "
            "--train-short-shares shares like '0,0.25'"
        )
    if not shares or any(not 0.0 <= v <= 1.0 for v in shares):
        return _error("--train-short-shares needs at least one share between 0 and 1")
    if (any(shares) or args.train_length_profiles) and not args.short_turns:
        return _error(
            "--train-short-shares above 0 and --train-length-profiles need --short-turns (the crops they train on)"
        )
    if args.train_length_profiles and any(shares):
        return _error("--train-length-profiles replaces --train-short-shares: use one or the other")
    if not jitter_sets or not l2_values or any(j < 0 for js in jitter_sets for j in js) or min(l2_values) <= 0:
        return _error("--jitter-sets needs at least one set of levels >= 0 and --l2 at least one value > 0")
    loaded = _embed_calibration_corpus(args, short_crop_seed=args.seed if args.short_turns else None)
    if isinstance(loaded, int):
        return loaded
    _, embedded, short = loaded
    try:
        results = calibrate_cv.cross_validate(
            embedded,
            jitter_sets,
            l2_values,
            folds=args.folds,
            repeats=args.repeats,
            seed=args.seed,
            train_dialogues=args.dialogues,
            test_dialogues=args.test_dialogues,
            short_clips=short if args.short_turns else None,
            train_short_shares=shares,
            length_profiles=args.train_length_profiles,
            progress=_progress_printer(args),
        )
    except ValueError as exc:
        return _error(str(exc))
    chosen = calibrate_cv.select(results, args.min_s1)
    print(calibrate_cv.table(results, chosen, args.min_s1))
    none = f"none keeps S1 >= {args.min_s1:g} % in every test condition"
    print(f"\nchosen: {chosen.setting.label() if chosen else none}")
    _write_json(args.json, calibrate_cv.to_json(results, chosen, _params(args)))
    return 0


def cmd_calibrate_cohort_cv(args: argparse.Namespace) -> int:
    from sleuthd_bench import cohort_eval

    loaded = _embed_calibration_corpus(args)
    if isinstance(loaded, int):
        return loaded
    _, embedded, _ = loaded
    try:
        by_jitter = cohort_eval.cohort_cross_validate(
            embedded,
            folds=args.folds,
            repeats=args.repeats,
            seed=args.seed,
            train_dialogues=args.dialogues,
            test_dialogues=args.test_dialogues,
            look_alike=args.look_alike,
            progress=_progress_printer(args),
        )
    except ValueError as exc:
        return _error(str(exc))
    cohort_kind = "with a look-alike" if args.look_alike else "strangers"
    rows = {f"held-out voices, test jitter {j:g}, cohort: {cohort_kind}": v for j, v in by_jitter.items()}
    print(cohort_eval.table(rows))
    _write_json(args.json, cohort_eval.to_json(rows, _params(args)))
    return 0


def cmd_calibrate_cohort_eval(args: argparse.Namespace) -> int:
    from sleuthd.judgment.calibration import Calibration, CalibrationError

    from sleuthd_bench import calibrate, cohort_eval
    from sleuthd_bench.turn_lengths import MIXED_SHORT_SHARE

    loaded = _embed_calibration_corpus(args, short_crop_seed=None if args.turn_lengths == "whole" else args.seed)
    if isinstance(loaded, int):
        return loaded
    manifest_raw, embedded, short = loaded
    if args.turn_lengths == "mixed":
        embedded = calibrate.mix_lengths(embedded, short, args.seed, MIXED_SHORT_SHARE)
    elif args.turn_lengths == "short":
        embedded = short
    try:
        calibration = Calibration.from_manifest(manifest_raw, args.encoder)
        instances = calibrate.make_instances(
            embedded,
            args.dialogues,
            args.seed,
            benchmark_like=True,
            cohort=True,
            intruder_in_cohort=0.0,
            similar_in_cohort=args.look_alike,
        )
    except (CalibrationError, ValueError) as exc:
        return _error(str(exc))
    cohort_kind = "with a look-alike" if args.look_alike else "strangers"
    lengths = "" if args.turn_lengths == "whole" else f", {args.turn_lengths} turns"
    label = f"{args.corpus} ({args.dialogues}, cohort: {cohort_kind}{lengths})"
    rows = {label: cohort_eval.compare(calibration.models, instances)}
    print(cohort_eval.table(rows))
    _write_json(args.json, cohort_eval.to_json(rows, _params(args)))
    return 0


# ---------------------------------------------------------------------------------------------- parser

LENGTH_PROFILES_HELP = (
    "draw the training dialogues by length profile: a third from whole clips, a third mixing whole clips and "
    "1.2-3 s cuts, a third from cuts only (docs/research/auto-turn-lengths.md, step 9); "
    "replaces a training share of cuts"
)
LOOK_ALIKE_HELP = (
    "every test cohort includes the target's second most similar same-gender speaker (the most similar is the "
    "S3 intruder): two alike voices in one dialogue"
)


def build_parser() -> argparse.ArgumentParser:
    """The ``sleuthd-bench`` command line: benchmarks, replay, calibration fitting and speech synthesis."""
    from sleuthd.config import default_models_dir

    from sleuthd_bench.driftset import PRESETS as DRIFT_PRESETS
    from sleuthd_bench.turn_lengths import TRAIN_SHORT_SHARE

    p = argparse.ArgumentParser(
        prog="sleuthd-bench",
        description="Research tools for sleuthd: build benchmarks, replay them through a server, fit `auto`.",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default: info)")
    sub = p.add_subparsers(dest="command", required=True)

    def engine_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
        sp.add_argument("--encoder", default="ge2e", help="encoder that embeds the corpus (default: ge2e)")
        sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the encoder runs")
        sp.add_argument("--seed", type=int, default=0, help="seed for every random choice (default: 0)")
        sp.add_argument("--turns", type=int, default=5, help="target turns per dialogue (paper: 5 or 10; default 5)")
        sp.add_argument("--quiet", action="store_true", help="no progress bars on stderr")

    m = sub.add_parser(
        "make",
        help="build a manifest from a speaker-labelled corpus CSV",
        description="Build a SpeakerSleuth-style manifest from a CSV with columns path,speaker,gender[,text] "
        "(paths relative to the CSV). S2 = a clip of an opposite-gender speaker (least similar speaker if the "
        "corpus has none), S3 = a clip of the most similar same-gender speaker by centroid cosine.",
    )
    m.add_argument("corpus", type=Path, help="corpus CSV: path,speaker,gender[,text]")
    m.add_argument("--out", type=Path, required=True, help="manifest to write (JSONL)")
    m.add_argument("--dialogues-per-speaker", type=int, default=3, help="dialogues per target speaker (default: 3)")
    m.add_argument("--source", help="the manifest's source field (default: the CSV's folder name)")
    engine_args(m)
    m.set_defaults(func=cmd_bench_make)

    cut = sub.add_parser(
        "cut",
        help="a corpus whose clips differ in length: a share of them cut to 1.2-3 s (about 2 s of speech)",
        description="Writes OUT/corpus.csv with every clip of CORPUS; each clip, by a coin flip with probability "
        "--share, is replaced by a random 1.2-3 s stretch of its audible part, written under OUT/<speaker>/. "
        "Build a manifest from it with `bench make` to measure dialogues of mixed turn lengths.",
    )
    cut.add_argument("corpus", type=Path, help="corpus CSV: path,speaker,gender[,text]")
    cut.add_argument("--out", type=Path, required=True, help="folder for the cut clips and corpus.csv")
    cut.add_argument(
        "--share",
        type=float,
        help="share of clips to cut, 0-1 (default: 0.5, the share of the mixed condition of `calibrate cv`)",
    )
    cut.add_argument("--seed", type=int, default=0, help="seed of the coin flips and the cuts (default: 0)")
    cut.set_defaults(func=cmd_bench_cut)

    s = sub.add_parser(
        "synth",
        help="build the dev benchmark: fit (espeak), transfer (flite + sox variants), fsdd (real speech)",
    )
    s.add_argument("--size", choices=["small", "large"], default="small", help="small: CI; large: threshold fitting")
    s.add_argument("--out", type=Path, help="output folder (default: data/dev/<size>/)")
    s.add_argument("--fsdd-dir", type=Path, help="FSDD folder with fsdd.csv (default: ../shared/data/fsdd)")
    s.add_argument("--splits", default="fit,transfer,fsdd", help="splits to build (default: fit,transfer,fsdd)")
    s.add_argument("--workers", type=int, default=2, help="parallel synthesis processes (default: 2)")
    engine_args(s)
    s.set_defaults(func=cmd_bench_synth)

    from sleuthd_bench import kokoro_cli  # the Kokoro dev set: `synth-kokoro` (its own module)

    kokoro_cli.add_parser(sub, engine_args)

    from sleuthd_bench import judge_cli  # the LALM judge: `judge bench`, `judge calibrate` (its own module)

    judge_cli.add_parser(sub)

    r = sub.add_parser(
        "replay",
        help="replay a benchmark manifest through a running server and write a report",
        description="Send every instance of MANIFEST through CheckDialogue and RankCandidates and write "
        "report.json, report.md, predictions.jsonl, sweep.json and plots to --out. The paper's three methods at "
        "the paper's thresholds are always run. Exit status: 0 ok, 1 some instances failed, 2 error.",
    )
    r.add_argument("manifest", type=Path)
    r.add_argument("--target", default="127.0.0.1:50051", help="server host:port (default: 127.0.0.1:50051)")
    r.add_argument(
        "--methods",
        default="pairwise,centroid,reference",
        help="pairwise,centroid,reference[,auto][,lalm] (lalm needs a server started with an LALM judge)",
    )
    r.add_argument("--thresholds", default="paper,default", help="paper, default or paper,default (default: both)")
    r.add_argument("--out", type=Path, help="report folder (default: runs/<manifest name>/)")
    r.add_argument("--concurrency", type=int, default=4, help="RPCs in flight (default: 4)")
    r.add_argument("--timeout", type=float, default=120.0, help="deadline per RPC, seconds (default: 120)")
    r.add_argument(
        "--busy-retries",
        type=int,
        default=6,
        help="times an RPC the server refused as busy (RESOURCE_EXHAUSTED) is sent again, backing off 0.5-8 s, "
        "before it counts as failed (default: 6; 0 = never)",
    )
    r.add_argument("--connect-timeout", type=float, default=10.0, help="wait for the server, seconds (default: 10)")
    r.add_argument("--encoder", default="", help="server encoder (default: the server's)")
    r.add_argument("--seed", type=int, default=0, help="seed of the candidate shuffles (default: 0)")
    r.add_argument("--allow-failures", action="store_true", help="exit 0 even if some instances failed")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_replay)

    cp = sub.add_parser(
        "compare",
        help="one run of a replay against every other, paired over dialogues, with bootstrap intervals",
        description="Read a replay's predictions.jsonl and print, for --run against every other run, the "
        "difference in balanced detection accuracy and balanced localization F1 (percentage points) with a "
        "paired bootstrap interval over dialogues. replay writes the same table for auto into report.md.",
    )
    cp.add_argument(
        "run_dir",
        type=Path,
        nargs="+",
        help="a replay's report folder (or its predictions.jsonl); several replays of one manifest (e.g. one "
        "per encoder) are compared together, each run named FOLDER:RUN",
    )
    cp.add_argument(
        "--run", default="auto", help="the run compared with all others (default: auto; FOLDER:RUN with several)"
    )
    cp.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    cp.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    cp.add_argument("--level", type=float, default=0.95, help="interval level, 0-1 (default: 0.95)")
    cp.add_argument("--json", type=Path, help="also write the comparisons as JSON")
    cp.add_argument(
        "--by-speaker",
        type=Path,
        metavar="MANIFEST",
        help="resample whole target speakers, as the replayed manifest names them, instead of dialogues: where a "
        "speaker's dialogues reuse the same clips, they are not independent draws and their interval is too narrow",
    )
    cp.set_defaults(func=cmd_bench_compare)

    t = sub.add_parser(
        "throughput",
        help="audio-seconds scored per second and latency: resemblyzer vs our server unbatched vs batched",
    )
    t.add_argument("--concurrency", default="1,8,32,128", help="concurrency levels (default: 1,8,32,128)")
    t.add_argument("--seconds", type=float, default=20.0, help="measuring time per mode and level (default: 20)")
    t.add_argument("--dialogues", type=int, default=40, help="distinct dialogues of 5 turns x 2-6 s (default: 40)")
    t.add_argument("--cache", type=Path, default=Path("data/throughput"), help="where the speech is cached")
    t.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="servers' --device (default: cpu)")
    t.add_argument("--server-arg", action="append", help="extra `sleuthd serve` argument for both servers (repeat)")
    t.add_argument(
        "--modes",
        default="resemblyzer,unbatched,per_clip,batched",
        help="which to run, batched always among them (default: all four)",
    )
    t.add_argument(
        "--encoders",
        default="ge2e",
        help="encoders measured one after the other, each against its raw model rate, e.g. ge2e,campplus,fused "
        "(default: ge2e; the resemblyzer baseline runs for ge2e only)",
    )
    t.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="server processes per mode, calls spread over them round robin; cores and memory summed (default: 1)",
    )
    t.add_argument("--json", type=Path, help="write the results as JSON (keyed by encoder when several)")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_bench_throughput)

    sb = sub.add_parser(
        "side-by-side",
        help="server configurations or checkouts measured in one run, alternating rounds, ratios to the first",
    )
    sb.add_argument(
        "--variant",
        action="append",
        help="NAME=SERVE ARGS, e.g. 'threads1=--intra-op-threads 1' (repeat; the first is the reference)",
    )
    sb.add_argument("--checkout", action="append", help="NAME=DIR: that variant's server runs DIR/service's code")
    sb.add_argument(
        "--encoders", default="ge2e,fused", help="servers' --encoder, one after the other (default: ge2e,fused)"
    )
    sb.add_argument("--concurrency", default="1,32", help="closed-loop clients (default: 1,32)")
    sb.add_argument("--seconds", type=float, default=10.0, help="per level, variant and round (default: 10)")
    sb.add_argument("--rounds", type=int, default=2, help="alternating rounds (default: 2)")
    sb.add_argument("--stream-turns", type=int, default=30, help="3 s turns streamed per round, 0 = none (default: 30)")
    sb.add_argument("--dialogues", type=int, default=40, help="distinct dialogues of 5 turns (default: 40)")
    sb.add_argument(
        "--beside-check",
        type=int,
        default=0,
        help="also stream once more while another client sends CheckDialogue of this many cached turns back to "
        "back (a long dialogue's judging beside the stream); 0 = not (default)",
    )
    sb.add_argument("--cache", type=Path, default=Path("data"), help="holds throughput/ and latency/ speech")
    sb.add_argument("--json", type=Path, help="write the results as JSON")
    sb.add_argument("--quiet", action="store_true")
    sb.set_defaults(func=cmd_bench_side_by_side)

    la = sub.add_parser(
        "latency",
        help="streamed verdict latency as a dialogue grows, and CheckDialogue's judging time, through the server",
    )
    la.add_argument(
        "--stream-turns", default="10,100,500,1000", help="checkpoints of one long stream (default: 10,100,500,1000)"
    )
    la.add_argument(
        "--check-turns", default="10,100,1000", help="CheckDialogue sizes, embeddings cached (default: 10,100,1000)"
    )
    la.add_argument("--repeats", type=int, default=5, help="timed CheckDialogue calls per size (default: 5)")
    la.add_argument("--cache", type=Path, default=Path("data/latency"), help="where the speech is cached")
    la.add_argument("--target", help="an already running server (HOST:PORT) instead of a fresh subprocess")
    la.add_argument("--server-arg", action="append", help="extra `sleuthd serve` argument (repeat)")
    la.add_argument("--json", type=Path, help="write the results as JSON")
    la.add_argument("--quiet", action="store_true")
    la.set_defaults(func=cmd_bench_latency)

    rp = sub.add_parser(
        "report-paint", help="how fast an HTML review report opens in headless Chromium: small vs large, cold"
    )
    rp.add_argument("--dialogues", default="10,1000", help="report sizes, each checked for real (default: 10,1000)")
    rp.add_argument("--clips", type=Path, default=REPO / "data" / "test-speech", help="one folder of WAVs per voice")
    rp.add_argument("--out", type=Path, default=REPO / "runs" / "report-paint", help="where the reports are written")
    rp.add_argument("--runs", type=int, default=5, help="cold opens per report (default: 5)")
    rp.add_argument("--target", help="an already running server (HOST:PORT) instead of a fresh subprocess")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--json", type=Path, help="write the results as JSON")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(func=cmd_bench_report_paint)

    dr = sub.add_parser(
        "drift",
        help="build the speaker-drift dev set, fit drift detection on it and compare with the paper's baseline",
        description="Build the speaker-drift dev set (3 segments + 500 ms silence; non-drift, hard negatives "
        "(speed x1.05, noise -30 dB), abrupt and smooth drift, equal numbers; fit = espeak voices, transfer = "
        "flite + sox voices), fit the detector and the paper's min-adjacent-cosine baseline on fit, and report "
        "accuracy, F1 and localization on both splits. Prints the card's drift block.",
    )
    dr.add_argument(
        "--size", choices=sorted(DRIFT_PRESETS), default="small", help="small: 4, large: 32 per subtype and split"
    )
    dr.add_argument("--out", type=Path, help="output folder (default: data/drift/<size>/)")
    dr.add_argument(
        "--rates", default="5,2.5", help="window rates to try, windows/s; each the largest / a whole number"
    )
    dr.add_argument("--seed", type=int, default=0, help="seed for voices, sentences and noise (default: 0)")
    dr.add_argument("--workers", type=int, default=2, help="parallel synthesis threads (default: 2)")
    dr.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    dr.add_argument("--encoder", default="ge2e", help="encoder to embed with (default: ge2e)")
    dr.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the encoder runs")
    dr.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    dr.set_defaults(func=cmd_bench_drift)

    c = sub.add_parser("calibrate", help="fit the auto method's calibration")
    csub = c.add_subparsers(dest="calibrate_command", required=True)
    f = csub.add_parser(
        "fit",
        help="fit the auto method on a speaker-labelled corpus and store it in the encoder's model card",
        description="Embeds the corpus in-process, draws benchmark-like training dialogues from it, fits one "
        "logistic model per variant and writes the calibration block (with how it was fitted) into the card.",
    )
    f.add_argument("corpus", type=Path, help="corpus CSV: path,speaker,gender[,text] (the FIT split only)")
    f.add_argument("--card", type=Path, default=Path("service/sleuthd/cards/ge2e.json"), help="model card to update")
    f.add_argument("--dialogues", type=int, default=8000, help="training dialogues to draw (default: 8000)")
    f.add_argument("--corpus-label", help="how the corpus is described in the card (default: its path)")
    f.add_argument("--make-default", action="store_true", help="also make auto the encoder's default method")
    f.add_argument(
        "--short-share",
        type=float,
        default=TRAIN_SHORT_SHARE,
        help="share of training clips replaced by a random 1.2-3 s cut of themselves "
        "(default: %(default)s, chosen by `calibrate cv --train-short-shares`)",
    )
    f.add_argument("--train-length-profiles", action="store_true", help=LENGTH_PROFILES_HELP)
    engine_args(f)
    f.set_defaults(func=cmd_calibrate_fit)
    v = csub.add_parser(
        "cv",
        help="compare fitting settings (jitter, L2) by cross-validation over held-out voices of the fit corpus",
        description="Splits the corpus's speakers into folds, fits on the others and scores benchmark-style "
        "dialogues of the held-out target speakers at decision threshold 0.5, as recorded and with their "
        "embeddings jittered. Chooses the best mean balanced accuracy among settings that keep S1 accuracy "
        ">= --min-s1 in every test condition. Values are percentages (mean over folds).",
    )

    def fold_args(sp: argparse.ArgumentParser, training_dialogues: str) -> None:
        """The corpus and the fold layout, shared by the cross-validation commands."""
        sp.add_argument("corpus", type=Path, help="corpus CSV: path,speaker,gender[,text] (the FIT split only)")
        sp.add_argument("--folds", type=int, default=6, help="speaker folds (default: 6)")
        sp.add_argument("--repeats", type=int, default=2, help="independent fold splits, averaged (default: 2)")
        sp.add_argument("--dialogues", type=int, default=4000, help=f"{training_dialogues} (default: 4000)")
        sp.add_argument(
            "--test-dialogues", type=int, default=1200, help="test dialogues per fold and jitter (default: 1200)"
        )

    fold_args(v, "training dialogues per fold")
    v.add_argument(
        "--jitter-sets",
        default="0;0,0.01,0.02;0,0.02;0,0.01,0.02,0.03",
        help="';'-separated sets of training jitter levels (default: %(default)s)",
    )
    v.add_argument("--l2", default="1e-3,2e-3,3e-3,5e-3,1e-2", help="L2 penalties to try (default: %(default)s)")
    v.add_argument("--min-s1", type=float, default=99.0, help="S1 accuracy (%%) a setting must keep (default: 99)")
    v.add_argument(
        "--short-turns",
        action="store_true",
        help="also test on short turns (each clip cut to 1.2-3 s, about 2 s of speech) and on dialogues "
        "mixing whole and cut clips; they count in the selection rule like the test jitters",
    )
    v.add_argument(
        "--train-short-shares",
        default="0",
        help="shares of training clips replaced by their short cuts to try, e.g. '0,0.25,0.5' "
        "(above 0 needs --short-turns; default: %(default)s)",
    )
    v.add_argument("--train-length-profiles", action="store_true", help=LENGTH_PROFILES_HELP)
    v.add_argument("--json", type=Path, help="write every result as JSON")
    engine_args(v)
    v.set_defaults(func=cmd_calibrate_cv)
    cc = csub.add_parser(
        "cohort-cv",
        help="what the dialogue's other speakers add: plain vs cohort models on held-out voices of the fit corpus",
        description="Splits the corpus's speakers into folds, fits every variant (as `calibrate fit` does) on the "
        "others, and judges benchmark-style dialogues of the held-out targets that also have 1-3 other speakers "
        "(strangers to target and intruder) twice: ignoring those speakers, and with them as the cohort. "
        "Detection and F1 in %, ECE on the 0-1 scale, means over folds.",
    )
    fold_args(cc, "training dialogues per fold and kind (plain, cohort)")
    cc.add_argument("--look-alike", action="store_true", help=LOOK_ALIKE_HELP)
    cc.add_argument("--json", type=Path, help="write the results as JSON")
    engine_args(cc)
    cc.set_defaults(func=cmd_calibrate_cohort_cv)
    ce = csub.add_parser(
        "cohort-eval",
        help="judge dialogues of any corpus with the shipped calibration, without and with a cohort",
        description="Embeds the corpus, draws benchmark-style dialogues (5 turns + reference) that also have 1-3 "
        "other speakers (strangers to target and intruder), and judges each twice with the encoder's shipped "
        "calibration: ignoring those speakers, and with them as the cohort. Fits nothing. Detection and F1 in %, "
        "ECE on the 0-1 scale.",
    )
    ce.add_argument("corpus", type=Path, help="corpus CSV: path,speaker,gender[,text]")
    ce.add_argument("--dialogues", type=int, default=1500, help="dialogues to draw (default: 1500)")
    ce.add_argument("--look-alike", action="store_true", help=LOOK_ALIKE_HELP)
    ce.add_argument(
        "--turn-lengths",
        choices=["whole", "short", "mixed"],
        default="whole",
        help="draw the turns from whole clips (default), from cuts of 1.2-3 s of them (about 2 s of speech), "
        "or from both, each clip whole or cut by a coin flip",
    )
    ce.add_argument("--json", type=Path, help="write the results as JSON")
    engine_args(ce)
    ce.set_defaults(func=cmd_calibrate_cohort_eval)

    from sleuthd_bench.robustness import cli as robustness_cli  # `robustness` and `calibrate fit-evidence`

    robustness_cli.add_parsers(sub, csub)

    d = sub.add_parser("dialogue", help="render a dialogue script (voices + texts) to WAVs and a dialogue file")
    d.add_argument("script", type=Path)
    d.add_argument("--out", type=Path, required=True)
    d.set_defaults(func=cmd_synth_dialogue)
    return p


def cmd_synth_dialogue(args: argparse.Namespace) -> int:
    from sleuthd_bench import synth

    try:
        path = synth.render_dialogue_script(args.script, args.out)
    except (synth.SynthesisError, OSError, ValueError) as exc:
        return _error(str(exc))
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

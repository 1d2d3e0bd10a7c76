"""Real synthetic speech for the load test: dialogues of WAV turns, synthesized once and cached on disk.

Each dialogue has ``TURNS`` turns by two speakers in the order ``SPEAKERS`` (A B A B A), each turn one
sentence (about 2-6 s) spoken by that speaker's espeak-ng or flite voice. Both speakers have at least
two turns, so every turn can be scored by the pairwise and centroid methods.

Run ``python -m loadtest.speech`` from the repository root to build the cache ahead of a load run.
"""

from __future__ import annotations

import argparse
import logging
import random
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sleuthd_bench import synth

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / "data" / "loadtest"
SPEAKERS = ("A", "B", "A", "B", "A")
TURNS = len(SPEAKERS)
SEED = 23

# Unique-audio tag: the least significant bit of this many samples (see tag_wav).
_TAG_BITS = 48


def _voices() -> list[synth.Voice]:
    # Plain engine voices only: the sox variants exist to be confusable, which is beside the point here.
    return [v for v in synth.catalogue() if v.family in ("espeak", "flite")]


def _is_fresh(wav: Path, label: str) -> bool:
    sidecar = wav.with_suffix(".txt")
    return wav.is_file() and wav.stat().st_size > 0 and sidecar.is_file() and sidecar.read_text() == label


def dialogues(n: int = 8, cache_dir: Path = CACHE_DIR, seed: int = SEED, workers: int = 2) -> list[list[bytes]]:
    """``n`` dialogues, each a list of ``TURNS`` WAV files (16 kHz mono PCM_16) as bytes, speakers ``SPEAKERS``.

    Clips are cached as ``cache_dir/<dialogue>-<turn>.wav`` with a ``.txt`` sidecar naming the voice and
    text; a clip whose sidecar matches is reused, so only the first call synthesizes (a few seconds
    per dialogue on two cores). Deterministic in ``seed``.
    """
    if n < 1:
        raise ValueError(f"need at least one dialogue, got {n}")
    rng = random.Random(seed)
    voices = _voices()
    texts = synth.sentences(n * TURNS, seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths: list[list[Path]] = []
    todo: list[tuple[synth.Voice, str, Path, str]] = []
    for d in range(n):
        cast = dict(zip(("A", "B"), rng.sample(voices, 2), strict=True))
        row = []
        for t, speaker in enumerate(SPEAKERS):
            wav = cache_dir / f"{d:02d}-{t}.wav"
            text = texts[d * TURNS + t]
            label = f"{cast[speaker].name}\t{text}"
            if not _is_fresh(wav, label):
                todo.append((cast[speaker], text, wav, label))
            row.append(wav)
        paths.append(row)
    if todo:
        logger.info("synthesizing %d load-test clips into %s", len(todo), cache_dir)

        def job(voice: synth.Voice, text: str, wav: Path, label: str) -> None:
            synth.synthesize(voice, text, wav)
            wav.with_suffix(".txt").write_text(label)

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for fut in [pool.submit(job, *item) for item in todo]:
                fut.result()
    return [[p.read_bytes() for p in row] for row in paths]


def _data_chunk(wav: bytes) -> tuple[int, int]:
    """Offset and length of the ``data`` chunk of a 16-bit PCM RIFF/WAVE file."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    pos, bits = 12, None
    while pos + 8 <= len(wav):
        chunk_id, size = wav[pos : pos + 4], struct.unpack_from("<I", wav, pos + 4)[0]
        if chunk_id == b"fmt ":
            bits = struct.unpack_from("<H", wav, pos + 8 + 14)[0]
        elif chunk_id == b"data":
            if bits != 16:
                raise ValueError(f"expected 16-bit PCM, got {bits} bits per sample")
            return pos + 8, min(size, len(wav) - pos - 8)
        pos += 8 + size + (size & 1)  # chunks are padded to even length
    raise ValueError("WAV has no data chunk")


def tag_wav(wav: bytes, nonce: int) -> bytes:
    """``wav`` with the low bit of its first 48 samples set to the bits of ``nonce``.

    The server remembers clip embeddings by a hash of the audio bytes, so a load test that resends
    the same clips measures only cache hits. Changing the least significant bit of a few samples
    (at most 1/32768 of full scale, far below the noise of any speech) makes each request's audio
    new to the server without changing what it hears.
    """
    start, length = _data_chunk(wav)
    n = min(_TAG_BITS, length // 2)
    out = bytearray(wav)
    for k in range(n):
        # Little-endian int16: the low bit of a sample is the low bit of its first byte.
        i = start + 2 * k
        out[i] = (out[i] & 0xFE) | ((nonce >> k) & 1)
    return bytes(out)


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the load test's cached speech.")
    parser.add_argument("--dialogues", type=int, default=8, help="dialogues to synthesize (default: 8)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help=f"where clips go (default: {CACHE_DIR})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = dialogues(args.dialogues, args.cache_dir)
    seconds = sum(_data_chunk(w)[1] for d in built for w in d) / (2 * synth.SAMPLE_RATE)
    logger.info("%d dialogues x %d turns, %.0f s of speech in %s", len(built), TURNS, seconds, args.cache_dir)


if __name__ == "__main__":
    main()

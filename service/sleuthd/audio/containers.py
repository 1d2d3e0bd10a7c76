"""Which encoded files reach libsndfile, and how libsndfile reads them.

libsndfile reads about 26 formats; the API promises WAV, FLAC, OGG (Vorbis, Opus) and MP3. Everything
else is refused from its first bytes, before libsndfile sees it: its rarely used readers are a large
surface for hostile input (the SDS reader printf()s to stdout on corrupt packets), and for bytes it
cannot place by a magic number (MP3 among them) it goes looking for a Mac resource fork next to the
file it was given. For in-memory audio that is the server's working directory (``._``, ``.AppleDouble/``),
where an empty ``._`` made every MP3 fail. WAV, FLAC and OGG are placed by their magic numbers before that
lookup, so they are read straight from memory; an MP3 is handed over as the path of an anonymous in-memory
file (memfd), so the lookups land inside ``/proc/self/fd/``, where nothing can be created.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

import soundfile as sf

logger = logging.getLogger(__name__)

ACCEPTED = "WAV, FLAC, OGG (Vorbis or Opus) or MP3"


class Container(Enum):
    WAV = "WAV"
    FLAC = "FLAC"
    OGG_VORBIS = "OGG/Vorbis"
    OGG_OPUS = "OGG/Opus"
    MP3 = "MP3"


# MPEG audio frame header tables (ISO 11172-3 / 13818-3), Layer III only: kbit/s by bitrate index and
# sample rates by sample-rate index, per MPEG version (3 = MPEG-1, 2 = MPEG-2, 0 = MPEG-2.5).
_L3_KBPS = {
    3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    0: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MPEG_RATES = {3: (44_100, 48_000, 32_000), 2: (22_050, 24_000, 16_000), 0: (11_025, 12_000, 8_000)}
# Encoders pad after an ID3v2 tag with zeros the tag size does not count; skip at most this many.
_MAX_ID3_PADDING = 64 * 1024


def _mpeg_header(data: bytes, pos: int) -> tuple[int, int, int, int] | None:
    """(version, layer, sample rate, frame length in bytes; 0 unless Layer III) of a valid MPEG audio
    frame header at ``pos``, else None."""
    if pos + 4 > len(data) or data[pos] != 0xFF or data[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2, b3 = data[pos + 1], data[pos + 2], data[pos + 3]
    version, layer = (b1 >> 3) & 3, (b1 >> 1) & 3  # layer bits: 1 = III, 2 = II, 3 = I
    bitrate, rate_index, padding = b2 >> 4, (b2 >> 2) & 3, (b2 >> 1) & 1
    if version == 1 or layer == 0 or bitrate == 15 or rate_index == 3 or b3 & 3 == 2:
        return None
    rate = _MPEG_RATES[version][rate_index]
    if layer != 1 or bitrate == 0:  # not Layer III, or free format: no length from the header
        return version, layer, rate, 0
    per_frame = 144 if version == 3 else 72  # bytes per kbit/s-per-Hz: 1152 or 576 samples per frame
    return version, layer, rate, per_frame * _L3_KBPS[version][bitrate] * 1000 // rate + padding


def _after_id3(data: bytes) -> int:
    """Offset just past any ID3v2 tags (and the zero padding some taggers leave after them)."""
    pos = 0
    for _ in range(4):  # careless taggers stack tags
        head = data[pos : pos + 10]
        if len(head) < 10 or head[:3] != b"ID3" or any(b & 0x80 for b in head[6:10]):
            break
        size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
        pos += 10 + size + (10 if head[5] & 0x10 else 0)  # flag 0x10: a footer follows
    end = min(len(data), pos + _MAX_ID3_PADDING)
    while pos < end and data[pos] == 0:
        pos += 1
    return pos


def _is_mp3(data: bytes, pos: int) -> bool:
    """A Layer III frame at ``pos`` and, where the data goes on, another one right after it: one
    stray 0xFFFx pair in random bytes is not an MP3."""
    first = _mpeg_header(data, pos)
    if first is None or first[1] != 1 or first[3] == 0:
        return False
    after = pos + first[3]
    if after + 4 > len(data):
        return True
    second = _mpeg_header(data, after)
    return second is not None and second[:3] == first[:3]


def sniff(data: bytes) -> Container | None:
    """The accepted container ``data`` is, from its first bytes; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return Container.WAV
    if data[:4] == b"OggS" and len(data) >= 28:
        packet = 27 + data[26]  # the first packet follows the page's segment table
        if data[packet : packet + 7] == b"\x01vorbis":
            return Container.OGG_VORBIS
        if data[packet : packet + 8] == b"OpusHead":
            return Container.OGG_OPUS
        return None
    pos = _after_id3(data)
    if data[pos : pos + 4] == b"fLaC":
        return Container.FLAC
    return Container.MP3 if _is_mp3(data, pos) else None


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b".snd", "Sun AU"),
    (b"dns.", "Sun AU"),
    (b"caff", "Apple CAF"),
    (b"riff\x2e\x91\xcf\x11", "Sony Wave64 (W64)"),
    (b"RF64", "RF64 (WAV for files over 4 GB)"),
    (b"BW64", "BW64 (broadcast WAV over 4 GB)"),
    (b"RIFX", "big-endian WAV (RIFX)"),
    (b"NIST_1A", "NIST SPHERE"),
    (b"Creative Voice File", "Creative VOC"),
    (b"\xf0\x7e", "MIDI sample dump (SDS)"),
    (b"2BIT", "AVR"),
    (b" paf", "Ensoniq PAF"),
    (b"fap ", "Ensoniq PAF"),
    (b"Extended Instrument:", "FastTracker XI"),
    (b"MATLAB", "MATLAB MAT"),
    (b"ALawSoundFile**", "Psion WVE"),
    (b"wvpk", "WavPack"),
    (b"MAC ", "Monkey's Audio"),
    (b"#!AMR", "AMR"),
    (b"\x1a\x45\xdf\xa3", "Matroska/WebM"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
)
# base64 of the first bytes of each accepted container: a client that sent the text of a JSON field.
_BASE64: tuple[tuple[bytes, str], ...] = (
    (b"UklGR", "WAV"),
    (b"ZkxhQ", "FLAC"),
    (b"T2dnU", "OGG"),
    (b"SUQz", "MP3"),
    (b"//", "MP3"),
)


def looks_like(data: bytes) -> str:
    """What bytes that :func:`sniff` refused look like, for the error message."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"FORM":
        return "AIFF" if data[8:12] in (b"AIFF", b"AIFC") else "an IFF file (e.g. Amiga 8SVX)"
    if data[:4] == b"RIFF":
        return f"a RIFF {data[8:12].decode('latin-1')!r} file, not WAVE"
    if data[:4] == b"OggS":
        return "OGG with a codec other than Vorbis or Opus (e.g. FLAC-in-OGG or Speex)"
    if data[4:8] == b"ftyp":
        return "MP4/M4A (AAC or ALAC)"
    pos = _after_id3(data)
    if data[pos : pos + 2] == b"\xff\xf1" or data[pos : pos + 2] == b"\xff\xf9":
        return "AAC in ADTS frames"
    header = _mpeg_header(data, pos)
    if header is not None:
        return "MPEG audio Layer I/II (MP2)" if header[1] != 1 else "a damaged MP3 (no second frame after the first)"
    head = data[:512]
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        for prefix, name in _BASE64:
            if head.startswith(prefix):
                return f"base64 text of a {name} file: decode the base64 and send the raw bytes"
        if head.startswith(b"data:"):
            return "a data: URL: send the decoded bytes it carries"
        return "text, not audio bytes"
    return f"no known audio format (first bytes {data[:8].hex(' ')})"


_memfd_works: bool | None = None


def _memfd(data: bytes) -> int | None:
    """An anonymous in-memory file holding ``data`` that can be opened as /proc/self/fd/N, or None
    where that does not exist (not Linux, no /proc)."""
    global _memfd_works
    if _memfd_works is False or not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("sleuthd-audio", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if _memfd_works is None:
            _memfd_works = os.path.exists(f"/proc/self/fd/{fd}")
            if not _memfd_works:
                logger.info("no /proc/self/fd: decoding encoded audio from private temporary files")
                os.close(fd)
                return None
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def open_sound(data: bytes, container: Container) -> Iterator[sf.SoundFile]:
    """Open an encoded file held in memory (sniffed as ``container``) with libsndfile, never touching
    the working directory.

    Raises what soundfile raises for bytes it cannot read (LibsndfileError, RuntimeError)."""
    if container is not Container.MP3:
        # Placed by its magic number: no resource-fork lookup, and io.BytesIO shares the bytes (no copy).
        with sf.SoundFile(io.BytesIO(data)) as f:
            yield f
        return
    fd = _memfd(data)
    if fd is not None:
        try:
            with sf.SoundFile(f"/proc/self/fd/{fd}") as f:
                yield f
        finally:
            os.close(fd)
        return
    # Elsewhere: a file in a fresh private directory, so resource-fork lookups find nothing.
    with tempfile.TemporaryDirectory(prefix="sleuthd-audio-") as folder:
        path = os.path.join(folder, "clip")
        with open(path, "wb") as out:
            out.write(data)
        with sf.SoundFile(path) as f:
            yield f

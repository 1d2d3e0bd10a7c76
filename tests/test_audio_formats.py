"""Which encoded files reach the decoder, and how: MP3s from common encoders, only the documented
containers, nothing read from the working directory, nothing printed (no server needed)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from sleuthd.audio.decode import AudioError, decode_encoded, probe

from .support import VOICE_A, Speech, encode_wav

MP3_RATES = (8_000, 11_025, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make tools` installs it (Debian package {name})")
    return path


@pytest.fixture(scope="module")
def source(speech: Speech) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(speech.clips[VOICE_A][0], dtype="float32")
    return samples, rate


@pytest.fixture(scope="module")
def mp3s(source: tuple[np.ndarray, int], tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The same clip as MP3, written by sox (libsox-fmt-mp3) and lame with their defaults at several
    rates, and by libsndfile."""
    samples, rate = source
    out = tmp_path_factory.mktemp("mp3")
    sox, lame = _tool("sox"), _tool("lame")
    if "mp3" not in subprocess.run([sox, "-h"], capture_output=True, text=True).stdout.split("AUDIO FILE FORMATS")[-1]:
        pytest.fail("sox cannot write MP3: `make tools` installs its MP3 handler (Debian package libsox-fmt-mp3)")
    files: dict[str, bytes] = {}
    for r in MP3_RATES:
        wav = out / f"in-{r}.wav"
        sf.write(wav, soxr.resample(samples, rate, r), r, subtype="PCM_16")
        subprocess.run([sox, str(wav), str(out / f"sox-{r}.mp3")], check=True, capture_output=True)
        subprocess.run([lame, "--quiet", str(wav), str(out / f"lame-{r}.mp3")], check=True, capture_output=True)
        files[f"sox-{r}"] = (out / f"sox-{r}.mp3").read_bytes()
        files[f"lame-{r}"] = (out / f"lame-{r}.mp3").read_bytes()
    for r in (22_050, 44_100):
        files[f"libsndfile-{r}"] = encode_wav(soxr.resample(samples, rate, r), r, "MP3")
    return files


@pytest.mark.parametrize(
    "name", [f"{tool}-{r}" for tool in ("sox", "lame") for r in MP3_RATES] + ["libsndfile-22050", "libsndfile-44100"]
)
def test_mp3_from_common_encoders_decodes(mp3s: dict[str, bytes], source: tuple[np.ndarray, int], name: str) -> None:
    # libsndfile's frame count for MP3 is an estimate (from the Xing/LAME tag or the bitrate); what
    # decodes may be a frame shorter or longer. Valid files must not be called truncated.
    data = mp3s[name]
    wave = decode_encoded(data, max_seconds=60)
    samples, rate = source
    # Without gapless info the encoder's delay and last-frame padding stay in (3 frames of 576 samples at 8 kHz).
    assert abs(wave.seconds - len(samples) / rate) < 0.25
    reference, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert wave.samples.shape == (len(reference),)  # every sample the decoder gives, no more, no less
    assert np.allclose(wave.samples, reference[:, 0], atol=1e-6)
    # The header's count (an estimate for MP3) bounds what decodes: what a request budget sums.
    head = probe(data, None, max_seconds=60)
    assert head.container == "MP3" and not head.exact and len(wave.samples) <= head.frames


def _other_format(fmt: str, subtype: str | None = None) -> bytes:
    t = np.arange(16_000) / 16_000
    return encode_wav((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16_000, fmt, subtype)


# Containers libsndfile reads that the API does not promise (proto: WAV, FLAC, OGG/Vorbis, MP3; OGG/Opus too).
UNDOCUMENTED = {
    "AIFF": ("AIFF", None),
    "AU": ("AU", None),
    "CAF": ("CAF", None),
    "W64": ("W64", None),
    "RF64": ("RF64", None),
    "NIST": ("NIST", None),
    "VOC": ("VOC", None),
    "IRCAM": ("IRCAM", None),
    "SDS": ("SDS", None),
    "HTK": ("HTK", None),
    "MAT5": ("MAT5", None),
    "PAF": ("PAF", None),
    "SVX": ("SVX", None),
    "XI": ("XI", "DPCM_16"),
    "AVR": ("AVR", None),
    "WVE": ("WVE", None),
}


@pytest.mark.parametrize("fmt", list(UNDOCUMENTED))
def test_only_documented_containers_are_decoded(fmt: str) -> None:
    data = _other_format(*UNDOCUMENTED[fmt])
    with pytest.raises(AudioError, match="send WAV, FLAC, OGG") as err:
        decode_encoded(data, max_seconds=60)
    assert "not accepted" in str(err.value)


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (b"UklGRiQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQAAAAA=" * 4, "base64"),
        (b"\x00\x00\x00\x20ftypM4A \x00\x00\x00\x00" + bytes(500), "MP4"),
        (b"\x1a\x45\xdf\xa3" + bytes(500), "Matroska/WebM"),
        (b"<html>this is not audio</html>" * 20, "text"),
    ],
)
def test_unaccepted_bytes_name_what_they_look_like(data: bytes, hint: str) -> None:
    with pytest.raises(AudioError, match="not accepted") as err:
        decode_encoded(data, max_seconds=60)
    assert hint in str(err.value)


def _every_accepted_format(speech: Speech) -> dict[str, bytes]:
    samples, rate = sf.read(speech.clips[VOICE_A][1], dtype="float32")
    at48 = soxr.resample(samples, rate, 48_000)
    return {
        "WAV": encode_wav(samples, rate),
        "WAV float": encode_wav(samples, rate, "WAV", "FLOAT"),
        "FLAC": encode_wav(samples, rate, "FLAC"),
        "OGG/Vorbis": encode_wav(samples, rate, "OGG", "VORBIS"),
        "OGG/Opus": encode_wav(at48, 48_000, "OGG", "OPUS"),
        "MP3": encode_wav(at48, 48_000, "MP3"),
        "MP3 with ID3": b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + encode_wav(at48, 48_000, "MP3"),
    }


def test_decoding_never_reads_the_working_directory(
    speech: Speech, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libsndfile looks for a Mac resource fork ("._<name>", ".AppleDouble/<name>") next to the file it
    # opens; for in-memory audio that is the server's working directory. An empty "._" there made every
    # MP3 fail with "bad data length".
    monkeypatch.chdir(tmp_path)
    (tmp_path / "._").write_bytes(b"")
    (tmp_path / ".AppleDouble").mkdir()
    for name, data in _every_accepted_format(speech).items():
        wave = decode_encoded(data, max_seconds=60)
        assert wave.seconds > 1.0, name
        head = probe(data, None, max_seconds=60)
        assert head.exact == (not name.startswith("MP3")) and len(wave.samples) <= head.frames, name


def _corrupt(data: bytes, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for i in rng.integers(64, len(out), 40):
        out[i] ^= 1 << int(rng.integers(8))
    return bytes(out[: int(rng.integers(len(out) // 2, len(out)))])


def test_decoder_never_prints_to_stdout(speech: Speech, capfd: pytest.CaptureFixture[str]) -> None:
    # Corrupt SDS files made libsndfile printf two lines per packet: a server whose stdout is a pipe
    # nobody drains stops decoding once the pipe is full.
    sds = bytearray(_other_format("SDS", "PCM_16"))
    for i in range(21 + 1, len(sds), 127):  # the second byte of each 127-byte data packet (0x7E)
        sds[i] = 0x31
    blobs = [bytes(sds)] + [_corrupt(d, k) for k, d in enumerate(_every_accepted_format(speech).values())]
    for blob in blobs:
        try:
            decode_encoded(blob, max_seconds=60)
        except AudioError:
            pass
    assert capfd.readouterr().out == ""

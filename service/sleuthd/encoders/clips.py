"""From client audio to encoder windows: decode, downmix, resample, loudness, silence trimming, windows.

This is the CPU-bound half of scoring a clip; the engine runs it on worker threads. A clip whose
speech is shorter than the encoder's minimum comes back unusable with the reason, never with
made-up windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.bandwidth import TELEPHONE_LOW_HZ, band_measures, low_pass
from sleuthd.audio.clipping import clip_to_plateau, plateau_fraction
from sleuthd.audio.decode import (
    FLOAT_PEAK_LIMIT,
    AudioError,
    AudioProbe,
    Waveform,
    check_request_budget,
    decode_encoded,
    decode_pcm,
    normalize_loudness,
    probe,
    to_model_rate,
)
from sleuthd.audio.noise import add_noise, noise_bed, snr_db
from sleuthd.audio.pitch import STEPS_PER_OCTAVE, median_pitch_octaves, shift_pitch
from sleuthd.audio.vad import Vad
from sleuthd.audio.windows import WindowSpec, make_windows
from sleuthd.domain import AudioInput, PcmEncoding, PcmSpec
from sleuthd.encoders.manifest import EncoderManifest


class Channel(NamedTuple):
    """What channel matching measures of a clip (sleuthd.judgment.channel_matching), where a judgment compares
    channels (the fusion's shared decode)."""

    # Its effective bandwidth (sleuthd.audio.bandwidth), Hz; None when too short or silent to tell.
    bandwidth_hz: float | None
    # Its plateau fraction (sleuthd.audio.clipping: the share of samples at its peak); None when silent.
    plateau: float | None
    # Its estimated SNR in dB, at most sleuthd.audio.noise.CAP_DB; None when too short or silent to tell.
    snr_db: float | None
    # Its low band level (sleuthd.audio.bandwidth.band_measures: 60-250 Hz over 300-3400 Hz, dB; a telephone clip
    # about -28); None when too short or silent to tell, or not recorded (a voice registered before it was).
    low_band_db: float | None = None


UNMEASURED = Channel(None, None, None, None)  # a clip whose channel was not measured (a single encoder's decode)


@dataclass(frozen=True)
class PreparedClip:
    """A clip ready for the encoder, or the reason it cannot be scored."""

    audio_seconds: float  # after decoding, before trimming
    speech_seconds: float  # detected speech (VAD), without padding
    windows: np.ndarray | None  # (n_windows, window_samples) float32; None when not usable
    window_times: np.ndarray | None  # (n_windows, 2) start/end seconds in the ORIGINAL clip's time
    detail: str = ""  # why the clip is not usable
    channel: Channel = UNMEASURED  # Speech.channel

    @property
    def usable(self) -> bool:
        return self.windows is not None


def decode(audio: AudioInput, max_seconds: float, pitch_steps: int = 0) -> Waveform:
    """Decode and resample to 16 kHz mono; ``pitch_steps``: moved that many quarter tones in pitch first, at the
    clip's own rate (sleuthd.audio.pitch.shift_pitch), so that a clip sent at 22-48 kHz moved down brings the band
    it had above 8 kHz into the model's band, as the turn it was shifted from had it."""
    wave = decode_pcm(audio.data, audio.pcm, max_seconds) if audio.pcm else decode_encoded(audio.data, max_seconds)
    if pitch_steps:
        wave = Waveform(shift_pitch(wave.samples, pitch_steps, wave.sample_rate_hz), wave.sample_rate_hz)
    return to_model_rate(wave)


def check_request_audio(
    audios: Sequence[tuple[AudioInput, str]], max_clip_seconds: float, max_samples: int
) -> list[AudioProbe]:
    """Refuse, from the clips' headers alone (nothing is decoded), a request whose clips would decode to
    more than ``max_samples`` samples in all, or a clip that breaks the per-clip bounds: a small compressed
    file can decode to hundreds of MiB. Raises AudioError naming the clip, or LimitExceeded. Returns the
    headers read (what admission estimates the request's cost from)."""
    probes = []
    for audio, label in audios:
        try:
            probes.append((label, probe(audio.data, audio.pcm, max_clip_seconds)))
        except AudioError as exc:
            raise AudioError(f"{label}: {exc}") from exc
    check_request_budget(probes, max_samples)
    return [p for _, p in probes]


def prepare_placements(
    audio: AudioInput,
    manifest: EncoderManifest,
    vad: Vad,
    max_seconds: float,
    windows: Sequence[WindowSpec | None],
) -> list[PreparedClip]:
    """Decode, normalise, trim silence and cut windows under each placement (None: the manifest's), at
    the cost of one decode and one VAD pass: a turn checked for drift needs the judging windows and the
    denser drift ones, and decoding plus Silero VAD is about a third of what encoding the judging windows
    costs. Raises AudioError for unusable bytes."""
    wave = decode(audio, max_seconds)
    return prepare_waveform_placements(wave.samples, manifest, vad, windows)


def prepare_waveform(
    samples: np.ndarray, manifest: EncoderManifest, vad: Vad, window: WindowSpec | None = None
) -> PreparedClip:
    """:func:`prepare_placements` with one placement, for a 16 kHz mono float32 waveform in memory."""
    return prepare_waveform_placements(samples, manifest, vad, (window,))[0]


def prepare_waveform_placements(
    samples: np.ndarray, manifest: EncoderManifest, vad: Vad, windows: Sequence[WindowSpec | None]
) -> list[PreparedClip]:
    """The same as :func:`prepare_placements` for a 16 kHz mono float32 waveform already in memory."""
    return cut_placements(trim(samples, manifest.loudness_target_dbfs, vad), manifest, windows)


@dataclass(frozen=True)
class Speech:
    """A clip decoded, loudness-normalised and silence-trimmed: what every encoder's windows are cut from.

    It depends on the audio, the loudness target and the VAD only, so the encoders of a fused request
    (GE2E and CAM++ share the target) cut their windows from one of these (sleuthd.encoders.embedder).
    """

    audio_seconds: float  # after decoding, before trimming
    samples: np.ndarray  # (n,) float32, 16 kHz mono, loudness-normalised, untrimmed
    keep: np.ndarray  # (n,) bool: the samples kept as speech (VAD, with its padding)
    speech_seconds: float  # detected speech (VAD), without padding
    channel: Channel = UNMEASURED  # measured only where a judgment compares channels (decode_and_trim)


def decode_and_trim(audio: AudioInput, loudness_target_dbfs: float, vad: Vad, max_seconds: float) -> Speech:
    """Decode, resample, normalise and find the speech of one clip, and measure its channel: bandwidth, plateau
    fraction and SNR (about 0.5 ms of CPU per second of audio: only the fused encoder's judgment reads them, so only
    its shared decode comes here). Raises AudioError for unusable bytes."""
    samples = decode(audio, max_seconds).samples
    speech = trim(samples, loudness_target_dbfs, vad)
    return dataclasses.replace(speech, channel=measure_channel(samples))


def measure_channel(samples: np.ndarray) -> Channel:
    """A decoded clip's bandwidth, plateau fraction, SNR and low band level."""
    bandwidth, low_band = band_measures(samples)
    return Channel(bandwidth, plateau_fraction(samples), snr_db(samples), low_band)


def clip_pitch(audio: AudioInput, max_seconds: float) -> float | None:
    """The clip's median pitch, log2(Hz) (sleuthd.audio.pitch; None: too little voiced), measured only for a speaker
    pitch matching looks at (a flagged turn), so only then."""
    return median_pitch_octaves(decode(audio, max_seconds).samples)


def clip_channel(audio: AudioInput, max_seconds: float) -> Channel:
    """The clip's channel alone (Speech.channel), for a clip whose embeddings were all
    cached, and for a registration."""
    return measure_channel(decode(audio, max_seconds).samples)


@dataclass(frozen=True)
class ChannelCopy:
    """How a clip is copied so that a speaker heard through different channels is judged on like copies
    (sleuthd.judgment.channel_matching): hard-clipped to a plateau fraction (None: not clipped), made noisier
    (``snr_db``), then low-passed at the common band (``narrow``). Clipping comes first, as the channel did it."""

    narrow: bool = False
    plateau: float | None = None
    # Noise added until the copy's estimated SNR is this (dB): the quiet frames of ``noise`` (the speaker's
    # noisiest clip), tiled (sleuthd.audio.noise). With the two above only for a speaker who differs that way too.
    snr_db: float | None = None
    noise: AudioInput | None = None
    # With ``narrow``: the band below the telephone's low edge removed too (a speaker with a telephone clip).
    telephone: bool = False
    # Moved this many quarter tones in pitch, spectral envelope with it, before anything else (pitch matching:
    # sleuthd.judgment.pitch_matching; sleuthd.audio.pitch.shift_pitch).
    pitch_steps: int = 0
    # Only the middle this many samples (16 kHz) of the clip's trimmed speech, and nothing else done to it (length
    # matching: sleuthd.judgment.length_matching; :func:`speech_cut`); 0: the whole clip.
    cut_samples: int = 0

    def __post_init__(self) -> None:
        done = self.narrow or self.plateau is not None or self.snr_db is not None or self.telephone or self.pitch_steps
        if self.cut_samples and done:
            raise ValueError("a cut copy is a cut of the clip as sent: nothing else is done to it")

    def describe(self) -> str:
        """What the copy is, for labels and details ("narrowband copy", "copy clipped to 4.2 %", ...)."""
        if self.cut_samples:
            return f"copy cut to {self.cut_samples / SAMPLE_RATE:.2f} s of trimmed speech"
        moved = "" if not self.pitch_steps else f" moved {self.pitch_steps / STEPS_PER_OCTAVE:+.2f} octave in pitch"
        clipped = "" if self.plateau is None else f" clipped to {100 * self.plateau:.2f} % at the peak"
        noisy = "" if self.snr_db is None else f" with noise added to {self.snr_db:.1f} dB SNR"
        band = "telephone-band " if self.narrow and self.telephone else "narrowband " if self.narrow else ""
        return f"{band}copy{moved}{clipped}{noisy}"


NARROWBAND = ChannelCopy(narrow=True)  # band matching's copy


def copy_noise(copy: ChannelCopy, max_seconds: float) -> np.ndarray | None:
    """The noise a noisy copy gets (its ``noise`` clip's quiet frames), or None for a copy that gets none: decoded
    once for a batch of copies (ClipEmbedder.copies), not once per copy."""
    if copy.snr_db is None or copy.noise is None:
        return None
    return noise_bed(decode(copy.noise, max_seconds).samples)


def channel_copy(audio: AudioInput, max_seconds: float, copy: ChannelCopy, bed: np.ndarray | None = None) -> AudioInput:
    """The clip decoded to 16 kHz, clipped, made noisier and/or low-passed as ``copy`` says (sleuthd.audio.clipping,
    sleuthd.audio.noise, sleuthd.audio.bandwidth.low_pass), as 16 kHz float32 PCM: what a speaker whose clips
    differ in channel is compared on. ``bed``: :func:`copy_noise` of ``copy`` when the caller has it. It goes
    through the same listener as any client clip, so the embedding cache and single flight apply to it. Raises
    AudioError for unusable bytes."""
    samples = decode(audio, max_seconds, copy.pitch_steps).samples
    if copy.plateau is not None:
        samples = clip_to_plateau(samples, copy.plateau)
    if bed is None:
        bed = copy_noise(copy, max_seconds)
    if copy.snr_db is not None and bed is not None:
        samples = add_noise(samples, copy.snr_db, bed)
    if copy.narrow:
        samples = low_pass(samples)
        if copy.telephone:  # what lies below the telephone's low edge, removed as the band above was
            samples = samples - low_pass(samples, TELEPHONE_LOW_HZ)
        # The filter's ripple can overshoot a peak a little; decoding refuses float PCM beyond FLOAT_PEAK_LIMIT.
        samples = np.clip(samples, -FLOAT_PEAK_LIMIT, FLOAT_PEAK_LIMIT)
    return AudioInput(data=samples.astype("<f4").tobytes(), pcm=PcmSpec(PcmEncoding.F32LE, SAMPLE_RATE, 1))


def kept_samples(audio: AudioInput, max_seconds: float, loudness_target_dbfs: float, vad: Vad) -> int:
    """How many samples of the clip silence trimming keeps (speech with the VAD's padding): what the encoders'
    windows are cut from, and the length a cut copy (:func:`speech_cut`) is made to. Raises AudioError."""
    return int(trim(decode(audio, max_seconds).samples, loudness_target_dbfs, vad).keep.sum())


def speech_cut(
    audio: AudioInput, max_seconds: float, samples: int, loudness_target_dbfs: float, vad: Vad
) -> AudioInput:
    """The middle ``samples`` of the clip's trimmed speech (as :func:`kept_samples` counts it), as 16 kHz float32
    PCM: a long clip as long as a short turn it is compared with (length matching). A clip whose trimmed speech is no
    longer comes back as it is, so its copy's embedding is the clip's own. Raises AudioError."""
    speech = trim(decode(audio, max_seconds).samples, loudness_target_dbfs, vad)
    kept = speech.samples[speech.keep]
    if len(kept) <= samples:
        return audio
    start = (len(kept) - samples) // 2
    cut = np.ascontiguousarray(kept[start : start + samples], dtype="<f4")
    return AudioInput(data=cut.tobytes(), pcm=PcmSpec(PcmEncoding.F32LE, SAMPLE_RATE, 1))


def narrowband_copy(audio: AudioInput, max_seconds: float) -> AudioInput:
    """:func:`channel_copy` at the common band (band matching's copy)."""
    return channel_copy(audio, max_seconds, NARROWBAND)


def trim(samples: np.ndarray, loudness_target_dbfs: float, vad: Vad) -> Speech:
    """Loudness normalisation and VAD of a 16 kHz mono float32 waveform."""
    audio_seconds = len(samples) / SAMPLE_RATE
    samples = normalize_loudness(samples, loudness_target_dbfs)
    mask = vad.speech_mask(samples)
    return Speech(audio_seconds, samples, mask.keep, mask.speech_seconds)


def cut_placements(
    speech: Speech, manifest: EncoderManifest, windows: Sequence[WindowSpec | None]
) -> list[PreparedClip]:
    """The encoder's windows of trimmed speech under each placement (None: the manifest's), or the reason
    the clip is unusable (less speech than the encoder's minimum)."""
    if speech.speech_seconds < manifest.min_speech_seconds:
        unusable = PreparedClip(
            audio_seconds=speech.audio_seconds,
            speech_seconds=speech.speech_seconds,
            windows=None,
            window_times=None,
            detail=(
                f"{speech.speech_seconds:.2f} s of speech after silence trimming; the {manifest.name} encoder "
                f"needs at least {manifest.min_speech_seconds:.2f} s to give a meaningful embedding"
            ),
            channel=speech.channel,
        )
        return [unusable for _ in windows]
    kept_index = np.flatnonzero(speech.keep)
    kept = speech.samples[kept_index]
    out = []
    for window in windows:
        spec = window or manifest.window
        cut, starts = make_windows(kept, spec)
        # Map each window's span in the trimmed clip back to the original clip's clock.
        first = starts * spec.hop_samples
        last = np.minimum(first + spec.span_samples, len(kept_index)) - 1
        times = np.stack([kept_index[first], kept_index[np.maximum(last, first)] + 1], axis=1) / SAMPLE_RATE
        out.append(
            PreparedClip(
                audio_seconds=speech.audio_seconds,
                speech_seconds=speech.speech_seconds,
                windows=cut,
                window_times=times,
                channel=speech.channel,
            )
        )
    return out


@dataclass(frozen=True)
class ClipEmbedding:
    """A clip's embedding (unit vector) with its windows, or the reason it has none."""

    audio_seconds: float
    speech_seconds: float
    embedding: np.ndarray | None  # (D,) float32, unit length; None when the clip is not usable
    window_embeddings: np.ndarray | None  # (n_windows, D)
    window_times: np.ndarray | None  # (n_windows, 2) seconds in the original clip
    detail: str = ""
    channel: Channel = UNMEASURED  # Speech.channel

    @property
    def usable(self) -> bool:
        return self.embedding is not None


@dataclass(frozen=True)
class Heard:
    """A clip decoded once and heard twice: the waveform (for a listener that needs the audio itself, the
    LALM judge) and the encoder's embeddings of it.

    ``samples``: (n,) float32, 16 kHz mono, as decoded (before loudness normalisation and trimming).
    ``clips``: one embedding per window placement asked for (the manifest's first, then drift windows).
    """

    samples: np.ndarray
    clips: list[ClipEmbedding]

    @property
    def clip(self) -> ClipEmbedding:
        return self.clips[0]


def decode_and_prepare(
    audio: AudioInput, manifest: EncoderManifest, vad: Vad, max_seconds: float, windows: Sequence[WindowSpec | None]
) -> tuple[np.ndarray, list[PreparedClip]]:
    """One decode for both listeners: the 16 kHz mono waveform, and the encoder's windows cut from it."""
    samples = decode(audio, max_seconds).samples
    return samples, prepare_waveform_placements(samples, manifest, vad, windows)


def embedded_clip(clip: PreparedClip, window_embeddings: np.ndarray) -> ClipEmbedding:
    """A usable clip's embedding from its windows' embeddings (unit rows)."""
    return ClipEmbedding(
        clip.audio_seconds,
        clip.speech_seconds,
        pool(window_embeddings),
        window_embeddings,
        clip.window_times,
        channel=clip.channel,
    )


def pool(window_embeddings: np.ndarray) -> np.ndarray:
    """Clip embedding: the L2-normalised mean of its window embeddings (GE2E's utterance embedding)."""
    mean = window_embeddings.mean(axis=0)
    return np.asarray(mean / max(float(np.linalg.norm(mean)), 1e-12), dtype=np.float32)

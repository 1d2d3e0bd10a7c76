"""Requests from what a pipeline has at hand: audio as file paths, encoded bytes or NumPy samples.

NumPy is imported only when samples are given as an array (the caller has it loaded already), so the
client itself needs nothing beyond grpc and protobuf.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuthd.v1 import sleuthd_pb2 as pb

THRESHOLD_SETS = {"default": pb.THRESHOLD_SET_DEFAULT, "paper": pb.THRESHOLD_SET_PAPER}
METHODS = ("pairwise", "centroid", "reference", "auto", "lalm")
MAX_CHANNELS = 8  # the server's limit; a wider array is most likely (channels, frames)

# Audio as accepted everywhere: a file path (str or PathLike), an encoded file's bytes (WAV, FLAC, OGG,
# MP3), NumPy samples with a sample rate (float in [-1, 1] or int16; shape (frames,) or (frames,
# channels)), or a ready pb.Audio.
AudioLike = Any


class DialogueFileError(ValueError):
    """A dialogue JSON file is malformed or names audio that does not exist."""


class MissingAudioError(DialogueFileError):
    """A dialogue names an audio file that does not exist (a batch records it as that dialogue's error and
    goes on with the others). ``detail`` says which file, for which turn or reference; ``where`` names the
    dialogue (its file, or FILE:LINE) when known."""

    def __init__(self, detail: str, where: str = "") -> None:
        super().__init__(f"{where}: {detail}" if where else detail)
        self.detail = detail
        self.where = where


def turn_id_or_default(turn_id: object, position: int) -> str:
    """A turn's id: the one given, else ``t1``, ``t2``, ... by the turn's position in the dialogue (0-based
    ``position``, turns without audio counted). The one rule for :class:`Turn` lists and dialogue files."""
    return str(turn_id) if turn_id not in (None, "") else f"t{position + 1}"


@dataclass(frozen=True)
class Turn:
    """One turn of a dialogue to check. A plain ``(speaker, audio)`` tuple means the same."""

    speaker: str
    audio: AudioLike  # None: a turn without audio is carried but not judged
    turn_id: str = ""  # "" = "t1", "t2", ... by position in the dialogue (turn_id_or_default)
    text: str = ""
    sample_rate: int | None = None  # Hz, for NumPy samples (default: the call's sample_rate)


def to_audio(audio: AudioLike, sample_rate: int | None = None, what: str = "audio") -> pb.Audio:
    """``audio`` as a pb.Audio; ``what`` names it in errors (ValueError, FileNotFoundError)."""
    if isinstance(audio, pb.Audio):
        return audio
    if isinstance(audio, bytes | bytearray | memoryview):
        if not len(audio):
            raise ValueError(f"{what} is empty bytes")
        return pb.Audio(encoded=bytes(audio))
    if isinstance(audio, str | os.PathLike):
        path = Path(audio)
        if not path.is_file():
            raise FileNotFoundError(f"{what}: audio file {path} does not exist")
        return pb.Audio(encoded=path.read_bytes())
    if hasattr(audio, "__array_interface__") or hasattr(audio, "__array__"):
        return _samples(audio, sample_rate, what)
    raise TypeError(
        f"{what} is a {type(audio).__name__}: give a file path, encoded bytes or NumPy samples with a sample rate"
    )


def _samples(samples: Any, sample_rate: int | None, what: str) -> pb.Audio:
    import numpy as np  # the caller passed an array, so NumPy is loaded already

    a = np.asarray(samples)
    if sample_rate is None:
        raise ValueError(f"{what} is an array of samples: give its sample rate (sample_rate=, in Hz)")
    if a.ndim not in (1, 2) or a.size == 0:
        raise ValueError(f"{what}: expected samples of shape (frames,) or (frames, channels), got {a.shape}")
    channels = 1 if a.ndim == 1 else int(a.shape[1])
    if channels > MAX_CHANNELS:
        raise ValueError(
            f"{what} has shape {a.shape}: samples go as (frames, channels) with at most {MAX_CHANNELS} channels; "
            "transpose a (channels, frames) array"
        )
    if a.dtype == np.int16:
        pcm = pb.PcmAudio(data=a.astype("<i2").tobytes(), encoding=pb.PCM_S16LE)
    elif a.dtype.kind == "f":
        pcm = pb.PcmAudio(data=a.astype("<f4").tobytes(), encoding=pb.PCM_F32LE)
    else:
        raise ValueError(f"{what}: samples of dtype {a.dtype} are not supported; send float in [-1, 1] or int16")
    pcm.sample_rate_hz = int(sample_rate)
    pcm.channels = channels
    return pb.Audio(pcm=pcm)


def make_options(
    method: str | None = None,
    thresholds: str | None = None,
    threshold: float | None = None,
    encoder: str = "",
    detect_drift: bool = False,
    similarity_matrix: bool = False,
) -> pb.CheckOptions:
    """Request options; None/"" leave the server's default."""
    opts = pb.CheckOptions(encoder=encoder, detect_drift=detect_drift, similarity_matrix=similarity_matrix)
    # ValueError, not DialogueFileError: these come from a caller's arguments as often as from a file (the
    # file reader adds where it found them).
    if method:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        opts.method = pb.Method.Value(f"METHOD_{method.upper()}")
    if thresholds:
        if thresholds not in THRESHOLD_SETS:
            raise ValueError(f"thresholds must be one of {', '.join(THRESHOLD_SETS)}, not {thresholds!r}")
        opts.threshold_set = THRESHOLD_SETS[thresholds]  # type: ignore[assignment]
    if threshold is not None:
        opts.threshold = threshold
    return opts


def dialogue_request(
    turns: Iterable[Turn | tuple[str, AudioLike]],
    *,
    references: Mapping[str, AudioLike] | None = None,
    voices: Mapping[str, str] | None = None,
    dialogue_id: str = "",
    options: pb.CheckOptions | None = None,
    sample_rate: int | None = None,
) -> pb.CheckDialogueRequest:
    """A CheckDialogue request. ``references``: speaker -> reference audio; ``voices``: speaker -> id of a
    voice registered on the server (in place of reference audio)."""
    req = pb.CheckDialogueRequest(dialogue_id=dialogue_id, options=options or pb.CheckOptions())
    for n, item in enumerate(turns):
        t = item if isinstance(item, Turn) else Turn(*item)
        turn_id = turn_id_or_default(t.turn_id, n)
        turn = req.turns.add(turn_id=turn_id, speaker=t.speaker, text=t.text)
        if t.audio is not None:
            turn.audio.CopyFrom(to_audio(t.audio, t.sample_rate or sample_rate, f"turn {turn_id!r}"))
    both = set(references or {}) & set(voices or {})
    if both:
        raise ValueError(f"speaker(s) {', '.join(sorted(both))} given both reference audio and a voice id; give one")
    for speaker, ref in (references or {}).items():
        req.references.add(speaker=speaker, audio=to_audio(ref, sample_rate, f"reference of {speaker!r}"))
    for speaker, voice_id in (voices or {}).items():
        req.references.add(speaker=speaker, voice_id=voice_id)
    return req


def check_request(
    turns: Iterable[Turn | tuple[str, AudioLike]],
    *,
    references: Mapping[str, AudioLike] | None = None,
    voices: Mapping[str, str] | None = None,
    dialogue_id: str = "",
    method: str | None = None,
    thresholds: str | None = None,
    threshold: float | None = None,
    encoder: str = "",
    detect_drift: bool = False,
    sample_rate: int | None = None,
    similarity_matrix: bool = False,
) -> pb.CheckDialogueRequest:
    """The CheckDialogue request of ``check(...)``'s arguments: the one place the client library
    (:class:`~sleuthd.client.SleuthClient`, its asyncio twin) and the in-process judge (``sleuthd.api.Judge``)
    build it. Raises ValueError for an unknown method or threshold set (the message lists the valid ones)."""
    options = make_options(method, thresholds, threshold, encoder, detect_drift, similarity_matrix)
    return dialogue_request(
        turns, references=references, voices=voices, dialogue_id=dialogue_id, options=options, sample_rate=sample_rate
    )


def rank_candidates_request(
    candidates: Mapping[str, AudioLike] | Sequence[AudioLike],
    *,
    context: Sequence[AudioLike] = (),
    reference: AudioLike = None,
    reference_voice: str = "",
    speaker: str = "speaker",
    method: str | None = None,
    encoder: str = "",
    sample_rate: int | None = None,
) -> pb.RankCandidatesRequest:
    """The RankCandidates request of ``rank(...)``'s arguments (the clients' and ``sleuthd.api.Judge``'s)."""
    return rank_request(
        candidates, context=context, reference=reference, reference_voice=reference_voice, speaker=speaker,
        options=make_options(method, encoder=encoder), sample_rate=sample_rate,
    )  # fmt: skip


def rank_request(
    candidates: Mapping[str, AudioLike] | Sequence[AudioLike],
    *,
    context: Sequence[AudioLike] = (),
    reference: AudioLike = None,
    reference_voice: str = "",
    speaker: str = "speaker",
    options: pb.CheckOptions | None = None,
    sample_rate: int | None = None,
) -> pb.RankCandidatesRequest:
    """A RankCandidates request. ``candidates``: id -> audio, or a sequence (ids: the paths as given, else
    "c1", "c2", ...)."""
    if reference is not None and reference_voice:
        raise ValueError("give either reference audio or reference_voice, not both")
    if isinstance(candidates, Mapping):
        named = list(candidates.items())
    else:
        named = [(str(c) if isinstance(c, str | os.PathLike) else f"c{n + 1}", c) for n, c in enumerate(candidates)]
    ids = [i for i, _ in named]
    if len(set(ids)) != len(ids):
        raise ValueError(f"candidate ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})}")
    req = pb.RankCandidatesRequest(speaker=speaker, options=options or pb.CheckOptions())
    for cid, audio in named:
        req.candidates.add(candidate_id=cid, audio=to_audio(audio, sample_rate, f"candidate {cid!r}"))
    for n, audio in enumerate(context):
        req.context.append(to_audio(audio, sample_rate, f"context clip #{n}"))
    if reference is not None:
        req.reference.CopyFrom(to_audio(reference, sample_rate, "reference"))
    elif reference_voice:
        req.reference_voice_id = reference_voice
    return req


# A turn's audio goes to StreamDialogue in pieces of this size (bytes): well under any message limit, and
# small enough that the server's per-stream buffer bound counts it finely.
STREAM_CHUNK_BYTES = 256 * 1024


def stream_open(
    *,
    references: Mapping[str, AudioLike] | None = None,
    voices: Mapping[str, str] | None = None,
    dialogue_id: str = "",
    options: pb.CheckOptions | None = None,
    sample_rate: int | None = None,
) -> pb.StreamDialogueRequest:
    """A StreamDialogue's first message: the dialogue id, references (audio or registered voice ids), options."""
    both = dialogue_request((), references=references, voices=voices, options=options, sample_rate=sample_rate)
    return pb.StreamDialogueRequest(
        open=pb.StreamOpen(dialogue_id=dialogue_id, references=both.references, options=both.options)
    )


def stream_turn(
    item: Turn | tuple[str, AudioLike], position: int, sample_rate: int | None = None
) -> list[pb.StreamDialogueRequest]:
    """One turn of a stream, at ``position`` (0-based) in the dialogue: its TurnStart and its audio in pieces,
    the last marked final (NumPy samples go as headerless PCM). A turn without audio sends nothing: the
    next turn's index leaves the gap, as a dialogue's turns without audio are carried but not judged."""
    t = item if isinstance(item, Turn) else Turn(*item)
    if t.audio is None:
        return []
    turn_id = turn_id_or_default(t.turn_id, position)
    audio = to_audio(t.audio, t.sample_rate or sample_rate, f"turn {turn_id!r}")
    start = pb.TurnStart(turn_id=turn_id, speaker=t.speaker, text=t.text, index=position)
    if audio.WhichOneof("source") == "pcm":
        p = audio.pcm
        start.pcm.CopyFrom(pb.PcmFormat(encoding=p.encoding, sample_rate_hz=p.sample_rate_hz, channels=p.channels))
        data = p.data
    else:
        data = audio.encoded
    cuts = [*range(0, len(data), STREAM_CHUNK_BYTES), len(data)] if data else [0, 0]
    pieces = [
        pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn_id, data=data[a:b], final=b == len(data)))
        for a, b in itertools.pairwise(cuts)
    ]
    return [pb.StreamDialogueRequest(turn_start=start), *pieces]


def register_request(
    voice_id: str,
    clips: Sequence[AudioLike],
    *,
    metadata: Mapping[str, str] | None = None,
    replace: bool = False,
    keep_audio: bool | None = None,
    sample_rate: int | None = None,
) -> pb.RegisterVoiceRequest:
    if isinstance(clips, str | bytes | bytearray | memoryview | os.PathLike | pb.Audio) or hasattr(
        clips, "__array_interface__"
    ):
        clips = [clips]  # one clip given on its own
    req = pb.RegisterVoiceRequest(voice_id=voice_id, metadata=dict(metadata or {}), replace=replace)
    req.clips.extend(to_audio(c, sample_rate, f"clip #{k}") for k, c in enumerate(clips))
    if keep_audio is not None:
        req.keep_audio = keep_audio
    return req


# ---------------------------------------------------------------------------------------------- files

# What an audio file starts with, to tell a user who passed one where a dialogue file goes what happened.
_AUDIO_MAGIC = ((b"RIFF", "a WAV"), (b"fLaC", "a FLAC"), (b"OggS", "an Ogg"), (b"ID3", "an MP3"))


def _audio_kind(head: bytes) -> str:
    """``"a WAV"``, ``"an MP3"``, ... when ``head`` (a file's first bytes) starts an audio file, else ""."""
    for magic, kind in _AUDIO_MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame header
        return "an MP3"
    return ""


def read_dialogue_text(path: Path) -> str:
    """A dialogue JSON (or JSON Lines) file's text. Raises DialogueFileError that says what was given
    instead: a folder, an audio file, or a file that is not UTF-8 text."""
    if path.is_dir():
        raise DialogueFileError(f"{path} is a folder: give a dialogue JSON file (`sleuthd check` takes folders)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DialogueFileError(f"cannot read dialogue file {path}: {exc.strerror or exc}") from None
    kind = _audio_kind(data[:4])
    if kind:
        raise DialogueFileError(
            f"{path} is {kind} audio file, not a dialogue: give a dialogue JSON file (or a .jsonl of dialogues) that "
            f'names each turn\'s speaker and audio, e.g. {{"turns": [{{"speaker": "A", "audio": "{path.name}"}}]}}'
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DialogueFileError(
            f"{path} is not UTF-8 text: expected a dialogue JSON file (or a .jsonl of dialogues)"
        ) from None


def audio_file(path: Path, read: bool = True) -> pb.Audio:
    """The file's bytes as encoded audio (``read`` False: only check that it exists; the audio is empty)."""
    if not path.is_file():
        raise MissingAudioError(f"audio file {path} does not exist")
    return pb.Audio(encoded=path.read_bytes()) if read else pb.Audio()


def dialogue_request_from_dict(doc: Any, base: Path, where: str, read_audio: bool = True) -> pb.CheckDialogueRequest:
    """A dialogue object (the dialogue file format; audio paths relative to ``base``) as a request;
    ``where`` names it in errors (DialogueFileError; MissingAudioError for audio that does not exist).
    ``read_audio`` False checks it without reading audio. Turns without a ``turn_id`` are numbered as the
    client library numbers them (:func:`turn_id_or_default`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("turns"), list):
        raise DialogueFileError(f"{where}: expected an object with a 'turns' list")
    req = pb.CheckDialogueRequest(dialogue_id=str(doc.get("dialogue_id", "")))

    def audio(path: Any, what: str) -> pb.Audio:
        try:
            return audio_file(base / path, read_audio)
        except MissingAudioError as exc:
            raise MissingAudioError(f"{what}: {exc.detail}", where) from None

    for n, t in enumerate(doc["turns"]):
        if not isinstance(t, dict) or "speaker" not in t:
            raise DialogueFileError(f"{where}: turns[{n}] lacks speaker")
        turn_id = turn_id_or_default(t.get("turn_id"), n)
        turn = req.turns.add(turn_id=turn_id, speaker=str(t["speaker"]), text=str(t.get("text", "")))
        if t.get("audio"):
            turn.audio.CopyFrom(audio(t["audio"], f"turn {turn_id!r}"))
    references, voices = doc.get("references") or {}, doc.get("voices") or {}
    if not isinstance(references, dict) or not isinstance(voices, dict):
        raise DialogueFileError(f"{where}: 'references' and 'voices' must map speakers to a path / a voice id")
    for speaker, ref in references.items():
        req.references.add(speaker=speaker, audio=audio(ref, f"reference of {speaker!r}"))
    for speaker, voice_id in voices.items():
        if speaker in references:
            raise DialogueFileError(f"{where}: speaker {speaker!r} has both a reference and a voice; give one")
        req.references.add(speaker=speaker, voice_id=str(voice_id))
    o = doc.get("options") or {}
    try:
        options = make_options(o.get("method"), o.get("thresholds"), o.get("threshold"), o.get("encoder", ""),
                               bool(o.get("detect_drift", False)), bool(o.get("similarity_matrix", False)))  # fmt: skip
    except ValueError as exc:
        raise DialogueFileError(f"{where}: options: {exc}") from None
    req.options.CopyFrom(options)
    return req


def dialogue_request_from_file(path: Path) -> pb.CheckDialogueRequest:
    """Read a dialogue JSON file (audio paths relative to the file) into a request.

    Format: {"dialogue_id": str, "turns": [{"speaker", "turn_id"?, "text"?, "audio"?}],
    "references": {speaker: path}?, "voices": {speaker: registered voice id}?,
    "options": {"method"?, "thresholds"?, "threshold"?, "encoder"?, "detect_drift"?, "similarity_matrix"?}?}
    """
    text = read_dialogue_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DialogueFileError(f"{path} is not valid JSON: {exc}") from exc
    req = dialogue_request_from_dict(doc, path.parent, str(path))
    req.dialogue_id = req.dialogue_id or path.stem
    return req

"""Small pure conversions between protobuf messages and engine dataclasses.

Bad field values raise :class:`InvalidRequest` naming the field, so the servicer can answer
INVALID_ARGUMENT with a message that says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sleuthd import domain
from sleuthd.domain import Method, PcmEncoding, PcmSpec, TurnUpdate
from sleuthd.errors import InvalidRequest
from sleuthd.registry.model import Voice
from sleuthd.registry.voices import Registration, VoiceListing, VoiceRegistry
from sleuthd.v1 import sleuthd_pb2 as pb

if TYPE_CHECKING:
    from sleuthd.lalm.types import JudgeInfo

_METHOD_FROM_PB = {
    pb.METHOD_UNSPECIFIED: None,
    pb.METHOD_PAIRWISE: Method.PAIRWISE,
    pb.METHOD_CENTROID: Method.CENTROID,
    pb.METHOD_REFERENCE: Method.REFERENCE,
    pb.METHOD_AUTO: Method.AUTO,
    pb.METHOD_LALM: Method.LALM,
}
_METHOD_TO_PB = {m: p for p, m in _METHOD_FROM_PB.items() if m is not None}
_THRESHOLD_SET_FROM_PB = {
    pb.THRESHOLD_SET_UNSPECIFIED: domain.ThresholdSet.DEFAULT,
    pb.THRESHOLD_SET_DEFAULT: domain.ThresholdSet.DEFAULT,
    pb.THRESHOLD_SET_PAPER: domain.ThresholdSet.PAPER,
}
_THRESHOLD_SET_TO_PB = {
    domain.ThresholdSet.DEFAULT: pb.THRESHOLD_SET_DEFAULT,
    domain.ThresholdSet.PAPER: pb.THRESHOLD_SET_PAPER,
}
_REASON_TO_PB = {
    domain.FlagReason.NONE: pb.FLAG_REASON_UNSPECIFIED,
    domain.FlagReason.SCORE_THRESHOLD: pb.SCORE_THRESHOLD,
    domain.FlagReason.SPEAKER_CONFUSION: pb.SPEAKER_CONFUSION,
}
_PCM_FROM_PB = {pb.PCM_S16LE: PcmEncoding.S16LE, pb.PCM_F32LE: PcmEncoding.F32LE}
_STATUS_TO_PB = {
    domain.TurnStatus.CONSISTENT: pb.CONSISTENT,
    domain.TurnStatus.INCONSISTENT: pb.INCONSISTENT,
    domain.TurnStatus.INSUFFICIENT_AUDIO: pb.INSUFFICIENT_AUDIO,
    domain.TurnStatus.INSUFFICIENT_CONTEXT: pb.INSUFFICIENT_CONTEXT,
    domain.TurnStatus.UNCERTAIN: pb.UNCERTAIN,
}
_UNCERTAIN_TO_PB = {
    domain.UncertainReason.NONE: pb.UNCERTAIN_REASON_UNSPECIFIED,
    domain.UncertainReason.OUT_OF_SUPPORT: pb.OUT_OF_SUPPORT,
    domain.UncertainReason.OWN_TURNS_DISSIMILAR: pb.OWN_TURNS_DISSIMILAR,
    domain.UncertainReason.LOW_ANSWER_MASS: pb.LOW_ANSWER_MASS,
}


def method_to_pb(method: Method) -> int:
    return _METHOD_TO_PB[method]


def pcm_spec_from_pb(p: pb.PcmAudio | pb.PcmFormat, field: str) -> PcmSpec:
    if p.encoding not in _PCM_FROM_PB:
        raise InvalidRequest(f"{field}.encoding is not set: use PCM_S16LE or PCM_F32LE")
    return PcmSpec(_PCM_FROM_PB[p.encoding], int(p.sample_rate_hz), int(p.channels))


def audio_from_pb(msg: pb.Audio, field: str) -> domain.AudioInput:
    kind = msg.WhichOneof("source")
    if kind == "encoded":
        return domain.AudioInput(data=msg.encoded)
    if kind == "pcm":
        return domain.AudioInput(data=msg.pcm.data, pcm=pcm_spec_from_pb(msg.pcm, f"{field}.pcm"))
    raise InvalidRequest(f"{field} has no audio: set either encoded or pcm")


def options_from_pb(msg: pb.CheckOptions) -> domain.CheckOptions:
    if msg.method not in _METHOD_FROM_PB:
        raise InvalidRequest(f"options.method {msg.method} is not a known method")
    if msg.threshold_set not in _THRESHOLD_SET_FROM_PB:
        raise InvalidRequest(f"options.threshold_set {msg.threshold_set} is not a known threshold set")
    return domain.CheckOptions(
        encoder=msg.encoder,
        method=_METHOD_FROM_PB[msg.method],
        threshold_set=_THRESHOLD_SET_FROM_PB[msg.threshold_set],
        threshold=msg.threshold if msg.HasField("threshold") else None,
        detect_drift=msg.detect_drift,
        similarity_matrix=msg.similarity_matrix,
    )


def references_from_pb(refs: Iterable[pb.SpeakerReference]) -> dict[str, domain.Reference]:
    references: dict[str, domain.Reference] = {}
    for i, r in enumerate(refs):
        if not r.speaker:
            raise InvalidRequest(f"references[{i}].speaker is empty")
        if r.speaker in references:
            raise InvalidRequest(f"two references for speaker {r.speaker!r}; send at most one per speaker")
        if r.WhichOneof("source") == "voice_id":
            references[r.speaker] = domain.VoiceRef(r.voice_id)
        else:
            references[r.speaker] = audio_from_pb(r.audio, f"references[{i}].audio")
    return references


def rank_reference_from_pb(msg: pb.RankCandidatesRequest) -> domain.Reference | None:
    kind = msg.WhichOneof("reference_source")
    if kind == "reference_voice_id":
        return domain.VoiceRef(msg.reference_voice_id)
    return audio_from_pb(msg.reference, "reference") if kind == "reference" else None


def dialogue_from_pb(msg: pb.CheckDialogueRequest) -> domain.DialogueRequest:
    turns = tuple(
        domain.DialogueTurn(
            turn_id=t.turn_id,
            speaker=t.speaker,
            text=t.text,
            audio=audio_from_pb(t.audio, f"turns[{i}].audio") if t.HasField("audio") else None,
        )
        for i, t in enumerate(msg.turns)
    )
    return domain.DialogueRequest(
        dialogue_id=msg.dialogue_id,
        turns=turns,
        references=references_from_pb(msg.references),
        options=options_from_pb(msg.options),
    )


def turn_to_pb(t: domain.TurnResult) -> pb.TurnVerdict:
    out = pb.TurnVerdict(
        turn_id=t.turn_id,
        speaker=t.speaker,
        status=_STATUS_TO_PB[t.status],  # type: ignore[arg-type]
        score_scale=t.score_scale,
        audio_seconds=t.audio_seconds,
        speech_seconds=t.speech_seconds,
        detail=t.detail,
        reason=_REASON_TO_PB[t.reason],  # type: ignore[arg-type]
        uncertain_reason=_UNCERTAIN_TO_PB[t.uncertain_reason],  # type: ignore[arg-type]
        closest_speaker=t.closest_speaker,
        judge_model=t.judge_model,
        judge_calibrated=t.judge_calibrated,
        encoder_scores=[
            pb.EncoderScores(
                encoder=e.encoder,
                pairwise_mean_cosine=e.pairwise_mean_cosine,
                centroid_cosine_distance=e.centroid_cosine_distance,
                reference_cosine=e.reference_cosine,
            )
            for e in t.encoder_scores
        ],
    )
    # Optional fields stay unset when the value does not exist: absence is not zero.
    for name in (
        "score",
        "threshold",
        "pairwise_mean_cosine",
        "centroid_cosine_distance",
        "reference_cosine",
        "inconsistency_probability",
        "closest_speaker_margin",
        "judge_probability",
        "judge_answer_mass",
        "bandwidth_hz",
        "compared_below_hz",
        "clipped_fraction",
        "compared_clipped_fraction",
        "snr_db",
        "compared_snr_db",
        "low_band_db",
        "compared_above_hz",
    ):
        value = getattr(t, name)
        if value is not None:
            setattr(out, name, value)
    if t.drift is not None:
        out.drift_score = t.drift.score
        for seg in t.drift.segments:
            out.drift_segments.add(start_seconds=seg.start_seconds, end_seconds=seg.end_seconds, score=seg.score)
    return out


def speaker_to_pb(s: domain.SpeakerResult) -> pb.SpeakerVerdict:
    return pb.SpeakerVerdict(
        speaker=s.speaker,
        consistent=s.consistent,
        judged=s.judged,
        inconsistent_turn_ids=list(s.inconsistent_turn_ids),
        scored_turns=s.scored_turns,
        unscored_turns=s.unscored_turns,
        uncertain_turn_ids=list(s.uncertain_turn_ids),
    )


def verdict_to_pb(result: domain.DialogueResult) -> pb.DialogueVerdict:
    out = pb.DialogueVerdict(
        dialogue_id=result.dialogue_id,
        turns=[turn_to_pb(t) for t in result.turns],
        speakers=[speaker_to_pb(s) for s in result.speakers],
        encoder=result.encoder,
        method=method_to_pb(result.method),  # type: ignore[arg-type]
        threshold_set=_THRESHOLD_SET_TO_PB[result.threshold_set],  # type: ignore[arg-type]
    )
    if result.similarity is not None:
        out.similarity.turn_ids.extend(result.similarity.turn_ids)
        out.similarity.cosines.extend(result.similarity.cosines)
    return out


def rank_from_pb(msg: pb.RankCandidatesRequest) -> domain.RankRequest:
    return domain.RankRequest(
        speaker=msg.speaker,
        context=tuple(audio_from_pb(a, f"context[{i}]") for i, a in enumerate(msg.context)),
        candidates=tuple(
            domain.CandidateInput(c.candidate_id, audio_from_pb(c.audio, f"candidates[{i}].audio"))
            for i, c in enumerate(msg.candidates)
        ),
        reference=rank_reference_from_pb(msg),
        options=options_from_pb(msg.options),
    )


def rank_to_pb(result: domain.RankResult) -> pb.RankCandidatesResponse:
    ranked = []
    for c in result.candidates:
        msg = pb.RankedCandidate(
            candidate_id=c.candidate_id,
            rank=c.rank,
            score=c.score,
            score_scale=c.score_scale,
            higher_is_better=c.higher_is_better,
            speech_seconds=c.speech_seconds,
            judge_calibrated=c.judge_calibrated,
            judge_model=c.judge_model,
        )
        if c.fit_probability is not None:
            msg.fit_probability = c.fit_probability
        if c.fit_status is not None:
            msg.fit_status = _STATUS_TO_PB[c.fit_status]
            msg.fit_detail = c.fit_detail
        if c.judge_answer_mass is not None:
            msg.judge_answer_mass = c.judge_answer_mass
        ranked.append(msg)
    return pb.RankCandidatesResponse(
        candidates=ranked,
        encoder=result.encoder,
        method=method_to_pb(result.method),  # type: ignore[arg-type]
        usable_context=result.usable_context,
    )


def turn_update_to_pb(u: TurnUpdate) -> pb.TurnUpdate:
    return pb.TurnUpdate(
        verdict=turn_to_pb(u.verdict),
        revision=u.revision,
        trigger_turn_id=u.trigger_turn_id,
        speaker=speaker_to_pb(u.speaker),
    )


def judge_info_to_pb(info: JudgeInfo, max_context_clips: int, orderings: int, threshold: float) -> pb.JudgeInfo:
    """GetServerInfo's description of the LALM judge (sleuthd.lalm.types.JudgeInfo plus its options)."""
    return pb.JudgeInfo(
        model_name=info.model_name,
        backend=info.backend,
        architecture=info.architecture,
        device=info.device,
        dtype=info.dtype,
        max_clip_seconds=info.max_clip_seconds,
        weights_sha256=info.weights_sha256,
        calibrated_detection=info.calibrated_detection,
        calibrated_discrimination=info.calibrated_discrimination,
        prompt_version=info.prompt_version,
        max_context_clips=max_context_clips,
        orderings=orderings,
        decision_threshold=threshold,
        min_answer_mass=info.min_answer_mass,
    )


# ---------------------------------------------------------------------------------------------- voice registry


def registration_from_pb(msg: pb.RegisterVoiceRequest) -> Registration:
    return Registration(
        voice_id=msg.voice_id,
        clips=tuple(audio_from_pb(a, f"clips[{k}]") for k, a in enumerate(msg.clips)),
        metadata=dict(msg.metadata),
        replace=msg.replace,
        keep_audio=msg.keep_audio if msg.HasField("keep_audio") else None,
    )


def voice_to_pb(voice: Voice, registry: VoiceRegistry) -> pb.Voice:
    out = pb.Voice(
        voice_id=voice.voice_id,
        metadata=dict(voice.metadata),
        revision=voice.revision,
        speech_seconds=voice.speech_seconds,
        audio_kept=voice.audio_kept,
        clips=[
            pb.VoiceClip(
                sha256=c.sha256,
                size_bytes=c.n_bytes,
                audio_seconds=c.audio_seconds,
                speech_seconds=c.speech_seconds,
                bandwidth_hz=c.bandwidth_hz,
                clipped_fraction=c.plateau,
                snr_db=c.snr_db,
                low_band_db=c.low_band_db,
            )
            for c in voice.clips
        ],
    )
    out.created_at.FromDatetime(voice.created_at)
    out.updated_at.FromDatetime(voice.updated_at)
    for e in voice.embeddings:
        msg = out.embeddings.add(
            encoder=e.encoder,
            weights_sha256=e.weights_sha256,
            dimension=e.dim,
            loaded=registry.loaded(e.encoder, e.weights_sha256),
        )
        if e.created_at is not None:
            msg.created_at.FromDatetime(e.created_at)
    return out


def listing_to_pb(listing: VoiceListing, registry: VoiceRegistry) -> pb.ListVoicesResponse:
    return pb.ListVoicesResponse(
        voices=[voice_to_pb(v, registry) for v in listing.page.voices],
        next_page_token=listing.page.next_page_token,
        total_size=listing.total,
    )


def registry_info_to_pb(registry: VoiceRegistry) -> pb.VoiceRegistryInfo:
    c = registry.config
    return pb.VoiceRegistryInfo(
        backend=registry.backend,
        keep_audio=c.keep_audio,
        max_voices=c.registry_max_voices,
        max_clips_per_voice=c.registry_max_clips_per_voice,
        max_clip_bytes=c.max_clip_bytes,
        max_voice_bytes=c.max_voice_bytes,
        max_clip_seconds=c.registry_max_clip_seconds,
        max_metadata_entries=c.registry_max_metadata_entries,
        max_metadata_bytes=c.registry_max_metadata_bytes,
        max_total_bytes=c.max_total_bytes,
    )

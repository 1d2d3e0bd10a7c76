"""The verdict rules: speakers' evidence pools (sleuthd.judgment.pool) in, per-turn and per-speaker verdicts out.

:func:`score_speakers` turns every speaker's pool into arrays of scores and verdict codes at once;
:func:`turn_result` makes a verdict object only for the turns someone asks about; :func:`speaker_verdict`
is the one rule that makes a speaker's verdict from their turns' statuses, whatever judged them. Shared by
CheckDialogue and StreamDialogue, so a stream's verdicts are exactly what CheckDialogue gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ, TELEPHONE_LOW_HZ
from sleuthd.domain import EncoderScores, FlagReason, SpeakerResult, TurnResult, TurnStatus, UncertainReason
from sleuthd.encoders.clips import UNMEASURED, Channel, ChannelCopy
from sleuthd.judgment import scoring
from sleuthd.judgment.calibration import Calibration, features
from sleuthd.judgment.evidence import OUT_OF_SUPPORT, OWN_TURNS_DISSIMILAR, EvidenceCalibration, Verdicts
from sleuthd.judgment.gram import products
from sleuthd.judgment.pool import SpeakerPool
from sleuthd.judgment.scoring import METHODS, Method


@dataclass(frozen=True)
class Judgment:
    """How turns are judged: a method, its threshold on the method's scale, and the encoder's
    calibration (None when the encoder has none; required for Method.AUTO)."""

    method: Method
    threshold: float
    calibration: Calibration | None = None
    # A fused encoder's parts: (name, first, stop) column ranges of its embedding. Each turn verdict then
    # also reports every part's paper scores (TurnResult.encoder_scores).
    components: tuple[tuple[str, int, int], ...] = ()
    # The fused encoder's blend (sleuthd.judgment.evidence): with it, auto's probability is today's inside the
    # calibration's support and the stack of today's and the per-encoder evidence outside it, where a turn
    # the stack does not flag may be UNCERTAIN. Needs ``components``.
    evidence: EvidenceCalibration | None = None
    # Compare a speaker whose clips span more than this many octaves of bandwidth at the common band, and one
    # whose clips' plateau fractions differ by more than this spread on copies clipped alike
    # (sleuthd.judgment.channel_matching); 0 = never. Only where the blend judges (auto, fused).
    band_match_octaves: float = 0.0
    clip_match_spread: float = 0.0
    noise_match_db: float = 0.0  # the same for SNR (dB)
    noise_compose_db: float = 0.0  # the same for SNR, for a speaker matched by band or clipping (0: never)
    telephone_band_db: float = 0.0  # a clip's low band level (dB) below which it counts as a telephone one (0: never)
    # Judge a speaker again with a flagged turn pitched this many octaves or more from the speaker's other clips moved
    # to their pitch (sleuthd.judgment.pitch_matching; 0: never). Reads the audio channel matching keeps.
    pitch_match_octaves: float = 0.0
    # Judge a speaker again for a flagged turn with less speech than this share of the median of the speaker's other
    # clips, against those clips cut to its length (sleuthd.judgment.length_matching; 0: never). Reads the same audio.
    length_match_ratio: float = 0.0

    @property
    def channel_matching(self) -> bool:
        matching = self.band_match_octaves > 0 or self.clip_match_spread > 0 or self.noise_match_db > 0
        return matching and self.method is Method.AUTO and self.evidence is not None


# Verdict codes, one per turn, so that a whole dialogue's statuses compare as arrays.
CONSISTENT, OVER_THRESHOLD, CONFUSED, NO_CONTEXT, NO_AUDIO, UNSURE_SUPPORT, UNSURE_DISSIMILAR = range(7)
STATUS_OF_CODE = (
    TurnStatus.CONSISTENT,
    TurnStatus.INCONSISTENT,
    TurnStatus.INCONSISTENT,
    TurnStatus.INSUFFICIENT_CONTEXT,
    TurnStatus.INSUFFICIENT_AUDIO,
    TurnStatus.UNCERTAIN,
    TurnStatus.UNCERTAIN,
)
REASON_OF_CODE = (
    FlagReason.NONE,
    FlagReason.SCORE_THRESHOLD,
    FlagReason.SPEAKER_CONFUSION,
    FlagReason.NONE,
    FlagReason.NONE,
    FlagReason.NONE,
    FlagReason.NONE,
)
UNCERTAIN_REASON_OF_CODE = (
    *(UncertainReason.NONE,) * 5,
    UncertainReason.OUT_OF_SUPPORT,
    UncertainReason.OWN_TURNS_DISSIMILAR,
)
FLAGGED = (OVER_THRESHOLD, CONFUSED)  # the codes of an INCONSISTENT turn
_UNSURE_CODE = {OUT_OF_SUPPORT: UNSURE_SUPPORT, OWN_TURNS_DISSIMILAR: UNSURE_DISSIMILAR}
SCORED = (TurnStatus.CONSISTENT, TurnStatus.INCONSISTENT, TurnStatus.UNCERTAIN)


@dataclass(frozen=True)
class SpeakerScores:
    """One speaker's verdicts as arrays over their usable turns (dialogue order)."""

    pairwise: np.ndarray | None  # (n,) cosine similarity; None with fewer than two usable turns
    centroid: np.ndarray | None  # (n,) cosine distance
    reference: np.ndarray | None  # (n,) cosine similarity; None without a reference
    probability: np.ndarray | None  # (n,) P(inconsistent); None without a calibration or evidence
    model: str  # auto's fitted model (variant) that gave ``probability``; with the blend's stack, both models
    scores: np.ndarray | None  # (n,) the scores the method judges with (one of the above); None: unscored
    codes: np.ndarray  # (n,) int: CONSISTENT, OVER_THRESHOLD, CONFUSED or NO_CONTEXT
    rivals: list[str]  # the other speakers with usable turns
    closest: np.ndarray | None  # (n,) index into rivals of the closest other speaker; None: one voice only
    margin: np.ndarray | None  # (n,) cosine to own speaker minus to the closest rival; NaN: nothing own
    # A fused encoder's parts: name -> (pairwise, centroid, reference) as above, each part's own.
    components: Mapping[str, tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]] = field(
        default_factory=dict
    )
    uncertain: tuple[str, ...] = ()  # per turn: why the blend's stack cannot vouch for it, in words ("": it can)


def score_speakers(pools: Mapping[str, SpeakerPool], judgment: Judgment) -> dict[str, SpeakerScores]:
    """Every speaker's verdict arrays. ``pools``: speaker -> pool, in order of first appearance. The
    other speakers' voices are each speaker's cohort; under auto, a turn closer to another speaker than
    to its own is flagged SPEAKER_CONFUSION."""
    voiced = [s for s, p in pools.items() if p.n]
    centroids = {s: pools[s].centroid() for s in voiced}
    out: dict[str, SpeakerScores] = {}
    for s in voiced:
        pool = pools[s]
        others = [u for u in voiced if u != s]
        cohort = np.stack([centroids[u] for u in others]) if others else None
        pw, cd, rc = pool.paper_scores()
        prob, model = None, ""
        unsure: tuple[str, ...] = ()
        kinds: tuple[str, ...] = ()
        calibration = judgment.calibration
        if calibration is not None and (pool.n >= 2 or pool.reference is not None):
            near = pool.nearest_other(cohort) if cohort is not None and pool.n >= 2 else None
            model, x = features(pool.own_evidence(), near)
            logit = calibration.models[model].logit(x)
            prob = _probability(logit)
            if judgment.evidence is not None and pool.components:
                blended = _blend(pools, s, others, judgment, logit)
                if blended is not None and not blended.inside:
                    prob, model = blended.probability, f"{model} + evidence {blended.variant}"
                    unsure, kinds = blended.reasons, blended.kinds
        chosen = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc, Method.AUTO: prob}[judgment.method]
        if chosen is None:
            codes = np.full(pool.n, NO_CONTEXT)
        else:
            codes = np.where(scoring.flagged(judgment.method, chosen, judgment.threshold), OVER_THRESHOLD, CONSISTENT)
        if judgment.method is Method.AUTO and any(kinds):
            # Not flagged, but outside what the blend's stack was fitted on: neither flagged nor cleared.
            unsure_codes = np.array([_UNSURE_CODE.get(k, CONSISTENT) for k in kinds])
            codes = np.where(codes == CONSISTENT, unsure_codes, codes)
        best = margin = None
        if cohort is not None:
            rivals = products(pool.emb, cohort)  # (n, c) float32: cosine to each other speaker's centroid
            best = np.argmax(rivals, axis=1)
            margin = pool.own_speaker_cosine() - rivals[np.arange(pool.n), best].astype(np.float64)
            if judgment.method is Method.AUTO:
                codes = np.where(margin < 0, CONFUSED, codes)  # NaN (unattributed) compares False
        parts = {name: part.paper_scores() for name, part in pool.components.items()}
        out[s] = SpeakerScores(pw, cd, rc, prob, model, chosen, codes, others, best, margin, parts, unsure)
    return out


def _probability(logit: np.ndarray) -> np.ndarray:
    # calibration.LogisticModel.probability's expression (and evidence's): the same bits from the same logit.
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(logit, -40, 40))))


def _blend(
    pools: Mapping[str, SpeakerPool], speaker: str, others: list[str], judgment: Judgment, auto_logit: np.ndarray
) -> Verdicts | None:
    """The blend's verdicts of one speaker of a fused encoder, from each encoder's own pool (reference first) and
    each turn's cosines to the other speakers' centroids in that encoder."""
    assert judgment.evidence is not None
    pool = pools[speaker]
    grams, rivals = {}, {}
    for name, part in pool.components.items():
        grams[name] = part.gram()
        if others:
            cents = np.stack([pools[u].components[name].centroid() for u in others])
            rivals[name] = np.asarray(products(part.emb, cents), np.float64)
    kept = {name: part.evidence() for name, part in pool.components.items()}
    return judgment.evidence.judge(
        grams, pool.reference is not None, pool.seconds, rivals or None, auto_logit, judgment.threshold, kept
    )


def turn_result(
    turn_id: str,
    speaker: str,
    audio_seconds: float,
    speech_seconds: float,
    detail: str,
    scores: SpeakerScores | None,
    k: int,
    judgment: Judgment,
    channel: Channel = UNMEASURED,
    compared_on: ChannelCopy | None = None,
    channel_note: str = "",
) -> TurnResult:
    """The verdict object of one turn: the k-th usable turn of its speaker, or (``scores`` None) a turn
    without usable audio, whose ``detail`` says why. ``compared_on``: the copies its speaker was judged on
    (channel matching; ``channel_note`` says why, and leads the detail). (Plain Python on scalars: CheckDialogue
    makes one per turn, so this is most of what judging a long dialogue costs beyond the vector work.)"""
    if scores is None:
        return TurnResult(
            turn_id,
            speaker,
            TurnStatus.INSUFFICIENT_AUDIO,
            audio_seconds,
            speech_seconds,
            detail=detail,
            bandwidth_hz=channel.bandwidth_hz,
            clipped_fraction=channel.plateau,
            snr_db=channel.snr_db,
        )
    code = int(scores.codes[k])
    score = threshold = None
    scale = ""
    if scores.scores is None:
        detail = (
            f"speaker {speaker!r} has no other usable turn to compare with; "
            "send more turns, or a reference and use method reference or auto"
        )
    else:
        info = METHODS[judgment.method]
        score, threshold, scale = float(scores.scores[k]), judgment.threshold, info.scale
        # The same comparison as scoring.flagged, on one number.
        bad = score > threshold if info.flag_above else score < threshold
        relation = (">" if bad else "<=") if info.flag_above else ("<" if bad else ">=")
        # auto names the fitted model it used (which evidence it had, cohort or not).
        model = f" ({scores.model} model)" if judgment.method is Method.AUTO else ""
        detail = f"{judgment.method.value}{model}: {scale.replace('_', ' ')} {score:.3f} {relation} {threshold:.3f}"
    closest, margin = "", None
    if scores.margin is not None and scores.closest is not None:
        d = float(scores.margin[k])
        if d == d:  # not NaN: the turn had something of its own speaker to compare with
            closest, margin = (speaker if d >= 0 else scores.rivals[int(scores.closest[k])]), d
    if code == CONFUSED:
        detail = f"sounds closer to speaker {closest!r} than to {speaker!r} (cosine margin {margin:.3f}); {detail}"
    elif code in (UNSURE_SUPPORT, UNSURE_DISSIMILAR):
        detail = f"uncertain, listen to it: {scores.uncertain[k]}; {detail}"
    if channel_note:
        detail = f"{channel_note}; {detail}"
    return TurnResult(
        turn_id=turn_id,
        speaker=speaker,
        status=STATUS_OF_CODE[code],
        audio_seconds=audio_seconds,
        speech_seconds=speech_seconds,
        score=score,
        score_scale=scale,
        threshold=threshold,
        pairwise_mean_cosine=None if scores.pairwise is None else float(scores.pairwise[k]),
        centroid_cosine_distance=None if scores.centroid is None else float(scores.centroid[k]),
        reference_cosine=None if scores.reference is None else float(scores.reference[k]),
        detail=detail,
        inconsistency_probability=None if scores.probability is None else float(scores.probability[k]),
        reason=REASON_OF_CODE[code],
        uncertain_reason=UNCERTAIN_REASON_OF_CODE[code],
        bandwidth_hz=channel.bandwidth_hz,
        compared_below_hz=NARROW_CUTOFF_HZ if compared_on is not None and compared_on.narrow else None,
        clipped_fraction=channel.plateau,
        compared_clipped_fraction=None if compared_on is None else compared_on.plateau,
        snr_db=channel.snr_db,
        compared_snr_db=None if compared_on is None else compared_on.snr_db,
        low_band_db=channel.low_band_db,
        compared_above_hz=TELEPHONE_LOW_HZ if compared_on is not None and compared_on.telephone else None,
        closest_speaker=closest,
        closest_speaker_margin=margin,
        encoder_scores=tuple(
            EncoderScores(name, *(None if a is None else float(a[k]) for a in arrays))
            for name, arrays in scores.components.items()
        ),
    )


def speaker_verdict(speaker: str, turns: Sequence[tuple[str, TurnStatus]]) -> SpeakerResult:
    """A speaker's verdict from all their turns (turn id and status, dialogue order), whichever method
    judged them. Detection: consistent when every scored turn is CONSISTENT; localization: the INCONSISTENT
    ones; UNCERTAIN turns are scored but listed apart, neither flagged nor cleared."""
    bad = tuple(t for t, status in turns if status is TurnStatus.INCONSISTENT)
    unsure = tuple(t for t, status in turns if status is TurnStatus.UNCERTAIN)
    scored = sum(1 for _, status in turns if status in SCORED)
    return SpeakerResult(
        speaker=speaker,
        judged=scored > 0,
        consistent=scored > 0 and not bad and not unsure,
        inconsistent_turn_ids=bad,
        scored_turns=scored,
        unscored_turns=len(turns) - scored,
        uncertain_turn_ids=unsure,
    )


@dataclass(frozen=True)
class Rematched:
    """A speaker's verdicts after a turn was judged again on copies (pitch and length matching), and what each cleared
    turn's detail says (row -> note)."""

    scores: SpeakerScores
    notes: Mapping[int, str]


def merge_rows(first: SpeakerScores, again: SpeakerScores, rows: np.ndarray) -> SpeakerScores:
    """``first`` with the ``rows`` (a mask over the speaker's usable turns) taken from ``again``: a speaker judged
    again on copies (pitch and length matching) keeps its first verdicts elsewhere."""

    def pick(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
        return a if a is None or b is None else np.where(rows, b, a)

    return replace(
        first,
        pairwise=pick(first.pairwise, again.pairwise),
        centroid=pick(first.centroid, again.centroid),
        reference=pick(first.reference, again.reference),
        probability=pick(first.probability, again.probability),
        scores=pick(first.scores, again.scores),
        codes=np.where(rows, again.codes, first.codes),
        closest=pick(first.closest, again.closest),
        margin=pick(first.margin, again.margin),
        components={
            name: (pick(p[0], q[0]), pick(p[1], q[1]), pick(p[2], q[2]))
            for name, p in first.components.items()
            for q in [again.components[name]]
        },
        uncertain=tuple(_why(again if rows[k] else first, k) for k in range(len(rows)))
        if first.uncertain or again.uncertain
        else (),
    )


def _why(scores: SpeakerScores, k: int) -> str:
    return scores.uncertain[k] if scores.uncertain else ""

"""Judging the matrix's instances offline, as the server would: the paper's three methods at a threshold,
today's `auto` (sleuthd.calibration, the encoder's shipped calibration), the evidence model
(sleuthd.judgment.evidence), and the hindsight (oracle) threshold of a paper method.

Each judge returns the dialogue positions it flags (and, for the evidence model, those it calls
uncertain). The paper scores are those of sleuthd.judge's SpeakerPool (pairwise mean cosine to the other
turns, cosine distance to the centroid of all turns, cosine to the reference), on the usable turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from sleuthd.api import CLEAR_BELOW, GUARD_COSINE, GUARD_ENCODER, MAX_PIECES, guard_margin, short_turns
from sleuthd.api import pitch_moves as moves_of
from sleuthd.judgment.calibration import Calibration, inconsistency_probability, turn_features
from sleuthd.judgment.evidence import EvidenceCalibration

from sleuthd_bench.metrics import DetectionRecord, detection_metrics, localization_metrics
from sleuthd_bench.robustness.embed import Embeddings, cut_key, fused, pitch_key
from sleuthd_bench.robustness.instances import ENCODERS, FUSED, Instance, Turns, telephone_kinds

PAPER = ("pairwise", "centroid", "reference")
FLAG_ABOVE = {"pairwise": False, "centroid": True, "reference": False}


def paper_scores(v: Turns, method: str) -> np.ndarray | None:
    """(n,) scores of the usable turns, or None when the method has nothing to compare with."""
    n = len(v.emb)
    e = v.emb.astype(np.float64)
    if method == "reference":
        return None if v.reference is None or n == 0 else e @ v.reference.astype(np.float64)
    if n < 2:
        return None
    g = e @ e.T
    rows = g.sum(axis=1)
    if method == "pairwise":
        return np.asarray((rows - np.diagonal(g)) / (n - 1))
    return np.asarray(1.0 - (rows / n) / max(float(np.sqrt(max(rows.sum(), 0.0))) / n, 1e-12))


def paper_flags(v: Turns, method: str, threshold: float) -> frozenset[int]:
    s = paper_scores(v, method)
    if s is None:
        return frozenset()
    bad = s > threshold if FLAG_ABOVE[method] else s < threshold
    return frozenset(int(i) for i in v.index[bad])


def auto_flags(v: Turns, calibration: Calibration) -> frozenset[int]:
    if len(v.emb) == 0 or (len(v.emb) < 2 and v.reference is None):
        return frozenset()
    _, p = inconsistency_probability(calibration, v.emb, v.reference, v.seconds, None)
    return frozenset(int(i) for i in v.index[p > calibration.decision_threshold])


def auto_logits(v: Turns, calibration: Calibration) -> np.ndarray:
    """(n,) today's `auto` log-odds of the usable turns (no cohort: the matrix's dialogues have one voice)."""
    variant, x = turn_features(v.emb, v.reference, v.seconds, None)
    return calibration.models[variant].logit(x)


def evidence_inputs(
    inst: Instance, use_reference: bool = True
) -> tuple[dict[str, np.ndarray], bool, np.ndarray, np.ndarray]:
    """(encoder -> pool cosine matrix, has_reference, speech seconds, dialogue positions) over the turns
    every encoder can use (the fused view's), reference first when every encoder can use it."""
    joint = inst.views["fused"]
    has_ref = use_reference and joint.reference is not None
    grams = {}
    for e in ENCODERS:
        v = inst.views[e]
        rows = v.emb[np.searchsorted(v.index, joint.index)].astype(np.float64)
        pool = (
            np.vstack([v.reference[None, :].astype(np.float64), rows]) if has_ref and v.reference is not None else rows
        )
        grams[e] = pool @ pool.T
    return grams, has_ref, joint.seconds, joint.index


def channel_matched(
    inst: Instance,
    band_match_octaves: float,
    clip_match_spread: float,
    noise_match_db: float,
    noise_compose_db: float = 0.0,
    telephone_band_db: float = 0.0,
) -> Instance:
    """The instance with the views the server's channel matching judges it on (the same instance when it is judged
    as sent): where it is band- or clip-mixed and its SNRs differ by more than ``noise_compose_db``, its copies with
    the noise added too; else its clipped copies (low-passed too where it is also band-mixed), else its narrowband
    copies, else, matched neither way, its noisy copies. A band-mixed one with a telephone clip among clips that kept
    their low band (``telephone_band_db``) is judged on those copies band-passed at the telephone band, and falls back
    as the server does: without the noise, then narrowband at the telephone band, then narrowband."""
    band_mixed = inst.band_mixed(band_match_octaves)
    clip_mixed = inst.clip_mixed(clip_match_spread)
    if band_mixed and inst.telephone_mixed(telephone_band_db):
        noise_too = inst.noise_mixed(noise_compose_db)
        for kind in telephone_kinds(clip_mixed, noise_too):
            views = inst.telephone_matched(*kind)
            if views is not None:
                return replace(inst, views=views)
        return replace(inst, views=inst.narrow_views) if inst.band_matched(band_match_octaves) else inst
    composed = inst.composed_matched(noise_compose_db, band_mixed, clip_mixed)
    if composed is not None:
        return replace(inst, views=composed)
    clipped = inst.clip_matched(clip_match_spread, band_mixed)
    if clipped is not None:
        return replace(inst, views=clipped)
    if inst.band_matched(band_match_octaves):
        return replace(inst, views=inst.narrow_views)
    if not band_mixed and not inst.clip_mixed(clip_match_spread):
        noisy = inst.noise_matched(noise_match_db)
        if noisy is not None:
            return replace(inst, views=noisy)
    return inst


def evidence_flags(
    inst: Instance,
    calibration: EvidenceCalibration,
    auto: Calibration | None = None,
    band_match_octaves: float = 0.0,
    clip_match_spread: float = 0.0,
    noise_match_db: float = 0.0,
    noise_compose_db: float = 0.0,
    telephone_band_db: float = 0.0,
    pitch: PitchMatching | None = None,
    length: LengthMatching | None = None,
) -> tuple[frozenset[int], frozenset[int], np.ndarray]:
    """(flagged positions, uncertain positions, per-turn probabilities over the usable turns). With ``auto``
    (today's fused calibration) and a calibration that has a blend, the blend judges, as the server's fused
    `auto` does; else the evidence model alone. With the blend and ``band_match_octaves`` (the server's
    --band-match-octaves), an instance whose clips span more bandwidth is judged on its narrowband copies, as
    the server judges such a speaker; with ``clip_match_spread`` (--clip-match-spread), one whose clips differ
    in clipping on its copies clipped alike (low-passed too where it is also band-mixed), else as above; with
    ``noise_match_db`` (--noise-match-db), one matched neither way whose clips differ in SNR on its copies with its
    noisiest clip's noise added; with ``noise_compose_db`` (--noise-compose-db), one matched by band or clipping whose
    clips differ in SNR by more than that on those copies with the noise added too. With ``pitch`` (and the blend),
    a flagged turn pitched away from the speaker is judged again on its moved copy (:func:`pitch_matched`); with
    ``length`` (and the blend), a short flagged turn of a speaker judged as sent is judged again against the other
    pieces cut to its length (:func:`length_matched`)."""
    if auto is not None and calibration.blend is not None:
        sent = inst
        inst = channel_matched(
            inst, band_match_octaves, clip_match_spread, noise_match_db, noise_compose_db, telephone_band_db
        )
        first = _judged(inst, calibration, auto)
        # As the server: only a speaker judged on its clips as sent or on their narrowband copies is pitch matched.
        if pitch is not None and pitch.octaves > 0 and first[0] and (inst is sent or inst.views is sent.narrow_views):
            first = pitch_matched(inst, inst is not sent, first, pitch, calibration, auto)
        # ... and only one judged as sent is length matched.
        if length is not None and length.ratio > 0 and first[0] and inst is sent:
            first = length_matched(inst, first, length, calibration, auto)
        return first
    return _judged(inst, calibration, auto)


@dataclass(frozen=True)
class PitchMatching:
    """What the offline judges need to pitch match as the server does (sleuthd.judgment.pitch_matching): the least
    pitch distance of a moved turn (the server's --pitch-match-octaves), the clips' median pitches (log2 Hz, NaN:
    too little voiced; sleuthd_bench.robustness.embed.measure_pitches) and the moved copies' embeddings (keyed
    embed.pitch_key, in the clipped copies' cache)."""

    octaves: float
    pitches: Mapping[str, float]
    copies: Mapping[str, Embeddings] | None


def pitch_moves(inst: Instance, index: np.ndarray, flagged: frozenset[int], octaves: float,
                pitches: Mapping[str, float]) -> dict[int, int]:  # fmt: skip
    """Flagged dialogue position -> quarter-tone steps to the median pitch of the speaker's other pieces (the usable
    turns ``index`` and the reference), by the server's rule (sleuthd.api.pitch_moves). Raises LookupError for a
    piece whose pitch was never measured."""
    pieces = [inst.paths[k] for k in index.tolist()] + [inst.reference_path]
    unmeasured = [p for p in pieces if p not in pitches]
    if unmeasured:
        raise LookupError(f"{inst.dialogue_id}: no pitch for {unmeasured[0]}: run `sleuthd-bench robustness embed "
                          "--pitched`")  # fmt: skip
    pitch = [None if not np.isfinite(v := pitches[p]) else float(v) for p in pieces]
    positions = index.tolist()
    rows = [j for j, pos in enumerate(positions) if pos in flagged]
    return {positions[j]: steps for j, steps in moves_of(pitch, rows, octaves).items()}


def pitch_matched(
    inst: Instance,
    narrow: bool,
    first: tuple[frozenset[int], frozenset[int], np.ndarray],
    pitch: PitchMatching,
    calibration: EvidenceCalibration,
    auto: Calibration,
) -> tuple[frozenset[int], frozenset[int], np.ndarray]:
    """``first`` (the instance judged on ``inst.views``, narrowband copies when ``narrow``) after pitch matching: judged
    again with each moved turn's embeddings replaced by its copy's; a turn flagged before and not after is cleared,
    only when every moved copy's mean CAM++ cosine to the other pieces is within GUARD_COSINE of the speaker's level
    (the server's PitchMatcher._judge_again and guard_margin). A copy that is unusable leaves ``first``."""
    flagged, unsure, probability = first
    index = inst.views[FUSED].index
    moves = pitch_moves(inst, index, flagged, pitch.octaves, pitch.pitches)
    if not moves:
        return first
    keys = {pos: pitch_key(inst.paths[pos], steps, narrow) for pos, steps in moves.items()}
    if pitch.copies is None or not all(k in pitch.copies[e].index for e in ENCODERS for k in keys.values()):
        raise LookupError(f"{inst.dialogue_id}/{inst.scenario}: the copies moved in pitch are not embedded: run "
                          "`sleuthd-bench robustness embed --pitched`")  # fmt: skip
    made: dict[str, dict[int | None, tuple[np.ndarray | None, float]]] = {
        e: {pos: pitch.copies[e].get(key) for pos, key in keys.items()} for e in ENCODERS
    }
    if any(vec is None for e in ENCODERS for vec, _ in made[e].values()):
        return first  # too little speech left in a copy: judged as first judged
    again_inst = replace(inst, views=_with_copies(inst, made))
    again = _judged(again_inst, calibration, auto)
    cleared = flagged - again[0]
    if not cleared:
        return first
    grams, has_ref, _, _ = evidence_inputs(again_inst)
    moved = [int(has_ref) + int(np.searchsorted(index, pos)) for pos in moves]  # reference first
    if guard_margin(grams[GUARD_ENCODER], moved) < GUARD_COSINE:
        return first
    rows = np.isin(index, sorted(cleared))
    return (
        flagged - cleared,
        frozenset(p for p in unsure if p not in cleared) | frozenset(p for p in again[1] if p in cleared),
        np.where(rows, again[2], probability) if len(probability) == len(rows) else probability,
    )


@dataclass(frozen=True)
class LengthMatching:
    """What the offline judges need to length match as the server does (sleuthd.judgment.length_matching): the share
    of the speaker's median speech under which a flagged turn is judged again (the server's --length-match-ratio),
    every clip's speech seconds (a cache of the clips as sent: a reference's are not in the views), the trimmed
    lengths in samples of the clips of instances with a short turn (sleuthd_bench.robustness.embed.measure_kept) and
    the cut copies' embeddings (keyed embed.cut_key, in the clipped copies' cache)."""

    ratio: float
    speech: Embeddings
    kept: Mapping[str, int]
    copies: Mapping[str, Embeddings] | None


def length_matched(
    inst: Instance,
    first: tuple[frozenset[int], frozenset[int], np.ndarray],
    length: LengthMatching,
    calibration: EvidenceCalibration,
    auto: Calibration,
) -> tuple[frozenset[int], frozenset[int], np.ndarray]:
    """``first`` (the instance judged on its clips as sent) after length matching: each flagged turn with less speech
    than ``length.ratio`` of the median of the speaker's other pieces (sleuthd.api.short_turns) judged again with every
    other piece whose trimmed speech is longer replaced by its copy cut to the turn's, and cleared when its probability
    so is under CLEAR_BELOW and its mean CAM++ cosine to the cut pieces is within GUARD_COSINE of their own level (the
    server's LengthMatcher; none for a speaker of more than MAX_PIECES pieces). A cut that is unusable leaves that turn
    as first judged."""
    flagged, unsure, probability = first
    joint = inst.views[FUSED]
    index = joint.index
    positions = index.tolist()
    has_ref = joint.reference is not None
    pieces = [inst.paths[k] for k in positions] + ([inst.reference_path] if has_ref else [])
    if len(pieces) > MAX_PIECES:
        return first
    seconds = joint.seconds.tolist() + ([length.speech.get(inst.reference_path)[1]] if has_ref else [])
    rows = short_turns(seconds, [j for j, pos in enumerate(positions) if pos in flagged], length.ratio)
    unmeasured = [p for p in pieces if p not in length.kept]
    if rows and unmeasured:
        raise LookupError(f"{inst.dialogue_id}: no trimmed length for {unmeasured[0]}: run `sleuthd-bench "
                          "robustness embed --cut`")  # fmt: skip
    cleared: dict[int, tuple[bool, float]] = {}  # position -> (uncertain after, probability)
    for j in rows:
        n = length.kept[pieces[j]]
        # The pieces cut, by dialogue position (None: the reference), and their copies' cache keys.
        keys = {
            (positions[k] if k < len(positions) else None): cut_key(p, n)
            for k, p in enumerate(pieces)
            if k != j and length.kept[p] > n
        }
        if length.copies is None or not all(key in length.copies[e].index for e in ENCODERS for key in keys.values()):
            raise LookupError(f"{inst.dialogue_id}/{inst.scenario}: the cut copies are not embedded: run "
                              "`sleuthd-bench robustness embed --cut`")  # fmt: skip
        made = {e: {at: length.copies[e].get(key) for at, key in keys.items()} for e in ENCODERS}
        if any(vec is None for e in ENCODERS for vec, _ in made[e].values()):
            continue  # too little speech in a cut: judged as first judged
        again_inst = replace(inst, views=_with_copies(inst, made))
        again = _judged(again_inst, calibration, auto)
        if len(again[2]) == len(positions) and again[2][j] < CLEAR_BELOW:
            grams, has_ref_again, _, _ = evidence_inputs(again_inst)
            if guard_margin(grams[GUARD_ENCODER], [int(has_ref_again) + j]) >= GUARD_COSINE:  # reference first
                cleared[positions[j]] = (positions[j] in again[1], float(again[2][j]))
    if not cleared:
        return first
    if len(probability) == len(positions):
        probability = probability.copy()
        for pos, (_, p) in cleared.items():
            probability[positions.index(pos)] = p
    return (
        flagged - frozenset(cleared),
        frozenset(p for p in unsure if p not in cleared) | frozenset(p for p, (u, _) in cleared.items() if u),
        probability,
    )


def _with_copies(
    inst: Instance, made: Mapping[str, Mapping[int | None, tuple[np.ndarray | None, float]]]
) -> dict[str, Turns]:
    """The instance's views with the pieces ``made`` names (encoder -> dialogue position, None for the reference ->
    the copy's embedding and speech seconds, every one usable) replaced by their copies, the fused view's joined as
    the server joins them: what pitch and length matching judge again."""
    views = {}
    for e in [*ENCODERS, FUSED]:
        v = inst.views[e]
        emb, seconds, reference = v.emb.copy(), v.seconds.copy(), v.reference
        for at in made[ENCODERS[0]]:
            part = ENCODERS[0] if e == FUSED else e
            vec = fused([made[c][at][0] for c in ENCODERS]) if e == FUSED else made[e][at][0]
            if at is None:
                reference = vec
            else:
                j = int(np.searchsorted(v.index, at))
                emb[j], seconds[j] = vec, made[part][at][1]
        views[e] = Turns(v.index, emb, seconds, reference)
    return views


def _judged(
    inst: Instance, calibration: EvidenceCalibration, auto: Calibration | None
) -> tuple[frozenset[int], frozenset[int], np.ndarray]:
    """The evidence model (with ``auto``'s log-odds when it has a blend) on the instance's views as they are."""
    grams, has_ref, seconds, index = evidence_inputs(inst)
    logits = None
    if auto is not None and calibration.blend is not None and len(seconds) and (len(seconds) > 1 or has_ref):
        logits = auto_logits(inst.views["fused"], auto)
    # With the blend, the decision threshold is its own (today's calibration's 0.5), as on the server.
    verdicts = calibration.judge(grams, has_ref, seconds, auto_logit=logits)
    if verdicts is None:
        return frozenset(), frozenset(), np.zeros(0)
    flagged = frozenset(int(i) for i in index[verdicts.flagged])
    uncertain = frozenset(int(i) for i in index[verdicts.uncertain])
    return flagged, uncertain, verdicts.probability


def record(inst: Instance, flagged: frozenset[int]) -> DetectionRecord:
    return DetectionRecord(inst.dialogue_id, inst.condition, inst.scenario, inst.gold, flagged, bool(flagged))


def metrics(records: Sequence[DetectionRecord]) -> dict[str, float]:
    """Percent: S1, S2, S3, bal (detection) and bal_f1 (localization)."""
    d = detection_metrics(records)
    return {
        "S1": d["S1"],
        "S2": d["S2"],
        "S3": d["S3"],
        "bal": d["bal"],
        "bal_f1": localization_metrics(records)["bal_f1"],
    }


@dataclass(frozen=True)
class Oracle:
    encoder: str
    method: str
    threshold: float
    S1: float
    S2: float
    S3: float
    bal: float


def oracle(instances: Sequence[Instance], encoder: str, method: str) -> Oracle | None:
    """The single threshold that maximises Bal on these instances, in hindsight (the bar `auto` must beat).
    A dialogue is flagged at threshold tau when its most extreme turn score crosses tau."""
    extreme = {"S1": [], "S2": [], "S3": []}  # type: dict[str, list[float]]
    for inst in instances:
        s = paper_scores(inst.views[encoder], method)
        # Oriented so that "flagged" means value > tau; an unscored instance is never flagged.
        value = -np.inf if s is None or not len(s) else (float(s.max()) if FLAG_ABOVE[method] else -float(s.min()))
        extreme[inst.scenario].append(value)
    arrays = {k: np.sort(np.asarray(v)) for k, v in extreme.items()}
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays.values()])
    if not len(finite):
        return None
    values = np.unique(finite)
    # Candidate thresholds: midpoints between observed values, and below / above them all.
    cands = np.concatenate([[values[0] - 1e-6], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-6]])

    def rate(a: np.ndarray) -> np.ndarray:  # share flagged (> tau) at every candidate
        return 1.0 - np.searchsorted(a, cands, side="right") / max(len(a), 1)

    s1, s2, s3 = 1.0 - rate(arrays["S1"]), rate(arrays["S2"]), rate(arrays["S3"])
    bal = 50.0 * (s1 + (s2 + s3) / 2)
    best = int(np.argmax(bal))
    tau = float(cands[best]) if FLAG_ABOVE[method] else -float(cands[best])
    return Oracle(encoder, method, tau, 100 * s1[best], 100 * s2[best], 100 * s3[best], float(bal[best]))


def judge_all(
    instances: Sequence[Instance],
    thresholds: Mapping[str, Mapping[str, Mapping[str, float]]],
    calibrations: Mapping[str, Calibration],
    evidence: Mapping[str, EvidenceCalibration] | None = None,
    band_match_octaves: float = 0.0,
    clip_match_spread: float = 0.0,
    noise_match_db: float = 0.0,
    noise_compose_db: float = 0.0,
    telephone_band_db: float = 0.0,
    pitch: PitchMatching | None = None,
    length: LengthMatching | None = None,
) -> tuple[dict[str, list[DetectionRecord]], dict[str, list[int]]]:
    """Records per run name (``<encoder>:<method>@<set>``, ``<encoder>:auto``, ``evidence[:<label>]``) and,
    per evidence run, for each instance 1 when its verdict is uncertain (nothing flagged, a turn uncertain).
    ``band_match_octaves``, ``clip_match_spread``, ``noise_match_db``, ``noise_compose_db``: the blends' channel
    matching (:func:`evidence_flags`); 0 = off; ``pitch``, ``length``: their pitch and length matching (None: off)."""
    runs: dict[str, list[DetectionRecord]] = {}
    uncertain: dict[str, list[int]] = {}
    for inst in instances:
        for enc, sets in thresholds.items():
            v = inst.views[enc]
            for label, values in sets.items():
                for method in PAPER:
                    runs.setdefault(f"{enc}:{method}@{label}", []).append(
                        record(inst, paper_flags(v, method, values[method]))
                    )
            if enc in calibrations:
                runs.setdefault(f"{enc}:auto", []).append(record(inst, auto_flags(v, calibrations[enc])))
        for name, cal in (evidence or {}).items():
            flagged, unsure, _ = evidence_flags(
                inst,
                cal,
                calibrations.get("fused"),
                band_match_octaves,
                clip_match_spread,
                noise_match_db,
                noise_compose_db,
                telephone_band_db,
                pitch,
                length,
            )
            runs.setdefault(name, []).append(record(inst, flagged))
            uncertain.setdefault(name, []).append(int(not flagged and bool(unsure)))
    return runs, uncertain

"""Resolving a request's options against what the server has loaded: encoder, method, threshold.

Precedence for the threshold: an explicit threshold > the requested threshold set (the paper's fixed
thresholds) > the encoder manifest's defaults; method auto uses its calibration's decision threshold.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sleuthd.domain import CheckOptions, DialogueResult, SimilarityMatrix, SpeakerResult, ThresholdSet, TurnResult
from sleuthd.encoders.embedder import Placements
from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.manifest import PAPER_THRESHOLDS
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.errors import InvalidRequest, UnknownName, Unsupported
from sleuthd.judgment.calibration import Calibration, CalibrationError
from sleuthd.judgment.drift import DriftConfig, drift_window
from sleuthd.judgment.evidence import EvidenceCalibration, EvidenceError
from sleuthd.judgment.scoring import METHODS, Method
from sleuthd.judgment.verdicts import Judgment

logger = logging.getLogger(__name__)

LALM_THRESHOLD = 0.5  # method lalm flags a turn whose judge probability of a different speaker is above this


@dataclass(frozen=True)
class EncoderEntry:
    """A loaded encoder with what its manifest adds: the auto calibration (or why there is none), the fused
    encoder's blend (None for a single encoder, or a fusion without one), and the drift settings (None: the
    manifest has none, so detect_drift is unavailable)."""

    encoder: WindowEncoder
    calibration: Calibration | CalibrationError
    drift: DriftConfig | None
    evidence: EvidenceCalibration | None = None

    @classmethod
    def from_encoder(cls, encoder: WindowEncoder) -> EncoderEntry:
        raw = encoder.manifest.raw
        evidence = None
        try:
            calibration: Calibration | CalibrationError = Calibration.from_manifest(raw, encoder.manifest.name)
            if isinstance(encoder, FusedEncoder):
                # The blend is bound to both encoders' weights and to today's calibration: either changed, and
                # auto is refused with how to refit, never served from a model fitted for other evidence.
                evidence = EvidenceCalibration.from_manifest(raw)
        except (CalibrationError, EvidenceError) as exc:
            # The encoder still serves the paper methods; auto then fails with this reason instead of
            # quietly falling back to a fixed threshold.
            logger.warning("%s", exc)
            calibration = (
                exc
                if isinstance(exc, CalibrationError)
                else CalibrationError(f"encoder {encoder.manifest.name!r} cannot judge with method auto: {exc}")
            )
        drift = DriftConfig.from_manifest(raw["drift"]) if "drift" in raw else None
        return cls(encoder, calibration, drift, evidence)


@dataclass(frozen=True)
class ResolvedOptions:
    entry: EncoderEntry
    judgment: Judgment
    threshold_set: ThresholdSet
    detect_drift: bool
    similarity_matrix: bool = False  # the verdict carries the turn x turn cosines

    @property
    def encoder(self) -> WindowEncoder:
        return self.entry.encoder

    @property
    def method(self) -> Method:
        return self.judgment.method

    @property
    def placements(self) -> Placements:
        """Where each turn's windows go: the manifest's, plus the denser drift windows when the request
        asked for drift (both from one decode)."""
        if self.detect_drift and self.entry.drift is not None:
            return (None, drift_window(self.encoder.manifest.window, self.entry.drift))
        return (None,)

    def as_auto(self) -> ResolvedOptions:
        """These options under auto with the encoder's calibration and the server's channel matching, without drift
        or the similarity matrix: how a RankCandidates candidate's fit is judged, whatever the request's method."""
        calibration = self.entry.calibration
        assert isinstance(calibration, Calibration), "auto needs the encoder's calibration"
        judgment = dataclasses.replace(
            self.judgment, method=Method.AUTO, threshold=calibration.decision_threshold, calibration=calibration
        )
        return dataclasses.replace(
            self, judgment=judgment, threshold_set=ThresholdSet.DEFAULT, detect_drift=False, similarity_matrix=False
        )

    def result(
        self,
        dialogue_id: str,
        turns: Sequence[TurnResult],
        speakers: Sequence[SpeakerResult],
        similarity: SimilarityMatrix | None = None,
    ) -> DialogueResult:
        """The dialogue verdict, stating which encoder, method and threshold set judged it."""
        return DialogueResult(
            similarity=similarity,
            dialogue_id=dialogue_id,
            turns=tuple(turns),
            speakers=tuple(speakers),
            encoder=self.encoder.manifest.name,
            method=self.method,
            threshold_set=self.threshold_set,
        )


def resolve(
    options: CheckOptions,
    entries: Mapping[str, EncoderEntry],
    default_encoder: str,
    band_match_octaves: float = 0.0,
    clip_match_spread: float = 0.0,
    noise_match_db: float = 0.0,
    noise_compose_db: float = 0.0,
    telephone_band_db: float = 0.0,
    pitch_match_octaves: float = 0.0,
    length_match_ratio: float = 0.0,
) -> ResolvedOptions:
    """Apply defaults to ``options``; raise with what to change when they cannot be served.
    ``band_match_octaves``, ``clip_match_spread``, ``noise_match_db``, ``noise_compose_db``, ``telephone_band_db``,
    ``pitch_match_octaves``, ``length_match_ratio``: the server's --band-match-octaves, --clip-match-spread,
    --noise-match-db, --noise-compose-db, --telephone-band-db, --pitch-match-octaves and --length-match-ratio
    (Judgment's)."""
    name = options.encoder or default_encoder
    if name not in entries:
        raise UnknownName(f"unknown encoder {name!r}; this server has: {', '.join(sorted(entries))}")
    entry = entries[name]
    method = options.method or Method(entry.encoder.manifest.default_method)
    if method is Method.LALM and isinstance(entry.encoder, FusedEncoder):
        # The judge hears the audio itself; the encoder only trims silence and gates short clips, which the
        # fusion's first component does as well as the fusion would.
        name = entry.encoder.component_names[0]
        entry = entries[name]
    manifest = entry.encoder.manifest
    info = METHODS[method]
    calibration = entry.calibration
    if method is Method.AUTO and isinstance(calibration, CalibrationError):
        raise Unsupported(str(calibration))
    if options.threshold is not None:
        lo, hi = info.threshold_range
        if not (np.isfinite(options.threshold) and lo <= options.threshold <= hi):
            raise InvalidRequest(
                f"threshold {options.threshold} is outside the {method.value} scale ({info.scale}, {lo}–{hi})"
            )
        threshold = float(options.threshold)
    elif method is Method.LALM:  # the judge's own scale: flag what it finds more likely than not a different voice
        if options.threshold_set is ThresholdSet.PAPER:
            raise InvalidRequest("the paper has no threshold for method lalm: use the default threshold set")
        threshold = LALM_THRESHOLD
    elif method is Method.AUTO:
        if options.threshold_set is ThresholdSet.PAPER:
            raise InvalidRequest("the paper has no threshold for method auto: use the default threshold set")
        assert isinstance(calibration, Calibration)
        threshold = calibration.decision_threshold
    elif options.threshold_set is ThresholdSet.PAPER:
        threshold = PAPER_THRESHOLDS[method.value]
    else:
        if method.value not in manifest.default_thresholds:
            raise InvalidRequest(f"encoder {name!r} has no default threshold for method {method.value!r}")
        threshold = manifest.default_thresholds[method.value]
    if options.detect_drift and entry.drift is None:
        raise Unsupported(f"encoder {name!r} has no drift settings in its manifest, so detect_drift is unavailable")
    usable_calibration = calibration if isinstance(calibration, Calibration) else None
    components: tuple[tuple[str, int, int], ...] = ()
    if isinstance(entry.encoder, FusedEncoder):
        components = entry.encoder.layout
    evidence = entry.evidence if usable_calibration is not None and components else None
    judgment = Judgment(
        method,
        threshold,
        usable_calibration,
        components,
        evidence,
        band_match_octaves,
        clip_match_spread,
        noise_match_db,
        noise_compose_db,
        telephone_band_db,
        pitch_match_octaves,
        length_match_ratio,
    )
    return ResolvedOptions(entry, judgment, options.threshold_set, options.detect_drift, options.similarity_matrix)

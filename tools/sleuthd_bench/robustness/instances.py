"""The robustness matrix's detection instances with their cached embeddings, ready to be judged offline.

One instance is a dialogue under one scenario (S1, S2, S3), as sleuthd_bench.instances derives them, with
each encoder's unit embeddings of the target turns and the reference (None where the encoder found the clip
unusable, as the server would mark it INSUFFICIENT_AUDIO) and the turns' speech seconds. ``fused`` is the
two encoders joined as sleuthd.fusion joins them; a clip is usable for it when both encoders can use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sleuthd_bench.instances import gold_turns, scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.metrics import SCENARIOS, Scenario
from sleuthd_bench.robustness.embed import (
    ENCODERS,
    Embeddings,
    composed_key,
    copy_key,
    fused,
    noise_key,
    telephone_key,
)

FUSED = "fused"
_MEASURE = "run `sleuthd-bench robustness embed --clipped --split <this split>` first"
ALL_ENCODERS = (*ENCODERS, FUSED)


@dataclass
class Turns:
    """One encoder's view of an instance: usable turns only, with their index in the dialogue."""

    index: np.ndarray  # (n,) dialogue positions of the usable turns
    emb: np.ndarray  # (n, D) float32 unit embeddings
    seconds: np.ndarray  # (n,) speech seconds
    reference: np.ndarray | None


@dataclass
class Instance:
    dialogue_id: str
    condition: str
    scenario: Scenario
    gold: frozenset[int]
    n_turns: int
    views: dict[str, Turns] = field(default_factory=dict)
    target: str = ""
    intruder: str = ""
    # The clips of the turns (in dialogue order) and of the reference, relative to the data folder: what pitch
    # matching looks up the clips' pitches and moved copies by.
    paths: tuple[str, ...] = ()
    reference_path: str = ""
    # Band matching: the octaves of bandwidth the usable turns and the reference span (0: not measured), and
    # the views of the clips' narrowband copies (empty when they were not embedded).
    band_octaves: float = 0.0
    narrow_views: dict[str, Turns] = field(default_factory=dict)
    # Clip matching: the least and most clipped plateau fractions of the usable turns and the reference (None: not
    # measured), and the views of the clips' copies clipped to the most-clipped one's (as the server rounds it),
    # full band (False) and low-passed too (True), where they were embedded.
    plateaus: tuple[float, float] | None = None
    clip_views: dict[bool, dict[str, Turns]] = field(default_factory=dict)
    # Noise matching: the noisiest and cleanest SNR of the usable turns and the reference (dB) and the noisiest
    # piece's path (None: not measured), and the views of the copies with its noise added, where embedded.
    noise: tuple[float, float, str] | None = None
    noise_views: dict[str, Turns] = field(default_factory=dict)
    # Noise matching on top of band or clip matching: the views of the copies low-passed (first key) and/or clipped
    # (second key) with the noisiest piece's noise added too, where embedded.
    composed_views: dict[tuple[bool, bool], dict[str, Turns]] = field(default_factory=dict)
    # Telephone-band matching: the lowest and highest low band level (dB) of the usable turns and the reference (None:
    # not measured), and the views of the copies band-passed at the telephone band, clipped (first key) and with the
    # noise added (second key) too, where embedded.
    low_band: tuple[float, float] | None = None
    telephone_views: dict[tuple[bool, bool], dict[str, Turns]] = field(default_factory=dict)
    # Which measures some clip of the instance lacks (a cache measured for the other split only): judging with
    # that kind of matching on then raises instead of silently judging as unmatched.
    unmeasured: frozenset[str] = frozenset()

    @property
    def refused(self) -> bool:
        """Whether the server refuses this instance's CheckDialogue: its reference clip is unusable for the fused
        encoder (too little speech for either encoder), which the server answers with INVALID_ARGUMENT
        ("reference of speaker ... is unusable", sleuthd.engine.judging) rather than a verdict: a replay scores no
        verdict for it."""
        return self.views[FUSED].reference is None

    def _standing_in(self, views: dict[str, Turns]) -> dict[str, Turns] | None:
        """The copies' views if they can stand in for the clips as sent (every usable turn usable, and the reference),
        as the server's pool of copies must (ChannelMatcher._complete), else None."""
        ok = np.array_equal(self.views[FUSED].index, views[FUSED].index) and views[FUSED].reference is not None
        return views if ok else None

    def _embedded(self, views: dict[str, Turns] | None, mixed: str, option: str = "--clipped") -> dict[str, Turns]:
        """The views of copies the instance is judged on (``mixed``: how its clips differ, and which copies), or
        LookupError saying which `robustness embed` makes them."""
        if not views:
            raise LookupError(
                f"{self.dialogue_id}/{self.scenario}: {mixed} are not embedded: run `sleuthd-bench robustness embed "
                f"{option}`"
            )
        return views

    # Whether the server would call the instance mixed (ChannelMatcher.matches), whatever copies were embedded.
    def band_mixed(self, octaves: float) -> bool:
        return 0 < octaves < self.band_octaves

    def clip_mixed(self, spread: float) -> bool:
        return self.plateaus is not None and 0 < spread < self.plateaus[1] - self.plateaus[0]

    def noise_mixed(self, db: float) -> bool:
        return self.noise is not None and 0 < db < self.noise[1] - self.noise[0]

    def noise_matched(self, db: float) -> dict[str, Turns] | None:
        """The views the server's noise matching at ``db`` judges this instance on (only asked when neither band
        nor clip matching applies), or None: its SNRs do not differ that much, or a copy lost a usable turn or the
        reference. Raises when they differ and the copies were never embedded."""
        if db > 0 and "snr" in self.unmeasured:
            raise LookupError(f"{self.dialogue_id}: clips without an SNR: {_MEASURE}")
        if not self.noise_mixed(db):
            return None
        assert self.noise is not None
        why = f"its clips differ in SNR ({self.noise[0]:.1f}-{self.noise[1]:.1f} dB), and their noisy copies"
        return self._standing_in(self._embedded(self.noise_views, why))

    def composed_matched(self, db: float, narrow: bool, clipped: bool) -> dict[str, Turns] | None:
        """The views the server judges a speaker matched by band (``narrow``) or clipping (``clipped``) on when its
        SNRs also differ by more than ``db`` (--noise-compose-db), or None: they do not, or a copy lost a usable turn
        or the reference (the server then falls back to its copies without the noise). Raises when they differ and
        the copies were never embedded."""
        if db > 0 and "snr" in self.unmeasured:
            raise LookupError(f"{self.dialogue_id}: clips without an SNR: {_MEASURE}")
        if not (narrow or clipped) or not self.noise_mixed(db):
            return None
        why = "its clips differ in SNR and in band or clipping, and their composed copies"
        return self._standing_in(self._embedded(self.composed_views.get((narrow, clipped)), why))

    def composed_copy_keys(
        self, turns: Sequence[str], reference: str, narrow: bool, clipped: bool
    ) -> dict[str, str] | None:
        """Each clip's composed copy key (embed.composed_key), or None when the SNRs were not measured."""
        from sleuthd.api import copy_snr

        if self.noise is None:
            return None
        plateau = self.clip_target() if clipped else None
        snr = copy_snr(self.noise[0])
        return {p: composed_key(p, narrow, plateau, snr, self.noise[2]) for p in (*turns, reference)}

    def telephone_mixed(self, db: float) -> bool:
        """A telephone clip (low band level below ``db``, the server's --telephone-band-db) among clips above it.
        Raises when some clip's level was not measured (a cache from before it was)."""
        if db < 0 and "low_band" in self.unmeasured:
            raise LookupError(f"{self.dialogue_id}: clips without a low band level: {_MEASURE}")
        return self.low_band is not None and db < 0 and self.low_band[0] < db <= self.low_band[1]

    def telephone_matched(self, clipped: bool, noisy: bool) -> dict[str, Turns] | None:
        """The views of the copies band-passed at the telephone band (clipped, with the noise added, as asked), or
        None when a copy lost a usable turn or the reference. Raises when they were never embedded."""
        why = "it has a telephone clip among clips that kept their low band, and its telephone-band copies"
        return self._standing_in(self._embedded(self.telephone_views.get((clipped, noisy)), why))

    def telephone_copy_keys(self, turns: Sequence[str], reference: str, clipped: bool, noisy: bool) -> dict[str, str]:
        """Each clip's telephone-band copy key (embed.telephone_key)."""
        from sleuthd.api import copy_snr

        plateau = self.clip_target() if clipped else None
        snr, noisiest = (copy_snr(self.noise[0]), self.noise[2]) if noisy and self.noise is not None else (None, "")
        return {p: telephone_key(p, plateau, snr, noisiest) for p in (*turns, reference)}

    def noise_copy_keys(self, turns: Sequence[str], reference: str) -> dict[str, str] | None:
        """Each clip's noisy copy key (embed.noise_key), or None when the SNRs were not measured."""
        from sleuthd.api import copy_snr

        if self.noise is None:
            return None
        return {p: noise_key(p, copy_snr(self.noise[0]), self.noise[2]) for p in (*turns, reference)}

    def clip_matched(self, spread: float, narrow: bool) -> dict[str, Turns] | None:
        """The views the server's clip matching at ``spread`` judges this instance on (``narrow``: it is also
        band-mixed, so its copies are low-passed too), or None: it is not mixed, or a copy lost a usable turn or
        the reference (the server then judges it on its narrowband copies, or as sent). Raises when it is mixed
        and its copies were never embedded."""
        if spread > 0 and "plateau" in self.unmeasured:
            raise LookupError(f"{self.dialogue_id}: clips without a plateau fraction: {_MEASURE}")
        if not self.clip_mixed(spread):
            return None
        assert self.plateaus is not None
        why = f"its clips differ in clipping ({self.plateaus[0]:.4f}-{self.plateaus[1]:.4f}), and their clipped copies"
        return self._standing_in(self._embedded(self.clip_views.get(narrow), why))

    def clip_target(self) -> float | None:
        """The plateau fraction its copies are clipped to when clip-matched (the server's rounding)."""
        from sleuthd.api import copy_target

        return None if self.plateaus is None else copy_target(self.plateaus[1])

    def band_matched(self, octaves: float) -> bool:
        """Whether the server's band matching at ``octaves`` judges this instance on its narrowband copies: it
        is mixed, and the copies keep every usable turn and the reference usable (else the server judges the
        clips as sent). Raises when it is mixed and the copies were never embedded."""
        if not self.band_mixed(octaves):
            return False
        why = f"its clips span {self.band_octaves:.2f} octave of bandwidth, and their narrowband copies"
        return self._standing_in(self._embedded(self.narrow_views, why, "--narrowband")) is not None


def _view(emb: Sequence[np.ndarray | None], seconds: Sequence[float], ref: np.ndarray | None, dim: int) -> Turns:
    keep = [k for k, e in enumerate(emb) if e is not None]
    rows = [np.asarray(emb[k], np.float32) for k in keep]
    mat = np.stack(rows) if rows else np.zeros((0, dim), np.float32)
    return Turns(np.array(keep, int), mat, np.array([seconds[k] for k in keep], np.float64), ref)


def load_instances(
    root: Path,
    split: str,
    conditions: Sequence[str],
    embs: Mapping[str, Embeddings],
    bandwidths: Mapping[str, float] | None = None,
    narrow: Mapping[str, Embeddings] | None = None,
    plateaus: Mapping[str, float] | None = None,
    clipped: Mapping[str, Embeddings] | None = None,
    snrs: Mapping[str, float] | None = None,
    low_bands: Mapping[str, float] | None = None,
) -> list[Instance]:
    """Every instance of the split's manifests ``root/<split>-<condition>.jsonl``. ``bandwidths`` (clip ->
    Hz) and ``narrow`` (the narrowband copies' embeddings) give each instance what band matching reads;
    ``plateaus`` (clip -> plateau fraction) and ``clipped`` (the clipped copies' embeddings, by copy_key) what
    clip matching reads; ``snrs`` (clip -> SNR dB; the noisy copies are among ``clipped``) what noise matching
    reads."""
    out = []
    for cond in conditions:
        path = root / f"{split}-{cond}.jsonl"
        metas = [json.loads(line).get("meta") or {} for line in path.read_text().splitlines()]
        for line, meta in zip(read_manifest(path), metas, strict=True):
            ref_rel = line.reference
            for scenario in SCENARIOS:
                turns = scenario_turns(line, scenario)
                inst = Instance(
                    line.dialogue_id,
                    cond,
                    scenario,
                    gold_turns(line, scenario),
                    len(turns),
                    target=line.target_speaker,
                    intruder={"S1": "", "S2": meta.get("s2_speaker", ""), "S3": meta.get("s3_speaker", "")}[scenario],
                    paths=tuple(turns),
                    reference_path=ref_rel,
                )
                inst.views = _views(turns, ref_rel, embs)
                if bandwidths:
                    # The server's rule (BandMatcher.matches): the usable turns' bandwidths and the reference's.
                    usable = [turns[k] for k in inst.views[FUSED].index]
                    hz = [bandwidths[p] for p in (*usable, ref_rel) if np.isfinite(bandwidths[p]) and bandwidths[p] > 0]
                    inst.band_octaves = float(np.log2(max(hz) / min(hz))) if len(hz) >= 2 else 0.0
                if narrow and all(p in narrow[e].index for e in ENCODERS for p in (*turns, ref_rel)):
                    inst.narrow_views = _views(turns, ref_rel, narrow)
                if plateaus:
                    # The server's rule (ChannelMatcher.matches): the usable turns' plateau fractions and the
                    # reference's (measured even where it is unusable).
                    usable = [turns[k] for k in inst.views[FUSED].index]
                    if any(p not in plateaus for p in (*usable, ref_rel)):
                        inst.unmeasured |= {"plateau"}
                    share = [v for p in (*usable, ref_rel) if np.isfinite(v := plateaus.get(p, np.nan))]
                    inst.plateaus = (min(share), max(share)) if len(share) >= 2 else None
                if snrs:
                    # The server's rule (ChannelMatcher._noise): the usable turns in dialogue order, then the
                    # reference; the noisiest is the first of the lowest SNR.
                    usable = [turns[k] for k in inst.views[FUSED].index]
                    if any(p not in snrs for p in (*usable, ref_rel)):
                        inst.unmeasured |= {"snr"}
                    pieces = [(v, p) for p in (*usable, ref_rel) if np.isfinite(v := snrs.get(p, np.nan))]
                    if len(pieces) >= 2:
                        low = min(v for v, _ in pieces)
                        noisiest = next(p for v, p in pieces if v == low)
                        inst.noise = (low, max(v for v, _ in pieces), noisiest)
                        found = _copy_views(turns, ref_rel, inst.noise_copy_keys(turns, ref_rel), clipped)
                        inst.noise_views = found or {}
                        for kind in ((True, False), (False, True), (True, True)):
                            if kind[1] and inst.clip_target() is None:
                                continue
                            found = _copy_views(turns, ref_rel, inst.composed_copy_keys(turns, ref_rel, *kind), clipped)
                            if found is not None:
                                inst.composed_views[kind] = found
                if low_bands:
                    usable = [turns[k] for k in inst.views[FUSED].index]
                    if any(p not in low_bands for p in (*usable, ref_rel)):
                        inst.unmeasured |= {"low_band"}
                    levels = [v for p in (*usable, ref_rel) if np.isfinite(v := low_bands.get(p, np.nan))]
                    inst.low_band = (min(levels), max(levels)) if levels else None
                    if inst.low_band is not None:
                        for kind in ((False, False), (True, False), (False, True), (True, True)):
                            if (kind[0] and inst.clip_target() is None) or (kind[1] and inst.noise is None):
                                continue
                            keys = inst.telephone_copy_keys(turns, ref_rel, *kind)
                            if (found := _copy_views(turns, ref_rel, keys, clipped)) is not None:
                                inst.telephone_views[kind] = found
                target = inst.clip_target()
                if target is not None:
                    for band in (False, True):
                        keys = {p: copy_key(p, band, target) for p in (*turns, ref_rel)}
                        if (found := _copy_views(turns, ref_rel, keys, clipped)) is not None:
                            inst.clip_views[band] = found
                out.append(inst)
    return out


def _copy_views(
    turns: Sequence[str],
    reference: str,
    keys: Mapping[str, str] | None,
    copies: Mapping[str, Embeddings] | None,
) -> dict[str, Turns] | None:
    """The views of the clips' copies (``keys``: clip -> its copy's cache key) where every encoder embedded every one
    of them, else None."""
    if not copies or not keys or not all(k in copies[e].index for e in ENCODERS for k in keys.values()):
        return None
    return _views([keys[p] for p in turns], keys[reference], copies)


def telephone_kinds(clipped: bool, noisy: bool) -> list[tuple[bool, bool]]:
    """The telephone-band copies (clipped, noisy) a telephone-matched instance is judged on, then those it falls back
    to, in the server's order (sleuthd.judgment.channel_matching.ChannelMatch.fallbacks): without the noise, then
    unclipped too."""
    return list(dict.fromkeys([(clipped, noisy), (clipped, False), (False, False)]))


def _views(turns: Sequence[str], reference: str, embs: Mapping[str, Embeddings]) -> dict[str, Turns]:
    """Each encoder's and the fused view of these clips."""
    views = {}
    parts, seconds, refs = {}, {}, {}
    for enc in ENCODERS:
        got = [embs[enc].get(p) for p in turns]
        parts[enc], seconds[enc] = [g[0] for g in got], [g[1] for g in got]
        refs[enc] = embs[enc].get(reference)[0]
        views[enc] = _view(parts[enc], seconds[enc], refs[enc], embs[enc].vectors.shape[1])
    joined = [fused([parts[e][k] for e in ENCODERS]) for k in range(len(turns))]
    dim = sum(embs[e].vectors.shape[1] for e in ENCODERS)
    views[FUSED] = _view(joined, seconds[ENCODERS[0]], fused([refs[e] for e in ENCODERS]), dim)
    return views

"""Kokoro voices for the dev benchmark: the five voice packs, blends of them and their fit/transfer split.

A voice is a pack or a linear blend of two packs' style vectors, with integer percent weights that
are recorded for every clip, so every turn's true speaker is known. Blends of two packs are new
speakers, and blends a few percent apart are near-identical ones: the hard "similar speaker" a TTS
system produces when it picks a neighbouring voice. Only ``jm_kumo`` is male: a voice is male when
kumo carries at least :data:`MIN_MALE_PERCENT` of it and female when it has no kumo at all (in
between, pitch is ambiguous; see :func:`voice_gender`).

The voice design (:func:`design_voices`) splits the voices into ``fit`` and ``transfer`` so that the
transfer voices' base pairs never occur in fit and every transfer voice lies at least
:data:`MIN_UNSEEN_DISTANCE` (weight distance, :func:`weight_distance`) from every fit voice;
:func:`near_intruder` is the near-S3 rule. Pure data: synthesis is in :mod:`sleuthd_bench.kokoro`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DESIGNS",
    "MALE_PACK",
    "MIN_MALE_PERCENT",
    "MIN_UNSEEN_DISTANCE",
    "NEAR_MAX_DISTANCE",
    "PACKS",
    "SPLITS",
    "BlendFamily",
    "KokoroError",
    "KokoroVoice",
    "VoiceDesign",
    "blend",
    "check_splits",
    "design_voices",
    "near_intruder",
    "read_weights",
    "voice_gender",
    "weight_distance",
]

PACKS = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
MALE_PACK = "jm_kumo"
# Short names used in voice names: kokoro-alpha71-gong29.
PACK_TAGS: Mapping[str, str] = {
    "jf_alpha": "alpha",
    "jf_gongitsune": "gong",
    "jf_nezumi": "nezu",
    "jf_tebukuro": "tebu",
    "jm_kumo": "kumo",
}
# Male voices need kumo to dominate: the median F0 of a kumo/female blend falls gradually with kumo's
# weight (measured on one sentence: kumo 102 Hz, alpha 261 Hz; kumo 70 % with tebukuro, the
# highest-pitched pack, 147 Hz; at 60 % 156-175 Hz, at 50 % 154-202 Hz). At 72 % and above every
# blend is clearly male; female voices have no kumo at all.
MIN_MALE_PERCENT = 72
# Every transfer voice is at least this far (weight distance) from every fit voice.
MIN_UNSEEN_DISTANCE = 0.15
# The near-S3 intruder lies at most this far from the target (the designs give 0.06-0.23).
NEAR_MAX_DISTANCE = 0.25
SPLITS = ("fit", "transfer")


class KokoroError(RuntimeError):
    """The Kokoro voices or engine cannot do what was asked; the message says what to fix."""


# --------------------------------------------------------------------------------------------
# Voices
# --------------------------------------------------------------------------------------------


def voice_gender(weights: Mapping[str, int]) -> str:
    """``"M"`` when kumo has at least :data:`MIN_MALE_PERCENT`, ``"F"`` when it has none.

    Raises :class:`KokoroError` in between, where the blend's pitch is ambiguous.
    """
    kumo = weights.get(MALE_PACK, 0)
    if kumo >= MIN_MALE_PERCENT:
        return "M"
    if kumo == 0:
        return "F"
    raise KokoroError(
        f"a blend with {kumo} % {MALE_PACK} has no clear gender: use at least {MIN_MALE_PERCENT} % (male) or none"
    )


@dataclass(frozen=True)
class KokoroVoice:
    """One speaker: a voice pack or a blend of packs, with integer percent weights summing to 100.

    ``weights`` is sorted by pack name; ``split`` is ``"fit"`` or ``"transfer"``; ``gender`` follows
    from the weights (:func:`voice_gender`).
    """

    name: str
    split: str
    weights: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        packs = [p for p, _ in self.weights]
        if any(p not in PACKS for p in packs) or len(set(packs)) != len(packs):
            raise KokoroError(f"voice {self.name}: packs must be distinct names from {', '.join(PACKS)}: {packs}")
        if list(self.weights) != sorted(self.weights) or any(w <= 0 for _, w in self.weights):
            raise KokoroError(f"voice {self.name}: weights must be positive and sorted by pack: {self.weights}")
        if sum(w for _, w in self.weights) != 100:
            raise KokoroError(f"voice {self.name}: weights must sum to 100 %, not {sum(w for _, w in self.weights)}")
        if self.split not in SPLITS:
            raise KokoroError(f"voice {self.name}: split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        voice_gender(dict(self.weights))

    @property
    def gender(self) -> str:
        return voice_gender(dict(self.weights))

    @property
    def fractions(self) -> dict[str, float]:
        """Weights as fractions of 1, e.g. ``{"jf_alpha": 0.71, "jf_gongitsune": 0.29}``."""
        return {p: w / 100 for p, w in self.weights}

    @property
    def base_pair(self) -> tuple[str, ...]:
        """The packs blended (one pack for a pure voice), sorted."""
        return tuple(p for p, _ in self.weights)

    def weights_text(self) -> str:
        """The CSV form: ``jf_alpha:0.71;jf_gongitsune:0.29``."""
        return ";".join(f"{p}:{w / 100:.2f}" for p, w in self.weights)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "split": self.split, "gender": self.gender, "weights": self.fractions}


def blend(name: str, split: str, percents: Mapping[str, int]) -> KokoroVoice:
    """A voice from ``{pack: percent}`` (zero weights dropped)."""
    return KokoroVoice(name, split, tuple(sorted((p, w) for p, w in percents.items() if w)))


def weight_distance(a: KokoroVoice, b: KokoroVoice) -> float:
    """Total-variation distance of two voices' weights: 0 (same blend) to 1 (no pack in common).

    A 90/10 blend is 0.1 from its main pack; blends of disjoint pairs are 1 apart.
    """
    wa, wb = dict(a.weights), dict(b.weights)
    return sum(abs(wa.get(p, 0) - wb.get(p, 0)) for p in PACKS) / 200


@dataclass(frozen=True)
class BlendFamily:
    """Blends of two packs along one line: ``first`` gets ``positions`` percent (each moved by a
    seeded integer offset of at most ``jitter``), ``second`` the rest."""

    first: str
    second: str
    split: str
    positions: tuple[int, ...]
    jitter: int = 2


@dataclass(frozen=True)
class VoiceDesign:
    """Which voices a dev-set size has: pure packs (all in fit) and blend families per split."""

    pure: tuple[str, ...]
    families: tuple[BlendFamily, ...]


_FIT, _TRANSFER = "fit", "transfer"
# The six pairs of female packs and the four kumo/female pairs are dealt so that each split has
# every female pack in some pair: fit gets alpha+gong, alpha+tebu, nezu+tebu, kumo+alpha, kumo+nezu;
# transfer the rest. Positions are spaced so that every voice has a same-gender neighbour 0.08-0.24
# away (the near-S3 rule) and every transfer voice is >= 0.16 from every fit voice.
_FIT_FEMALE = (90, 70, 50, 30, 10)
_TRANSFER_FEMALE = (80, 60, 40, 20)
_FIT_MALE = (93, 85, 77)
_TRANSFER_MALE = (82, 74)
DESIGNS: dict[str, VoiceDesign] = {
    "large": VoiceDesign(
        pure=PACKS,
        families=(
            BlendFamily("jf_alpha", "jf_gongitsune", _FIT, _FIT_FEMALE),
            BlendFamily("jf_alpha", "jf_tebukuro", _FIT, _FIT_FEMALE),
            BlendFamily("jf_nezumi", "jf_tebukuro", _FIT, _FIT_FEMALE),
            BlendFamily("jm_kumo", "jf_alpha", _FIT, _FIT_MALE),
            BlendFamily("jm_kumo", "jf_nezumi", _FIT, _FIT_MALE),
            BlendFamily("jf_alpha", "jf_nezumi", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jf_gongitsune", "jf_nezumi", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jf_gongitsune", "jf_tebukuro", _TRANSFER, _TRANSFER_FEMALE),
            BlendFamily("jm_kumo", "jf_gongitsune", _TRANSFER, _TRANSFER_MALE),
            BlendFamily("jm_kumo", "jf_tebukuro", _TRANSFER, _TRANSFER_MALE),
        ),
    ),
    # 6 + 6 voices (4 F, 2 M each), every one with a near neighbour: a quick look, not a benchmark.
    "small": VoiceDesign(
        pure=("jf_alpha", "jf_gongitsune", "jm_kumo"),
        families=(
            BlendFamily("jf_alpha", "jf_gongitsune", _FIT, (90, 15)),
            BlendFamily("jm_kumo", "jf_alpha", _FIT, (90,)),
            BlendFamily("jf_alpha", "jf_nezumi", _TRANSFER, (80, 65)),
            BlendFamily("jf_gongitsune", "jf_tebukuro", _TRANSFER, (60, 45)),
            BlendFamily("jm_kumo", "jf_tebukuro", _TRANSFER, (82, 74)),
        ),
    ),
}


def _voice_name(percents: Mapping[str, int], order: Sequence[str]) -> str:
    used = [p for p in order if percents.get(p)]
    if len(used) == 1:
        return f"kokoro-{PACK_TAGS[used[0]]}"
    return "kokoro-" + "-".join(f"{PACK_TAGS[p]}{percents[p]:02d}" for p in used)


def design_voices(design: VoiceDesign, seed: int) -> list[KokoroVoice]:
    """The voices of ``design``: pure packs (fit) first, then each family's blends in order.

    Blend weights are the family's positions moved by an integer offset drawn from
    ``Random(f"{seed}:{first}:{second}")``, so a seed fixes every voice. Raises :class:`KokoroError`
    if two voices coincide or the splits break the rules of :func:`check_splits`.
    """
    voices = [blend(f"kokoro-{PACK_TAGS[p]}", _FIT, {p: 100}) for p in design.pure]
    for family in design.families:
        rng = random.Random(f"{seed}:{family.first}:{family.second}")
        for position in family.positions:
            first = position + rng.randint(-family.jitter, family.jitter)
            if not 0 < first < 100:
                raise KokoroError(f"family {family.first}+{family.second}: position {position} jitters to {first} %")
            percents = {family.first: first, family.second: 100 - first}
            voices.append(blend(_voice_name(percents, (family.first, family.second)), family.split, percents))
    names = [v.name for v in voices]
    if len(set(names)) != len(names):
        raise KokoroError(f"the design names two voices alike: {sorted(n for n in names if names.count(n) > 1)}")
    check_splits(voices)
    return voices


def check_splits(voices: Sequence[KokoroVoice], min_distance: float = MIN_UNSEEN_DISTANCE) -> None:
    """Raise :class:`KokoroError` unless the transfer voices are unseen by fit.

    Unseen: no transfer voice's base pair (or pack) is a fit voice's, and every transfer voice is at
    least ``min_distance`` from every fit voice by :func:`weight_distance`.
    """
    fit = [v for v in voices if v.split == _FIT]
    transfer = [v for v in voices if v.split == _TRANSFER]
    shared = {v.base_pair for v in fit} & {v.base_pair for v in transfer}
    if shared:
        raise KokoroError(f"fit and transfer share base packs {sorted(shared)}")
    for t in transfer:
        nearest = min(fit, key=lambda f: weight_distance(t, f), default=None)
        if nearest is not None and weight_distance(t, nearest) < min_distance:
            raise KokoroError(
                f"transfer voice {t.name} is {weight_distance(t, nearest):.2f} from fit voice {nearest.name} "
                f"(at least {min_distance:g} required)"
            )


def near_intruder(target: KokoroVoice, voices: Sequence[KokoroVoice], max_distance: float) -> KokoroVoice:
    """The near-S3 intruder: the same-gender voice nearest to ``target`` by weight distance.

    Candidates are ``voices`` other than the target with its gender; ties go to the first name. Raises
    :class:`KokoroError` when none lies within ``max_distance``.
    """
    same = sorted((v for v in voices if v.name != target.name and v.gender == target.gender), key=lambda v: v.name)
    best = min(same, key=lambda v: weight_distance(target, v), default=None)
    if best is None or weight_distance(target, best) > max_distance:
        found = "none" if best is None else f"the nearest, {best.name}, is {weight_distance(target, best):.2f} away"
        raise KokoroError(
            f"no {target.gender} voice within {max_distance:g} of {target.name} for the near-S3 rule ({found})"
        )
    return best


def read_weights(text: str) -> dict[str, float]:
    """Parse the CSV ``weights`` column (``jf_alpha:0.71;jf_gongitsune:0.29``)."""
    out: dict[str, float] = {}
    for part in text.split(";"):
        pack, sep, value = part.partition(":")
        if not sep or pack not in PACKS:
            raise KokoroError(f"bad weights {text!r}: expected pack:fraction pairs separated by ';'")
        out[pack] = float(value)
    return out

"""How clipped a clip is, and a hard clip that brings clips of one speaker to a common amount of clipping.

Why: a turn that was clipped (rendered too loud, or clipped by a channel) sounds to both speaker encoders like
another voice. In the robustness matrix the turn flagged in a consistent speaker under clipping was that
speaker's most-clipped turn in 26 of 28 cases (d-clip) and 17 of 17 (d-loud). Judging such a speaker on copies
of every clip clipped as hard as its most-clipped one lifted d-clip's balanced accuracy from 80.9 to 91.4
(docs/research/robustness.md, "Screen 4"): the analogue of band matching (sleuthd.audio.bandwidth).

The measure is the clip's *plateau fraction*: the share of its samples within 1 % of its peak magnitude. A clean
clip's peak is one sample or a few (fraction ~0); a clipped one sits on its ceiling for the clipped share.
"""

from __future__ import annotations

import numpy as np

# A sample counts as on the plateau at this share of the clip's peak magnitude or above (within 1 %).
PLATEAU_LEVEL = 0.99
# Copies are clipped to a plateau fraction rounded to this many decimals (so that near-equal targets make the
# same copies, which the embedding cache then shares).
PLATEAU_DECIMALS = 4


def plateau_fraction(samples: np.ndarray) -> float | None:
    """The share of the clip's samples within 1 % of its peak magnitude (0-1), or None for an empty or silent
    clip."""
    x = np.abs(np.asarray(samples, np.float32))
    if not x.size:
        return None
    peak = float(x.max())
    if not peak > 0:
        return None
    return float(np.count_nonzero(x >= PLATEAU_LEVEL * peak) / x.size)


def copy_target(fraction: float) -> float:
    """The plateau fraction copies are clipped to for a speaker whose most-clipped piece has ``fraction``."""
    return round(fraction, PLATEAU_DECIMALS)


def clip_to_plateau(samples: np.ndarray, fraction: float) -> np.ndarray:
    """A copy hard-clipped at the magnitude that ``fraction`` of its samples reach, so that about that share of
    it sits on the plateau (a clip already clipped harder is left as it is, up to its own ceiling)."""
    x = np.asarray(samples, np.float32)
    if not fraction > 0 or not x.size:
        return x.copy()
    ceiling = float(np.quantile(np.abs(x), 1 - min(fraction, 1.0)))
    return np.clip(x, -ceiling, ceiling) if ceiling > 0 else x.copy()

"""Calibrating the judge's answer probabilities, per model weights and prompt version.

The SpeakerSleuth paper finds LALM judges badly calibrated in both directions (some flag nearly
everything, some nearly nothing). We read the answer tokens' probabilities instead of a one-word answer
and map them through a calibration fitted on dev data:

- detection: Platt scaling, ``P = sigmoid(a · logit(p_raw) + b)``;
- discrimination: temperature scaling of the options' log-probabilities, ``softmax(log p / T)`` (the
  ranking is unchanged; only how sure it claims to be).

A calibration holds only for the weights and the prompt wording it was fitted on. The file is a JSON
object ``{"calibrations": {"<weights sha256>": entry, …}}``; :func:`select` returns the entry for the
judge's weights and refuses one fitted for other weights or another prompt version. Fitting uses dev
data only (never the split a report is measured on); the tools call :func:`fit_platt` and
:func:`fit_temperature` and write entries with :func:`save_entry`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sleuthd.config import ConfigError

logger = logging.getLogger(__name__)

# Weight files hashed for a model folder, in name order; config and tokenizer files are not weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_EPS = 1e-6


@dataclass(frozen=True)
class Platt:
    """P(different) = sigmoid(a · logit(raw) + b), fitted on ``instances`` dev prompts. ``kind`` is
    "platt" (a and b fitted) or "temperature" (b fixed at 0, a = 1/T), whichever cross-validated better."""

    a: float
    b: float
    instances: int
    kind: str = "platt"

    def apply(self, raw: float) -> float:
        p = min(max(raw, _EPS), 1 - _EPS)
        z = self.a * math.log(p / (1 - p)) + self.b
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True)
class Temperature:
    """Option probabilities ∝ p_raw^(1/T), fitted on ``instances`` dev rankings."""

    temperature: float
    instances: int

    def apply(self, shares: np.ndarray) -> np.ndarray:
        z = np.log(np.clip(shares, 1e-12, 1.0)) / self.temperature
        e = np.exp(z - z.max())
        out: np.ndarray = e / e.sum()
        return out


@dataclass(frozen=True)
class JudgeCalibration:
    """One model's calibration entry. Either task may be missing (that task stays uncalibrated)."""

    weights_sha256: str
    model_name: str
    prompt_version: str
    detection: Platt | None = None
    discrimination: Temperature | None = None
    fitted_on: str = ""  # which dev data, in words
    # The answer mass (0-1) below which a detection turn is UNCERTAIN with this calibration: the dev turns'
    # low tail, where the fit has seen too little to vouch for a probability. None: the server's default.
    min_answer_mass: float | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, object], where: str) -> JudgeCalibration:
        try:
            det = d.get("detection")
            dis = d.get("discrimination")
            return cls(
                weights_sha256=str(d["weights_sha256"]),
                model_name=str(d.get("model_name", "")),
                prompt_version=str(d["prompt_version"]),
                detection=Platt(**det) if isinstance(det, dict) else None,
                discrimination=Temperature(**dis) if isinstance(dis, dict) else None,
                fitted_on=str(d.get("fitted_on", "")),
                min_answer_mass=_optional_float(d.get("min_answer_mass")),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{where}: malformed judge calibration entry ({exc})") from exc


def _optional_float(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise TypeError(f"min_answer_mass must be a probability (0-1) or null, got {value!r}")
    return float(value)


def weights_sha256(folder: Path) -> str:
    """SHA-256 over a model folder's weight files (names and bytes, in name order).

    Reads every weight byte once (about a second per GB), so a calibration can never attach to a
    fine-tune or a re-quantisation that happens to share a name.
    """
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise ConfigError(f"{folder}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to hash")
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(8 << 20):
                h.update(block)
    return h.hexdigest()


def load_entries(path: Path) -> dict[str, JudgeCalibration]:
    """All entries of a calibration file, keyed by weights hash."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"judge calibration file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"judge calibration file {path} is not JSON: {exc}") from exc
    entries = doc.get("calibrations") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        raise ConfigError(f'{path}: expected {{"calibrations": {{"<weights sha256>": {{…}}}}}}')
    out = {}
    for key, value in entries.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: entry {key} is not an object")
        entry = JudgeCalibration.from_json(value, f"{path} [{key}]")
        if entry.weights_sha256 != key:
            raise ConfigError(f"{path}: entry {key} says weights_sha256 {entry.weights_sha256}; the key must match")
        out[key] = entry
    return out


def select(path: Path, weights: str, prompt_version: str) -> JudgeCalibration:
    """The calibration for these weights and prompt wording; refuses anything else with the reason."""
    if not weights:
        raise ConfigError(
            f"a judge calibration ({path}) needs the judge's weights hash; for a remote judge pass "
            "--judge-weights-sha256 (the hash of the folder the endpoint serves)"
        )
    entries = load_entries(path)
    entry = entries.get(weights)
    if entry is None:
        known = ", ".join(f"{k[:12]}… ({e.model_name})" for k, e in entries.items()) or "none"
        raise ConfigError(
            f"{path} has no calibration for weights {weights[:12]}…; it has: {known}. A calibration fitted "
            "for other weights is never used: fit one for this model on dev data, or run uncalibrated"
        )
    if entry.prompt_version != prompt_version:
        raise ConfigError(
            f"{path}: the calibration for weights {weights[:12]}… was fitted with prompt version "
            f"{entry.prompt_version}; this server asks prompt version {prompt_version}: refit it"
        )
    return entry


def save_entry(path: Path, entry: JudgeCalibration) -> None:
    """Add or replace ``entry`` in the calibration file (created when missing)."""
    path = Path(path)
    doc: dict[str, dict[str, object]] = {"calibrations": {}}
    if path.exists():
        doc["calibrations"] = {k: v.to_json() for k, v in load_entries(path).items()}
    doc["calibrations"][entry.weights_sha256] = entry.to_json()
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def fit_platt(raw: Sequence[float], different: Sequence[bool], l2: float = 1e-3, with_bias: bool = True) -> Platt:
    """Fit ``a, b`` by regularised logistic regression of the labels on logit(raw) (Newton's method).

    ``raw``: the judge's raw P(different) per dev prompt; ``different``: whether that turn really was
    another speaker. Needs both labels present. ``with_bias=False`` fits temperature scaling (b = 0).
    """
    p = np.clip(np.asarray(raw, np.float64), _EPS, 1 - _EPS)
    y = np.asarray(different, np.float64)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"raw and different must be equal-length 1-D sequences, got {p.shape} and {y.shape}")
    if not (0 < y.sum() < len(y)):
        raise ValueError("fit_platt needs dev prompts of both kinds (same speaker and different speaker)")
    x = np.stack([np.log(p / (1 - p)), np.ones_like(p)], axis=1)[:, : 2 if with_bias else 1]
    w = np.array([1.0, 0.0])[: x.shape[1]]
    reg = np.diag([l2, 0.0])[: x.shape[1], : x.shape[1]] * len(y)
    for _ in range(100):
        z = np.clip(x @ w, -500, 500)
        q = 1.0 / (1.0 + np.exp(-z))
        grad = x.T @ (q - y) + reg @ w
        hess = x.T @ (x * (q * (1 - q))[:, None]) + reg + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    if with_bias:
        return Platt(float(w[0]), float(w[1]), len(y))
    return Platt(float(w[0]), 0.0, len(y), kind="temperature")


def fit_temperature(shares: Sequence[Sequence[float]], correct: Sequence[int]) -> Temperature:
    """Fit T minimising the dev rankings' negative log-likelihood of the correct candidate.

    ``shares[i]``: the judge's raw option probabilities for dev ranking ``i``; ``correct[i]``: the index of
    the candidate that really is the speaker. A 1-D search over log T in [-4, 4] (golden section).
    """
    if len(shares) != len(correct) or not shares:
        raise ValueError("shares and correct must be non-empty and of equal length")
    width = max(len(s) for s in shares)
    logs = np.full((len(shares), width), -np.inf)  # rankings of fewer candidates padded with p = 0
    for i, s in enumerate(shares):
        logs[i, : len(s)] = np.log(np.clip(np.asarray(s, np.float64), 1e-12, 1.0))
    picked = logs[np.arange(len(shares)), np.asarray(correct)]

    def nll(log_t: float) -> float:
        z = logs / math.exp(log_t)
        top = z.max(axis=1)
        return float(np.sum(top + np.log(np.exp(z - top[:, None]).sum(axis=1)) - picked / math.exp(log_t)))

    lo, hi = -4.0, 4.0
    g = (math.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(80):
        if nll(c) < nll(d):
            hi = d
        else:
            lo = c
        c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    return Temperature(float(math.exp((lo + hi) / 2)), len(shares))

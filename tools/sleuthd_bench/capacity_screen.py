"""Is `auto`'s logistic model too simple? A screen on the FIT corpus only.

(docs/research/auto-fitting.md, "Model capacity")

Each of the 6 speaker folds of `calibrate cv` (repeat 0) fits on dialogues of the other voices and is
scored on benchmark-style dialogues of its held-out voices, as recorded and with every embedding
jittered (0.01-0.03 per dimension, the cv command's stand-in for less self-consistent voices):

- ``logistic``: the shipped model (IRLS, L2 3e-3, the calibration's features), 8000 training dialogues;
- ``logistic_32k``: the same on 32000 dialogues (is it short of data?);
- ``hinge``: the same features plus hinges max(0, x - knot) at their 50/80/95 % training quantiles
  (a generalised additive logistic model: one bend per feature, still one linear score);
- ``gbm``: gradient-boosted trees (scikit-learn, regularised) on the same features;
- ``gbm_platt``: the trees' log-odds recalibrated by a one-feature logistic fitted on out-of-fold
  scores of inner speaker folds (so it is calibrated for voices it was not fitted on).

Only the >= 3-turn variants (the benchmark's) change; the others stay logistic. Prints detection
S1 / S3 / Bal (%) at decision threshold 0.5 per test jitter, then, at jitter 0, the S3 each model
reaches at the threshold where its S1 first reaches that of the shipped model (matched false alarms).

Needs scikit-learn (installed with the ``export`` extra, through resemblyzer -> librosa); it is a
research script, not part of the service. About 30 minutes on 2 cores:

    .venv/bin/python -m sleuthd_bench.capacity_screen data/dev/large/corpus/synth/fit.csv
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import BASE_VARIANTS, FEATURES

from sleuthd_bench import calibrate as cal
from sleuthd_bench.calibrate_cv import TEST_JITTERS, fold_mean, held_out_folds
from sleuthd_bench.corpus import read_corpus

Predict = Callable[[np.ndarray], np.ndarray]
MODELS = ("logistic", "logistic_32k", "hinge", "gbm", "gbm_platt")
HINGE_QUANTILES = (0.5, 0.8, 0.95)
THRESHOLDS = np.round(np.arange(0.05, 0.96, 0.01), 2)


def gbm(x: np.ndarray, y: np.ndarray) -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(
        max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=100, l2_regularization=1.0, random_state=0
    ).fit(x, y)


def log_odds(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(p / (1 - p)))


def hinges(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    return np.hstack([x] + [np.maximum(0.0, x - k) for k in knots])


def fit_variant(name: str, variant: str, x: np.ndarray, y: np.ndarray, platt_scores: tuple | None) -> Predict:
    if not variant.startswith("context") or name.startswith("logistic"):
        return cal.fit_logistic(x, y, FEATURES[variant]).probability
    if name == "hinge":
        knots = np.quantile(x, HINGE_QUANTILES, axis=0)
        model = cal.fit_logistic(hinges(x, knots), y, [f"h{i}" for i in range(x.shape[1] * (1 + len(knots)))])
        return lambda f: model.probability(hinges(f, knots))
    trees = gbm(x, y)
    if name == "gbm":
        return lambda f: trees.predict_proba(f)[:, 1]
    assert platt_scores is not None
    platt = cal.fit_logistic(platt_scores[0][:, None], platt_scores[1], ["tree_log_odds"], l2=1e-4)
    return lambda f: platt.probability(log_odds(trees.predict_proba(f)[:, 1])[:, None])


def out_of_fold_tree_scores(train_clips: list[cal.Clip], seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Tree log-odds for turns of voices the trees were not fitted on (3 inner speaker folds)."""
    scores: dict[str, list[np.ndarray]] = {}
    labels: dict[str, list[np.ndarray]] = {}
    for inner in held_out_folds(train_clips, 3, 1, seed, lambda _: None):
        fitted = cal.make_instances(inner.train_clips, 6000, inner.draw_seed)
        scored = cal.make_instances(train_clips, 3000, inner.draw_seed + 5, targets=inner.held_out)
        for v in ("context_reference", "context"):
            trees = gbm(*cal.variant_turns(fitted, v))
            x, y = cal.variant_turns(scored, v)
            scores.setdefault(v, []).append(log_odds(trees.predict_proba(x)[:, 1]))
            labels.setdefault(v, []).append(y)
    return {v: (np.concatenate(scores[v]), np.concatenate(labels[v])) for v in scores}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="the fit corpus CSV (path,speaker,gender[,text])")
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    args = parser.parse_args()

    async def embed() -> list[cal.Clip]:
        encoder = SpeakerEncoder.load(args.models_dir)
        try:
            return await cal.embed_corpus(encoder, read_corpus(args.corpus), lambda done, total: None)
        finally:
            await encoder.aclose()

    clips = asyncio.run(embed())
    at_threshold: dict[tuple[str, float, float], list[dict[str, float]]] = {}
    for fold in held_out_folds(clips, 6, 1, 0, lambda m: print(m, file=sys.stderr, flush=True)):
        tests = {
            j: cal.make_instances(
                clips, 1200, fold.draw_seed, benchmark_like=True, jitter_levels=(j,), targets=fold.held_out
            )
            for j in TEST_JITTERS
        }
        train = cal.make_instances(fold.train_clips, 8000, fold.draw_seed)
        big = cal.make_instances(fold.train_clips, 32000, fold.draw_seed + 7)
        platt = out_of_fold_tree_scores(fold.train_clips, 99)
        for name in MODELS:
            data = big if name == "logistic_32k" else train
            predict = {v: fit_variant(name, v, *cal.variant_turns(data, v), platt.get(v)) for v in BASE_VARIANTS}
            for j, test in tests.items():
                probs = [predict[i.variant](i.features) for i in test]
                taus = THRESHOLDS if j == 0.0 else (0.5,)
                for tau in taus:
                    at_threshold.setdefault((name, j, float(tau)), []).append(
                        cal.dialogue_scores(test, probs, float(tau))
                    )
    mean = {key: fold_mean(v) for key, v in at_threshold.items()}
    print("model | " + " | ".join(f"jitter {j:g}: S1/S3/Bal" for j in TEST_JITTERS) + " | min S1 | mean Bal")
    for name in MODELS:
        cells = [mean[(name, j, 0.5)] for j in TEST_JITTERS]
        print(
            f"{name} | "
            + " | ".join(f"{m['S1']:.1f}/{m['S3']:.1f}/{m['bal']:.2f}" for m in cells)
            + f" | {min(m['S1'] for m in cells):.1f} | {np.mean([m['bal'] for m in cells]):.2f}"
        )
    target_s1 = mean[("logistic", 0.0, 0.5)]["S1"]
    print(f"\nat jitter 0, the lowest threshold where S1 >= {target_s1:.1f} (the shipped model's S1 at 0.5):")
    for name in MODELS:
        ok = [t for t in THRESHOLDS if mean[(name, 0.0, float(t))]["S1"] >= target_s1 - 1e-9]
        if not ok:
            print(f"{name}: never reaches it")
            continue
        m = mean[(name, 0.0, float(ok[0]))]
        print(f"{name}: threshold {ok[0]:.2f}  S1 {m['S1']:.1f}  S3 {m['S3']:.1f}  Bal {m['bal']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

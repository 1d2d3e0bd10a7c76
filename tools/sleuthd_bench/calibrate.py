"""`sleuthd-bench calibrate fit`: fit the `auto` method's logistic models on a speaker-labelled corpus.

Training instances are dialogues drawn from the corpus the way the SpeakerSleuth benchmark builds
them: a target speaker's turns (2 to 10), in a third of them one turn replaced by an opposite-gender
speaker (S2), in a third by one of the most similar same-gender speakers (S3), with a reference clip
from outside the turns half of the time. Every turn becomes a row (features from
sleuthd.judgment.calibration, label = replaced or not); one model is fitted per variant (what the request
offers: context size, reference). The decision threshold on the probability is
a fixed 0.5 (the Bayes decision for a calibrated probability); the threshold that tuning on the fit
corpus would pick is recorded beside it. Nothing here looks at the evaluation splits.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import FEATURES, VARIANTS, LogisticModel, turn_features

from sleuthd_bench.corpus import CorpusClip
from sleuthd_bench.metrics import SCENARIOS, DetectionRecord, Scenario, detection_metrics, localization_metrics
from sleuthd_bench.reliability import expected_calibration_error
from sleuthd_bench.turn_lengths import MIXED_SHORT_SHARE, TRAIN_SHORT_SHARE, short_crop

logger = logging.getLogger(__name__)

CALIBRATION_VERSION = 3  # 2: cohort variants; 3: reference_z, context_robust_z, farthest_gap
# Flag a turn when it is more likely foreign than not: the Bayes decision for a calibrated probability.
# Not tuned (fit_stats.decision_threshold_search records what tuning on the fit corpus would pick).
DECISION_THRESHOLD = 0.5
# The fitting settings below were chosen by `sleuthd-bench calibrate cv` on held-out voices of the fit corpus
# (runs/calibration/cv.md; docs/research/auto-fitting.md): the best mean balanced accuracy among the settings that kept
# consistent speakers unflagged in >= 99 % of dialogues at every test jitter. The penalty is per
# training turn (it scales with n), on standardised features.
L2_PENALTY = 3e-3
# The benchmark's 5 turns dominate; the others keep every variant trained (1 turn needs a reference).
TURN_COUNTS = (1, 2, 3, 4, 5, 5, 5, 5, 6, 8, 10)


@dataclass(frozen=True)
class Clip:
    speaker: str
    gender: str
    embedding: np.ndarray
    speech_seconds: float
    source: str = ""  # the corpus file (a short crop keeps the path of the clip it was cut from)


@dataclass(frozen=True)
class Instance:
    variant: str
    features: np.ndarray  # (n, k)
    labels: np.ndarray  # (n,) 1 = replaced turn
    n_turns: int
    scenario: Scenario
    # For a dialogue with a cohort: the same turns judged as if the other speakers were absent, so the
    # two judgments can be compared on identical dialogues.
    plain_variant: str = ""
    plain_features: np.ndarray | None = None


async def embed_corpus(
    encoder: SpeakerEncoder,
    clips: Sequence[CorpusClip],
    progress: Callable[[int, int], None],
    *,
    short_crop_seed: int | None = None,
) -> list[Clip]:
    """Embed every clip in-process (offline tooling); clips with too little speech are dropped.
    ``short_crop_seed``: embed a random short stretch of each clip instead (see ``short_crop``)."""
    rng = random.Random(short_crop_seed)
    out: list[Clip] = []
    chunk = 32
    for start in range(0, len(clips), chunk):
        part = clips[start : start + chunk]
        audio = [c.path.read_bytes() if short_crop_seed is None else short_crop(c.path, rng) for c in part]
        results = await encoder.embed(audio, [str(c.path) for c in part])
        for c, r in zip(part, results, strict=True):
            if r.embedding is not None:
                out.append(Clip(c.speaker, c.gender, r.embedding, r.speech_seconds, str(c.path)))
        progress(min(start + chunk, len(clips)), len(clips))
    return out


def _centroids(by_speaker: dict[str, list[Clip]]) -> dict[str, np.ndarray]:
    out = {}
    for s, clips in by_speaker.items():
        m = np.mean([c.embedding for c in clips], axis=0)
        out[s] = m / np.linalg.norm(m)
    return out


def mix_lengths(clips: Sequence[Clip], short_clips: Sequence[Clip], seed: int, share: float) -> list[Clip]:
    """Each clip, or its short crop (same ``source``) with probability ``share``."""
    crops = {c.source: c for c in short_clips}
    rng = random.Random(seed)
    return [crops.get(c.source, c) if rng.random() < share else c for c in clips]


def shared_training_clips(clips: Sequence[Clip], short_clips: Sequence[Clip], seed: int, share: float) -> list[Clip]:
    """The clips a training draw with seed ``seed`` uses when a share of them is cut (no profiles)."""
    return mix_lengths(clips, short_clips, seed + 3, share) if share > 0 else list(clips)


def training_instances(
    clips: Sequence[Clip],
    short_clips: Sequence[Clip],
    n_instances: int,
    seed: int,
    *,
    short_share: float = 0.0,
    length_profiles: bool = False,
    **draw: Any,
) -> list[Instance]:
    """``n_instances`` training dialogues (make_instances, with ``draw`` passed on) from ``clips`` and
    their crops in ``short_clips`` (paired by ``Clip.source``; crops of other clips are ignored):

    - by default, each clip replaced by its crop with probability ``short_share`` (0: whole clips);
    - ``length_profiles``: a third of the dialogues from whole clips, a third from clips each whole or
      cut by a coin flip (MIXED_SHORT_SHARE, as the test's mixed condition), a third from cuts only,
      so a speaker whose turns are all short is as common in training as any other profile.
    """
    if (short_share > 0 or length_profiles) and not short_clips:
        raise ValueError("training on short turns needs the corpus's short crops")
    if length_profiles and short_share > 0:
        # The profiles fix which clips are cut; a share on top would be silently ignored.
        raise ValueError("training by length profile replaces a training share of cuts: use one or the other")
    if not length_profiles:
        return make_instances(shared_training_clips(clips, short_clips, seed, short_share), n_instances, seed, **draw)
    sources = {c.source for c in clips}
    profiles = (
        list(clips),
        mix_lengths(clips, short_clips, seed + 3, MIXED_SHORT_SHARE),
        [c for c in short_clips if c.source in sources],
    )
    counts = (n_instances // 3, n_instances // 3, n_instances - 2 * (n_instances // 3))
    # A seed per profile (seed, seed + 10, seed + 20): the three draws share no random choices. The
    # whole-clip third is therefore the first third of the unprofiled draw with the same seed.
    return [
        instance
        for k, (profile, count) in enumerate(zip(profiles, counts, strict=True))
        for instance in make_instances(profile, count, seed + 10 * k, **draw)
    ]


# Domain randomisation: per-dimension standard deviation of the Gaussian jitter added to every unit
# embedding of a training dialogue (D = 256), one level drawn per dialogue. 0.02 lowers a same-voice
# cosine of 0.94 to about 0.87, 0.01 to about 0.92. Cross-validation kept it off: at the L2 penalties
# where it helps detection it also flagged more consistent speakers than the selection rule allows.
JITTER_LEVELS: tuple[float, ...] = (0.0,)


def _jitter(emb: np.ndarray, scale: float, noise: np.random.Generator) -> np.ndarray:
    x = emb + noise.normal(0.0, scale, emb.shape)
    return np.asarray(x / np.linalg.norm(x, axis=1, keepdims=True))


# Dialogues with a cohort: how many other speakers (two-person dialogues are the most common), and
# how many turns each of them has.
COHORT_SPEAKERS = (1, 1, 2, 3)
COHORT_TURNS = (1, 2, 3, 4, 5)
# In training, the share of S2/S3 dialogues whose intruder voice is one of the other speakers of the
# dialogue (a TTS system that used the wrong speaker's voice); otherwise the intruder is a stranger.
INTRUDER_IN_COHORT = 0.25


def make_instances(
    clips: Sequence[Clip],
    n_instances: int,
    seed: int,
    benchmark_like: bool = False,
    *,
    jitter_levels: Sequence[float] | None = None,
    targets: Collection[str] | None = None,
    cohort: bool = False,
    intruder_in_cohort: float = INTRUDER_IN_COHORT,
    similar_in_cohort: bool = False,
) -> list[Instance]:
    """Training dialogues (S1/S2/S3 in equal shares) drawn from embedded clips.

    Default: 1-10 turns, reference half of the time, S3 from the 3 most similar same-gender speakers
    (the most similar 80 % of the time), so every variant is trained and n stays general; every
    dialogue's embeddings jittered by a level drawn from ``jitter_levels`` (default JITTER_LEVELS).
    ``benchmark_like``: exactly the SpeakerSleuth construction (5 turns, a reference, S3 = the most
    similar same-gender speaker), unjittered unless ``jitter_levels`` says otherwise; used to choose
    the decision threshold and, in cross-validation, as test dialogues.
    ``targets``: draw target speakers only from these (intruders still come from every speaker).
    ``cohort``: every dialogue also has 1-3 other speakers with 1-5 turns each (at least 2 target
    turns, so the cohort variants apply); in a share ``intruder_in_cohort`` of S2/S3 dialogues the
    intruder's voice is one of them. Each instance then also carries the plain (no-cohort) features.
    ``similar_in_cohort``: the cohort always includes the target's second most similar same-gender
    speaker (the most similar is the S3 intruder of benchmark-like dialogues): two alike voices in one
    dialogue, the hardest yardstick.
    S2 is an opposite-gender speaker, or in a corpus of one gender the least similar speaker.
    """
    levels = tuple(jitter_levels) if jitter_levels is not None else ((0.0,) if benchmark_like else JITTER_LEVELS)
    rng = random.Random(seed)
    by_speaker: dict[str, list[Clip]] = {}
    for c in clips:
        by_speaker.setdefault(c.speaker, []).append(c)
    centroids = _centroids(by_speaker)
    gender = {s: cs[0].gender for s, cs in by_speaker.items()}
    speakers = sorted(
        s for s, cs in by_speaker.items() if len(cs) >= max(TURN_COUNTS) + 1 and (targets is None or s in targets)
    )
    if not speakers:
        raise ValueError(f"no target speaker has the {max(TURN_COUNTS) + 1} clips a training dialogue needs")
    similar: dict[str, list[str]] = {}
    opposite: dict[str, list[str]] = {}
    for s in speakers:
        same = [o for o in by_speaker if o != s and gender[o] == gender[s]]
        similar[s] = sorted(same, key=lambda o: -float(centroids[s] @ centroids[o]))[:3]
        opposite[s] = [o for o in by_speaker if gender[o] != gender[s]] or [
            min(same, key=lambda o: float(centroids[s] @ centroids[o]))
        ]
    turn_counts = [t for t in TURN_COUNTS if t >= 2] if cohort else list(TURN_COUNTS)
    out = []
    for k in range(n_instances):
        target = rng.choice(speakers)
        n = 5 if benchmark_like else rng.choice(turn_counts)
        scenario = SCENARIOS[k % 3]
        own = rng.sample(by_speaker[target], n + 1)
        with_reference = benchmark_like or n == 1 or rng.random() < 0.5
        turns, reference = own[:n], own[n] if with_reference else None
        labels = np.zeros(n)
        intruder = None
        if scenario != "S1":
            if scenario == "S2":
                pool = opposite[target]
            else:  # most similar most of the time, as the benchmark does; the next two for variety
                top1 = benchmark_like or rng.random() < 0.8
                pool = similar[target][:1] if top1 else similar[target]
            slot = rng.randrange(n)
            intruder = rng.choice(by_speaker[rng.choice(pool)])
            turns[slot] = intruder
            labels[slot] = 1
        look_alike = similar[target][1] if similar_in_cohort and len(similar[target]) > 1 else None
        cohort_turns = _draw_cohort(by_speaker, target, intruder, intruder_in_cohort, rng, look_alike) if cohort else []
        emb = np.stack([t.embedding for t in turns])
        ref = None if reference is None else reference.embedding
        # Domain randomisation: synthetic voices are unusually self-consistent, real and other
        # synthetic voices less so. Jittering every clip's embedding by a random amount per
        # dialogue teaches the model that the speaker's own spread varies, so it leans on the
        # spread-normalised features instead of the tight spread of this corpus.
        # A single level draws nothing from rng, so the dialogues drawn do not depend on the jitter.
        jitter = levels[0] if len(levels) == 1 else rng.choice(levels)
        cohort_emb = [np.stack([c.embedding for c in group]) for group in cohort_turns]
        if jitter:
            noise = np.random.default_rng(rng.getrandbits(32))
            emb = _jitter(emb, jitter, noise)
            ref = None if ref is None else _jitter(ref[None, :], jitter, noise)[0]
            cohort_emb = [_jitter(g, jitter, noise) for g in cohort_emb]
        seconds = np.array([t.speech_seconds for t in turns])
        variant, x = turn_features(emb, ref, seconds, None)
        if not cohort:
            out.append(Instance(variant, x, labels, n, scenario))
            continue
        centroids_of_others = np.stack([g.mean(axis=0) / np.linalg.norm(g.mean(axis=0)) for g in cohort_emb])
        cohort_variant, cx = turn_features(emb, ref, seconds, centroids_of_others)
        out.append(Instance(cohort_variant, cx, labels, n, scenario, plain_variant=variant, plain_features=x))
    return out


def _draw_cohort(
    by_speaker: dict[str, list[Clip]],
    target: str,
    intruder: Clip | None,
    intruder_in_cohort: float,
    rng: random.Random,
    look_alike: str | None = None,
) -> list[list[Clip]]:
    """The other speakers of a dialogue, as lists of their turns: strangers to the target, and the
    intruder's own voice (other clips of it) in a share ``intruder_in_cohort`` of altered dialogues;
    ``look_alike`` (a stranger) is always among them when given."""
    wanted = rng.choice(COHORT_SPEAKERS)
    strangers = [s for s in by_speaker if s not in (target, look_alike) and (intruder is None or s != intruder.speaker)]
    chosen: list[str] = []
    if intruder is not None and rng.random() < intruder_in_cohort:
        chosen.append(intruder.speaker)
    if look_alike is not None and (intruder is None or look_alike != intruder.speaker):
        chosen.append(look_alike)
    chosen += rng.sample(strangers, min(max(wanted - len(chosen), 0), len(strangers)))
    groups = []
    for s in chosen:
        available = [c for c in by_speaker[s] if c is not intruder]
        groups.append(rng.sample(available, min(rng.choice(COHORT_TURNS), len(available))))
    return groups


def fit_logistic(x: np.ndarray, y: np.ndarray, features: Sequence[str], l2: float = L2_PENALTY) -> LogisticModel:
    """Logistic regression by iteratively reweighted least squares on standardised features."""
    mean = x.mean(axis=0)
    scale = np.maximum(x.std(axis=0), 1e-6)
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    penalty = np.diag([l2 * len(x)] * (z.shape[1] - 1) + [0.0])  # the bias is not penalised
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -40, 40)))
        grad = z.T @ (p - y) + penalty @ w
        hess = (z * (p * (1 - p))[:, None]).T @ z + penalty
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return LogisticModel(tuple(features), mean, scale, w[:-1], float(w[-1]))


def dialogue_scores(instances: Sequence[Instance], probs: Sequence[np.ndarray], tau: float) -> dict[str, float]:
    """Benchmark metrics (percent) at decision threshold tau, by the replay report's own definitions:
    detection accuracy per scenario (S1, S2, S3), balanced accuracy (bal), balanced localization F1
    (bal_f1). A dialogue is flagged when any turn is; its flagged turns are the predicted locations."""
    records = []
    for k, (inst, p) in enumerate(zip(instances, probs, strict=True)):
        pred = frozenset(np.flatnonzero(p > tau).tolist())
        gold = frozenset(np.flatnonzero(inst.labels).tolist())
        records.append(DetectionRecord(str(k), "calibration", inst.scenario, gold, pred, bool(pred)))
    return {**detection_metrics(records), "bal_f1": localization_metrics(records)["bal_f1"]}


def variant_turns(instances: Sequence[Instance], variant: str) -> tuple[np.ndarray, np.ndarray]:
    """Every turn of the instances of one variant: ((n, k) features, (n,) labels)."""
    rows = [i for i in instances if i.variant == variant]
    if not rows:
        raise ValueError(f"no training dialogue of variant {variant!r}: draw more dialogues")
    return np.vstack([i.features for i in rows]), np.concatenate([i.labels for i in rows])


def fit_models(
    instances: Sequence[Instance], l2: float = L2_PENALTY, variants: Sequence[str] = VARIANTS
) -> dict[str, LogisticModel]:
    """One logistic model per variant, on every turn of the instances of that variant."""
    return {v: fit_logistic(*variant_turns(instances, v), FEATURES[v], l2=l2) for v in variants}


def fit(
    clips: Sequence[Clip],
    n_instances: int,
    seed: int,
    n_threshold_instances: int = 1500,
    *,
    short_clips: Sequence[Clip] = (),
    short_share: float = TRAIN_SHORT_SHARE,
    length_profiles: bool = False,
) -> tuple[dict[str, LogisticModel], dict[str, Any]]:
    """Fit every variant on dialogues drawn from ``clips`` and their crops in ``short_clips`` as
    training_instances draws them (``short_share``, ``length_profiles``)."""
    # Dialogues without and with other speakers come from separate draws, so the models of requests
    # without a cohort do not depend on whether the cohort models are fitted.
    instances = [
        instance
        for draw_seed, cohort in ((seed, False), (seed + 2, True))
        for instance in training_instances(
            clips,
            short_clips,
            n_instances,
            draw_seed,
            short_share=short_share,
            length_profiles=length_profiles,
            cohort=cohort,
        )
    ]
    models = fit_models(instances)
    stats: dict[str, Any] = {"variants": {}}
    for variant in VARIANTS:
        x, y = variant_turns(instances, variant)
        p = models[variant].probability(x)
        stats["variants"][variant] = {
            "dialogues": sum(i.variant == variant for i in instances),
            "turns": len(y),
            "inconsistent_share": round(float(y.mean()), 4),
            "ece_in_sample": round(expected_calibration_error(p, y), 4),
        }
    # The decision threshold: chosen once, on fresh benchmark-style dialogues of the same corpus.
    bench = make_instances(clips, n_threshold_instances, seed + 1, benchmark_like=True)
    probs = [models[i.variant].probability(i.features) for i in bench]
    grid = np.round(np.arange(0.05, 0.96, 0.01), 2)
    scored = [(float(tau), *(dialogue_scores(bench, probs, float(tau))[k] for k in ("bal", "bal_f1"))) for tau in grid]
    top = max((b + f) / 2 for _, b, f in scored)
    plateau = [t for t, b, f in scored if (b + f) / 2 >= top - 1e-9]
    tau = plateau[len(plateau) // 2]  # the middle of a tied plateau, not its edge
    at = {t: (b, f) for t, b, f in scored}
    stats["decision_threshold_search"] = {
        "dialogues": len(bench),
        "construction": "5 turns + reference, S2 = opposite gender, S3 = most similar same-gender speaker",
        "grid": "0.05-0.95 step 0.01",
        "objective": "mean of balanced detection accuracy and balanced localization F1",
        "best": {"threshold": tau, "bal": round(at[tau][0], 1), "bal_f1": round(at[tau][1], 1)},
        "at_0.5": {"bal": round(at[0.5][0], 1), "bal_f1": round(at[0.5][1], 1)},
    }
    stats["instances"] = len(instances)
    stats["short_share"] = short_share
    stats["length_profiles"] = length_profiles
    shared = shared_training_clips(clips, short_clips, seed, 0.0 if length_profiles else short_share)
    stats["short_clips_in_training"] = sum(a is not b for a, b in zip(shared, clips, strict=True))
    stats["cohort_instances"] = sum(i.plain_features is not None for i in instances)
    return models, stats


def _short_words(stats: dict[str, Any]) -> str:
    if stats.get("length_profiles"):
        return (
            "drawn by length profile: a third of the dialogues from whole clips, a third from clips each whole or "
            f"replaced by a random 1.2-3 s cut of their audible part with probability {MIXED_SHORT_SHARE:g}, "
            "a third from such cuts only"
        )
    if not stats.get("short_share"):
        return "every clip whole"
    return (
        f"{stats['short_clips_in_training']} of the clips (each with probability {stats['short_share']:g}) replaced by "
        "a random 1.2-3 s cut of their audible part"
    )


def _jitter_words() -> str:
    if not any(JITTER_LEVELS):
        return "embeddings used as measured (no jitter)"
    return f"each dialogue's embeddings jittered by Gaussian noise of per-dimension sd drawn from {list(JITTER_LEVELS)}"


def calibration_block(
    models: dict[str, LogisticModel], stats: dict[str, Any], manifest_raw: dict[str, Any], corpus: str, seed: int
) -> dict[str, Any]:
    block = {
        "version": CALIBRATION_VERSION,
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "encoder_weights_sha256": manifest_raw["source"]["file_sha256"],
        "encoder_onnx_sha256": manifest_raw["sha256"],
        "how": (
            f"logistic regression per variant (IRLS, L2 penalty {L2_PENALTY:g} per turn, standardised features) on "
            f"turns of {stats['instances'] - stats['cohort_instances']} benchmark-like dialogues (S1/S2/S3 in equal "
            "shares, 1-10 turns, reference "
            f"half of the time) drawn with seed {seed} from {corpus}; {_short_words(stats)}; {_jitter_words()}. "
            "The *_cohort variants "
            f"are fitted instead on {stats['cohort_instances']} further dialogues (2-10 turns, drawn with seed "
            f"{seed + 2}) that also "
            f"have 1-3 other speakers with 1-5 turns each (the intruder's voice among them in "
            f"{INTRUDER_IN_COHORT:.0%} of altered dialogues); the other variants never see them. L2 and jitter "
            "chosen by "
            "`sleuthd-bench calibrate cv` on held-out voices of the same corpus. Decision threshold 0.5, the "
            "Bayes decision for a calibrated probability (not tuned; fit_stats.decision_threshold_search shows what "
            "tuning on the fit corpus would have picked). Never fitted on the transfer or real-speech splits."
        ),
        "decision_threshold": DECISION_THRESHOLD,
        "score_scale": "probability that the turn does not belong to its speaker",
        "models": {name: m.to_json() for name, m in models.items()},
        "fit_stats": stats,
    }
    if "components" in manifest_raw["source"]:  # the fused encoder: the weights of each encoder it joins
        block["encoder_components_weights_sha256"] = manifest_raw["source"]["components"]
    return block


def write_into_card(card_path: Path, block: dict[str, Any], make_default: bool) -> None:
    card = json.loads(card_path.read_text())
    card["calibration"] = block
    if make_default:
        card["default_method"] = "auto"
    tmp = card_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(card, indent=2) + "\n")
    tmp.replace(card_path)

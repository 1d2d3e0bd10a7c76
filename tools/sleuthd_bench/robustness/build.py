"""The robustness matrix's speakers, conditions and dialogues (benchmark manifests, docs/benchmark-format.md).

Speakers are split into ``train`` (what `calibrate fit-evidence` may fit on) and ``eval`` (what the report
judges): espeak-ng voice variants alternate between the two within each gender (a variant is one speaker in
every language), Kokoro's fit voices train and its transfer voices are evaluated, and FSDD's six real
speakers are evaluated only, never fitted on.

A condition is a pool of speakers (its clean source clips) and a policy that turns every slot of a dialogue
(5 turns, or the condition's ``turns``; the reference, the S2 and S3 intruders) into a clip spec: prosody, a cut,
a channel. Random choices that belong to a clip (its cut, its channel's parameters) are drawn from a generator
seeded by the clip and the choice, so a clip reappearing in another dialogue or condition under the same choice is
the same file.

Intruders: S2 is a clip of a random opposite-gender speaker of the pool (FSDD, all men: the least similar
one); S3 is a clip of the most similar same-gender speaker, judged by neither encoder under test: by MFCC
statistics of the clean clips (espeak-ng, FSDD) or by the blend weights (Kokoro, kokoro_voices.near_intruder).
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd_bench import synth
from sleuthd_bench.robustness import render, texts

SPLITS = ("train", "eval")
TURNS = 5
# Emotion-like prosody presets for espeak-ng: (pitch 0-99, rate wpm, amplitude); each clip jitters them.
EMOTIONS: dict[str, tuple[int, int, int]] = {
    "neutral": (50, 160, 100),
    "happy": (72, 195, 120),
    "angry": (58, 205, 170),
    "sad": (28, 115, 70),
    "fear": (82, 215, 90),
    "bored": (34, 125, 80),
    "disgust": (40, 140, 115),
}
CHANNELS = ("mp3", "opus", "phone", "reverb", "noise", "loud", "clip")
DRIFT_CHANNELS = (*CHANNELS, "vorbis", "clean")


@dataclass(frozen=True)
class Speaker:
    name: str
    gender: str
    family: str  # espeak, kokoro, fsdd
    split: str
    clips: tuple[dict[str, Any], ...]  # clean specs: {"src": ..., "fx": [...]}
    group: str = ""  # speakers of one group only meet each other (one language of a pool)


@dataclass(frozen=True)
class Condition:
    name: str
    group: str  # the letter: a-g, x (the outside failure emulated), ctrl
    pool: str
    length: str = "whole"  # whole, short (every slot but the reference 1.2-2 s), mixed (each such slot whole or short)
    channel: str = "none"  # none, one of CHANNELS (every slot), any (one per dialogue), drift (one per slot)
    prosody: str = "none"  # none, sox (pitch and tempo per slot)
    about: str = ""
    # The target's turns a dialogue. Long dialogues are their own condition: the evidence model was fitted on
    # 5-turn speakers, and a pool of many short turns was found to hide intruders that 5 turns show.
    turns: int = TURNS
    # Cut the reference short too (a caller whose reference is a short prompt): a pool of short pieces only.
    short_reference: bool = False
    # Whether `calibrate fit-evidence` fits on its train split by default. The long conditions came after the served
    # evidence card; fitting on them is a screen of its own (docs/research/robustness-phase3/size/REPORT.md), and the
    # documented command must keep reproducing the served card.
    fitted: bool = True


CONDITIONS: tuple[Condition, ...] = (
    Condition("ctrl-espeak", "ctrl", "espeak-en", about="espeak-ng English voices, clean (control)"),
    Condition("a-espeak-lang", "a", "espeak-lang", about="espeak-ng voices speaking German, French or Spanish"),
    Condition("a-kokoro-lang", "a", "kokoro-de", about="Kokoro voices speaking German"),
    Condition("b-espeak-expressive", "b", "espeak-expr", about="espeak-ng: every turn in an emotion-like prosody"),
    Condition("b-espeak-sox", "b", "espeak-en", prosody="sox", about="sox pitch +-350 cents, tempo 0.8-1.25 per turn"),
    Condition("b-kokoro-speed", "b", "kokoro-en", about="Kokoro, speed 0.7-1.4 per turn"),
    Condition("c-short", "c", "espeak-en", length="short", about="every turn 1.2-2 s"),
    Condition("c-mixed", "c", "espeak-en", length="mixed", about="each turn whole or 1.2-2 s by a coin flip"),
    Condition(
        "c-long-short",
        "c",
        "espeak-en-long",
        length="short",
        turns=30,
        fitted=False,
        about="30 turns a speaker, every turn 1.2-2 s",
    ),
    Condition(
        "c-long-allshort",
        "c",
        "espeak-en-long",
        length="short",
        turns=30,
        short_reference=True,
        fitted=False,
        about="30 turns a speaker and the reference, each 1.2-2 s",
    ),
    *(Condition(f"d-{c}", "d", "espeak-en", channel=c, about=f"every clip through {c}") for c in CHANNELS),
    Condition("e-drift", "e", "espeak-en", channel="drift", about="a different channel for every turn"),
    Condition("f-fsdd", "f", "fsdd", about="FSDD real speech, clean (control)"),
    Condition("f-fsdd-prosody", "f", "fsdd", prosody="sox", about="FSDD, sox pitch/tempo per turn"),
    Condition("f-fsdd-short", "f", "fsdd", length="short", about="FSDD, every turn 1.2-2 s"),
    Condition("f-fsdd-channel", "f", "fsdd", channel="any", about="FSDD, one channel per dialogue"),
    Condition("f-fsdd-drift", "f", "fsdd", channel="drift", about="FSDD, a different channel per turn"),
    Condition("g-kokoro-short", "g", "kokoro-en", length="short", about="Kokoro, every turn 1.2-2 s"),
    Condition("g-kokoro-channel", "g", "kokoro-en", channel="any", about="Kokoro, one channel per dialogue"),
    Condition("g-kokoro-drift", "g", "kokoro-en", channel="drift", about="Kokoro, a different channel per turn"),
    Condition(
        "x-de-expressive-2s",
        "x",
        "espeak-de-expr",
        about="the outside failure emulated: German, every turn another emotion, turns cut to <= 2.2 s",
    ),
)
CONDITION_BY_NAME = {c.name: c for c in CONDITIONS}
FSDD_POOLS = frozenset({"fsdd"})


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


# ------------------------------------------------------------------------------------------ pools


def espeak_variants() -> list[tuple[str, str, str]]:
    """(speaker name, variant, gender) of the catalogue's espeak-ng voices, split alternately per gender."""
    out = []
    for v in synth.catalogue():
        if v.family == "espeak":
            out.append((v.name, v.engine_args[2].partition("+")[2], v.gender))
    return out


def _split_of(names: Sequence[str]) -> dict[str, str]:
    return {n: SPLITS[k % 2] for k, n in enumerate(sorted(names))}


def _espeak_pool(kind: str, clips: int) -> list[Speaker]:
    variants = espeak_variants()
    split = {}
    for g in ("M", "F"):
        split.update(_split_of([n for n, _, gg in variants if gg == g]))
    langs = ("de", "fr", "es") if kind == "lang" else ("de",) if kind == "de-expr" else ("en",)
    out = []
    for name, variant, gender in variants:
        for lang in langs:
            seed = _seed("espeak", kind, name, lang)
            lines = texts.sentences(lang, clips, seed, short=kind == "de-expr")
            rng = random.Random(seed)
            specs = []
            emotions = list(EMOTIONS)
            rng.shuffle(emotions)
            for i, text in enumerate(lines):
                p, s, a = EMOTIONS["neutral"] if kind in ("en", "lang") else EMOTIONS[emotions[i % len(emotions)]]
                src: dict[str, Any] = {
                    "kind": "espeak",
                    "lang": texts.ESPEAK_LANG[lang],
                    "variant": variant,
                    "text": text,
                    "p": p,
                    "s": s,
                    "a": a,
                }
                fx: list[Any] = []
                if kind in ("expr", "de-expr"):
                    src["p"] = int(np.clip(p + rng.randint(-8, 8), 0, 99))
                    src["s"] = s + rng.randint(-15, 15)
                    src["a"] = a + rng.randint(-15, 15)
                    words = text.split()
                    k = rng.randrange(len(words))
                    words[k] = f'<emphasis level="strong">{words[k]}</emphasis>'
                    src["text"] = "<speak>" + " ".join(words) + "</speak>"
                    src["ssml"] = True
                if kind == "de-expr":
                    fx.append(["cut", round(rng.random(), 3), 2.2])
                specs.append({"src": src, "fx": fx})
            suffix = "" if lang == "en" else f"@{lang}"
            out.append(Speaker(name + suffix, gender, "espeak", split[name], tuple(specs), group=lang))
    return out


def _kokoro_pool(lang: str, clips: int) -> list[Speaker]:
    from sleuthd_bench.kokoro_voices import DESIGNS, design_voices

    voices = design_voices(DESIGNS["large"], 0)
    # Kokoro synthesis costs tens of seconds per clip on these shared CPUs, so the pool is small: 3 men and
    # 3 women of the fit voices train, 4 men and 4 women of the transfer voices are evaluated; German is
    # evaluated only (the language condition's training is espeak-ng's): a language Kokoro was never fitted on.
    chosen = []
    for split, each in (("fit", 3), ("transfer", 4)):
        if split == "fit" and lang != "en":
            continue
        pool = [v for v in voices if v.split == split]
        for gender in ("M", "F"):
            same = [v for v in pool if v.gender == gender]
            chosen += same[:: max(1, len(same) // each)][:each]
    out = []
    for v in chosen:
        seed = _seed("kokoro", lang, v.name)
        rng = random.Random(seed)
        specs = []
        for text in texts.sentences(lang, clips, seed):
            speed = round(rng.uniform(0.7, 1.4), 2) if lang == "en" else round(rng.uniform(0.9, 1.1), 2)
            src = {"kind": "kokoro", "voice": v.name, "lang": texts.KOKORO_LANG[lang], "text": text, "speed": speed}
            specs.append({"src": src, "fx": []})
        split = "train" if v.split == "fit" else "eval"
        out.append(Speaker(v.name + ("" if lang == "en" else f"@{lang}"), v.gender, "kokoro", split, tuple(specs)))
    return out


def _fsdd_pool(root: Path, fsdd_dir: Path, turns: int) -> list[Speaker]:
    out_dir = root / "sources" / "fsdd"
    csv_path = synth.build_fsdd_corpus(fsdd_dir, out_dir, turns, seed=0, turn_seconds=(2.0, 5.0))
    by: dict[str, list[dict[str, Any]]] = {}
    gender: dict[str, str] = {}
    with csv_path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            rel = str(Path("sources") / "fsdd" / row["path"])
            by.setdefault(row["speaker"], []).append({"src": {"kind": "fsdd", "path": rel}, "fx": []})
            gender[row["speaker"]] = row["gender"]
    return [Speaker(f"fsdd-{s}", gender[s], "fsdd", "eval", tuple(c)) for s, c in sorted(by.items())]


def pools(root: Path, fsdd_dir: Path, needed: Sequence[str]) -> dict[str, list[Speaker]]:
    makers: dict[str, Callable[[], list[Speaker]]] = {
        "espeak-en": lambda: _espeak_pool("en", 8),
        # The same voices with 32 sentences each (the first 8 are espeak-en's: same seed), for 30-turn dialogues.
        "espeak-en-long": lambda: _espeak_pool("en", 32),
        "espeak-lang": lambda: _espeak_pool("lang", 7),
        "espeak-expr": lambda: _espeak_pool("expr", 8),
        "espeak-de-expr": lambda: _espeak_pool("de-expr", 7),
        "kokoro-en": lambda: _kokoro_pool("en", 6),
        "kokoro-de": lambda: _kokoro_pool("de", 6),
        "fsdd": lambda: _fsdd_pool(root, fsdd_dir, 16),
    }
    return {name: makers[name]() for name in dict.fromkeys(needed)}


# ------------------------------------------------------------------------------------------ similarity


def mfcc_stats(x: np.ndarray) -> np.ndarray:
    """Mean and s.d. of 19 MFCCs (40 mel bands, 60-3800 Hz so narrowband speech compares) over the louder
    half of the 25 ms frames: a speaker vector that depends on neither encoder under test."""
    n, hop = 400, 160
    if len(x) < n:
        x = np.pad(x, (0, n - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[::hop] * np.hamming(n)
    power = np.abs(np.fft.rfft(frames, 512)) ** 2
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(60), mel(3800), 42) / 2595) - 1)
    bins = np.fft.rfftfreq(512, 1 / 16000)
    fb = np.zeros((40, len(bins)))
    for m in range(40):
        lo, mid, hi = edges[m : m + 3]
        fb[m] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    logmel = np.log(power @ fb.T + 1e-10)
    energy = logmel.mean(axis=1)
    keep = logmel[energy >= np.median(energy)]
    k = np.arange(40)
    dct = np.cos(np.pi / 40 * (k[None, :] + 0.5) * np.arange(1, 20)[:, None])
    c = keep @ dct.T
    return np.concatenate([c.mean(axis=0), c.std(axis=0)])


def most_similar(speakers: Sequence[Speaker], vectors: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
    """For each speaker, the other speakers of its gender and group, most similar first (cosine of the
    pool-standardised MFCC statistics)."""
    names = [s.name for s in speakers]
    mat = np.stack([vectors[n] for n in names])
    mat = (mat - mat.mean(axis=0)) / (mat.std(axis=0) + 1e-9)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    sim = mat @ mat.T
    out = {}
    for i, s in enumerate(speakers):
        same = [j for j, o in enumerate(speakers) if j != i and o.gender == s.gender and o.group == s.group]
        out[s.name] = [names[j] for j in sorted(same, key=lambda j: -sim[i, j])]
    return out


def kokoro_similar(speakers: Sequence[Speaker]) -> dict[str, list[str]]:
    from sleuthd_bench.kokoro_voices import DESIGNS, design_voices, weight_distance

    voices = {v.name: v for v in design_voices(DESIGNS["large"], 0)}
    base = {s.name: voices[s.name.partition("@")[0]] for s in speakers}
    out = {}
    for s in speakers:
        same = [o for o in speakers if o.name != s.name and o.gender == s.gender and o.split == s.split]
        out[s.name] = [o.name for o in sorted(same, key=lambda o: weight_distance(base[s.name], base[o.name]))]
    return out


# ------------------------------------------------------------------------------------------ dialogues


def _channel_fx(kind: str, key: str) -> list[list[Any]]:
    rng = random.Random(_seed("channel", kind, key))
    if kind == "clean":
        return []
    if kind == "mp3":
        return [["mp3", rng.choice((16, 24, 32))]]
    if kind == "opus":
        return [["opus", round(rng.uniform(0.93, 1.0), 3)]]
    if kind == "vorbis":
        return [["vorbis", round(rng.uniform(0.8, 1.0), 3)]]
    if kind == "phone":
        return [["phone"]]
    if kind == "reverb":
        return [["reverb", rng.randint(40, 95), rng.randint(40, 100)]]
    if kind == "noise":
        return [["noise", round(rng.uniform(5, 30), 1), rng.choice(("white", "pink", "brown")), rng.getrandbits(31)]]
    if kind == "loud":
        return [["level", round(-26 + rng.uniform(-20, 20), 1)]]
    if kind == "clip":
        return [["clip", round(rng.uniform(6, 20), 1)]]
    raise ValueError(f"unknown channel {kind!r}")


def slot_spec(clean: Mapping[str, Any], cond: Condition, channel: str, cut: bool = True) -> dict[str, Any]:
    """The spec of one slot: the clean clip, then the condition's prosody, cut and channel. ``cut`` False: never
    cut short (the reference: a caller chooses it, and the server refuses one with less speech than the encoder
    needs, so a cut reference would make the dialogue one the server does not answer; the conditions are about
    short turns), unless the condition cuts the reference too (``short_reference``; the report counts refusals)."""
    key = render.clip_id(clean)
    fx = list(clean.get("fx") or [])
    rng = random.Random(_seed("slot", cond.prosody, cond.length, key))
    if cond.prosody == "sox":
        fx.append(["sox", rng.randint(-350, 350), round(rng.uniform(0.8, 1.25), 3)])
    short = cond.length == "short" or (cond.length == "mixed" and random.Random(_seed("mixed", key)).random() < 0.5)
    if short and cut:
        where = random.Random(_seed("cut", key))
        fx.append(["cut", round(where.random(), 3), round(where.uniform(1.2, 2.0), 2)])
    fx += _channel_fx(channel, key)
    return {"src": clean["src"], "fx": fx}


def draw_dialogues(
    cond: Condition, speakers: Sequence[Speaker], similar: Mapping[str, list[str]], n: int, split: str, seed: int
) -> list[dict[str, Any]]:
    """``n`` manifest lines of one condition from the speakers of one split (relative audio paths) with
    their clip specs under ``meta.specs``."""
    mine = [s for s in speakers if s.split == split]
    by_name = {s.name: s for s in mine}
    rng = random.Random(_seed("dialogues", cond.name, split, seed))
    turns = cond.turns
    targets = [s for s in mine if len(s.clips) >= turns + 1 and similar.get(s.name)]
    if not targets:
        raise ValueError(f"{cond.name}/{split}: no speaker has the clips and a similar voice a dialogue needs")
    order = list(targets)
    rng.shuffle(order)
    lines = []
    for k in range(n):
        t = order[k % len(order)]
        own = rng.sample(list(t.clips), turns + 1)
        altered = rng.randrange(turns)
        opposite = [o for o in mine if o.gender != t.gender and o.group == t.group]
        s2_speaker = rng.choice(opposite) if opposite else by_name[similar[t.name][-1]]
        s3_speaker = by_name[similar[t.name][0]]
        slots = [*own, rng.choice(s2_speaker.clips), rng.choice(s3_speaker.clips)]
        if cond.channel == "drift":
            channels = [rng.choice(DRIFT_CHANNELS) for _ in slots]
        elif cond.channel == "any":
            channels = [rng.choice(CHANNELS)] * len(slots)
        elif cond.channel == "none":
            channels = ["clean"] * len(slots)
        else:
            channels = [cond.channel] * len(slots)
        specs = [
            slot_spec(c, cond, ch, cut=k != turns or cond.short_reference)
            for k, (c, ch) in enumerate(zip(slots, channels, strict=True))
        ]
        paths = [render.relpath(s) for s in specs]
        lines.append(
            {
                "dialogue_id": f"{cond.name}-{split}-{k:04d}",
                "source": cond.name,
                "target_speaker": t.name,
                "reference": paths[turns],
                "target_turns": paths[:turns],
                "altered_turn": altered,
                "s2_audio": paths[turns + 1],
                "s3_audio": paths[turns + 2],
                "meta": {
                    "condition": cond.name,
                    "group": cond.group,
                    "split": split,
                    "s2_speaker": s2_speaker.name,
                    "s3_speaker": s3_speaker.name,
                    "gender": t.gender,
                    "channels": channels,
                    "specs": specs,
                },
            }
        )
    return lines


@dataclass
class BuildResult:
    manifests: dict[str, Path] = field(default_factory=dict)  # "<split>/<condition>" -> path
    clips: int = 0
    rendered: int = 0


def _similarity(
    root: Path, renderer: render.Renderer, pool: str, speakers: Sequence[Speaker], en: Sequence[Speaker] | None
) -> dict[str, list[str]]:
    if pool.startswith("kokoro"):
        return kokoro_similar(speakers)
    basis = en if pool.startswith("espeak") and en is not None else speakers
    vectors: dict[str, np.ndarray] = {}
    for s in basis:
        clean = [c for c in s.clips[:4]]
        feats = [mfcc_stats(render._read(renderer.render(c).read_bytes())) for c in clean]
        vectors[s.name] = np.mean(feats, axis=0)
    # A speaker of another language is the same voice variant: it borrows the English vector.
    vec = {s.name: vectors[s.name.partition("@")[0]] for s in speakers}
    out: dict[str, list[str]] = {}
    for split in SPLITS:
        part = [s for s in speakers if s.split == split]
        if len(part) > 1:
            out.update(most_similar(part, vec))
    return out


def build(
    root: Path,
    conditions: Sequence[Condition],
    *,
    eval_dialogues: int,
    train_dialogues: int,
    fsdd_dir: Path,
    seed: int = 0,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> BuildResult:
    """Draw every condition's dialogues (train and eval; FSDD eval only), write the manifests
    ``root/<split>-<condition>.jsonl`` and render every clip they use that is not on disk yet."""
    from concurrent.futures import ThreadPoolExecutor

    root.mkdir(parents=True, exist_ok=True)
    renderer = render.Renderer(root, fsdd_dir)
    needed = [c.pool for c in conditions]
    if any(p.startswith("espeak") for p in needed):
        needed.insert(0, "espeak-en")
    pool = pools(root, fsdd_dir, needed)
    similar = {name: _similarity(root, renderer, name, sp, pool.get("espeak-en")) for name, sp in pool.items()}
    result = BuildResult()
    specs: dict[str, dict[str, Any]] = {}
    for cond in conditions:
        for split in SPLITS:
            if split == "train" and cond.pool in FSDD_POOLS:
                continue  # real speech is never fitted on
            if not any(s.split == split for s in pool[cond.pool]):
                continue  # a pool evaluated only (Kokoro's German)
            n = eval_dialogues if split == "eval" else train_dialogues
            lines = draw_dialogues(cond, pool[cond.pool], similar[cond.pool], n, split, seed)
            path = root / f"{split}-{cond.name}.jsonl"
            path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
            result.manifests[f"{split}/{cond.name}"] = path
            for line in lines:
                for spec in line["meta"]["specs"]:
                    specs[render.relpath(spec)] = spec
    result.clips = len(specs)
    todo = [s for rel, s in specs.items() if not (root / rel).is_file()]
    # Kokoro clips one at a time in a thread of their own (one engine), everything else beside it.
    kokoro = [s for s in todo if s["src"]["kind"] == "kokoro"]
    rest = [s for s in todo if s["src"]["kind"] != "kokoro"]
    done = 0

    def tick(_: object) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, len(todo))

    with ThreadPoolExecutor(max_workers=max(1, workers) + 1) as ex:

        def serially() -> None:
            for s in kokoro:
                tick(renderer.render(s))

        serial = ex.submit(serially)
        for path in ex.map(renderer.render, rest):
            tick(path)
        serial.result()
    result.rendered = len(todo)
    # Merged into what is there: building one condition must not drop the others from the index.
    index_path = root / "conditions.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    index.update({c.name: {"group": c.group, "pool": c.pool, "about": c.about} for c in conditions})
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    return result

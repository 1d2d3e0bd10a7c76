"""Incremental, vectorised judgment: the same verdicts however and in whatever order they are computed.

- sleuthd.judgment.gram's exact cosines and order statistics equal the obvious computations;
- auto's vectorised features equal the pre-vectorised implementation (tests/reference_judge.py) to ~1e-12;
- a dialogue's verdicts equal the reference judge's;
- a streamed turn's verdict and its revisions equal CheckDialogue's for the same turns, exactly, for long
  dialogues of real synthesized speech as well as random ones (turns finishing out of order included).
"""

from __future__ import annotations

import random
from dataclasses import fields

import numpy as np
import pytest
from sleuthd.domain import AudioInput, CheckOptions, DialogueRequest, DialogueTurn, Method, TurnResult, TurnUpdate
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.engine.facade import Engine
from sleuthd.engine.stream import StreamSession
from sleuthd.judgment.calibration import turn_features
from sleuthd.judgment.dialogue import EncoderDialogue
from sleuthd.judgment.gram import SCALE_BITS, SortedPairs, cosines, gram, median_without, quantize, std_without
from sleuthd.judgment.options import ResolvedOptions
from sleuthd.ops.observe import NullObserver

from .reference_judge import ref_judge_dialogue, ref_turn_features
from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech

D = 32


def unit_rows(x: np.ndarray) -> np.ndarray:
    return np.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True))


def on_grid(x: np.ndarray) -> np.ndarray:
    """Unit rows rounded to the exact-cosine grid, so the reference's float64 cosines are the same numbers."""
    return quantize(unit_rows(x)) * 2.0**-SCALE_BITS


def speaker_turns(rng: np.random.Generator, n: int, dim: int = D, repeats: float = 0.3) -> np.ndarray:
    """n turns of one voice (noisy), some of them exact repeats of earlier ones (ties in every statistic)."""
    voice = rng.standard_normal(dim)
    rows = voice + rng.standard_normal((n, dim)) * rng.uniform(0.3, 1.2)
    for i in range(1, n):
        if rng.random() < repeats:
            rows[i] = rows[rng.integers(i)]
    return rows


# ---------------------------------------------------------------------------------------------- gram


def test_exact_cosines_do_not_depend_on_how_they_are_computed() -> None:
    rng = np.random.default_rng(0)
    x = unit_rows(rng.standard_normal((150, 256))).astype(np.float32)
    q = quantize(x)
    whole = gram(q)
    assert np.array_equal(whole, whole.T)
    for i in range(150):  # one matrix-vector product per new turn: the same bits
        assert np.array_equal(cosines(q[: i + 1], q[i : i + 1])[:, 0], whole[: i + 1, i])
    assert np.array_equal(cosines(q[::-1], q[::2]), whole[::-1, ::2])
    assert np.abs(whole - x.astype(np.float64) @ x.T.astype(np.float64)).max() < 1e-7


def test_non_unit_embeddings_are_refused() -> None:
    with pytest.raises(ValueError, match="unit length"):
        quantize(np.full((1, 4), 1.0))


def test_sorted_pairs_one_member_at_a_time_equal_sorting_at_once() -> None:
    rng = np.random.default_rng(1)
    q = quantize(on_grid(speaker_turns(rng, 40)))
    pairs = SortedPairs.of(gram(q[:2]))
    order = [0, 1]
    for new in range(2, 40):
        z = int(rng.integers(len(order) + 1))  # members may arrive in any order
        order.insert(z, new)
        pairs = pairs.inserted(gram(q[order]), z)
    at_once = SortedPairs.of(gram(q[order]))
    assert np.array_equal(pairs.values, at_once.values)
    g = gram(q[order])
    assert np.array_equal(g[pairs.a, pairs.b], pairs.values)  # ids still name the right members


@pytest.mark.parametrize("n", [2, 3, 4, 7, 30])
def test_statistics_without_one_element_equal_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal(n), np.round(rng.standard_normal(n), 1)):  # the second has ties
        rest = [np.delete(x, i) for i in range(n)]
        assert np.array_equal(median_without(x), [np.median(r) for r in rest])
        assert np.allclose(std_without(x), [r.std() for r in rest], rtol=0, atol=1e-14)
        g = gram(quantize(on_grid(rng.standard_normal((n + 1, D)))))
        pairs, m = SortedPairs.of(g), n + 1
        rows = np.arange(m)
        level = pairs.median_without(m, rows)
        mad = pairs.median_deviation_without(m, rows, level)
        for i in rows:
            others = np.delete(np.arange(m), i)
            values = g[np.ix_(others, others)][np.triu_indices(m - 1, 1)]
            assert level[i] == np.median(values)
            assert mad[i] == np.median(np.abs(values - level[i]))


# ---------------------------------------------------------------------------------------------- features


def test_vectorised_features_equal_the_reference_implementation() -> None:
    rng = np.random.default_rng(2)
    worst = 0.0
    for trial in range(250):
        n = int(rng.integers(1, 40)) if trial % 50 else int(rng.integers(60, 90))
        emb = on_grid(speaker_turns(rng, n, repeats=rng.choice([0.0, 0.3, 0.8])))
        reference = on_grid(emb[0] + rng.standard_normal(D) * 0.5) if rng.random() < 0.5 else None
        if n == 1 and reference is None:
            continue
        cohort = on_grid(rng.standard_normal((int(rng.integers(1, 4)), D))) if rng.random() < 0.6 else None
        seconds = rng.uniform(0.05, 6.0, n)
        want_variant, want = ref_turn_features(emb, reference, seconds, cohort)
        variant, got = turn_features(emb, reference, seconds, cohort)
        assert variant == want_variant
        worst = max(worst, float((np.abs(got - want) / np.maximum(1.0, np.abs(want))).max()))
    assert worst < 1e-12


# ---------------------------------------------------------------------------------------------- dialogues

METHODS = [
    (Method.PAIRWISE, CheckOptions(method=Method.PAIRWISE)),
    (Method.CENTROID, CheckOptions(method=Method.CENTROID)),
    (Method.REFERENCE, CheckOptions(method=Method.REFERENCE)),
    (Method.AUTO, CheckOptions(method=Method.AUTO)),
]


def random_dialogue(
    rng: np.random.Generator, n: int, speakers: int, every_reference: bool
) -> tuple[list[tuple[str, str]], list[ClipEmbedding], dict[str, np.ndarray]]:
    """Turns of a few noisy voices, some replaced by another voice, a few too short to use, some repeated."""
    voices = [rng.standard_normal(256) for _ in range(speakers)]
    turns, clips = [], []
    for i in range(n):
        s = int(rng.integers(speakers))
        voice = voices[int(rng.integers(speakers))] if rng.random() < 0.1 else voices[s]
        e = unit_rows(voice + rng.standard_normal(256) * rng.uniform(0.5, 1.2)).astype(np.float32)
        if i and rng.random() < 0.2:  # the same clip again: exact ties
            j = int(rng.integers(i))
            e, s = clips[j].embedding if clips[j].embedding is not None else e, int(turns[j][1][1:])
        usable = rng.random() > 0.08
        turns.append((f"t{i}", f"s{s}"))
        clips.append(
            ClipEmbedding(
                3.0, float(rng.uniform(0.3, 5.0)), e if usable else None, None, None, "" if usable else "short"
            )
        )
    named = {s for _, s in turns}
    references = {
        s: unit_rows(voices[int(s[1:])] + rng.standard_normal(256) * 0.8).astype(np.float32)
        for s in sorted(named)
        if every_reference or rng.random() < 0.5
    }
    return turns, clips, references


def state(opts: ResolvedOptions, references: dict[str, np.ndarray]) -> EncoderDialogue:
    return EncoderDialogue("d", opts, references, NullObserver())


def assert_close(got: TurnResult, want: TurnResult) -> None:
    for f in fields(TurnResult):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, float):
            assert a == pytest.approx(b, abs=1e-5), f.name
        else:
            assert a == b, (f.name, got.turn_id, a, b)


@pytest.mark.parametrize(("method", "options"), METHODS, ids=[m.value for m, _ in METHODS])
def test_dialogue_verdicts_equal_the_reference_judge(engine: Engine, method: Method, options: CheckOptions) -> None:
    opts = engine.resolve(options)
    rng = np.random.default_rng(3)
    for _ in range(12):
        n, speakers = int(rng.integers(1, 16)), int(rng.integers(1, 4))
        turns, clips, references = random_dialogue(rng, n, speakers, method is Method.REFERENCE)
        want_turns, want_speakers = ref_judge_dialogue(turns, clips, references, opts.judgment)
        s = state(opts, references)
        for position, ((turn_id, speaker), clip) in enumerate(zip(turns, clips, strict=True)):
            s.add_clip(turn_id, speaker, position, clip)
        got_turns, got_speakers = s.judge()
        assert got_speakers == want_speakers
        for got, want in zip(got_turns, want_turns, strict=True):
            assert_close(got, want)


@pytest.mark.parametrize(("method", "options"), METHODS, ids=[m.value for m, _ in METHODS])
def test_streamed_updates_equal_check_of_every_prefix(engine: Engine, method: Method, options: CheckOptions) -> None:
    opts = engine.resolve(options)
    rng = np.random.default_rng(4)
    revisions = 0
    for _ in range(4):
        turns, clips, references = random_dialogue(rng, 45, int(rng.integers(1, 4)), method is Method.REFERENCE)
        arrival = list(range(len(turns)))
        for i in range(len(arrival) - 1):  # turns open together may finish out of order
            if rng.random() < 0.25:
                arrival[i], arrival[i + 1] = arrival[i + 1], arrival[i]
        streamed = state(opts, references)
        last: dict[str, object] = {}
        done: list[int] = []
        for i in arrival:
            streamed.add_clip(turns[i][0], turns[i][1], i, clips[i])
            updates = streamed.updates(turns[i][0])
            done.append(i)
            fresh = state(opts, references)
            for j in sorted(done):
                fresh.add_clip(turns[j][0], turns[j][1], j, clips[j])
            want_turns, want_speakers = fresh.judge()
            want = {t.turn_id: t for t in want_turns}
            speakers = {v.speaker: v for v in want_speakers}
            assert updates[0].verdict == want[turns[i][0]] and not updates[0].revision
            revised = {u.verdict.turn_id for u in updates[1:]}
            for u in updates:
                assert u.verdict == want[u.verdict.turn_id] and u.speaker == speakers[u.verdict.speaker]
                assert u.trigger_turn_id == turns[i][0]
            # Revisions: exactly the earlier turns whose status changed, in dialogue order.
            changed = {t for t, s in last.items() if s is not want[t].status}
            assert revised == changed and all(u.revision for u in updates[1:])
            revisions += len(revised)
            positions = [int(u.verdict.turn_id[1:]) for u in updates[1:]]
            assert positions == sorted(positions)
            last = {t: v.status for t, v in want.items()}
        assert streamed.judge() == fresh.judge()
    # Against a fixed reference a verdict never changes; the other methods compare turns with each other.
    assert revisions == 0 if method is Method.REFERENCE else revisions > 0


# ---------------------------------------------------------------------------------------------- real speech


async def test_long_real_dialogue_streamed_equals_check_dialogue(engine: Engine, speech: Speech) -> None:
    """300 turns of four real synthetic voices (reused clips: cached embeddings and exact ties), now and
    then one speaker's turn spoken by another voice, references for two speakers, method auto, through
    the engine side of StreamDialogue. Every streamed verdict equals the verdict of the turns streamed so
    far judged at once; the stream's final verdict equals the engine's CheckDialogue."""
    rnd = random.Random(5)
    cast = {"Ann": VOICE_A, "Bob": VOICE_B, "Fay": VOICE_F, "Cat": VOICE_C}
    script = []
    for k in range(300):
        speaker = rnd.choice(list(cast))
        voice = cast[speaker] if rnd.random() > 0.05 else cast[rnd.choice([s for s in cast if s != speaker])]
        script.append((f"t{k:03d}", speaker, speech.wav_bytes(voice, rnd.randrange(6))))
    references = {s: AudioInput(speech.wav_bytes(cast[s], 6)) for s in ("Ann", "Fay")}
    options = CheckOptions(method=Method.AUTO)

    session = StreamSession(engine)
    await session.open("long", references, options)
    finished: list[tuple[int, list[TurnUpdate]]] = []  # in the order turns finished
    k = 0
    while k < len(script):
        # Now and then two turns are open together and the later one finishes first.
        pair = [k, k + 1] if k % 37 == 5 else [k]
        for j in pair:
            session.start_turn(script[j][0], script[j][1], j, None)
            session.add_audio(script[j][0], script[j][2])
        for j in reversed(pair):
            finished.append((j, await session.finish_turn(script[j][0])))
        k += len(pair)
    final = await session.close()

    opts = engine.resolve(options)
    refs = (await engine.open_dialogue("long", references, opts, None)).references
    clips = [(await engine.embedder.embed_audio(opts.encoder, [(AudioInput(data), t)]))[0] for t, _, data in script]
    for step, (j, updates) in enumerate(finished):
        fresh = EncoderDialogue("long", opts, refs, NullObserver())
        for i in sorted(i for i, _ in finished[: step + 1]):
            fresh.add_clip(script[i][0], script[i][1], i, clips[i])
        turns, speakers = fresh.judge()
        want = {t.turn_id: t for t in turns}
        assert updates[0].verdict == want[script[j][0]]
        for u in updates:
            assert u.verdict == want[u.verdict.turn_id]
            assert u.speaker == next(v for v in speakers if v.speaker == u.verdict.speaker)
    assert sum(len(u) - 1 for _, u in finished) > 0  # earlier verdicts were revised along the way

    request = DialogueRequest(
        "long", tuple(DialogueTurn(t, s, audio=AudioInput(data)) for t, s, data in script), references, options
    )
    assert await engine.check_dialogue(request) == final

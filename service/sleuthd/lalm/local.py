"""The in-process judge model: a Qwen2-Audio or Qwen2.5-Omni (thinker) checkpoint run with transformers.

torch and transformers are imported when :meth:`LocalModel.load` runs, never at import time, so a server
without the ``judge`` extra starts. The request path, one prompt at a time up to one model call a batch:

    prompt → :meth:`LocalModel.prepare` (any thread: chat template, placeholder expansion, log-mel features)
          → :meth:`LocalModel.run` (the model thread: encode each distinct clip once, scatter into the token
            embeddings, run the language model with left padding, read the final position's hidden state)
          → answer log-probabilities from the LM head's answer rows and a log-normaliser over the vocabulary

Reading the final hidden state instead of calling ``forward`` keeps logits at (batch × vocabulary) for
one position, never (batch × length × vocabulary), which for eight 560-token prompts with a Qwen
vocabulary is 2.6 GB. A clip longer than the model's audio window is refused (the feature extractor would
otherwise cut it silently). Prompts are rendered with sleuthd's own chat template for the architecture
(:mod:`sleuthd.lalm.templates`), the one a vLLM server is started with, so both backends hear the same tokens.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.config import ConfigError
from sleuthd.errors import EngineFailure, InvalidRequest
from sleuthd.lalm.audio_encoder import AudioEncoder, audio_tokens
from sleuthd.lalm.calibration import weights_sha256
from sleuthd.lalm.checkpoint import chat_template, detect_architecture
from sleuthd.lalm.prompts import Answer, Prompt
from sleuthd.lalm.templates import template_text
from sleuthd.lalm.types import SAMPLE_RATE, AnswerScores, BatchTooLarge, Clip

logger = logging.getLogger(__name__)

__all__ = ["LocalModel", "Prepared", "audio_tokens"]

# Vocabulary rows per step when the log-normaliser is computed in float32 from half-precision weights.
VOCAB_CHUNK = 8192


@dataclass(frozen=True)
class Prepared:
    """A prompt ready for a model call: token ids (audio placeholders expanded) and clips in order."""

    input_ids: tuple[int, ...]
    clips: tuple[Clip, ...]  # in the order of their placeholders
    answer_ids: tuple[tuple[int, ...], ...]  # per answer option, the token ids of its spellings

    @property
    def tokens(self) -> int:
        return len(self.input_ids)


class LocalModel:
    """One loaded judge checkpoint. :meth:`run` must be called from one thread at a time."""

    def __init__(
        self,
        folder: Path,
        arch: str,
        model: Any,
        tokenizer: Any,
        features: Any,
        chat_template: str,
        device: Any,
        dtype: Any,
        encoder_cache_entries: int,
        weights_sha256: str,
    ) -> None:
        """Wrap loaded parts (use :meth:`load`); ``model`` is the Qwen2-Audio model or the Omni thinker."""
        import torch

        self._torch = torch
        self.folder = folder
        self.name = folder.name
        self.arch = arch
        self.model = model
        self.tokenizer = tokenizer
        self.features = features
        self.chat_template = chat_template
        self.device = device
        self.dtype = dtype
        self.weights_sha256 = weights_sha256
        config = model.config
        self.audio_token_id = int(config.audio_token_id)
        self.audio_token = tokenizer.convert_ids_to_tokens(self.audio_token_id)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.window_samples = int(features.n_samples)
        self.max_clip_seconds = self.window_samples / SAMPLE_RATE
        if arch == "qwen2-audio":
            expected = config.audio_config.max_source_positions * 2
            if features.nb_max_frames != expected:
                raise ConfigError(
                    f"{folder}: the feature extractor makes {features.nb_max_frames} mel frames per clip but the "
                    f"audio encoder takes exactly {expected}"
                )
        # HF tokenizers mutate their Rust backend's padding/truncation state per call: concurrent calls
        # from the prepare threads can fail with "Already borrowed", so tokenising is serialised (it is fast).
        self._tokenizing = threading.Lock()
        self._lm_head = model.lm_head.weight  # (vocab, hidden)
        self._answer_cache: dict[Answer, tuple[int, ...]] = {}
        self._encoded: OrderedDict[str, Any] = OrderedDict()  # clip key → (audio tokens, hidden) on device
        self._cache_entries = encoder_cache_entries
        # Real frames only (False: every Qwen2-Audio clip padded to the 30 s window, for comparison).
        self.audio = AudioEncoder(arch, model.model, features, device, dtype)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        folder: Path,
        device: str = "auto",
        dtype: str = "auto",
        encoder_cache_entries: int = 64,
        weights: str = "",
    ) -> LocalModel:
        """Load a model folder; ``device`` auto|cpu|cuda, ``dtype`` auto|float32|bfloat16|float16;
        ``weights``: the folder's :func:`weights_sha256` when the caller has it already."""
        folder = Path(folder)
        arch = detect_architecture(folder)
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise ConfigError(
                f"the in-process judge needs torch and transformers ({exc.name} is missing): "
                "pip install 'sleuthd[judge]'"
            ) from exc
        transformers.utils.logging.disable_progress_bar()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("judge_device=cuda but torch sees no CUDA device")
        if dtype == "auto":
            dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device == "cuda" else "float32"
        torch_dtype = getattr(torch, dtype)
        model_cls: Any
        if arch == "qwen2-audio":
            model_cls = transformers.Qwen2AudioForConditionalGeneration
        else:
            # Loads the thinker alone from a full Qwen2.5-Omni folder too (the talker's weights are skipped).
            model_cls = transformers.Qwen2_5OmniThinkerForConditionalGeneration
        model = model_cls.from_pretrained(folder, dtype=torch_dtype, attn_implementation="sdpa")
        model = model.to(device).eval().requires_grad_(False)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        # Only the audio front end: the Omni processor also wants a video processor (torchvision) we never use.
        features = transformers.AutoFeatureExtractor.from_pretrained(folder)
        chat_template(folder, tokenizer)  # a folder without one is a base model, which would not answer
        template = template_text(arch)
        logger.info("judge %s (%s) loaded on %s in %s", folder.name, arch, device, dtype)
        return cls(
            folder,
            arch,
            model,
            tokenizer,
            features,
            template,
            torch.device(device),
            torch_dtype,
            encoder_cache_entries,
            weights or weights_sha256(folder),
        )

    # ------------------------------------------------------------------ preparing (any thread)

    def answer_ids(self, answer: Answer) -> tuple[int, ...]:
        """Token ids of the answer's spellings that are one token each in this vocabulary."""
        ids = self._answer_cache.get(answer)
        if ids is None:
            found = []
            for spelling in answer.spellings:
                with self._tokenizing:
                    toks = self.tokenizer.encode(spelling, add_special_tokens=False)
                if len(toks) == 1:
                    found.append(int(toks[0]))
            if not found:
                raise EngineFailure(f"judge {self.name}: no spelling of answer {answer.label!r} is a single token")
            ids = tuple(dict.fromkeys(found))
            self._answer_cache[answer] = ids
        return ids

    def render(self, prompt: Prompt) -> str:
        """The prompt through the model's chat template, one audio placeholder per clip."""
        messages = prompt.messages(lambda _clip: {"type": "audio"})
        text: str = self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
        )
        return text

    def prepare(self, prompt: Prompt) -> Prepared:
        """Tokenise ``prompt`` with each audio placeholder expanded to its clip's audio-token count."""
        self.check_lengths(prompt.clips)
        with self._tokenizing:
            ids = self.tokenizer.encode(self.render(prompt), add_special_tokens=False)
        order = [prompt.clips[p] for p in prompt.parts if isinstance(p, int)]
        return self.expand(ids, order, prompt.answers)

    def check_lengths(self, clips: Sequence[Clip]) -> None:
        """Refuse a clip longer than the model's audio window (it would be cut, and the question change)."""
        for i, clip in enumerate(clips):
            if len(clip.samples) > self.window_samples:
                raise InvalidRequest(
                    f"audio input {i + 1} of the judge prompt is {clip.seconds:.1f} s; {self.name} hears at most "
                    f"{self.max_clip_seconds:.0f} s per clip and longer clips are not cut: send a shorter excerpt"
                )

    def expand(self, ids: Sequence[int], clips: Sequence[Clip], answers: Sequence[Answer]) -> Prepared:
        """Rendered token ids with one placeholder per clip (in order) → each placeholder repeated once per
        audio token of its clip; ``answers`` → their token ids."""
        ids = list(ids)
        if ids.count(self.audio_token_id) != len(clips):
            raise EngineFailure(
                f"judge {self.name}: its chat template rendered {ids.count(self.audio_token_id)} audio placeholders "
                f"for {len(clips)} clips"
            )
        expanded: list[int] = []
        k = 0
        for tok in ids:
            if tok == self.audio_token_id:
                expanded.extend([tok] * audio_tokens(self.audio.mel_frames(clips[k])))
                k += 1
            else:
                expanded.append(tok)
        return Prepared(tuple(expanded), tuple(clips), tuple(self.answer_ids(a) for a in answers))

    # ------------------------------------------------------------------ running (the model thread)

    def run(self, batch: Sequence[Prepared]) -> list[AnswerScores]:
        """One model call for the batch; raises :class:`BatchTooLarge` when it runs out of memory."""
        torch = self._torch
        hidden = self.final_hidden(batch)  # (B, H) float32
        with torch.inference_mode():
            log_norm = self._log_norm(hidden)  # (B,)
            scores = []
            for b, item in enumerate(batch):
                option_lps = []
                for ids in item.answer_ids:
                    rows = self._lm_head[list(ids)].float()  # (spellings, H): only the answer rows
                    option_lps.append(float(torch.logsumexp(rows @ hidden[b] - log_norm[b], dim=0)))
                mass = float(np.exp(option_lps).sum())
                scores.append(AnswerScores(tuple(option_lps), min(mass, 1.0)))
        return scores

    def top_log_probs(self, batch: Sequence[Prepared], k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely first tokens of each prompt with their log-probabilities (what an
        OpenAI-compatible server reports as ``top_logprobs``)."""
        torch = self._torch
        hidden = self.final_hidden(batch)
        w = self._lm_head
        out = []
        with torch.inference_mode():
            for b in range(len(batch)):
                # Float32 logits over the vocabulary, one chunk of half-precision rows at a time.
                logits = torch.cat([w[i : i + VOCAB_CHUNK].float() @ hidden[b] for i in range(0, len(w), VOCAB_CHUNK)])
                values, ids = torch.topk(torch.log_softmax(logits, dim=0), k)
                out.append([(int(i), float(v)) for i, v in zip(ids, values, strict=True)])
        return out

    def final_hidden(self, batch: Sequence[Prepared]) -> Any:
        """(batch, hidden) float32: the language model's last hidden state at each prompt's final position."""
        torch = self._torch
        try:
            with torch.inference_mode():
                return self._forward(batch)
        except torch.OutOfMemoryError as exc:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            tokens = len(batch) * max(p.tokens for p in batch)
            raise BatchTooLarge(f"out of memory for {len(batch)} prompts ({tokens} padded tokens)") from exc

    def _forward(self, batch: Sequence[Prepared]) -> Any:
        torch = self._torch
        audio = self._encode_clips([c for p in batch for c in p.clips])
        width = max(p.tokens for p in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, p in enumerate(batch):  # left padding: every prompt's last token is at the final position
            ids[b, width - p.tokens :] = torch.tensor(p.input_ids)
            mask[b, width - p.tokens :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        inner = self.model.model
        embeds = inner.get_input_embeddings()(ids)
        if audio:
            rows = torch.cat([audio[c.key] for p in batch for c in p.clips]).to(embeds.dtype)
            slots = (ids == self.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(slots, rows)
        if self.arch == "qwen2-audio":
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        else:
            # The thinker's own (multimodal) RoPE index; for audio-only prompts it reduces to 1-D positions.
            positions, _ = inner.get_rope_index(ids, None, None, mask, False, None, None)
        out = inner.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False)
        return out.last_hidden_state[:, -1, :].float()

    def _encode_clips(self, clips: Sequence[Clip]) -> dict[str, Any]:
        """Audio-encoder output, (audio tokens, hidden), for each distinct clip; repeated clips reuse it."""
        found: dict[str, Any] = {}
        todo: dict[str, Clip] = {}
        for c in clips:
            if c.key in found or c.key in todo:
                continue
            hit = self._encoded.get(c.key)
            if hit is not None:
                self._encoded.move_to_end(c.key)
                found[c.key] = hit
            else:
                todo[c.key] = c
        for batch in self.audio.batches(list(todo.values())):
            for c, emb in zip(batch, self.audio.encode(batch), strict=True):
                found[c.key] = emb
                if self._cache_entries:
                    self._encoded[c.key] = emb
                    if len(self._encoded) > self._cache_entries:
                        self._encoded.popitem(last=False)
        return found

    def _log_norm(self, hidden: Any) -> Any:
        """(B,) log of the softmax normaliser over the whole vocabulary, in float32."""
        torch = self._torch
        w = self._lm_head
        if w.dtype == torch.float32:
            return torch.logsumexp(hidden @ w.T, dim=-1)
        parts = [
            torch.logsumexp(hidden @ w[i : i + VOCAB_CHUNK].float().T, dim=-1) for i in range(0, len(w), VOCAB_CHUNK)
        ]
        return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)

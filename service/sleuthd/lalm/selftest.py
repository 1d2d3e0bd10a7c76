"""The judge's start-up self-test: one real prompt before the server reports SERVING.

A judge that cannot hear its prompts fails here, with one line that names the fix, instead of failing (or
answering nonsense) on every request:

- remote: the server must render the judge's prompt exactly as sleuthd's template does (the prompt as the
  server tokenizes it, ``POST /tokenize`` with the messages, against sleuthd's template rendered here and
  tokenized by the server; the audio placeholders the server may have expanded are counted once). This
  also tells which architecture it serves. A server whose template renders no audio placeholder refuses
  the prompt (vLLM: "Expected there to be N prompt updates corresponding to N audio items…") or renders
  other tokens: either way, the line says to start vLLM with sleuthd's ``--chat-template``;
- both backends: a plain detection prompt (synthetic voices) must get an answer: at least
  :data:`SELF_TEST_MIN_MASS` of the first token's probability on Yes/No (or the judge's floor,
  ``--judge-min-answer-mass``, when that is lower). A model that does not follow the prompt, or a template that
  garbles it, puts a few hundredths there; a working judge most of it. The bar is not the floor itself: an
  operator's strict floor must not stop a judge that answers from starting (its low-mass turns are UNCERTAIN);
- remote: whether the server takes clips by reference (vLLM's media uuids), so that a dialogue's reference
  is sent once, not with every prompt.
"""

from __future__ import annotations

import logging
from typing import Any

from sleuthd.config import ConfigError
from sleuthd.errors import EngineFailure
from sleuthd.lalm import prompts
from sleuthd.lalm.templates import ARCHITECTURES, TEMPLATE_HINT, render
from sleuthd.lalm.tiny import synthetic_voice
from sleuthd.lalm.types import AnswerScores, Clip, JudgeDeploymentError

logger = logging.getLogger(__name__)

AUDIO_PLACEHOLDER = "<|AUDIO|>"  # the Qwen audio placeholder token, in both architectures
# Least answer mass (0-1) on the self-test prompt for the judge to start.
SELF_TEST_MIN_MASS = 0.25


def self_test_prompt() -> prompts.Prompt:
    """A detection prompt over synthetic voices: a reference, one other turn, the turn to check."""
    voices = ((125.0, 2.5), (128.0, 1.5), (130.0, 2.0))  # pitch (Hz), seconds
    ref, other, test = (Clip.of(synthetic_voice(hz, seconds, i)) for i, (hz, seconds) in enumerate(voices))
    return prompts.detection(test, ref, [other])


async def run_self_test(scorer: Any, min_answer_mass: float) -> str:
    """Run the self-test on ``scorer`` (a LocalScorer or RemoteScorer); raises ConfigError (one line) when the
    judge cannot work; returns what it found, for the start-up log."""
    from sleuthd.lalm.remote import RemoteScorer

    prompt = self_test_prompt()
    found = []
    if isinstance(scorer, RemoteScorer):
        scorer.architecture = await _served_architecture(scorer, prompt)
        found.append(f"renders prompts as sleuthd's {scorer.architecture} template" if scorer.architecture else "")
    try:
        scores: AnswerScores = await scorer.score(prompt)
    except (JudgeDeploymentError, EngineFailure) as exc:
        raise ConfigError(f"the judge {scorer.model_name} could not answer its self-test prompt: {exc}") from None
    bar = min(min_answer_mass, SELF_TEST_MIN_MASS)
    if scores.answer_mass < bar:
        raise ConfigError(
            f"the judge {scorer.model_name} put {scores.answer_mass:.3f} of its first-token probability on Yes/No "
            f"for its self-test prompt, under {bar:.2f}: it does not answer the judge's question; check the model "
            f"(an instruction-tuned checkpoint) and its chat template ({TEMPLATE_HINT})"
        )
    found.append(f"answer mass {scores.answer_mass:.3f}")
    if isinstance(scorer, RemoteScorer):
        exact = "exact" if scores.exact else "top-k only (it ignores logprob_token_ids: answers outside are bounded)"
        found.append(f"answer log-probabilities {exact}")
        reuse = await scorer.probe_references(prompt)
        found.append("clips sent once, then by reference" if reuse else "every prompt carries its clips in full")
    return "; ".join(f for f in found if f)


async def _served_architecture(scorer: Any, prompt: prompts.Prompt) -> str:
    """The architecture whose sleuthd template the server renders ``prompt`` with; ConfigError when none;
    "" when the server cannot tokenize chat messages (the check is skipped, with a warning)."""
    try:
        served = await scorer.tokenize_chat(prompt)
    except JudgeDeploymentError as exc:
        if "placeholder" in str(exc) or "prompt updates" in str(exc):
            raise ConfigError(f"judge endpoint {scorer.endpoint} cannot render the judge's prompts: {exc}") from None
        logger.warning(
            "judge endpoint %s could not tokenize a chat prompt (%s): its rendering is not checked",
            scorer.endpoint,
            exc,
        )
        return ""
    (audio,) = await scorer.tokenize_text(AUDIO_PLACEHOLDER)
    collapsed = [t for i, t in enumerate(served) if t != audio or i == 0 or served[i - 1] != audio]
    placeholders = collapsed.count(audio)
    for arch in ARCHITECTURES:
        ours = await scorer.tokenize_text(render(arch, prompt.messages(lambda _clip: {"type": "audio"})))
        if ours == collapsed:
            return arch
    raise ConfigError(
        f"judge endpoint {scorer.endpoint} renders the judge's prompt differently from sleuthd's templates "
        f"({len(collapsed)} tokens with {placeholders} audio placeholders for {len(prompt.clips)} clips): "
        f"{TEMPLATE_HINT}"
    )

"""Every word the judge says to the model, in one place.

Design (from the SpeakerSleuth findings): prompts carry audio only — no transcripts, since text context
makes LALMs judge textual coherence and ignore the voices — with a reference recording of the target
speaker; every clip is its own audio input preceded by its own label; candidates for discrimination are
labelled options. The answer is one token read from the model's first-token distribution, so the
question ends by asking for exactly that token.

Changing any wording changes what the model's probabilities mean: bump :data:`PROMPT_VERSION`, which
invalidates calibrations fitted on the old wording (they record the version they were fitted with).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sleuthd.errors import InvalidRequest
from sleuthd.lalm.types import Clip

PROMPT_VERSION = "1"

SYSTEM = (
    "You compare voices. Decide only from who is speaking: timbre, pitch, accent and voice quality. "
    "Ignore what is said, the language, background noise and recording quality."
)

# Letters for candidate options; each is one token in the Qwen vocabulary.
OPTION_LETTERS = string.ascii_uppercase[:10]


@dataclass(frozen=True)
class Answer:
    """One answer option: its canonical spelling and every single-token spelling counted for it."""

    label: str
    spellings: tuple[str, ...]


SAME = Answer("Yes", ("Yes", "yes", "YES"))
DIFFERENT = Answer("No", ("No", "no", "NO"))


def option_answer(letter: str) -> Answer:
    # Upper case only: a lower-case "a" is as likely the start of a sentence as an answer.
    return Answer(letter, (letter,))


@dataclass(frozen=True)
class Prompt:
    """A chat prompt: a system message and one user message of text parts and audio parts.

    ``parts`` holds text, or the index of a clip in ``clips``; ``answers`` are the options whose
    first-token probabilities are read.
    """

    system: str
    parts: tuple[str | int, ...]
    clips: tuple[Clip, ...]
    answers: tuple[Answer, ...]

    def messages(self, audio_part: Callable[[Clip], dict[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI-style chat messages; ``audio_part`` renders one clip as a content part."""
        content: list[dict[str, Any]] = []
        for part in self.parts:
            if isinstance(part, str):
                content.append({"type": "text", "text": part})
            else:
                content.append(audio_part(self.clips[part]))
        return [{"role": "system", "content": self.system}, {"role": "user", "content": content}]

    @property
    def audio_seconds(self) -> float:
        return sum(c.seconds for c in self.clips)


class _Builder:
    def __init__(self) -> None:
        self.parts: list[str | int] = []
        self.clips: list[Clip] = []

    def text(self, text: str) -> None:
        self.parts.append(text)

    def audio(self, label: str, clip: Clip) -> None:
        self.parts.append(label)
        self.parts.append(len(self.clips))
        self.clips.append(clip)
        self.parts.append("\n")

    def anchors(self, reference: Clip | None, context: Sequence[Clip], context_heading: str) -> str:
        """Reference and context clips; returns how the question should name them."""
        if reference is None and not context:
            raise InvalidRequest("the judge needs a reference clip or at least one other turn of the speaker")
        if reference is not None:
            self.audio("Reference recording of the target speaker:\n", reference)
        if context:
            self.text(context_heading if reference is not None else "Recordings of the target speaker:\n")
            for i, clip in enumerate(context, 1):
                self.audio(f"Recording {i}:\n", clip)
        return "the reference recording" if reference is not None else "these recordings"


def detection(test: Clip, reference: Clip | None, context: Sequence[Clip] = ()) -> Prompt:
    """Is ``test`` spoken by the speaker of ``reference`` (and of the speaker's other turns ``context``)?

    Answers: Yes (same speaker) / No (a different speaker).
    """
    b = _Builder()
    anchor = b.anchors(reference, context, "More recordings attributed to the same speaker (some may be wrong):\n")
    b.audio("Recording to check:\n", test)
    b.text(f"Is the recording to check spoken by the same person as {anchor}? Reply with one word: Yes or No.")
    return Prompt(SYSTEM, tuple(b.parts), tuple(b.clips), (SAME, DIFFERENT))


def discrimination(candidates: Sequence[Clip], reference: Clip | None, context: Sequence[Clip] = ()) -> Prompt:
    """Which of ``candidates`` (labelled A, B, … in the given order) sounds most like the target speaker?"""
    if len(candidates) < 2:
        raise InvalidRequest(f"discrimination needs at least 2 candidates, got {len(candidates)}")
    if len(candidates) > len(OPTION_LETTERS):
        raise InvalidRequest(
            f"the judge compares at most {len(OPTION_LETTERS)} candidates in one prompt, got {len(candidates)}; "
            "send fewer candidates or rank with an embedding method"
        )
    b = _Builder()
    b.anchors(reference, context, "Other recordings of the same speaker:\n")
    b.text("Candidate recordings:\n")
    letters = OPTION_LETTERS[: len(candidates)]
    for letter, clip in zip(letters, candidates, strict=True):
        b.audio(f"Option {letter}:\n", clip)
    b.text(
        "Which option sounds most like the target speaker? "
        f"Reply with one letter only: {', '.join(letters[:-1])} or {letters[-1]}."
    )
    return Prompt(SYSTEM, tuple(b.parts), tuple(b.clips), tuple(option_answer(x) for x in letters))

"""The chat templates the judge renders its prompts with, one per architecture, shipped with sleuthd.

The template is part of the prompt: the in-process judge renders with it whatever template the checkpoint
folder carries, and a vLLM server must be started with the same file (``--chat-template``, see
docs/judge.md), so both backends hear exactly the same tokens. Older checkpoint templates recognise an
audio part only by an ``audio`` key, which the ``{"type": "audio"}`` parts that vLLM and transformers pass
do not have: they render no audio placeholder at all.

    python -c "from sleuthd.lalm.templates import template_path; print(template_path('qwen2-audio'))"
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

ARCHITECTURES = ("qwen2-audio", "qwen2.5-omni")


def template_path(arch: str) -> Path:
    """The template file for ``arch`` ("qwen2-audio" or "qwen2.5-omni"), as installed."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"no judge chat template for {arch!r}; there are: {', '.join(ARCHITECTURES)}")
    return Path(str(importlib.resources.files(__name__) / f"{arch}.jinja"))


def template_text(arch: str) -> str:
    """The template for ``arch`` as text."""
    return template_path(arch).read_text(encoding="utf-8")

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
from typing import Any

ARCHITECTURES = ("qwen2-audio", "qwen2.5-omni")

# What to tell an operator whose vLLM renders the judge's prompts differently.
TEMPLATE_HINT = (
    "start vLLM with --chat-template set to sleuthd's template for the model "
    "(python -c \"from sleuthd.lalm.templates import template_path; print(template_path('qwen2-audio'))\"; "
    "'qwen2.5-omni' for Qwen2.5-Omni) and --chat-template-content-format openai (docs/judge.md)"
)


def template_path(arch: str) -> Path:
    """The template file for ``arch`` ("qwen2-audio" or "qwen2.5-omni"), as installed."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"no judge chat template for {arch!r}; there are: {', '.join(ARCHITECTURES)}")
    return Path(str(importlib.resources.files(__name__) / f"{arch}.jinja"))


def template_text(arch: str) -> str:
    """The template for ``arch`` as text."""
    return template_path(arch).read_text(encoding="utf-8")


def render(arch: str, messages: list[dict[str, Any]]) -> str:
    """``messages`` through the template for ``arch`` with a generation prompt, as transformers'
    ``apply_chat_template`` renders it (a sandboxed Jinja environment, blocks trimmed), without transformers."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template_text(arch)).render(messages=messages, add_generation_prompt=True)

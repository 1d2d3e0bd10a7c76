"""What a judge model folder holds: its architecture (from config.json) and its chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sleuthd.config import ConfigError

# config.json model_type → the architecture name used in options, logs and GetServerInfo.
ARCHITECTURES = {"qwen2_audio": "qwen2-audio", "qwen2_5_omni": "qwen2.5-omni", "qwen2_5_omni_thinker": "qwen2.5-omni"}


def detect_architecture(folder: Path) -> str:
    """The judge architecture of a model folder, from its config.json."""
    path = Path(folder) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type", "")
    except FileNotFoundError:
        raise ConfigError(f"{folder} is not a model folder: it has no config.json") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from exc
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"{folder}: model_type {model_type!r} is not a supported judge; supported: {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type]


def chat_template(folder: Path, tokenizer: Any) -> str:
    """The checkpoint's chat template: chat_template.jinja, chat_template.json, or the tokenizer's."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    js = folder / "chat_template.json"
    if js.exists():
        return str(json.loads(js.read_text())["chat_template"])
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.chat_template)
    raise ConfigError(
        f"{folder} has no chat template (chat_template.jinja/.json or in tokenizer_config.json): the judge needs "
        "an instruction-tuned checkpoint (e.g. Qwen2-Audio-7B-Instruct, Qwen2.5-Omni-7B)"
    )

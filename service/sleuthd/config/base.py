"""The machinery behind sleuthd.config: option fields, flags generated from them, SLEUTHD_* variables.

Only the standard library is imported here: the client and the tools read these defaults too.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

ENV_PREFIX = "SLEUTHD_"
# Where clients look for a server when told nothing else (`sleuthd serve` listens there by default).
DEFAULT_TARGET = "127.0.0.1:50051"


class ConfigError(ValueError):
    """An option has a value that cannot work; the message names the option and what it accepts."""


def option(default: Any = dataclasses.MISSING, *, help: str, factory: Any = None, flag: str = "") -> Any:
    """A config field: ``help`` becomes the flag's help text; ``flag`` overrides its name."""
    meta = {"help": help, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def default_models_dir() -> Path:
    """$SLEUTHD_MODELS_DIR, else the repository's models/ when running from a checkout, else ./models."""
    if ENV_PREFIX + "MODELS_DIR" in os.environ:
        return Path(os.environ[ENV_PREFIX + "MODELS_DIR"])
    checkout = Path(__file__).resolve().parents[3] / "models"
    return checkout if checkout.is_dir() else Path("models")


def _positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):  # also refuses NaN
        raise ConfigError(f"{name} must be more than 0, got {value!r}")


def _at_least(config: Any, name: str, low: float) -> None:
    value = getattr(config, name)
    if not value >= low:  # also refuses NaN
        bound = "0 or more" if low == 0 else ("more than 0" if low < 1 else f"at least {low:g}")
        raise ConfigError(f"{name} must be {bound}, got {value}")


# ---------------------------------------------------------------------------------------------- CLI


def _flag(f: dataclasses.Field[Any]) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def _env_name(f: dataclasses.Field[Any]) -> str:
    return ENV_PREFIX + (f.metadata.get("flag") or f.name).upper()


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def _parse(kind: Any, text: str, what: str) -> Any:
    """A string (from the environment) as the field's type."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        if text not in choices:
            raise ConfigError(f"{what}={text!r} is not one of: {', '.join(choices)}")
        return text
    try:
        return {int: int, float: float, str: str, Path: Path}[kind](text)
    except (KeyError, ValueError):
        raise ConfigError(f"{what}={text!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def add_cli_args(parser: argparse.ArgumentParser, cls: type, env: Mapping[str, str] | None = None) -> None:
    """Add one flag per field of config dataclass ``cls`` (nested config dataclasses are flattened).

    Defaults come from ``SLEUTHD_<FIELD>`` in ``env`` (default: the process environment), else from
    the dataclass; the help text shows the default and the variable's name. A malformed environment
    value raises :class:`ConfigError` naming the variable.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            add_cli_args(parser, kind, environ)
            continue
        default = _default(f)
        if _env_name(f) in environ:
            default = _parse(kind, environ[_env_name(f)], _env_name(f))
        choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
        parser.add_argument(
            _flag(f),
            dest=f.name,
            type=str if choices else kind,
            choices=choices,
            default=default,
            help=f"{f.metadata['help']} (default: {default}; env {_env_name(f)})",
        )


def from_cli_args(cls: type, args: argparse.Namespace) -> Any:
    """Build config dataclass ``cls`` from arguments parsed with :func:`add_cli_args`."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        nested = isinstance(kind, type) and dataclasses.is_dataclass(kind)
        values[f.name] = from_cli_args(kind, args) if nested else getattr(args, f.name)
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc

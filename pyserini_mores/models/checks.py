"""Checks of what names a model and its config, made before anything loads: a model name that no shipped model,
directory, bundled backbone or Hugging Face hub name matches, and config overrides the model's config lacks."""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from .backbones import OFFLINE_MINILM_NAMES
from .registry import model_class

#: config fields that are not hyperparameters a user sets: the backbone's dims and where it came from
NOT_OVERRIDABLE = frozenset({"encoder", "backbone"})
#: a Hugging Face hub repository name as the hub writes it: ORG/NAME
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class UnknownConfigKeyError(ValueError):
    """A model config override that the model's config does not have."""


class UnknownModelError(ValueError):
    """A model name that is no shipped model, directory, bundled backbone or Hugging Face hub name."""


def config_keys(model_type: str) -> list[str]:
    """The config fields of ``model_type`` a user may override (``--model-arg KEY=VALUE``)."""
    config_class = model_class(model_type).config_class
    return sorted(field.name for field in dataclasses.fields(config_class) if field.name not in NOT_OVERRIDABLE)


def check_config(model_type: str, config: dict[str, Any], *, given_as: str = "config key") -> None:
    """Every key of ``config`` is one of ``model_type``'s config fields.

    Raises:
        UnknownConfigKeyError: naming the unknown keys and the ones the model knows.
    """
    known = config_keys(model_type)
    unknown = sorted(set(config) - set(known))
    if unknown:
        listed = ", ".join(f"'{key}'" for key in unknown)
        raise UnknownConfigKeyError(f"{given_as} {listed} is not a setting of {model_type} models; they know: "
                                    f"{', '.join(known)}")


def check_model_name(model: Any) -> None:
    """``model`` names something a learned reranker can load: ``None`` (the shipped default), a loaded model, an
    existing path, a shipped model, a bundled backbone name, a Hugging Face hub name ``ORG/NAME``, or a bare hub name
    already in the local Hugging Face cache.

    Raises:
        FileNotFoundError: a path (``./x``, ``/x``, ``~/x``) that does not exist.
        UnknownModelError: anything else, naming the shipped models and how a hub name or directory is given.
    """
    from .loading import shipped_model_path, shipped_models  # imports torch: only when a name is checked

    if model is None or not isinstance(model, (str, os.PathLike)):
        return
    text = str(model)
    path = Path(text).expanduser()
    if path.exists() or text.lower() in OFFLINE_MINILM_NAMES or shipped_model_path(text) is not None:
        return
    parent = path.parent
    if text.startswith((".", "/", "~")) or (parent != Path(".") and parent.is_dir()):
        raise FileNotFoundError(f"model directory {text} does not exist")
    if _HUB_NAME.fullmatch(text) or _in_hub_cache(text):
        return
    raise UnknownModelError(
        f"unknown model '{text}': not a shipped model ({', '.join(shipped_models()) or 'none installed'}) nor a "
        "directory here; give a checkpoint or backbone directory, 'minilm' (the bundled backbone), or a Hugging Face "
        "hub name as ORG/NAME (e.g. google-bert/bert-base-uncased)")


def _in_hub_cache(name: str) -> bool:
    """Whether a bare (legacy) hub name such as ``bert-base-uncased`` has its config in the local cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - a name the hub library refuses is simply not cached
        return False


__all__ = ["NOT_OVERRIDABLE", "UnknownConfigKeyError", "UnknownModelError", "check_config", "check_model_name",
           "config_keys"]

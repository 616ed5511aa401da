"""Named training recipes: JSON files in ``recipes/`` holding the papers' hyperparameters (MS MARCO) and CPU-sized
ones (debian-packages). A recipe fills in settings; flags given on the command line win over it.

Recipe file layout::

    {"command": "train" | "pretrain-compressor",
     "description": "one line",
     "sources": "where each value comes from",
     "settings": {"model_type": "mores", "lr": 3e-5, "model_args": {...}, ...}}

``settings`` keys are the command's settings (:class:`.trainer.TrainingSettings` fields for ``train``,
:data:`COMPRESSOR_SETTINGS` for ``pretrain-compressor``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

RECIPES_DIR = Path(__file__).parent / "recipes"
COMMANDS = ("train", "pretrain-compressor")
COMPRESSOR_SETTINGS = ("init", "texts", "output", "model_args", "queries", "steps", "batch_size", "lr",
                       "warmup_steps", "heldout_pairs", "max_pairs", "seed", "bf16", "precision", "device")


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.json"))


def read_recipe(name_or_json: str | os.PathLike) -> dict:
    """The recipe dict of a shipped name (``mores-debian``), a JSON file path, or an inline JSON object.

    Raises:
        ValueError: an unknown name (the message lists the shipped ones) or a malformed recipe.
    """
    text = str(name_or_json)
    if text.lstrip().startswith("{"):
        recipe, origin = json.loads(text), "inline recipe"
    elif Path(text).is_file():
        recipe, origin = json.loads(Path(text).read_text()), text
    elif (RECIPES_DIR / f"{text}.json").is_file():
        recipe, origin = json.loads((RECIPES_DIR / f"{text}.json").read_text()), text
    else:
        raise ValueError(f"unknown recipe '{text}'; shipped recipes: {', '.join(recipe_names())} "
                         "(or pass a JSON file)")
    if not isinstance(recipe, dict) or not isinstance(recipe.get("settings"), dict):
        raise ValueError(f"{origin}: a recipe is a JSON object with a 'settings' object")
    command = recipe.get("command", "train")
    if command not in COMMANDS:
        raise ValueError(f"{origin}: unknown command '{command}'; one of {', '.join(COMMANDS)}")
    allowed = set(_settings_names(command)) - {"output"}
    unknown = sorted(set(recipe["settings"]) - allowed)
    if unknown:
        raise ValueError(f"{origin}: settings {unknown} are not {command} settings")
    return {"command": command, **recipe}


def _settings_names(command: str) -> tuple[str, ...]:
    if command == "train":
        from .trainer import TrainingSettings

        return TrainingSettings.field_names()
    return COMPRESSOR_SETTINGS


def merge_settings(command: str, recipe: str | None, given: dict) -> dict:
    """Settings for ``command``: the recipe's values (if any), overridden by ``given`` (the flags actually set).

    ``model_args`` merge key by key, so ``--model-arg n_interaction_blocks=1`` changes only that key of a
    recipe's model arguments.
    """
    values: dict = {}
    if recipe is not None:
        loaded = read_recipe(recipe)
        if loaded["command"] != command:
            raise ValueError(f"recipe '{recipe}' is for the {loaded['command']} command, not {command}")
        values = json.loads(json.dumps(loaded["settings"]))  # a deep copy
    for key, value in given.items():
        if key == "model_args":
            values["model_args"] = {**values.get("model_args", {}), **value}
        else:
            values[key] = value
    if command == "train" and "freeze_embeddings" in given:
        _embedding_flag_reaches_the_config(values, given)
    return values


def _embedding_flag_reaches_the_config(values: dict, given: dict) -> None:
    """A model that keeps its embeddings frozen by a field of its own config (TK, over borrowed WordPiece
    embeddings) takes an explicit ``--[no-]freeze-embeddings`` there too: else ``--no-freeze-embeddings`` would leave
    them frozen without a word.

    Raises:
        ValueError: when ``--model-arg freeze_embeddings=…`` says the opposite of the flag.
    """
    from ..models.registry import MODEL_CLASSES, model_class

    model_type = values.get("model_type")
    if model_type not in MODEL_CLASSES:
        return  # (an unknown or missing type is reported by the settings)
    if "freeze_embeddings" not in {field.name for field in dataclasses.fields(model_class(model_type).config_class)}:
        return
    frozen = bool(given["freeze_embeddings"])
    named = given.get("model_args", {}).get("freeze_embeddings")
    if named is not None and bool(named) != frozen:
        raise ValueError(f"--model-arg freeze_embeddings={named} contradicts "
                         f"--{'' if frozen else 'no-'}freeze-embeddings")
    values["model_args"] = {**values.get("model_args", {}), "freeze_embeddings": frozen}


__all__ = ["RECIPES_DIR", "recipe_names", "read_recipe", "merge_settings", "COMPRESSOR_SETTINGS"]

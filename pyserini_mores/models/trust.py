"""What a model directory may not ask of this package: to run its own code, or to be unpickled.

transformers imports the Python files a directory names under ``auto_map`` (in ``config.json``,
``tokenizer_config.json`` …) when the caller, or the user answering its ``[y/N]`` prompt, agrees; and
``torch.load`` of a ``pytorch_model.bin`` can run whatever its pickle names. Every load of a model directory here
passes ``trust_remote_code=False`` and reads safetensors only; :func:`check_model_directory` refuses such a directory
in one sentence before any of its files is loaded, so that no prompt is ever shown and nothing of it runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UserFixableError

#: the JSON files through which transformers finds a directory's own code (their ``auto_map`` key)
CODE_MAP_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
CODE_MAP_KEY = "auto_map"
#: weights transformers would unpickle when no safetensors file is beside them
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


class UntrustedModelError(UserFixableError):
    """A model directory that asks to run its own code or holds only pickled weights: it is never loaded."""


def check_model_directory(directory: str | os.PathLike) -> None:
    """Refuse ``directory`` when loading it could run code of its own; anything that is not a directory (a hub
    name, a shipped model's name) is left to the loaders, which pass ``trust_remote_code=False``.

    Raises:
        UntrustedModelError: a file of :data:`CODE_MAP_FILES` has an ``auto_map`` (the message names the file, the
            key and the Python files it points to), or the weights are ``pytorch_model.bin`` without safetensors.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    for name in CODE_MAP_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # not readable JSON: the loader that reads it reports that
        if isinstance(values, dict) and CODE_MAP_KEY in values:
            modules = _code_files(directory, values[CODE_MAP_KEY])
            named = f" ({', '.join(modules)})" if modules else ""
            raise UntrustedModelError(
                f"{path} has an '{CODE_MAP_KEY}' key: the model asks to run its own Python code{named}, which "
                "pyserini_mores never runs; use a model without custom code")
    has_safetensors = any((directory / name).is_file() for name in SAFETENSORS_WEIGHTS)
    pickled = [name for name in PICKLED_WEIGHTS if (directory / name).is_file()]
    if pickled and not has_safetensors:
        raise UntrustedModelError(
            f"{directory / pickled[0]} holds pickled weights, which can run code when loaded, and there is no "
            f"{SAFETENSORS_WEIGHTS[0]}: pyserini_mores loads safetensors only; convert the weights with "
            "safetensors (save_file) in an environment you trust")


def _code_files(directory: Path, auto_map) -> list[str]:
    """The Python files of ``directory`` that an ``auto_map`` names (``"modeling_x.XModel"`` → ``modeling_x.py``;
    ``"repo--modeling_x.XModel"`` names another repository's file), in the order given."""
    references = []
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    for value in values:
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(reference, str) and "." in reference:
                module = reference.split("--")[-1].rsplit(".", 1)[0]
                references.append(f"{module.replace('.', '/')}.py")
    present = [name for name in dict.fromkeys(references) if (directory / name).is_file()]
    return present or list(dict.fromkeys(references))

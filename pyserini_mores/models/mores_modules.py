"""MORES's three modules stored apart, the paper's independently deployable modules::

    directory/config.json                           the MoresConfig (as in save_pretrained), "layout": "modules"
    directory/<tokenizer files>
    directory/document_module/model.safetensors     embeddings + all L layers
    directory/query_module/model.safetensors        embeddings (+ its L−K layers when untied; tied layers live in
                                                    the document module)
    directory/interaction_module/model.safetensors  the K blocks + the score head

Each weights file names its module in its metadata, so one module can be swapped for another's (the paper's
adapt-interaction: a fine-tuned interaction module on the original representation modules, whose S1 sidecar stays
valid). :meth:`~.mores.MoresModel.from_pretrained` recognises such a directory too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .base import CONFIG_NAME, WEIGHTS_NAME, check_tokenizer_files
from .registry import model_class as registered_class

MODULE_NAMES = ("document_module", "query_module", "interaction_module")


def is_modules_directory(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a :func:`save_modules` layout rather than one ``model.safetensors``."""
    directory = Path(directory)
    return not (directory / WEIGHTS_NAME).is_file() and (directory / MODULE_NAMES[0]).is_dir()


def save_modules(model, directory: str | os.PathLike) -> None:
    """Write the three modules of a :class:`~.mores.MoresModel` to separate subdirectories (layout above)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model.model_type, "layout": "modules", **model.config.to_dict()}
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.tokenizer.save_pretrained(str(directory))
    for name in MODULE_NAMES:
        (directory / name).mkdir(exist_ok=True)
        tensors = {key: value.detach().contiguous() for key, value in _module_state(model, name).items()}
        metadata = {"format": "pt", "model_type": model.model_type, "module": name,
                    "tied": json.dumps(model.config.tied)}
        save_file(tensors, str(directory / name / WEIGHTS_NAME), metadata=metadata)


def load_modules(
    directory: str | os.PathLike,
    *,
    document_module: str | os.PathLike | None = None,
    query_module: str | os.PathLike | None = None,
    interaction_module: str | os.PathLike | None = None,
    model_class: type | None = None,
    **overrides,
):
    """Assemble a :class:`~.mores.MoresModel` (or ``model_class``) from a :func:`save_modules` directory.

    ``document_module`` / ``query_module`` / ``interaction_module`` name other module directories (each holding a
    ``model.safetensors`` written by :func:`save_modules`) to use instead of the ones in ``directory`` — e.g. an
    interaction module fine-tuned separately (the paper's adapt-interaction) on top of the original representation
    modules, whose S1 sidecar then stays valid. ``overrides`` replace config fields.

    Raises:
        FileNotFoundError: no config, tokenizer files or weights where they should be.
        ValueError: a directory of another model type, a weights file of another module, or weights that do not
            fit the config.
    """
    from safetensors import safe_open
    from transformers import AutoTokenizer, PretrainedConfig

    cls = model_class or registered_class("mores")
    directory = Path(directory)
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} is not a MORES module directory (no {CONFIG_NAME})")
    values = json.loads(config_path.read_text())
    if values.get("model_type") != cls.model_type:
        raise ValueError(f"{directory} holds a '{values.get('model_type')}' model, not '{cls.model_type}'")
    values.pop("layout", None)
    config = cls.config_class.from_dict({**values, **overrides})
    check_tokenizer_files(directory)
    # an empty config keeps transformers from reading our config.json as its own (as base.from_pretrained does)
    model = cls(config, AutoTokenizer.from_pretrained(str(directory), config=PretrainedConfig(),
                                                           trust_remote_code=False))
    sources = {"document_module": document_module, "query_module": query_module,
               "interaction_module": interaction_module}
    for name in MODULE_NAMES:
        path = Path(sources[name] or directory / name)
        path = path / WEIGHTS_NAME if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"no {name} weights at {path}")
        with safe_open(str(path), framework="pt") as handle:
            stored = (handle.metadata() or {}).get("module")
            if stored is not None and stored != name:
                raise ValueError(f"{path} holds a MORES {stored}, not a {name}")
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        _load_module_state(model, name, tensors)
    return model.eval()


def sub_state(state: dict[str, torch.Tensor], prefix: str, strict: bool = False) -> dict[str, torch.Tensor]:
    """The entries under ``prefix``, with the prefix removed (``strict``: no other entries allowed)."""
    selected = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    if strict and len(selected) != len(state):
        others = sorted(key for key in state if not key.startswith(prefix))
        raise ValueError(f"unexpected tensors {others[:5]}")
    return selected


def _module_state(model, name: str) -> dict[str, torch.Tensor]:
    if name == "query_module" and model.config.tied:
        return model.query_module.embeddings.state_dict(prefix="embeddings.")  # layers live in the doc module
    return getattr(model, name).state_dict()


def _load_module_state(model, name: str, tensors: dict[str, torch.Tensor]) -> None:
    try:
        if name == "query_module" and model.config.tied:
            model.query_module.embeddings.load_state_dict(sub_state(tensors, "embeddings.", strict=True))
        else:
            getattr(model, name).load_state_dict(tensors)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"the {name} weights do not fit this MORES config: {error}") from error


__all__ = ["MODULE_NAMES", "is_modules_directory", "load_modules", "save_modules", "sub_state"]

"""Where a model comes from: a checkpoint directory (full, or a delta over its backbone), a model shipped inside the
package, or a new model built from a backbone — which may itself be a trained cross-encoder or MaxSim checkpoint."""
from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from torch import nn

from ._layers import BertDims
from .backbones import DEFAULT_BACKBONE, OFFLINE_MINILM_NAMES, load_backbone
from .base import CONFIG_NAME, RankingModel
from .delta import is_delta_checkpoint, load_delta
from .registry import MODEL_CLASSES, model_class
from .trust import check_model_directory

logger = logging.getLogger(__name__)

#: trained models shipped inside the package (as deltas over the bundled MiniLM), loadable by directory name
SHIPPED_MODELS_DIR = Path(__file__).resolve().parents[1] / "resources" / "models"
#: the entry-point group through which a separately installed models package adds its directory of trained models,
#: loadable by name like those shipped inside the package: the package index refuses wheels over 100 MB, so models
#: that do not fit beside the code ship in packages of their own (docs/search.md#model-packages)
MODELS_ENTRY_POINT_GROUP = "pyserini_mores.models"
#: the shipped checkpoint each model type loads when no model is named (all trained on debian-packages' training
#: queries; see docs/results.md), inside the package or in :data:`MODELS_PACKAGE`
SHIPPED_DEFAULTS = {"maxsim": "debian-maxsim", "cross-encoder": "debian-cross-encoder", "mores": "debian-mores-2ib",
                    "tk": "debian-tk", "prettr": "debian-prettr-e128"}
#: the models package built from this repository (its directory of the same name), with the shipped models that do
#: not fit in the package's own wheel
MODELS_PACKAGE = "pyserini-mores-models"


def load_model(model_type: str, name_or_path: str | os.PathLike, **overrides) -> RankingModel:
    """A trained checkpoint directory of ``model_type`` (full, or a delta over its backbone — see :mod:`.delta`),
    or a new model initialised from a backbone name/dir (:meth:`RankingModel.initialised`).

    ``overrides`` go to the config (e.g. ``reuse='s2'`` for MORES).
    """
    cls = model_class(model_type)
    model = None
    shipped = shipped_model_path(name_or_path)
    directory = Path(shipped or name_or_path)
    check_model_directory(directory)  # before any of its files is read by a loader
    if directory.is_dir() and not (directory / CONFIG_NAME).is_file() \
            and str(name_or_path).lower() not in OFFLINE_MINILM_NAMES:
        # Neither a checkpoint nor an HF backbone directory: say so, rather than transformers' "no model_type".
        raise FileNotFoundError(f"{directory} has no config.json: it is neither a pyserini_mores checkpoint nor a "
                                "Hugging Face model directory")
    if (directory / CONFIG_NAME).is_file():
        values = json.loads((directory / CONFIG_NAME).read_text())
        stored_type = values.get("model_type")
        if stored_type == model_type and "architectures" not in values:
            model = (load_delta(cls, directory, **overrides) if is_delta_checkpoint(directory)
                     else cls.from_pretrained(directory, **overrides))
        elif stored_type in MODEL_CLASSES and not (
                model_class(stored_type).capabilities.encoder_is_a_backbone and cls.capabilities.starts_from_rankers):
            raise ValueError(f"{directory} holds a '{stored_type}' checkpoint, not a '{model_type}' one")
    if model is None:
        # A shipped ranker as the backbone is recorded by name (config.backbone), not by this installation's path,
        # so that a delta trained from it rebuilds wherever the package is installed.
        model = cls.initialised(name_or_path, **overrides)
    # Remembered so that commands can tell the user how to rebuild what this model needs (e.g. its sidecar).
    model.source, model.source_overrides = str(directory), dict(overrides)
    return model


def trained_ranker(name_or_path: str | os.PathLike, model_types: tuple[str, ...] | None = None):
    """The trained model saved at ``name_or_path`` when it is one whose encoder is a backbone
    (:attr:`~.base.ModelCapabilities.encoder_is_a_backbone`: the cross-encoder, MaxSim) and of ``model_types`` (any
    such by default), else ``None``.

    A BERT already fine-tuned for ranking is a backbone like any other, and a far better start for the models that
    split it (MORES, PreTTR) when training data is small: they begin from a ranker instead of a sentence encoder.
    A MaxSim encoder's token states were trained to be matched by query tokens one by one, which is what MORES's
    cross-attention reads from the sidecar (its projection, if any, is not part of the backbone).
    """
    name_or_path = shipped_model_path(name_or_path) or name_or_path
    config_path = Path(name_or_path) / CONFIG_NAME
    if not config_path.is_file():
        return None
    values = json.loads(config_path.read_text())
    stored_type = values.get("model_type")
    if stored_type not in MODEL_CLASSES or "architectures" in values:
        return None
    if not model_class(stored_type).capabilities.encoder_is_a_backbone or (model_types is not None
                                                                            and stored_type not in model_types):
        return None
    return load_model(stored_type, name_or_path)


@dataclass(frozen=True)
class BackboneCheckpoint:
    """A backbone loaded once, with everything a model built from it takes (:func:`load_backbone_checkpoint`).

    Attributes:
        name: the name or path it was loaded from.
        dims: its BERT dims.
        state_dict: its BERT weights (HF names, or our encoder's when ``ranker`` is set).
        tokenizer: its tokenizer.
        ranker: the trained cross-encoder or MaxSim model whose encoder it is (:func:`trained_ranker`), else ``None``.
    """

    name: str
    dims: BertDims
    state_dict: dict
    tokenizer: object
    ranker: RankingModel | None = None


def load_backbone_checkpoint(name_or_path: str | os.PathLike) -> BackboneCheckpoint:
    """A BERT-architecture checkpoint (:func:`.backbones.load_backbone`), or one of our trained cross-encoder or
    MaxSim checkpoints (see :func:`trained_ranker`), loaded once for both its encoder and its head: a shipped ranker
    is rebuilt from its own backbone, which takes seconds, so no caller should load it twice.

    Raises:
        BackboneNotFoundError: when the name is not a directory and the hub cannot provide it (e.g. offline).
    """
    ranker = trained_ranker(name_or_path)
    if ranker is not None:
        return BackboneCheckpoint(str(name_or_path), ranker.config.encoder, ranker.encoder.state_dict(),
                                  ranker.tokenizer, ranker)
    dims, state_dict, tokenizer = load_backbone(name_or_path)
    return BackboneCheckpoint(str(name_or_path), dims, state_dict, tokenizer)


def backbone_weights(name_or_path: str | os.PathLike):
    """``(BertDims, state_dict, tokenizer)`` of :func:`load_backbone_checkpoint`, for models that take nothing else
    from a backbone."""
    checkpoint = load_backbone_checkpoint(name_or_path)
    return checkpoint.dims, checkpoint.state_dict, checkpoint.tokenizer


def copy_ranker_head(head: nn.Linear, checkpoint: BackboneCheckpoint, model_type: str) -> None:
    """Start ``head`` from a trained cross-encoder's when the model was initialised from one (``checkpoint``):
    the blocks that produce the pooled [CLS] are that cross-encoder's top layers, so its decision function is the
    best known start.

    Raises:
        ValueError: the heads differ in shape (set num_labels to match).
    """
    ranker = checkpoint.ranker
    if ranker is None or ranker.model_type != "cross-encoder":
        return
    if head.weight.shape != ranker.head.weight.shape:
        raise ValueError(f"{checkpoint.name}: the cross-encoder's head is {tuple(ranker.head.weight.shape)}, "
                         f"this {model_type} head is {tuple(head.weight.shape)} (set num_labels to match)")
    head.load_state_dict(ranker.head.state_dict())


@functools.cache
def shipped_model_dirs() -> tuple[Path, ...]:
    """Where shipped models are: the package's own directory, then each installed models package's (entry points
    of :data:`MODELS_ENTRY_POINT_GROUP`, by name). A models package that cannot be loaded is skipped, with a
    warning that names it, so that it costs only its own models."""
    directories = [SHIPPED_MODELS_DIR]
    for entry_point in sorted(entry_points(group=MODELS_ENTRY_POINT_GROUP), key=lambda point: point.name):
        try:
            directory = Path(entry_point.load())
        except Exception as error:  # noqa: BLE001 - any failure of a third-party package's import
            logger.warning("models package '%s' (%s) could not be loaded, so its models are not available: %s",
                           entry_point.name, entry_point.value, error)
            continue
        if not directory.is_dir():
            logger.warning("models package '%s' (%s) names %s, which is not a directory: its models are not "
                           "available", entry_point.name, entry_point.value, directory)
            continue
        directories.append(directory)
    return tuple(directories)


def shipped_model_path(name: str | os.PathLike) -> Path | None:
    """The directory of a trained model shipped with the package or an installed models package (e.g.
    ``debian-tk``), unless ``name`` is a path that exists (a local directory always wins). A name found in several
    is the first's, in the order of :func:`shipped_model_dirs`."""
    if Path(name).exists() or os.sep in str(name):
        return None
    for directory in shipped_model_dirs():
        path = directory / str(name)
        if (path / CONFIG_NAME).is_file():
            return path
    return None


def shipped_models() -> list[str]:
    """The names of every shipped model (:func:`shipped_model_dirs`)."""
    return sorted({path.name for directory in shipped_model_dirs() for path in directory.glob("*")
                   if (path / CONFIG_NAME).is_file()})


def default_model(model_type: str) -> str:
    """What a ``model_type`` reranker loads when no model is named: its shipped trained checkpoint, or — for a type
    none ships for — the untrained backbone (whose ranking head is random: fine for building and timing, not for
    ranking)."""
    name = SHIPPED_DEFAULTS.get(model_type)
    return name if name is not None and shipped_model_path(name) is not None else DEFAULT_BACKBONE


__all__ = ["MODELS_ENTRY_POINT_GROUP", "MODELS_PACKAGE", "SHIPPED_DEFAULTS", "SHIPPED_MODELS_DIR", "BackboneCheckpoint",
           "backbone_weights", "copy_ranker_head", "default_model", "load_backbone_checkpoint", "load_model",
           "shipped_model_dirs", "shipped_model_path", "shipped_models", "trained_ranker"]

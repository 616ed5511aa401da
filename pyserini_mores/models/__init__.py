"""Learned reranking models: pure ``nn.Module``s with one shared contract (see :mod:`.base`). No file I/O here
beyond checkpoints."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .backbones import ENCODER_RANKERS, OFFLINE_MINILM_NAMES, trained_ranker
from .base import RankingConfig, RankingModel, pad_documents

INIT_SEED = 0
#: model types whose encoder can start from a trained cross-encoder or MaxSim checkpoint (``--init DIR``; a
#: cross-encoder's [CLS] head too). A cross-encoder given a cross-encoder loads it as its own checkpoint instead.
RANKER_INITIALISED = ("cross-encoder", "mores", "prettr")
#: trained models shipped inside the package (as deltas over the bundled MiniLM), loadable by directory name
SHIPPED_MODELS_DIR = Path(__file__).resolve().parents[1] / "resources" / "models"

#: model_type → "module:Class"; imported lazily so that listing models costs nothing.
MODEL_CLASSES: dict[str, str] = {
    "maxsim": "pyserini_mores.models.dual_encoder:DualEncoder",
    "mores": "pyserini_mores.models.mores:MoresModel",
    "cross-encoder": "pyserini_mores.models.cross_encoder:CrossEncoder",
    "prettr": "pyserini_mores.models.prettr:PreTTRModel",
    "tk": "pyserini_mores.models.tk:TKModel",
}


def model_class(model_type: str) -> type[RankingModel]:
    import importlib

    try:
        target = MODEL_CLASSES[model_type]
    except KeyError:
        raise ValueError(f"unknown model type '{model_type}'; known: {', '.join(sorted(MODEL_CLASSES))}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_model(model_type: str, name_or_path: str | os.PathLike, **overrides) -> RankingModel:
    """A trained checkpoint directory of ``model_type`` (full, or a delta over its backbone — see :mod:`.delta`),
    or a new model initialised from a backbone name/dir.

    ``overrides`` go to the config (e.g. ``reuse='s2'`` for MORES).
    """
    cls = model_class(model_type)
    model = None
    name_or_path = shipped_model_path(name_or_path) or name_or_path
    directory = Path(name_or_path)
    if directory.is_dir() and not (directory / "config.json").is_file() \
            and str(name_or_path).lower() not in OFFLINE_MINILM_NAMES:
        # Neither a checkpoint nor an HF backbone directory: say so, rather than transformers' "no model_type".
        raise FileNotFoundError(f"{directory} has no config.json: it is neither a pyserini_mores checkpoint nor a "
                                "Hugging Face model directory")
    if (directory / "config.json").is_file():
        values = json.loads((Path(name_or_path) / "config.json").read_text())
        if values.get("model_type") == model_type and "architectures" not in values:
            from .delta import is_delta_checkpoint

            model = (cls.from_delta(name_or_path, **overrides) if is_delta_checkpoint(name_or_path)
                     else cls.from_pretrained(name_or_path, **overrides))
        elif values.get("model_type") in MODEL_CLASSES and not (
                values["model_type"] in ENCODER_RANKERS and model_type in RANKER_INITIALISED):
            raise ValueError(
                f"{name_or_path} holds a '{values['model_type']}' checkpoint, not a '{model_type}' one"
            )
    if model is None:
        # New parameters (heads, compressors, TK's contextualiser) are drawn from a fixed seed: the same backbone
        # and config give the same model — and so the same fingerprint and sidecar — in every process.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            model = cls.from_backbone(str(name_or_path), **overrides)
            _copy_ranker_head(model, name_or_path)
    # Remembered so that commands can tell the user how to rebuild what this model needs (e.g. its sidecar).
    model.source, model.source_overrides = str(name_or_path), dict(overrides)
    return model


def _copy_ranker_head(model: RankingModel, name_or_path: str | os.PathLike) -> None:
    """Start ``model``'s [CLS] head from a trained cross-encoder's when it was initialised from one: the blocks that
    produce the pooled [CLS] are that cross-encoder's top layers, so its decision function is the best known start."""
    ranker = trained_ranker(name_or_path, model_types=("cross-encoder",))
    head = getattr(model, "ranking_head", None)
    if ranker is None or head is None:
        return
    if head.weight.shape != ranker.head.weight.shape:
        raise ValueError(f"{name_or_path}: the cross-encoder's head is {tuple(ranker.head.weight.shape)}, "
                         f"this {model.model_type} head is {tuple(head.weight.shape)} (set num_labels to match)")
    head.load_state_dict(ranker.head.state_dict())


def shipped_model_path(name: str | os.PathLike) -> Path | None:
    """The directory of a trained model shipped with the package (e.g. ``debian-tk``), unless ``name`` is a path
    that exists (a local directory always wins)."""
    if Path(name).exists() or os.sep in str(name):
        return None
    path = SHIPPED_MODELS_DIR / str(name)
    return path if (path / "config.json").is_file() else None


def shipped_models() -> list[str]:
    return sorted(p.name for p in SHIPPED_MODELS_DIR.glob("*") if (p / "config.json").is_file())


__all__ = ["RankingConfig", "RankingModel", "MODEL_CLASSES", "model_class", "load_model", "pad_documents",
           "shipped_model_path", "shipped_models"]

"""Learned reranking models: pure ``nn.Module``s with one shared contract (see :mod:`.base`), the registry of model
types (:mod:`.registry`) and where models come from (:mod:`.loading`). No file I/O here beyond checkpoints.

The public names are re-exported lazily, so that the registry (``train --help``'s model types) starts no torch.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "RankingConfig": ".base",
    "RankingModel": ".base",
    "INIT_SEED": ".base",
    "pad_documents": ".base",
    "MODEL_CLASSES": ".registry",
    "MODEL_TYPES": ".registry",
    "model_class": ".registry",
    "model_types": ".registry",
    "register_model": ".registry",
    "load_model": ".loading",
    "MODELS_ENTRY_POINT_GROUP": ".loading",
    "MODELS_PACKAGE": ".loading",
    "SHIPPED_MODELS_DIR": ".loading",
    "SHIPPED_DEFAULTS": ".loading",
    "default_model": ".loading",
    "shipped_model_dirs": ".loading",
    "shipped_model_path": ".loading",
    "shipped_models": ".loading",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

"""Rerankers: the pygaggle-compatible interface, the registry, and the learned-model glue."""
from __future__ import annotations

from .base import IdentityReranker, Reranker
from .learned import ModelReranker, learned_reranker_factory
from .registry import ENTRY_POINT_GROUP, UnknownRerankerError, get_reranker, list_rerankers, register_reranker

#: Built-in learned rerankers: registry name → model type (see :data:`pyserini_mores.models.MODEL_CLASSES`).
LEARNED_RERANKERS = {
    "maxsim": "maxsim",
    "mores": "mores",
    "prettr": "prettr",
    "tk": "tk",
    "cross-encoder": "cross-encoder",
}
for _name, _model_type in LEARNED_RERANKERS.items():
    register_reranker(_name, learned_reranker_factory(_model_type))

__all__ = [
    "Reranker", "IdentityReranker", "ModelReranker", "get_reranker", "list_rerankers", "register_reranker",
    "UnknownRerankerError", "ENTRY_POINT_GROUP", "LEARNED_RERANKERS",
]

"""Rerankers: the pygaggle-compatible interface, the registry, and the learned-model glue."""
from __future__ import annotations

from ..models.registry import ModelTable
from .base import IdentityReranker, Reranker
from .learned import ModelReranker, learned_reranker_factory
from .registry import ENTRY_POINT_GROUP, UnknownRerankerError, get_reranker, list_rerankers, register_reranker

#: Learned rerankers: registry name → model type, one per registered model (:mod:`pyserini_mores.models.registry`).
LEARNED_RERANKERS = ModelTable(lambda model_class: model_class.model_type)

__all__ = [
    "Reranker", "IdentityReranker", "ModelReranker", "get_reranker", "list_rerankers", "register_reranker",
    "learned_reranker_factory", "UnknownRerankerError", "ENTRY_POINT_GROUP", "LEARNED_RERANKERS",
]

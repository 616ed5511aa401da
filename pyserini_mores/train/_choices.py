"""The names the training commands accept, importable without torch (so ``--help`` answers instantly)."""
from __future__ import annotations

from ..models.registry import MODEL_TYPES

LOSSES = ("pointwise", "pairwise", "listwise", "distill", "margin-mse")
#: the losses that learn from a teacher's scores (scored triples)
TEACHER_LOSSES = ("distill", "margin-mse")
#: ``all``, or a module group a model declares (its capabilities' ``trainable_module_groups``: MORES's
#: adapt-interaction and adapt-representation)
TRAIN_MODULES = ("all", "interaction", "representation")
SCHEDULERS = ("linear", "constant", "cosine")

__all__ = ["LOSSES", "MODEL_TYPES", "SCHEDULERS", "TEACHER_LOSSES", "TRAIN_MODULES"]

"""Training: MS MARCO-format triples (optionally scored by a teacher, for distillation) and hard-negative mining,
the training loop (losses, MORES adapt-* module selection, dev evaluation with early stopping, checkpoint/resume),
PreTTR compressor pre-training, and recipes.

The CLI is ``python -m pyserini_mores.train``. Torch is imported only by the submodules that need it.
"""
from __future__ import annotations

from .data import (TrainingGroup, compressor_pairs, load_groups, mine_negatives, read_scored_triples, read_triples,
                   write_triples)
from .recipes import merge_settings, read_recipe, recipe_names

__all__ = [
    "TrainingGroup", "read_triples", "read_scored_triples", "write_triples", "load_groups", "mine_negatives", "compressor_pairs",
    "read_recipe", "recipe_names", "merge_settings", "TrainingSettings", "train", "pretrain_compressor",
]


def __getattr__(name: str):
    # the torch-heavy entry points are imported on first use, so `--help` and recipe listing stay instant
    if name in ("TrainingSettings", "train"):
        from . import trainer

        return getattr(trainer, name)
    if name == "pretrain_compressor":
        from .compressor import pretrain_compressor

        return pretrain_compressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

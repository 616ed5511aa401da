"""The names the training commands accept, importable without torch (so ``--help`` answers instantly)."""
from __future__ import annotations

LOSSES = ("pointwise", "pairwise", "listwise", "distill")
TRAIN_MODULES = ("all", "interaction", "representation")
SCHEDULERS = ("linear", "constant", "cosine")
MODEL_TYPES = ("cross-encoder", "maxsim", "mores", "prettr", "tk")  # pyserini_mores.models.MODEL_CLASSES keys

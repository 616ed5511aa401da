"""Evaluation: metrics averaged over all judged queries, paired and non-inferiority tests, and the metrics table.

``python -m pyserini_mores.eval --qrels QRELS RUN [RUN ...]`` is the command-line entry point.
"""
from __future__ import annotations

from . import metrics
from .metrics import *  # noqa: F401,F403  (the public names are metrics.__all__)

__all__ = list(metrics.__all__)

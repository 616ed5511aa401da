"""Evaluation: metrics averaged over all judged queries, paired and non-inferiority tests, and the metrics table.

``python -m pyserini_mores.eval --qrels QRELS RUN [RUN ...]`` is the command-line entry point.
"""
from __future__ import annotations

from .metrics import (
    DEFAULT_METRICS,
    EvaluationResult,
    NonInferiorityResult,
    PairedTestResult,
    canonical_metric_name,
    evaluate,
    format_metrics_table,
    non_inferiority,
    paired_t_test,
)

__all__ = [
    "DEFAULT_METRICS",
    "EvaluationResult",
    "NonInferiorityResult",
    "PairedTestResult",
    "canonical_metric_name",
    "evaluate",
    "format_metrics_table",
    "non_inferiority",
    "paired_t_test",
]

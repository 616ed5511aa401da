"""Interpretability reports: why a document ranked where it did (MORES §6 / Figure 2 attention maps, TK §6 /
Figure 3 kernel scores, PreTTR's first joined layer).

``python -m pyserini_mores.explain`` is the command. The library side computes plain numbers
(:func:`mores_attention`, :func:`prettr_joined_attention`, :func:`tk_kernel_scores`), gathers them per query
(:func:`explain_documents`) and writes figures, JSON and HTML (:func:`write_report`). Exports are imported lazily so
that ``--help`` starts neither torch nor matplotlib.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "AttentionMap": "._types",
    "DocumentExplanation": "._types",
    "Report": "._types",
    "MoresAttention": "._attention",
    "JoinedAttention": "._attention",
    "mores_attention": "._attention",
    "prettr_joined_attention": "._attention",
    "combine_heads": "._attention",
    "parse_heads": "._attention",
    "KernelScores": "._kernels",
    "tk_kernel_scores": "._kernels",
    "compare_kernel_scores": "._kernels",
    "EXPLAINERS": "._explainers",
    "explain_documents": "._explainers",
    "write_report": "._report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")

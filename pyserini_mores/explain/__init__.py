"""Interpretability reports: why a document ranked where it did (MORES §6 / Figure 2 attention maps, TK §6 /
Figure 3 kernel scores, PreTTR's first joined layer).

``python -m pyserini_mores.explain`` is the command. The numbers come from the models themselves (attention maps from
their own layers: :func:`mores_attention`, :func:`prettr_joined_attention`; TK's kernels: :func:`tk_kernel_scores`);
the library gathers them per query (:func:`explain_documents`) and writes figures, JSON and HTML
(:func:`write_report`). Exports are imported lazily so that ``--help`` starts neither torch nor matplotlib.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "AttentionMap": "._types",
    "DocumentExplanation": "._types",
    "Report": "._types",
    "MoresAttention": "._attention",
    "JoinedAttention": "._attention",
    "mores_attention": "._attention",
    "prettr_joined_attention": "._attention",
    "combine_heads": "._explainers",
    "parse_heads": "._explainers",
    "KernelScores": "._types",
    "tk_kernel_scores": "._kernels",
    "compare_kernel_scores": "._kernels",
    "EXPLAINERS": "._explainers",
    "explain_documents": "._explainers",
    "write_report": "._report",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

"""Time-budget sweeps: effectiveness of every reranker against a per-query rerank time budget (TK paper, §6).

``python -m pyserini_mores.budget`` is the command; the cost model and depth choice live in
:mod:`pyserini_mores.search.calibration`.
"""
from __future__ import annotations

from .sweep import RerankerSpec, SweepResult, SweepRow, parse_reranker_specs, plot_sweep, run_sweep, write_outputs

__all__ = ["RerankerSpec", "SweepResult", "SweepRow", "parse_reranker_specs", "plot_sweep", "run_sweep",
           "write_outputs"]

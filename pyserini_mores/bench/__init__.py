"""Side-by-side speed benchmark of every reranker on this machine (``python -m pyserini_mores.bench``).

:mod:`.flops` holds the analytic FLOP formulas, :mod:`.workload` what is measured (backbones, variants, synthetic
candidates, sidecars), :mod:`.runner` the timing protocol, :mod:`.report` the table, JSON and plot. Heavy imports
(torch, matplotlib) happen inside functions.
"""
from __future__ import annotations

from .flops import FlopCount, cross_encoder_flops, mores_flops, prettr_flops, tk_flops


def run_benchmark(config, progress=None) -> dict:
    """See :func:`.runner.run_benchmark`."""
    from .runner import run_benchmark as run

    return run(config, progress=progress)


__all__ = ["FlopCount", "cross_encoder_flops", "mores_flops", "prettr_flops", "tk_flops", "run_benchmark"]

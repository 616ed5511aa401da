"""Side-by-side speed benchmark of every reranker on this machine (``python -m pyserini_mores.bench``).

:mod:`.flops` holds the FLOP accounting (each model's formula is the model's own), :mod:`.workload` what is measured
(backbones, variants, synthetic candidates, sidecars), :mod:`.runner` the timing protocol, :mod:`.report` the table,
JSON and plot. Exports are imported lazily, so that ``--help`` starts neither torch nor matplotlib.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "FlopCount": ".flops",
    "cross_encoder_flops": ".flops",
    "mores_flops": ".flops",
    "prettr_flops": ".flops",
    "tk_flops": ".flops",
    "run_benchmark": ".runner",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

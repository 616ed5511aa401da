"""Side-by-side speed benchmark of every reranker on this machine (``python -m pyserini_mores.bench``).

:mod:`.flops` holds the FLOP accounting, :mod:`.model_flops` each model's formula, :mod:`.model_hooks` what the
benchmark needs of each model type (variants, input layout, formula), :mod:`.workload` what is measured
(backbones, variants, synthetic candidates, sidecars), :mod:`.runner` the timing protocol, :mod:`.report` the table,
JSON and plot. Exports are imported lazily, so that ``--help`` starts neither torch nor matplotlib.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "FlopCount": ".flops",
    "cross_encoder_flops": ".model_flops",
    "mores_flops": ".model_flops",
    "prettr_flops": ".model_flops",
    "tk_flops": ".model_flops",
    "BenchmarkHooks": ".model_hooks",
    "register_benchmark": ".model_hooks",
    "run_benchmark": ".runner",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

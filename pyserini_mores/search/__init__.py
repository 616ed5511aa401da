"""Search: a first stage (BM25, BM25 + RM3, a dense index, their hybrid or a run), then a reranker
(``RerankingSearcher``); the search CLI.

Names are imported on first use, so that ``python -m pyserini_mores.search --help`` (which imports this package
first) does not wait for torch.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "RerankingSearcher": "pyserini_mores.search.searcher",
    "SidecarMissingError": "pyserini_mores.search.searcher",
    "SEARCHER_BUDGET": "pyserini_mores.search.searcher",
    "Dense": "pyserini_mores.search.first_stage",
    "Hybrid": "pyserini_mores.search.first_stage",
    "Rm3": "pyserini_mores.search.first_stage",
    "UnknownDocidsError": "pyserini_mores.search.first_stage",
    "RerankStats": "pyserini_mores.types",
    "default_sidecar_path": "pyserini_mores.sidecar",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

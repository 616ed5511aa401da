"""Search: BM25 with Pyserini followed by a reranker (``RerankingSearcher``) and the search CLI."""
from .searcher import RerankingSearcher, SidecarMissingError, default_sidecar_path

__all__ = ["RerankingSearcher", "SidecarMissingError", "default_sidecar_path"]

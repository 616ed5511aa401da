"""pyserini_mores: fast Transformer reranking for Pyserini with precomputed document representations.

The public API is imported lazily so that ``import pyserini_mores`` (and ``--help`` of every command) is instant and
starts neither torch nor the JVM. Importing it installs the start-up hook that lets Pyserini start its JVM with a
suitable Java (``_start_hook``), where the ``.pth`` file installed with the package has not already.
"""
from __future__ import annotations

from . import _start_hook
from ._lazy import lazy_exports

_start_hook.install()

__version__ = "0.1.0"

_EXPORTS = {
    "Query": "pyserini_mores.types",
    "Text": "pyserini_mores.types",
    "RerankedHit": "pyserini_mores.types",
    "hits_to_texts": "pyserini_mores.types",
    "CandidateError": "pyserini_mores.types",
    "Reranker": "pyserini_mores.rerankers",
    "get_reranker": "pyserini_mores.rerankers",
    "list_rerankers": "pyserini_mores.rerankers",
    "register_reranker": "pyserini_mores.rerankers",
    "RerankingSearcher": "pyserini_mores.search",
    "RerankStats": "pyserini_mores.types",
    "open_sidecar": "pyserini_mores.sidecar",
    "ensure_jvm": "pyserini_mores._jvm",
    "jvm_signal_handlers_kept": "pyserini_mores._jvm",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

__getattr__ = lazy_exports(__name__, _EXPORTS)

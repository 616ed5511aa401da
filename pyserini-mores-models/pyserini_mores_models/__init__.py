"""Trained models of pyserini-mores that do not fit in its own wheel beside the code and the models it ships.

pyserini-mores finds :data:`MODELS_DIR` through the ``pyserini_mores.models`` entry point, so that each model loads by
its directory's name (``--model debian-tk``, or ``--reranker tk`` with no ``--model``).
"""
from pathlib import Path

#: one directory per model, as ``python -m pyserini_mores.train export-delta`` writes it
MODELS_DIR = Path(__file__).resolve().parent / "models"

__all__ = ["MODELS_DIR"]

"""Where the package keeps what it makes on first use (the indexed sample and its sidecar, timing calibrations)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PYSERINI_MORES_CACHE``, else ``~/.cache/pyserini_mores``."""
    custom = os.environ.get("PYSERINI_MORES_CACHE")
    return Path(custom) if custom else Path.home() / ".cache" / "pyserini_mores"

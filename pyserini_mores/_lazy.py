"""Lazy re-exports for package ``__init__`` modules: a name is imported on first use, so that importing a package
(and ``--help`` of its command) starts neither torch, matplotlib nor the JVM."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package`` that imports ``exports[name]`` (absolute, or relative to
    ``package``) on first access of ``name``."""

    def __getattr__(name: str):
        if name in exports:
            return getattr(importlib.import_module(exports[name], package), name)
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__

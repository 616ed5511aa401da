"""Reranker names → factories. Every registered model type (:mod:`pyserini_mores.models.registry`) is a reranker of
the same name; third-party packages add rerankers through the ``pyserini_mores.rerankers`` entry-point group (a
callable taking keyword arguments and returning a :class:`~.base.Reranker`)."""
from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Callable

from ..models.registry import model_types
from .base import IdentityReranker, Reranker
from .learned import learned_reranker_factory

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pyserini_mores.rerankers"

RerankerFactory = Callable[..., Reranker]
_FACTORIES: dict[str, RerankerFactory] = {}
_entry_points_loaded = False


class UnknownRerankerError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0])


def register_reranker(name: str, factory: RerankerFactory | None = None, *, replace: bool = False):
    """Register ``factory`` under ``name`` (usable as a decorator). Re-registering a name needs ``replace=True``."""

    def add(target: RerankerFactory) -> RerankerFactory:
        if (name in _FACTORIES or name in model_types()) and not replace:
            raise ValueError(f"a reranker named '{name}' is already registered")
        _FACTORIES[name] = target
        return target

    return add(factory) if factory is not None else add


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in _FACTORIES or entry_point.name in model_types():
            logger.warning("entry point reranker '%s' ignored: the name is taken", entry_point.name)
            continue
        _FACTORIES[entry_point.name] = _LazyEntryPoint(entry_point)


class _LazyEntryPoint:
    """Imports a plugin only when its reranker is asked for, so a broken plugin cannot break the others."""

    def __init__(self, entry_point):
        self.entry_point = entry_point

    def __call__(self, **kwargs) -> Reranker:
        return self.entry_point.load()(**kwargs)


def list_rerankers() -> list[str]:
    """The names :func:`get_reranker` accepts: built-in, one per registered model type, and those of installed
    plugins."""
    _load_entry_points()
    return sorted(set(_FACTORIES) | set(model_types()))


def check_reranker_name(name: str) -> str:
    """``name`` when it is a registered reranker.

    Raises:
        UnknownRerankerError: naming the known ones.
    """
    if name not in list_rerankers():
        raise UnknownRerankerError(f"unknown reranker '{name}'; known rerankers: {', '.join(list_rerankers())}")
    return name


def get_reranker(name: str, **kwargs) -> Reranker:
    """Build the reranker registered as ``name``; ``kwargs`` go to its factory (e.g. ``model=``, ``sidecar=``)."""
    _load_entry_points()
    factory = _FACTORIES.get(name)
    if factory is None and name in model_types():
        factory = learned_reranker_factory(name)
    if factory is None:
        raise UnknownRerankerError(f"unknown reranker '{name}'; known rerankers: {', '.join(list_rerankers())}")
    return factory(**kwargs)


def _bm25(**kwargs) -> Reranker:
    if kwargs:
        raise TypeError(f"the bm25 reranker takes no options (got {', '.join(sorted(kwargs))})")
    return IdentityReranker()


register_reranker("bm25", _bm25)

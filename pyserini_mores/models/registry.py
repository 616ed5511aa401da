"""The one list of the package's models: model type → the class that implements it.

What training, loading and reranking ask of a model — its training loss, trainable module groups, fp32 steps — is
asked of the class itself (its :class:`~.base.ModelCapabilities`), so adding a model is one module plus one line here
(or one :func:`register_model` call from outside the package). The benchmark and the explanations keep their own
tables keyed by model type (:mod:`pyserini_mores.bench.model_hooks`, :data:`pyserini_mores.explain.EXPLAINERS`),
where a model that wants measuring or explaining adds a line of its own. Built-in classes are named by
``"module:Class"`` and imported on first use: listing the model types (``train --help``) starts no torch.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable

#: model type → the class, or ``"module:Class"`` until first used
MODEL_CLASSES: dict[str, Any] = {
    "cross-encoder": "pyserini_mores.models.cross_encoder:CrossEncoder",
    "maxsim": "pyserini_mores.models.dual_encoder:DualEncoder",
    "mores": "pyserini_mores.models.mores:MoresModel",
    "prettr": "pyserini_mores.models.prettr:PreTTRModel",
    "tk": "pyserini_mores.models.tk:TKModel",
}
#: the built-in model types (what the commands offer; models registered later are found by :func:`model_class`)
MODEL_TYPES = tuple(MODEL_CLASSES)


def register_model(model_type: str, model: type | str, *, replace: bool = False) -> None:
    """Make ``model`` (a :class:`~.base.RankingModel` subclass, or ``"module:Class"``) the model of ``model_type``:
    loading, rerankers and training find it from here.

    Raises:
        ValueError: the type is taken (unless ``replace``), or the class names another ``model_type``.
    """
    if model_type in MODEL_CLASSES and not replace:
        raise ValueError(f"a model of type '{model_type}' is already registered")
    declared = getattr(model, "model_type", model_type)
    if declared != model_type:
        raise ValueError(f"{model.__name__} declares model_type '{declared}', not '{model_type}'")
    MODEL_CLASSES[model_type] = model


def model_types() -> tuple[str, ...]:
    """Every registered model type, built-in ones first."""
    return tuple(MODEL_CLASSES)


def model_class(model_type: str) -> type:
    """The class of ``model_type`` (imported on first use).

    Raises:
        ValueError: for an unknown type, naming the known ones.
    """
    try:
        target = MODEL_CLASSES[model_type]
    except KeyError:
        raise ValueError(f"unknown model type '{model_type}'; known: {', '.join(sorted(MODEL_CLASSES))}") from None
    if isinstance(target, str):
        module_name, class_name = target.split(":")
        target = getattr(importlib.import_module(module_name), class_name)
    return target


class ModelTable(Mapping):
    """A read-only mapping derived from the registry when read: model type → ``value(model class)``, for the types
    where that is not ``None``. Models registered later appear in it; looking one type up imports only its class."""

    def __init__(self, value: Callable[[type], Any]):
        self._value = value

    def __getitem__(self, model_type: str) -> Any:
        if model_type not in MODEL_CLASSES:
            raise KeyError(model_type)
        found = self._value(model_class(model_type))
        if found is None:
            raise KeyError(model_type)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([model_type for model_type in model_types() if model_type in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


__all__ = ["MODEL_CLASSES", "MODEL_TYPES", "ModelTable", "model_class", "model_types", "register_model"]

"""What builds a reranker, in one object checked before anything loads: :class:`RerankerOptions` (the reranker and
how its model computes) and the model config overrides it carries, checked against the model's config fields."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..models.checks import (
    NOT_OVERRIDABLE,
    UnknownConfigKeyError,
    UnknownModelError,
    check_config,
    check_model_name,
    config_keys,
)
from ..models.registry import model_class, model_types
from ..precision import PRECISION_CHOICES, check_device_name, resolve_device
from ..windows import DEFAULT_AGGREGATION, WindowOptions, check_aggregation
from .registry import check_reranker_name

#: what a learned reranker's factory takes besides the options and the config: what it reads, not how it computes
LEARNED_FACTORY_INPUTS = frozenset({"sidecar", "expect_index"})


@dataclass(frozen=True)
class RerankerOptions:
    """How to build a reranker (:func:`~.registry.get_reranker`): its registered ``name``, the ``model`` it loads,
    how the model computes, and the overrides of the model's config. Checked when made, before any model loads.

    Attributes:
        name: a registered reranker (``bm25``, ``maxsim``, ``mores``, ..., or a plugin's).
        model: a shipped model's name, a checkpoint or backbone directory, a Hugging Face hub name ``ORG/NAME``,
            ``minilm``, or a loaded model; ``None``: the reranker's shipped default.
        batch_size: candidates scored per model batch (>= 1).
        precision: ``auto``, ``fp32`` or ``bf16``.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, or a ``torch.device`` already resolved.
        cast_weights, remap_by_docid: see :class:`~.learned.ModelReranker`.
        aggregate: how a long document's window scores make its score (``firstp``, ``maxp``, ``sump``, ``avgcls``;
            :data:`~pyserini_mores.windows.DEFAULT_AGGREGATION` unless given).
        windows: how a document scored from text is cut (:class:`~pyserini_mores.windows.WindowOptions`); ``None``:
            a sidecar's windows, or one window.
        config: model config overrides (``--model-arg KEY=VALUE``), each a field of the model's config.
        extra: further keywords for a plugin's factory, passed as they are.
    """

    name: str
    model: Any = None
    batch_size: int = 250
    precision: str = "auto"
    device: Any = "auto"
    cast_weights: bool | None = None
    remap_by_docid: bool = False
    aggregate: str = DEFAULT_AGGREGATION
    windows: WindowOptions | None = None
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_reranker_name(self.name)
        if self.name == "bm25":
            return
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, not {self.batch_size!r}")
        if self.precision not in PRECISION_CHOICES:
            raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, not '{self.precision}'")
        if isinstance(self.device, str):
            check_device_name(self.device)
        if self.windows is not None and not isinstance(self.windows, WindowOptions):
            raise TypeError(f"windows must be a WindowOptions, not {type(self.windows).__name__}")
        if self.name in model_types():
            check_model_name(self.model)
            check_config(self.name, self.config)
            check_aggregation(self.aggregate, self.name, model_class(self.name).capabilities.scores_cls)
        else:
            check_aggregation(self.aggregate)

    @classmethod
    def from_kwargs(cls, name: str, **kwargs) -> RerankerOptions:
        """The options of ``get_reranker(name, **kwargs)``: the factory's own keywords by name, the rest the model
        config's (a learned reranker's) or the plugin factory's (``extra``)."""
        own = {field.name for field in dataclasses.fields(cls)} - {"name", "config", "extra"}
        options = {key: kwargs.pop(key) for key in list(kwargs) if key in own}
        if name == "bm25" and (options or kwargs):
            raise TypeError(f"the bm25 reranker takes no options (got {', '.join(sorted({*options, *kwargs}))})")
        if name in model_types():
            extra = {key: kwargs.pop(key) for key in list(kwargs) if key in LEARNED_FACTORY_INPUTS}
            return cls(name, **options, config=kwargs, extra=extra)
        return cls(name, **options, extra=kwargs)

    def resolved(self) -> RerankerOptions:
        """These options with the device resolved (``auto`` → where the model computes; a GPU that is not there
        raises :class:`~pyserini_mores.precision.DeviceUnavailableError`): done once, before the model loads."""
        if self.name == "bm25" or not isinstance(self.device, str):
            return self
        return dataclasses.replace(self, device=resolve_device(self.device))

    def factory_kwargs(self) -> dict[str, Any]:
        """The keywords of the reranker's factory."""
        if self.name == "bm25":
            return {}
        if self.name not in model_types():  # a plugin's: only what was given
            defaults = {field.name: field.default for field in dataclasses.fields(self)
                        if field.default is not dataclasses.MISSING}
            given = {key: getattr(self, key) for key, default in defaults.items() if getattr(self, key) != default}
            return {**given, **self.extra}
        return {"model": self.model, "batch_size": self.batch_size, "precision": self.precision,
                "device": self.device, "cast_weights": self.cast_weights, "remap_by_docid": self.remap_by_docid,
                "aggregate": self.aggregate, "windows": self.windows, **self.extra, **self.config}


__all__ = ["NOT_OVERRIDABLE", "RerankerOptions", "UnknownConfigKeyError", "UnknownModelError", "check_config",
           "check_model_name", "check_reranker_name", "config_keys"]

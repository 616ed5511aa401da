"""Weight-space averaging of rankers fine-tuned from one start (a "model soup": Wortsman et al., ICML 2022,
"Model soups: averaging weights of multiple fine-tuned models improves accuracy without increasing inference time").

Models fine-tuned from one pretrained start with different losses, data or seeds tend to stay in one basin of the
loss surface (the paper's finding), so their weighted mean is a model of the same architecture and cost that often
ranks better than either. Models from different starts (another backbone, a random head each) do not: their mean
need not be a ranker at all, and nothing here can tell — the dev set decides.
"""
from __future__ import annotations

import math

import torch

from .base import RankingModel

#: how far the weights may sum from 1 (they are typed on a command line)
WEIGHT_SUM_TOLERANCE = 1e-6


def average_models(models: list[RankingModel], weights: list[float] | None = None) -> RankingModel:
    """A new model whose every floating-point tensor is ``sum(w_i × tensor_i)`` over ``models`` (equal weights by
    default), a tensor equal in all of them that tensor itself; the first model's config, tokenizer and non-float
    buffers.

    Raises:
        ValueError: fewer than two models; a weight count other than the models'; a weight ≤ 0 or weights not summing
            to 1; models of another type or config than the first, or with other tensor names, shapes or non-float
            buffers.
    """
    if len(models) < 2:
        raise ValueError(f"averaging needs at least two models, not {len(models)}")
    weights = [1 / len(models)] * len(models) if weights is None else [float(w) for w in weights]
    if len(weights) != len(models):
        raise ValueError(f"{len(weights)} weights for {len(models)} models: give one weight per model")
    if any(not w > 0 for w in weights) or not math.isclose(sum(weights), 1.0, abs_tol=WEIGHT_SUM_TOLERANCE):
        raise ValueError(f"the weights must be positive and sum to 1, not {weights}")
    first = models[0]
    for index, model in enumerate(models[1:], start=2):
        if model.model_type != first.model_type:
            raise ValueError(f"model {index} is a '{model.model_type}' model, model 1 a '{first.model_type}' one")
        if model.config.to_dict() != first.config.to_dict():
            differing = sorted(key for key, value in model.config.to_dict().items()
                               if first.config.to_dict().get(key) != value)
            raise ValueError(f"model {index}'s config differs from model 1's in {', '.join(differing)}: only models "
                             "of one architecture average")
    states = [model.state_dict() for model in models]
    averaged = {}
    for name, tensor in states[0].items():
        others = [state.get(name) for state in states[1:]]
        if any(other is None or other.shape != tensor.shape for other in others):
            raise ValueError(f"tensor {name} is missing or of another shape in a later model")
        if not tensor.is_floating_point():  # ids and masks: must agree, averaging them means nothing
            if not all(torch.equal(tensor, other) for other in others):
                raise ValueError(f"buffer {name} differs between the models")
            averaged[name] = tensor
            continue
        if all(torch.equal(tensor, other) for other in others):
            # kept bit for bit, not recomputed: a sum of weighted copies turns -0.0 into 0.0, and a part the models
            # share frozen (MORES's document module, read from one sidecar) must keep its fingerprint
            averaged[name] = tensor
            continue
        total = sum(w * state[name].double() for w, state in zip(weights, states))
        averaged[name] = total.to(tensor.dtype)
    soup = type(first)(type(first.config).from_dict(first.config.to_dict()), first.tokenizer)
    soup.load_state_dict(averaged, strict=True)
    return soup.eval()

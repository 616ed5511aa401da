"""What is optimised: the loss of a collated batch for each loss type, which parameters train (a model's module
groups, e.g. MORES's adapt-interaction / adapt-representation) and the optimiser's parameter groups (the model's new
layers at their own learning rate). What differs between models is declared by each model class
(:class:`~pyserini_mores.models.base.RankingModel`).

:class:`RankingObjective` wraps a :class:`~pyserini_mores.models.base.RankingModel` as a module whose ``forward``
takes a :class:`~.data.GroupCollator` batch and returns ``{"loss": ...}`` — the shape transformers' ``Trainer``
drives, so the loop in :mod:`.trainer` could be swapped for it without touching the losses.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from ..models.base import ModelCapabilities
from ..models.losses import (listwise_distillation, listwise_softmax_cross_entropy, margin_mse, pairwise_hinge,
                             pointwise_cross_entropy, ranking_scores)
from ._choices import LOSSES, TEACHER_LOSSES, TRAIN_MODULES


#: why the teacher losses (``distill``, ``margin-mse``) refuse unscored triples, and the command that scores them
UNSCORED_TRIPLES = ("the distill loss needs scored triples (a teacher's scores in fields 4 and 5): write them with "
                    "mine-negatives --run TEACHER_RUN --teacher-scores")


def ranking_loss(model: nn.Module, batch: dict, loss: str = "pointwise", margin: float = 1.0,
                 temperature: float = 1.0) -> torch.Tensor:
    """Scalar loss of one collated batch (``G`` groups of ``1 + k`` pairs, positive first).

    * ``pointwise`` — every pair is a labelled example: 2-class CE on the model's ``forward_logits`` where it has a
      classification head (MORES, cross-encoder: the MORES paper's loss), binary CE on the ranking score otherwise
      (the same value for a 2-logit head whose score is the logit difference, e.g. PreTTR).
    * ``pairwise`` — hinge ``max(0, margin − s⁺ + s⁻)`` over every (positive, negative) of a group (TK, EARL).
    * ``listwise`` — softmax CE over each group's ``1 + k`` scores; with one negative this is PreTTR's pairwise
      softmax loss ``−log softmax([s⁺, s⁻])[0]``.
    * ``distill`` — softmax CE against ``softmax(teacher_scores / temperature)`` of each group (scored triples).
    * ``margin-mse`` — Margin-MSE against the teacher's margins of each (positive, negative) pair (scored triples).
    """
    query_batch, doc_batch = batch["query_batch"], batch["doc_batch"]
    if loss == "pointwise":
        outputs = model.forward_logits(query_batch, doc_batch)
    else:
        outputs = model(query_batch, doc_batch)
    return loss_of_outputs(outputs, batch["labels"], batch["group_size"], loss, margin,
                           batch.get("teacher_scores"), temperature)


def loss_of_outputs(outputs: torch.Tensor, labels: torch.Tensor, group_size: int, loss: str = "pointwise",
                    margin: float = 1.0, teacher_scores: torch.Tensor | None = None,
                    temperature: float = 1.0) -> torch.Tensor:
    """The loss of ``outputs`` — ``[B, 2]`` head logits or ``[B]`` ranking scores of ``B = G·(1+k)`` pairs, each
    group's positive first — whichever way they were computed (from text, or from stored documents).

    Raises:
        ValueError: for ``distill`` or ``margin-mse`` without ``teacher_scores`` ``[G, 1+k]``.
    """
    if loss in TEACHER_LOSSES and teacher_scores is None:
        raise ValueError(UNSCORED_TRIPLES)
    if loss == "pointwise":
        return pointwise_cross_entropy(outputs, labels.to(outputs.device))
    scores = (ranking_scores(outputs) if outputs.dim() == 2 else outputs).view(-1, group_size)
    if loss == "pairwise":
        return pairwise_hinge(scores[:, 0], scores[:, 1:], margin=margin)
    if loss == "listwise":
        return listwise_softmax_cross_entropy(scores)
    if loss == "distill":
        return listwise_distillation(scores, teacher_scores.to(scores.device), temperature)
    if loss == "margin-mse":
        return margin_mse(scores, teacher_scores)
    raise ValueError(f"unknown loss '{loss}'; choose from {', '.join(LOSSES)}")


class RankingObjective(nn.Module):
    """A ranking model plus its loss: ``forward(**batch) → {"loss": scalar}`` (Trainer-compatible).

    With ``hidden`` (a :class:`~.hidden.HiddenStateDistillation`), the loss is the ranking loss plus ``hidden.weight``
    times the hidden-state loss of the same forward, and both parts come back too (``"ranking_loss"``,
    ``"hidden_loss"``, detached) for the log; the batch then carries the teacher's inputs
    (``teacher_query_batch``, ``teacher_doc_batch``: a collator given the same ``hidden`` adds them).
    """

    def __init__(self, model: nn.Module, loss: str = "pointwise", margin: float = 1.0, temperature: float = 1.0,
                 hidden=None):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss '{loss}'; choose from {', '.join(LOSSES)}")
        self.model = model
        self.loss = loss
        self.margin = margin
        self.temperature = temperature
        self.hidden = hidden

    def forward(self, query_batch: dict, doc_batch: dict, labels: torch.Tensor, group_size: int,
                teacher_scores: torch.Tensor | None = None, teacher_query_batch: dict | None = None,
                teacher_doc_batch: dict | None = None) -> dict:
        if self.hidden is None:
            batch = {"query_batch": query_batch, "doc_batch": doc_batch, "labels": labels, "group_size": group_size,
                     "teacher_scores": teacher_scores}
            return {"loss": ranking_loss(self.model, batch, self.loss, self.margin, self.temperature)}
        forward = self.model.forward_logits if self.loss == "pointwise" else self.model
        outputs, states = forward(query_batch, doc_batch, output_query_states=True)
        ranking = loss_of_outputs(outputs, labels, group_size, self.loss, self.margin, teacher_scores,
                                  self.temperature)
        return with_hidden_loss(self.hidden, ranking, states, query_batch, teacher_query_batch, teacher_doc_batch)


def with_hidden_loss(hidden, ranking: torch.Tensor, states, query_batch: dict, teacher_query_batch: dict | None,
                     teacher_doc_batch: dict | None) -> dict:
    """``{"loss": ranking + weight · hidden, "ranking_loss", "hidden_loss"}`` of one batch (see
    :class:`RankingObjective`).

    Raises:
        ValueError: the batch lacks the teacher's inputs (collated without the distillation).
    """
    if teacher_query_batch is None or teacher_doc_batch is None:
        raise ValueError("hidden-state distillation needs the teacher's inputs in the batch: collate with the same "
                         "HiddenStateDistillation")
    distance = hidden.loss(states, query_batch, teacher_query_batch, teacher_doc_batch)
    return {"loss": ranking + hidden.weight * distance, "ranking_loss": ranking.detach(),
            "hidden_loss": distance.detach()}


def batch_to_device(batch: dict, device: torch.device) -> dict:
    """Move the tensors of a collated batch (nested one level) to ``device``."""
    moved = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            moved[key] = {name: tensor.to(device) for name, tensor in value.items()}
        elif isinstance(value, torch.Tensor):
            moved[key] = value.to(device)
        else:
            moved[key] = value
    return moved


@torch.no_grad()
def mean_loss(model: nn.Module, groups: Sequence, loss: str = "pointwise", margin: float = 1.0,
              batch_size: int = 32) -> float:
    """The loss over ``groups`` with dropout off (the model's train/eval mode is restored), batch-size weighted."""
    from .data import GroupCollator

    collate = GroupCollator(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        for start in range(0, len(groups), batch_size):
            chunk = groups[start:start + batch_size]
            batch = batch_to_device(collate(chunk), device)
            total += float(ranking_loss(model, batch, loss, margin)) * len(chunk)
            count += len(chunk)
    finally:
        model.train(was_training)
    return total / max(count, 1)


def select_trainable(model: nn.Module, train_modules: str = "all", freeze_embeddings: bool = False,
                     freeze_layers: int = 0) -> list[str]:
    """Freeze every parameter outside ``train_modules`` and return the names of those left trainable.

    ``all`` keeps the model's own choices (e.g. TK's frozen borrowed embeddings); any other name is one of the
    model's :attr:`~pyserini_mores.models.base.ModelCapabilities.trainable_module_groups` — for MORES ``interaction``
    (adapt-interaction: only the interaction blocks and head train) and ``representation`` (adapt-representation:
    only the document and query modules — tied layers included — train).
    ``freeze_embeddings`` also freezes every embedding table (and its LayerNorm): half of a MiniLM's weights, so a
    model trained that way differs from its backbone only in its layers and can ship as a small delta
    (:func:`pyserini_mores.models.delta.save_delta`).
    ``freeze_layers`` also freezes the first that many layers of the model's one Transformer stack (its
    :attr:`~pyserini_mores.models.base.ModelCapabilities.layer_stack`): a cross-encoder trained so, with frozen
    embeddings too, keeps what the models built from it copied (MORES's document module is its first layers), so
    their deltas and sidecars stay valid over it; PreTTR's is its one encoder (separate below the join, joint
    above it), MORES's its document module's.

    Raises:
        ValueError: for a module group the model does not have; for ``freeze_layers`` on a model without one stack of
            layers, or beyond its depth.
    """
    if train_modules not in TRAIN_MODULES:
        raise ValueError(f"unknown train_modules '{train_modules}'; choose from {', '.join(TRAIN_MODULES)}")
    if train_modules != "all":
        groups = _capabilities(model).trainable_module_groups
        if train_modules not in groups:
            model_type = getattr(model, "model_type", type(model).__name__)
            raise ValueError(f"--train-modules {train_modules} is MORES's adapt-{train_modules}; a '{model_type}' "
                             "model has no separate representation and interaction modules")
        prefixes = groups[train_modules]
        for name, parameter in model.named_parameters():
            if not name.startswith(prefixes):
                parameter.requires_grad_(False)
    if freeze_embeddings:
        for name, parameter in model.named_parameters():
            if "embeddings." in name or name.startswith("embeddings"):
                parameter.requires_grad_(False)
    if freeze_layers:
        _freeze_lower_layers(model, freeze_layers)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    if not trainable:
        raise ValueError("no trainable parameters left")
    return trainable


def _capabilities(model: nn.Module) -> ModelCapabilities:
    """``model``'s capabilities; a plain module has the defaults (no module groups, no layer stack)."""
    return getattr(model, "capabilities", ModelCapabilities())


def _freeze_lower_layers(model: nn.Module, count: int) -> None:
    """Freeze the first ``count`` layers of ``model``'s ``capabilities.layer_stack``."""
    stack = _capabilities(model).layer_stack
    if stack is None:
        model_type = getattr(model, "model_type", type(model).__name__)
        raise ValueError("--freeze-layers needs a model with one stack of Transformer layers (a cross-encoder, "
                         f"PreTTR, MORES's document module); a '{model_type}' model has none")
    depth = len({name[len(stack):].split(".", 1)[0] for name, _ in model.named_parameters() if name.startswith(stack)})
    if not 0 < count <= depth:
        raise ValueError(f"--freeze-layers {count}: the model has {depth} layers")
    lower = tuple(f"{stack}{layer}." for layer in range(count))
    for name, parameter in model.named_parameters():
        if name.startswith(lower):
            parameter.requires_grad_(False)


def set_dropout(model: nn.Module, probability: float) -> int:
    """Set every dropout of ``model`` — ``nn.Dropout`` modules and our attention's dropout on its probabilities — to
    ``probability``; returns how many were set. Inference is unaffected (dropout acts only in training mode)."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = probability
            count += 1
        elif isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = probability
            count += 1
    return count


def parameter_groups(model: nn.Module, lr: float, head_lr: float | None = None,
                     weight_decay: float = 0.0, joint_lr: float | None = None) -> list[dict]:
    """Optimiser parameter groups over the trainable parameters.

    ``head_lr`` (when set) is the learning rate of the model's new layers
    (:attr:`~pyserini_mores.models.base.ModelCapabilities.new_parameters`): the score head of MORES/cross-encoder/PreTTR
    (PreTTR P4: 1e-3 for ``W_combine``), TK's kernel-scoring weights (§4.3: 1e-3, ``lr`` then being the
    embeddings'/contextualiser's 1e-4). ``joint_lr`` (when set) is that of the layers reading query and document
    together above those reading them apart (:attr:`~pyserini_mores.models.base.RankingModel.joint_parameters`:
    PreTTR's layers ``l+1..L``, MORES's interaction blocks). The model makes the groups (``optimizer_groups``).
    Weight decay, when non-zero, skips biases and norms (1-D tensors), as transformers' Trainer does.
    """
    groups = model.optimizer_groups(lr, head_lr, joint_lr)
    if weight_decay:
        split = []
        for group in groups:
            split.append({**group, "params": [p for p in group["params"] if p.dim() > 1],
                          "weight_decay": weight_decay})
            split.append({**group, "params": [p for p in group["params"] if p.dim() <= 1], "weight_decay": 0.0})
        groups = split
    return [group for group in groups if group["params"]]


def count_parameters(parameters: Iterable[nn.Parameter]) -> int:
    return sum(parameter.numel() for parameter in parameters)


__all__ = ["LOSSES", "TRAIN_MODULES", "UNSCORED_TRIPLES", "ranking_loss", "loss_of_outputs", "RankingObjective",
           "with_hidden_loss", "batch_to_device", "mean_loss", "select_trainable", "set_dropout", "parameter_groups",
           "count_parameters"]

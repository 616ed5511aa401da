"""Hidden-state distillation from a cross-encoder (``train --hidden-teacher``): dense per-token supervision for the
models whose upper layers mirror a cross-encoder's.

MORES's K interaction blocks (Gao, Dai & Callan 2020) and PreTTR's joint layers (MacAvaney et al. 2020) compute the
query rows of ``[CLS] q [SEP] d [SEP]`` the way a cross-encoder's last K layers do, each from its own view of the
document. So the student's query-token states after its block ``k`` (``k = 1..K``) can be pulled towards a frozen
cross-encoder's query-token states at layer ``L − K + k`` (``L``: the teacher's layers): the mean squared error over
the real query tokens (:func:`~pyserini_mores.models.losses.hidden_state_mse`), added to the ranking loss with a
weight. One score per pair is a thin signal; a state per query token and block is a dense one.

The student gives its states through its own forward (``output_query_states=True``); the teacher runs on the same
(query, document) pairs under ``no_grad``, tokenized by its own tokenizer. Both read ``[CLS] q [SEP]`` first, so its
first positions are the same query tokens when both tokenize queries alike (same tokenizer, same
``query_max_length``): that is checked at the start and for every batch.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..models import RankingModel, load_model, model_class
from ..models.losses import hidden_state_mse


def require_query_states(model_type: str) -> None:
    """Refuse a model type whose query states do not mirror a cross-encoder's layers (checked before any model
    loads: MORES and PreTTR expose theirs, see ``interaction_layers``)."""
    if not hasattr(model_class(model_type), "interaction_layers"):
        raise ValueError(f"a '{model_type}' model has no query states that mirror a cross-encoder's layers; "
                         "hidden-state distillation trains MORES and PreTTR")


class HiddenStateDistillation:
    """A frozen cross-encoder teacher and the weight of its hidden-state loss for one student.

    Not an ``nn.Module`` on purpose: the teacher's parameters must never reach the student's optimiser or
    checkpoints.

    Raises:
        ValueError: when the student exposes no query states, or its states cannot align with the teacher's (other
            width, fewer teacher layers than student blocks, another query length).
    """

    def __init__(self, teacher: RankingModel, student: RankingModel, weight: float = 1.0):
        if not weight > 0:
            raise ValueError(f"the hidden-state loss weight must be positive, not {weight}")
        if getattr(teacher, "model_type", None) != "cross-encoder":
            raise ValueError(f"the hidden-state teacher must be a cross-encoder, not a "
                             f"'{getattr(teacher, 'model_type', type(teacher).__name__)}' model")
        require_query_states(student.model_type)
        layers = student.interaction_layers
        student_width = student.config.encoder.hidden_size
        teacher_width = teacher.config.encoder.hidden_size
        if student_width != teacher_width:
            raise ValueError(f"the student's states are {student_width} wide, the teacher's {teacher_width}: "
                             "hidden-state distillation needs a teacher of the student's width")
        teacher_layers = teacher.config.encoder.num_hidden_layers
        if teacher_layers < layers:
            raise ValueError(f"the student's {layers} interaction layers mirror the teacher's last {layers}, but the "
                             f"teacher has {teacher_layers}")
        if teacher.config.query_max_length != student.config.query_max_length:
            raise ValueError(f"the teacher cuts queries at {teacher.config.query_max_length} tokens, the student at "
                             f"{student.config.query_max_length}: their query tokens would not align (set the "
                             "student's query_max_length to the teacher's)")
        self.teacher = teacher.eval().requires_grad_(False)
        self.weight = float(weight)
        self.layers = layers

    @classmethod
    def load(cls, name_or_path: str | os.PathLike, student: RankingModel, weight: float = 1.0,
             device: torch.device | str | None = None) -> HiddenStateDistillation:
        """The cross-encoder ``name_or_path`` (a checkpoint directory or a shipped name such as
        ``debian-cross-encoder``) as the teacher of ``student``."""
        teacher = load_model("cross-encoder", name_or_path)
        if device is not None:
            teacher.to(device)
        return cls(teacher, student, weight)

    def tokenize(self, queries: Sequence[str], documents: Sequence[str]) -> dict:
        """The teacher's inputs of aligned (query, document) texts: ``{"teacher_query_batch",
        "teacher_doc_batch"}`` (what the collators add to a batch)."""
        return {"teacher_query_batch": self.teacher.tokenize_queries(list(queries)),
                "teacher_doc_batch": self.teacher.tokenize_documents(list(documents))}

    @torch.no_grad()
    def teacher_states(self, query_batch: dict, doc_batch: dict) -> list[torch.Tensor]:
        """The teacher's states ``[B, T, n]`` of the joined pairs after each of its last :attr:`layers` layers."""
        return self.teacher.hidden_states(query_batch, doc_batch, self.layers)

    def loss(self, student_states: Sequence[torch.Tensor], student_query_batch: dict, teacher_query_batch: dict,
             teacher_doc_batch: dict) -> torch.Tensor:
        """Mean over the student's K blocks of the MSE between its query-token states ``[B, q, n]`` and the
        teacher's at layer ``L − K + k``, over the real query tokens of ``student_query_batch`` (one row per
        pair, as the student scored them).

        Raises:
            ValueError: the teacher tokenized a query differently, or the shapes disagree.
        """
        if len(student_states) != self.layers:
            raise ValueError(f"the student gave {len(student_states)} query states, not its {self.layers} layers'")
        width = student_states[0].shape[1]
        student_ids, student_mask = _to_width(student_query_batch["input_ids"], student_query_batch["attention_mask"],
                                              width)
        _check_same_query_tokens(student_ids, student_mask, teacher_query_batch["input_ids"],
                                 teacher_query_batch["attention_mask"])
        teacher = self.teacher_states(teacher_query_batch, teacher_doc_batch)
        losses = [hidden_state_mse(ours, _to_rows(theirs, width), student_mask)
                  for ours, theirs in zip(student_states, teacher)]
        return torch.stack(losses).mean()


def _to_width(input_ids: torch.Tensor, mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query ids and mask right-padded (or cut, where only padding is) to the states' ``width`` (PreTTR pads its
    query block to ``query_max_length`` inside the model)."""
    if input_ids.shape[1] < width:
        missing = width - input_ids.shape[1]
        return F.pad(input_ids, (0, missing)), F.pad(mask, (0, missing))
    if bool(mask[:, width:].any()):
        raise ValueError(f"query batch of {input_ids.shape[1]} tokens has real tokens past the {width} query states")
    return input_ids[:, :width], mask[:, :width]


def _to_rows(states: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` rows of ``states [B, T, n]`` (zero rows past ``T``; they are padding of the student)."""
    if states.shape[1] >= width:
        return states[:, :width]
    return F.pad(states, (0, 0, 0, width - states.shape[1]))


def _check_same_query_tokens(student_ids: torch.Tensor, student_mask: torch.Tensor, teacher_ids: torch.Tensor,
                             teacher_mask: torch.Tensor) -> None:
    """The student's real query tokens are the teacher's first tokens, pair by pair."""
    if student_ids.shape[0] != teacher_ids.shape[0]:
        raise ValueError(f"the teacher has {teacher_ids.shape[0]} pairs, the student {student_ids.shape[0]}")
    student_lengths = student_mask.sum(1)
    same = torch.equal(student_lengths.cpu(), teacher_mask.sum(1).cpu())
    if same:
        width = int(student_lengths.max())
        real = student_mask[:, :width].bool()
        same = torch.equal(student_ids[:, :width].masked_fill(~real, 0).cpu(),
                           teacher_ids[:, :width].masked_fill(~real, 0).cpu())
    if not same:
        raise ValueError("the teacher's query tokens differ from the student's: hidden-state distillation needs "
                         "both to tokenize queries alike (the same tokenizer and query_max_length)")


__all__ = ["HiddenStateDistillation", "require_query_states"]

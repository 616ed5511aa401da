"""Training the online part of a model against its sidecar: the document side is read, not encoded.

Everything a sidecar stores depends only on the model's *store parameters* (MORES: the document module, plus the
key/value projections under Reuse-S2; PreTTR: the embeddings, layers ``1..l`` and the compressing half). Hold those
fixed and the sidecar stays exact for the model being trained, so a training step needs no document encoder at all:
it reads each document's stored rows and runs only what runs online at search time — the query side and the
per-pair blocks — through the very ``encode_query``/``score`` the reranker uses. For MORES this is the paper's
*adapt-interaction* (representation modules frozen), made as cheap per pair as reranking (tens of times cheaper than
encoding the document every step); and because the store parameters never change, the trained model opens the same
sidecar it trained against: nothing is re-encoded afterwards.

Training texts are matched to sidecar rows through the index the sidecar was built from (documents are stored
there), so ordinary text triples (``mine-negatives`` output, ``triples.train.small.tsv``) work unchanged.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .data import TrainingGroup, batch_group_size, batch_teacher_scores
from .objectives import loss_of_outputs, with_hidden_loss

logger = logging.getLogger(__name__)


class UnmatchedTrainingTextError(ValueError):
    """Training passages that are not documents of the sidecar's index."""


def freeze_store_parameters(model: nn.Module) -> list[str]:
    """Freeze every parameter the stored vectors depend on (ties included); returns their names.

    Raises:
        ValueError: for a model that stores nothing (e.g. the cross-encoder).
    """
    if getattr(model, "store_width", None) is None:
        raise ValueError(f"a '{model.model_type}' model stores nothing, so it cannot train against a sidecar")
    stored = {name for name, _ in model.store_parameters()}
    frozen = []
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in stored:
            parameter.requires_grad_(False)
            frozen.append(name)
    return frozen


class StoredDocuments:
    """Sidecar rows of training passages, found by their text.

    Args:
        reader: an open sidecar (checked against the model's fingerprint by the caller).
        texts_by_docid: ``{docid: text}`` of the sidecar's documents (see :func:`open_stored_documents`).
    """

    def __init__(self, reader, texts_by_docid: dict[str, str]):
        self.reader = reader
        docids = list(texts_by_docid)
        rows = reader.rows_for_docids(docids)
        self._row_of_text = {}
        for docid, row in zip(docids, rows):
            self._row_of_text.setdefault(texts_by_docid[docid].strip(), int(row))

    def __len__(self) -> int:
        return len(self._row_of_text)

    def rows(self, texts: Sequence[str]) -> np.ndarray:
        """Sidecar rows of ``texts``.

        Raises:
            UnmatchedTrainingTextError: counting the texts that are no document of the index, with the first one.
        """
        rows, missing = [], []
        for text in texts:
            row = self._row_of_text.get(text.strip())
            if row is None:
                missing.append(text)
            rows.append(row)
        if missing:
            raise UnmatchedTrainingTextError(
                f"{len(missing)} training passage(s) are not documents of the sidecar's index (their text must equal "
                f"the indexed text), e.g. {missing[0][:80]!r}; mine the triples from this index "
                "(train mine-negatives) or train without --doc-sidecar")
        return np.asarray(rows, dtype=np.int64)

    def check_groups(self, groups: Sequence[TrainingGroup]) -> None:
        """Fail before training, not at step 5,000, when a passage of ``groups`` is not in the sidecar."""
        self.rows([text for group in groups for text in (group.positive, *group.negatives)])


#: ``--doc-sidecar default``: the sidecar where ``sidecar build`` puts it by default, beside the index
DEFAULT_SIDECAR = "default"


def open_stored_documents(model, sidecar: str | os.PathLike, index: str | os.PathLike) -> StoredDocuments:
    """The sidecar at ``sidecar`` (or at its default place beside ``index`` for ``"default"``; refused unless it
    was built by this model's store parameters and from ``index``) with the texts of its documents read from
    ``index``.

    Raises:
        FileNotFoundError: for a missing default sidecar, with the command that builds it.
    """
    from ..index import fetch_texts, index_identity, open_searcher, resolve_index
    from ..sidecar import open_sidecar

    resolved = resolve_index(index)
    if str(sidecar) == DEFAULT_SIDECAR:
        from ..search.searcher import build_command_for, default_sidecar_path

        sidecar = default_sidecar_path(resolved.path, model.model_type, model)
        if not sidecar.exists():
            raise FileNotFoundError(
                f"no sidecar of this {model.model_type} model beside the index ({sidecar}); build it first: "
                f"{build_command_for(index, model.model_type, model)}")
    searcher = open_searcher(resolved)
    reader = open_sidecar(sidecar, expect_model_fingerprint=model.store_fingerprint(),
                          expect_index=index_identity(searcher))
    docids = reader.docids(np.arange(reader.num_docs))
    logger.info("matching training passages to %d stored documents of %s", len(docids), sidecar)
    return StoredDocuments(reader, dict(zip(docids, fetch_texts(searcher, docids))))


class StoredGroupCollator:
    """Like :class:`~.data.GroupCollator`, but documents come as stored rows: ``{"query_batch"`` (one tokenized
    query per group), ``"docs" [G·(1+k), Lmax, width]``, ``"lengths"``, ``"labels"``, ``"group_size"``,
    ``"teacher_scores"}``; with ``hidden``, also the teacher's inputs of every (query, passage) pair, tokenized from
    the triples' texts (the teacher reads text: nothing of it is stored)."""

    def __init__(self, model, documents: StoredDocuments, hidden=None):
        self.model = model
        self.documents = documents
        self.hidden = hidden

    def __call__(self, groups: Sequence[TrainingGroup]) -> dict:
        group_size = batch_group_size(groups)
        texts = [text for group in groups for text in (group.positive, *group.negatives)]
        rows = self.documents.rows(texts)
        # in the stored precision: score() converts once to the compute dtype, which under bf16 autocast is the
        # stored bf16 itself, so a float32 batch would be two copies of the largest tensor of the step for nothing
        docs, lengths = self.documents.reader.get_batch(rows, dtype=None)
        batch = {
            "query_batch": self.model.tokenize_queries([group.query for group in groups]),
            "docs": docs,
            "lengths": lengths,
            "labels": torch.tensor(([1] + [0] * (group_size - 1)) * len(groups), dtype=torch.long),
            "group_size": group_size,
            "teacher_scores": batch_teacher_scores(groups),
        }
        if self.hidden is not None:
            batch.update(self.hidden.tokenize([group.query for group in groups for _ in range(group_size)], texts))
        return batch


class StoredRankingObjective(nn.Module):
    """``forward(**batch) → {"loss"}`` of a :class:`StoredGroupCollator` batch, scored exactly as the reranker
    scores: ``encode_query`` and ``score`` (``score_logits`` for the pointwise loss: MORES's head logits) against the
    groups' stored documents.

    Every group's query is encoded in one call and its state repeated for the group's candidates, so that the whole
    batch is one ``score`` call: the query states of a batch-B ``score`` may be per candidate (every model accepts a
    query state of batch 1 or B). A call per group would cost one small forward and backward per group of the step;
    one call for the batch trains more pairs per second.
    """

    def __init__(self, model: nn.Module, loss: str = "pointwise", margin: float = 1.0, temperature: float = 1.0,
                 hidden=None):
        super().__init__()
        self.model = model
        self.loss = loss
        self.margin = margin
        self.temperature = temperature
        self.hidden = hidden

    def forward(self, query_batch: dict, docs: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
                group_size: int, teacher_scores: torch.Tensor | None = None, teacher_query_batch: dict | None = None,
                teacher_doc_batch: dict | None = None) -> dict:
        state = per_candidate(self.model.encode_query(query_batch), group_size)
        if self.hidden is None:
            score = self.model.score_logits if self.loss == "pointwise" else self.model.score
            return {"loss": loss_of_outputs(score(state, docs, lengths), labels, group_size, self.loss, self.margin,
                                            teacher_scores, self.temperature)}
        # the logits (or scores) of the same forward that gives the query states; the losses take either
        outputs, states = self.model.score_logits(state, docs, lengths, output_query_states=True)
        ranking = loss_of_outputs(outputs, labels, group_size, self.loss, self.margin, teacher_scores,
                                  self.temperature)
        pairs = {key: value.repeat_interleave(group_size, dim=0) for key, value in query_batch.items()}
        return with_hidden_loss(self.hidden, ranking, states, pairs, teacher_query_batch, teacher_doc_batch)


def per_candidate(query_state, group_size: int):
    """A batch-G query state (a tuple, named or not, or a dataclass of tensors) with every row repeated
    ``group_size`` times: row ``i`` of the result belongs to candidate ``i`` of groups laid out one after another."""
    def repeat(value):
        return value.repeat_interleave(group_size, dim=0) if isinstance(value, torch.Tensor) else value

    if dataclasses.is_dataclass(query_state):
        return dataclasses.replace(query_state, **{field.name: repeat(getattr(query_state, field.name))
                                                   for field in dataclasses.fields(query_state)})
    if isinstance(query_state, tuple):
        values = [repeat(value) for value in query_state]
        return type(query_state)(*values) if hasattr(query_state, "_fields") else tuple(values)
    raise TypeError(f"cannot repeat a query state of type {type(query_state).__name__} per candidate")


__all__ = ["DEFAULT_SIDECAR", "StoredDocuments", "StoredGroupCollator", "StoredRankingObjective",
           "UnmatchedTrainingTextError", "freeze_store_parameters", "open_stored_documents",
           "per_candidate"]

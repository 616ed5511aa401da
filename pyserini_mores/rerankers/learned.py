"""The glue between a learned model and candidates: fetch stored document representations (or encode text),
score them against a once-encoded query in large batches, and hand the scores back."""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..models import (
    MODELS_PACKAGE,
    SHIPPED_DEFAULTS,
    RankingModel,
    default_model,
    load_model,
    model_class,
    pad_documents,
    shipped_models,
)
from ..models.checks import check_config, check_model_name
from ..models.code_tables import WORD_ID_BYTES
from ..precision import resolve_device, resolve_precision
from ..sidecar import BatchBuffer, SidecarRowMismatchError, open_sidecar, recorded_windows
from ..types import Query, Text, copy_candidates
from ..windows import (
    DEFAULT_AGGREGATION,
    WindowOptions,
    aggregate_scores,
    average_windows,
    check_aggregation,
    document_capacity,
    split_texts,
)
from .base import Reranker, string_candidates
from .pacing import QueryPace, paced_batches

logger = logging.getLogger(__name__)

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


class ModelReranker(Reranker):
    """Reranks with a :class:`~pyserini_mores.models.RankingModel`.

    With a sidecar, candidates are read from it by their row (``metadata['lucene_docid']``) or docid; without one,
    documents are encoded from their text — the same math, so both paths give the same scores. A candidate is read
    by its row only when the sidecar stores its docid there (checked for every candidate, one vectorised comparison
    per call): otherwise :class:`~pyserini_mores.sidecar.SidecarRowMismatchError`, or with ``remap_by_docid`` the
    row of its docid.

    Args:
        model: the model (put in eval mode).
        sidecar: an open :class:`~pyserini_mores.sidecar.SidecarReader` or ``None``.
        batch_size: candidates scored per batch.
        precision: ``auto`` (bf16 where the device runs it natively — a CPU with AMX or AVX512-BF16, a CUDA GPU with
            bf16 — else fp32), ``fp32`` or ``bf16`` (~10x faster than fp32 with native bf16, ~20x slower where it is
            emulated).
        device: where the model computes: ``auto`` (CUDA when ``torch.cuda.is_available()``, else the CPU), ``cpu``,
            ``cuda`` or ``cuda:N``; the model is moved there. Stored rows are read on the CPU and copied there batch
            by batch; scores come back to the CPU.
        cast_weights: under ``bf16``, score with a copy of the model whose weights were cast to bf16 once
            (:func:`bf16_scoring_copy`) instead of autocast alone, which re-casts every fp32 weight on every call.
            ``None`` (default): the model's choice, its capabilities' ``bf16_weight_copy`` (the copy, except for
            MORES). ``model`` itself stays fp32, so its fingerprints and sidecar builds do not change.
        remap_by_docid: candidates whose row (``lucene_docid``) holds another document in the sidecar are read at
            the row of their docid (binary search in the sidecar's sorted docids) instead of refused; for hits of
            another index of the same documents.
        aggregate: how a document's window scores make its score (:data:`~pyserini_mores.windows.AGGREGATIONS`):
            ``firstp``, ``maxp``, ``sump``, or ``avgcls`` (the head on the mean of the windows' [CLS] vectors, for a
            model whose capabilities have ``scores_cls``). A document with one window gets that window's score
            under every aggregation but ``avgcls``.
        windows: how a document's text is cut into windows when scored from text
            (:class:`~pyserini_mores.windows.WindowOptions`); ``None``: the sidecar's windows, or without a sidecar
            one window (the model's truncation). A sidecar's windows are fixed when it is built: windows that
            differ from them are refused.

    Long documents: every window is scored as a short document is (batches of ``batch_size`` windows, a sidecar's
    sorted by length), then the windows' scores are aggregated per candidate; under a deadline the pacing counts
    windows, and a candidate is returned only when all its windows were scored.

    A sidecar encoded under bf16 (its manifest's build precision) given to an fp32 reranker is used with a warning,
    once per sidecar: its scores match a from-text fp32 run only to bf16 accuracy.

    Memory: each thread that scores from a sidecar keeps the memory of one batch of stored rows for the reranker's
    lifetime (filling fresh memory costs more in page faults than the copy itself): ``batch_size`` × longest
    candidate × stored width, e.g. ~190 MB for MORES 2×IB Reuse-S2 at BERT-base dims and 128 tokens, 4× that at 512
    (twice when the stored dtype is converted). :meth:`release_memory` gives it back.
    """

    def __init__(self, model: RankingModel, sidecar=None, *, name: str | None = None, batch_size: int = 250,
                 precision: str = "auto", cast_weights: bool | None = None, remap_by_docid: bool = False,
                 device: str | torch.device | None = "auto", aggregate: str = DEFAULT_AGGREGATION,
                 windows: WindowOptions | None = None):
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        precision = resolve_precision(precision, self.device)
        if sidecar is not None and model.store_width is None:
            raise ValueError(f"model '{model.model_type}' scores text; it cannot read a sidecar")
        check_aggregation(aggregate, model.model_type, model.capabilities.scores_cls)
        self.aggregate = aggregate
        self._capacity: int | None = None
        self.model = model  # what capacity reads (its tokenizer), before the model moves to its device below
        if windows is not None:
            windows.resolved(self.capacity)  # a window longer than the model reads is refused now
        self.windows = windows
        self._counts_lock = threading.Lock()
        self._candidates_scored = self._windows_scored = 0
        self.model = model.to(self.device).eval()
        self.name = name or model.model_type
        self.batch_size = batch_size
        self.precision = precision  # resolved: fp32 or bf16
        self.remap_by_docid = remap_by_docid
        self._remap_reported = False
        self.sidecar = sidecar  # after name and precision: setting it checks the sidecar's build precision
        self.cast_weights = model.capabilities.bf16_weight_copy if cast_weights is None else cast_weights
        self._scoring_copy: RankingModel | None = None
        self._scoring_copy_of: tuple | None = None
        self._buffers = threading.local()
        self._frame_of: tuple | None = None  # (model, sidecar, frame) of _store_frame
        self._codebooks_of: tuple | None = None  # (sidecar, codebooks) of _store_codebooks

    @property
    def sidecar(self):
        """The open sidecar reader, or ``None`` (documents are then encoded from their text). Setting one checks its
        build precision against this reranker's (a bf16-built sidecar under fp32 warns, see the class docstring)."""
        return self._sidecar

    @sidecar.setter
    def sidecar(self, reader) -> None:
        if reader is not None:
            _warn_on_build_precision(reader, self.precision, self.name)
            _check_sidecar_windows(reader, self.windows, self.capacity)
        self._sidecar = reader

    @property
    def capacity(self) -> int:
        """Tokens of a document's text the model reads (:func:`~pyserini_mores.windows.document_capacity`)."""
        if self._capacity is None:
            self._capacity = document_capacity(self.model)
        return self._capacity

    def describe_windows(self) -> str:
        """The aggregation and the windows in words, e.g. ``firstmaxp of at most 4 windows of 126 tokens every 126``."""
        options = self.text_windows
        window, stride = options.resolved(self.capacity)
        if not options.windowed:
            return f"{self.aggregate} of 1 window of {window} tokens"
        return f"{self.aggregate} of at most {options.max_windows} windows of {window} tokens every {stride}"

    @property
    def windows_per_candidate(self) -> float | None:
        """Windows scored per candidate scored so far by this reranker (``None`` before the first)."""
        with self._counts_lock:
            return self._windows_scored / self._candidates_scored if self._candidates_scored else None

    @property
    def text_windows(self) -> WindowOptions:
        """How a document scored from text is cut: :attr:`windows`, else the sidecar's, else one window."""
        stored = getattr(self.sidecar, "windows", None) if self.sidecar is not None else None
        return self.windows or stored or WindowOptions()

    @property
    def scoring_model(self) -> RankingModel:
        """The module that scores: :attr:`model`, or under ``bf16`` (with ``cast_weights``) its bf16 copy, made on
        first use and made again when anything it copied from :attr:`model` has changed since: a weight or buffer
        (e.g. a loaded checkpoint) or the config (e.g. MORES ``set_reuse``, ``s2_reads``, TK ``mode``)."""
        if self.precision != "bf16" or not self.cast_weights:
            return self.model
        copied = _copy_key(self.model)
        if self._scoring_copy is None or self._scoring_copy_of != copied:
            self._scoring_copy = None  # free the old copy before making the new one
            with torch.inference_mode(False):  # normal tensors, even when first used inside inference mode
                self._scoring_copy = bf16_scoring_copy(self.model)
            self._scoring_copy_of = copied
        return self._scoring_copy

    @property
    def needs_text(self) -> bool:
        return self.sidecar is None

    def _autocast(self):
        # Kept on with bf16 weights too: the models' deliberate fp32 islands (e.g. PreTTR's CLS softmax) meet bf16
        # weights through it; with the weights already bf16 it casts only those activations.
        dtype = PRECISIONS[self.precision]
        return torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def _on_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A tokenized batch (made on the CPU) on the reranker's device."""
        return {key: value.to(self.device, non_blocking=True) for key, value in batch.items()}

    def _padded(self, doc_reps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Documents encoded from text (on the device) as a padded fp32 batch, their lengths on the device too."""
        docs, lengths = pad_documents([rep.float() for rep in doc_reps])
        return docs, lengths.to(self.device, non_blocking=True)

    def _read_batch(self, rows: np.ndarray, dtype: torch.dtype, buffer: BatchBuffer | None = None,
                    heads: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored rows ``rows`` as ``(docs, lengths)`` in ``dtype`` on the reranker's device (see
        :meth:`~pyserini_mores.sidecar.SidecarReader.get_batch`): gathered on the CPU from the memory map, into
        ``buffer``, then copied. On the CPU the reader converts into its buffer; elsewhere the rows travel in the
        stored precision (fp16: half the bytes of fp32) and are converted on the device. The buffer is pageable
        memory on the CPU; for a GPU it is pinned, so the copy runs asynchronously and the buffer waits for it before
        the next batch overwrites it (see :class:`~pyserini_mores.sidecar.BatchBuffer`)."""
        on_cpu = self.device.type == "cpu"
        docs, lengths = self.sidecar.get_batch(rows, dtype=dtype if on_cpu else None, buffer=buffer, heads=heads)
        return self._sent(docs, lengths, dtype, buffer)

    def _read_spans(self, starts: np.ndarray, lengths: np.ndarray, dtype: torch.dtype,
                    buffer: BatchBuffer | None = None, heads: int | None = None,
                    rotated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_read_batch` of token spans (windows, from ``SidecarReader.window_spans``) instead of rows;
        ``rotated``: in the sidecar codec's rotated frame (see :meth:`_store_frame`)."""
        on_cpu = self.device.type == "cpu"
        docs, lengths = self.sidecar.get_spans(starts, lengths, dtype=dtype if on_cpu else None, buffer=buffer,
                                               heads=heads, rotated=rotated)
        return self._sent(docs, lengths, dtype, buffer)

    def _read_codes(self, starts: np.ndarray, lengths: np.ndarray,
                    buffer: BatchBuffer | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored codes of token spans, undecoded (``SidecarReader.get_spans`` with ``codes=True``), on the
        reranker's device."""
        codes, lengths = self.sidecar.get_spans(starts, lengths, buffer=buffer, codes=True)
        docs, lengths = codes.to(self.device, non_blocking=True), lengths.to(self.device, non_blocking=True)
        if buffer is not None:
            buffer.in_flight(self.device)
        return docs, lengths

    @property
    def folds_codec_rotation(self) -> bool:
        """True when the sidecar's codec rotation (an ``opq`` store's) is folded into the scoring model, so that its
        codes are read without rotating them back (see :meth:`~pyserini_mores.models.base.RankingModel.store_frame`)."""
        return self._store_frame(self.scoring_model) is not None

    def _store_frame(self, model: RankingModel):
        """``model``'s frame (:meth:`~pyserini_mores.models.base.RankingModel.store_frame`) for the sidecar's codec
        rotation, made once per model and sidecar; ``None`` when the sidecar has no rotation or the model needs the
        stored vectors themselves."""
        rotation = getattr(self.sidecar, "store_rotation", None)
        if rotation is None:
            return None
        cached = self._frame_of
        if cached is None or cached[0] is not model or cached[1] is not self.sidecar:
            with torch.inference_mode(False), torch.no_grad():  # normal tensors: reused across queries and modes
                frame = model.store_frame(torch.tensor(rotation, device=self.device))  # a copy: the codec's is read-only
            cached = self._frame_of = (model, self.sidecar, frame)
        return cached[2]

    @property
    def scores_codes(self) -> bool:
        """True when the scoring model scores the sidecar's codes (an ``rq`` store's; TK's only where the codes carry
        their norms) through look-up tables, without decoding them (see
        :meth:`~pyserini_mores.models.base.RankingModel.code_tables`)."""
        return self._store_codebooks(self.scoring_model) is not None

    def _store_codebooks(self, model: RankingModel) -> tuple[torch.Tensor, torch.Tensor | None,
                                                              torch.Tensor | None] | None:
        """The sidecar codec's codebooks, norm levels (None without ``rq_norms``) and word means (None without a word
        stage) on the device, made once per sidecar, when ``model`` scores codes and the codes carry the norms it
        needs; else None."""
        books = getattr(self.sidecar, "store_codebooks", None) if model.scores_codes else None
        if books is None or (model.code_scores_need_norms and books.norm_levels is None):
            return None
        cached = self._codebooks_of
        if cached is None or cached[0] is not self.sidecar:
            levels, words = (None if array is None else torch.tensor(array, device=self.device)
                             for array in (books.norm_levels, books.words))
            cached = self._codebooks_of = (self.sidecar, (torch.tensor(books.entries, device=self.device), levels,
                                                          words))
        return cached[1]

    def _sent(self, docs: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype,
              buffer: BatchBuffer | None) -> tuple[torch.Tensor, torch.Tensor]:
        docs, lengths = docs.to(self.device, non_blocking=True), lengths.to(self.device, non_blocking=True)
        if buffer is not None:
            buffer.in_flight(self.device)
        return docs.to(dtype), lengths

    def rescore(self, query: Query, texts: list[Text]) -> list[Text]:
        if not texts:
            return texts
        with torch.inference_mode(), self._autocast():
            scores = self._scores(query.text, texts)
        for text, score in zip(texts, scores.tolist()):
            text.score = float(score)
        return texts

    def rerank_until(self, query: Query | str, texts: list[Text], deadline: float, *,
                     per_candidate_ms: float | None = None, pace: QueryPace | None = None) -> list[Text]:
        """Rerank the head of ``texts`` (best first, as given) until ``deadline`` (a :func:`time.monotonic` time).

        Candidates are scored batch by batch in their given order, each batch as large as is predicted to take at most
        a share of the time left (:func:`~.pacing.paced_batches`): the prediction comes from the batches recorded in
        ``pace`` (this query's, and earlier queries' when it shares a :class:`~.pacing.BatchPace` with them), or
        before the first, ``per_candidate_ms`` (e.g. the calibration's; ``None``: start it if time is left); the
        batches are recorded in ``pace``. With windows (long documents) the batches, the time per candidate and
        ``per_candidate_ms`` are per window, and a candidate counts as scored once all its windows are. Returns the
        texts scored in time — the first ``len(result)`` of ``texts`` — with new scores, best first (ties keep their
        order), as new ``Text`` objects: ``texts`` are not modified. :meth:`rerank` scores them all.
        """
        query = query if isinstance(query, Query) else Query(query)
        texts = copy_candidates(texts)
        if not texts:
            return []
        with torch.inference_mode(), self._autocast():
            scores = self._scores(query.text, texts, deadline=deadline, per_candidate_ms=per_candidate_ms, pace=pace)
        scored = texts[:len(scores)]
        for text, score in zip(scored, scores.tolist()):
            text.score = float(score)
        return sorted(scored, key=lambda text: -text.score)

    def rerank(self, query: Query | str, texts: list[Text], *, explain: bool = False) -> list[Text]:
        """As :meth:`Reranker.rerank`; with ``explain=True`` each text also gets
        ``metadata['explanation']``: the numbers behind its score as plain lists (for TK: per-kernel log and length
        scores and contributions, per-query-term kernel mass, the match matrix — the paper's Figure 3). With windows
        (long documents) those numbers are each scored window's, in ``explanation['windows']`` (a document's first
        window first; only the first under ``firstp``), beside ``aggregate`` and the aggregated ``score``."""
        ranked = super().rerank(query, texts)
        if explain:
            self._attach_explanations(query if isinstance(query, Query) else Query(query), ranked)
        return ranked

    def _attach_explanations(self, query: Query, texts: list[Text]) -> None:
        """Explain the windows the scores came from: the sidecar's stored windows, or the windows cut from the
        text, each read as :meth:`rerank` scored it."""
        model = self.model
        if not model.capabilities.explains_scores or model.store_width is None:  # the numbers of TK's ``explain``
            raise ValueError(f"reranker '{self.name}' cannot explain its scores")
        first_only = self.aggregate == "firstp"
        if self.sidecar is not None:
            starts, spans, owners = self.sidecar.window_spans(self._sidecar_rows(texts), first_only=first_only)
        else:
            pieces, owners = self._window_texts([_require_text(text, self.name) for text in texts],
                                                first_only=first_only)
        explained: list[dict] = []
        with torch.inference_mode():
            query_state = model.encode_query(self._on_device(model.tokenize_queries([query.text])))
            for start in range(0, len(owners), self.batch_size):
                chunk = slice(start, start + self.batch_size)
                if self.sidecar is not None:
                    docs, lengths = self._read_spans(starts[chunk], spans[chunk], torch.float32)
                else:
                    docs, lengths = self._padded(model.encode_documents(
                        self._on_device(model.tokenize_documents(pieces[chunk]))))
                numbers = model.explain(query_state, docs, lengths)
                explained.extend({key: (value[i] if _per_document(value, len(docs)) else value).tolist()
                                  for key, value in numbers.items() if isinstance(value, torch.Tensor)}
                                 for i in range(len(docs)))
        windowed = self.text_windows.windowed
        for position, text in enumerate(texts):
            windows = [explained[j] for j in np.flatnonzero(owners == position)]
            text.metadata["explanation"] = windows[0] if not windowed else \
                {"aggregate": self.aggregate, "score": text.score, "windows": windows}

    def score_documents(self, query: str, documents, doc_ids=None, batch_size: int | None = None) -> np.ndarray:
        """As :meth:`Reranker.score_documents`: read from the sidecar when there is one and ``doc_ids`` name the
        documents (docids of the sidecar's index), else encoded from ``documents``' text."""
        texts = string_candidates(documents, doc_ids)
        from_text = doc_ids is None or self.sidecar is None
        if from_text and documents is None:
            raise ValueError(f"reranker '{self.name}' has no sidecar to read doc_ids from: give the documents' texts")
        if not texts:
            return np.zeros(0, dtype=np.float32)
        with torch.inference_mode(), self._autocast():
            scores = self._scores(query, texts, from_text=from_text, batch_size=batch_size)
        return scores.numpy().astype(np.float32, copy=False)

    def score_windows(self, query: str, texts: list[Text], *, from_text: bool = False, head_inputs: bool = False
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The score of every window of ``texts`` (all of them, whatever :attr:`aggregate` is) and ``owners [W]``,
        the position in ``texts`` of each window's document (a document's windows consecutive, its first first):
        what an aggregation turns into one score per candidate (:func:`~pyserini_mores.windows.aggregate_scores`).

        With ``head_inputs`` (a model whose capabilities have ``scores_cls``), each window's ``[n]`` vector that the
        model's head reads instead of its score (``[W, n]``): :meth:`scores_from_head_inputs` of them are the window
        scores, of their mean per document the ``avgcls`` scores."""
        if head_inputs:
            check_aggregation("avgcls", self.model.model_type, self.model.capabilities.scores_cls)
        if not texts:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        with torch.inference_mode(), self._autocast():
            window_scores, owners = self._window_scores(query, texts, how="avgcls" if head_inputs else "maxp",
                                                        from_text=from_text)
        return window_scores.float().numpy(), owners

    def scores_from_head_inputs(self, vectors: np.ndarray) -> np.ndarray:
        """``[B]`` scores of the model's head on ``vectors [B, n]`` (from :meth:`score_windows` with ``head_inputs``,
        or their means), under this reranker's precision as :attr:`aggregate` ``avgcls`` scores them."""
        with torch.inference_mode(), self._autocast():
            tensor = torch.from_numpy(np.asarray(vectors, dtype=np.float32)).to(self.device)
            return self.scoring_model.score_from_cls(tensor).float().cpu().numpy()

    def _scores(self, query: str, texts: list[Text], *, deadline: float | None = None,
                per_candidate_ms: float | None = None, pace: QueryPace | None = None, from_text: bool = False,
                batch_size: int | None = None) -> torch.Tensor:
        """Scores of ``texts`` (from their text when ``from_text`` or without a sidecar), their windows scored in
        batches of ``batch_size`` (default: :attr:`batch_size`) windows and aggregated (:attr:`aggregate`); under a
        ``deadline`` (see :meth:`rerank_until`) of their first ``len(result)``, those whose windows were all
        scored."""
        window_scores, owners = self._window_scores(query, texts, how=self.aggregate, deadline=deadline,
                                                    per_candidate_ms=per_candidate_ms, pace=pace,
                                                    from_text=from_text, batch_size=batch_size)
        return self._aggregated(window_scores, owners, len(texts))

    def _window_scores(self, query: str, texts: list[Text], *, how: str, deadline: float | None = None,
                       per_candidate_ms: float | None = None, pace: QueryPace | None = None, from_text: bool = False,
                       batch_size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """``(window_scores, owners)`` of ``texts`` for aggregation ``how``: only each candidate's first window for
        ``firstp``, the head's inputs ``[W, n]`` for ``avgcls``; under a ``deadline`` the first ``len(window_scores)``
        windows (see :meth:`_scores`)."""
        model = self.scoring_model
        batch_size = batch_size or self.batch_size
        cls = how == "avgcls"
        if model.store_width is None or self.sidecar is None or from_text:
            pieces, owners = self._window_texts([_require_text(text, self.name) for text in texts],
                                                first_only=how == "firstp")
            batches = self._batches(len(pieces), deadline, per_candidate_ms, batch_size, pace)
            if model.store_width is None:
                score = model.text_cls if cls else model.score_texts
                window_scores = _concat([score(query, pieces[start:stop]).float().cpu() for start, stop in batches])
            else:
                query_state = model.encode_query(self._on_device(model.tokenize_queries([query])))
                window_scores = self._score_from_text(query_state, pieces, batches, cls)
            return window_scores, owners
        rows = self._sidecar_rows(texts)
        if deadline is not None:
            # What overshoots a deadline is cold reads, one page fault at a time: issue them all now, so that they
            # overlap each other, the query's encoding and the first batches (a warm sidecar pays a page look-up
            # per page, ~7 µs per MaxSim row, which is why this is not done without a deadline).
            self.sidecar.prefetch(rows)
        starts, lengths_of_windows, owners = self.sidecar.window_spans(rows, first_only=how == "firstp")
        query_state = model.encode_query(self._on_device(model.tokenize_queries([query])))
        width = (model.config.encoder.hidden_size,) if cls else ()
        window_scores = torch.empty((len(starts), *width))
        # Group windows of similar length so batches carry little padding: all of them, or under a deadline
        # within each batch, since batches then follow the given order (the best first-stage candidates first).
        if deadline is None:
            order = np.argsort(lengths_of_windows, kind="stable")
            chunks = (order[start:start + batch_size] for start in range(0, len(order), batch_size))
        else:
            chunks = (start + np.argsort(lengths_of_windows[start:stop], kind="stable")
                      for start, stop in self._batches(len(starts), deadline, per_candidate_ms, batch_size, pace))
        score_spans = self._span_scorer(model, query_state, cls, self._batch_buffer())
        scored = 0
        for chunk in chunks:
            window_scores[torch.from_numpy(chunk)] = score_spans(starts[chunk], lengths_of_windows[chunk]).float().cpu()
            scored += len(chunk)
        return window_scores[:scored], owners

    def _span_scorer(self, model: RankingModel, query_state, cls: bool,
                     buffer: BatchBuffer) -> Callable[[np.ndarray, np.ndarray], torch.Tensor]:
        """A function scoring the stored token spans ``(starts, lengths)`` of one batch for ``query_state`` (with
        ``cls`` the head's inputs): through look-up tables on the undecoded codes where the model scores codes and
        the store keeps their norms, else on the rows read (decoded where compressed, in the codec's rotated frame
        where the model folds it)."""
        frame = self._store_frame(model)
        if frame is not None:  # the codec's rotation is folded into the query side: codes decode without it
            query_state = model.query_in_frame(query_state, frame)
        books = None if cls else self._store_codebooks(model)
        if books is not None:  # codes never decoded
            entries, norm_levels, words = books
            tables = model.code_tables(query_state, entries, words)
            # a code: a word stage's two id bytes, one byte per codebook, then the norm's
            code_bytes = (WORD_ID_BYTES if words is not None else 0) + entries.shape[0]
            norm_levels = norm_levels if model.code_scores_need_norms else None  # MaxSim ignores a store's norms

            def score_codes(starts: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
                codes, lengths = self._read_codes(starts, lengths, buffer)
                norms = None if norm_levels is None else norm_levels[codes[..., code_bytes].long()]
                return model.score_codes(tables, codes[..., :code_bytes], lengths, norms)
            return score_codes
        score = model.score_cls if cls else model.score
        dtype = PRECISIONS[self.precision] or torch.float32  # under bf16 rows go straight to bf16, no fp32 copy

        def score_rows(starts: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
            docs, lengths = self._read_spans(starts, lengths, dtype, buffer=buffer, heads=model.stored_heads,
                                             rotated=frame is not None)
            return score(query_state, docs, lengths)
        return score_rows

    def _window_texts(self, documents: list[str], first_only: bool = False) -> tuple[list[str], np.ndarray]:
        """The texts of ``documents``' windows (:attr:`text_windows`; only each one's first when ``first_only``)
        and ``owners``, each window's document."""
        options = self.text_windows
        if not options.windowed:
            return documents, np.arange(len(documents), dtype=np.int64)
        with self.model.tokenizer_lock:  # a shared fast tokenizer's truncation is set per call (see call_tokenizer)
            pieces, owners = split_texts(documents, self.model.tokenizer, self.capacity, options)
        if first_only:
            first = np.flatnonzero(np.diff(owners, prepend=-1) != 0)
            return [pieces[i] for i in first], owners[first]
        return pieces, owners

    def _aggregated(self, window_scores: torch.Tensor, owners: np.ndarray, count: int) -> torch.Tensor:
        """``[k]`` scores of the first ``k`` of ``count`` candidates whose windows all have their score (or with
        ``avgcls`` their head's input ``[W, n]``) in ``window_scores``, the first ``len(window_scores)`` of the
        windows of ``owners``."""
        ends = np.cumsum(np.bincount(owners, minlength=count))
        complete = int(np.searchsorted(ends, len(window_scores), side="right"))
        used = int(ends[complete - 1]) if complete else 0
        window_scores, owners = window_scores[:used], owners[:used]
        with self._counts_lock:
            self._candidates_scored += complete
            self._windows_scored += used
        if self.aggregate == "avgcls":
            if not complete:
                return torch.empty(0)
            mean = average_windows(window_scores.numpy(), owners, complete)
            return self.scoring_model.score_from_cls(torch.from_numpy(mean).float().to(self.device)).float().cpu()
        if len(owners) == complete:  # one window each: its score, as it is
            return window_scores
        return torch.from_numpy(aggregate_scores(window_scores.numpy(), owners, complete, self.aggregate)
                                .astype(np.float32))

    def _batches(self, count: int, deadline: float | None, per_candidate_ms: float | None,
                 batch_size: int | None = None, pace: QueryPace | None = None) -> Iterator[tuple[int, int]]:
        batch_size = batch_size or self.batch_size
        if deadline is None:
            return ((start, min(count, start + batch_size)) for start in range(0, count, batch_size))
        return paced_batches(count, batch_size, deadline, per_candidate_ms, pace=pace)

    def release_memory(self) -> None:
        """Drop every thread's batch memory (see the class docstring); the next batch allocates afresh."""
        self._buffers = threading.local()

    def _batch_buffer(self) -> BatchBuffer:
        """This thread's reusable batch memory (candidates of one batch are scored before the next is read)."""
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None:
            buffer = self._buffers.buffer = BatchBuffer(pin_memory=self.device.type == "cuda")
        return buffer

    def _score_from_text(self, query_state: Any, documents: list[str], batches: Iterator[tuple[int, int]],
                         cls: bool = False) -> torch.Tensor:
        """Scores (``cls``: the head's inputs ``[W, n]``) of ``documents`` encoded from their text, batch by
        batch."""
        model = self.scoring_model
        score = model.score_cls if cls else model.score
        scores = []
        for start, stop in batches:
            doc_reps = model.encode_documents(self._on_device(model.tokenize_documents(documents[start:stop])))
            docs, lengths = self._padded(doc_reps)
            scores.append(score(query_state, docs, lengths).float().cpu())
        return _concat(scores)

    def _sidecar_rows(self, texts: list[Text]) -> np.ndarray:
        """The sidecar row of every candidate: its ``lucene_docid`` once the sidecar's docid at that row is checked
        to be its own, else (no ``lucene_docid``, or a mismatch under ``remap_by_docid``) the row of its docid."""
        rows = np.array([int(text.metadata.get("lucene_docid", -1)) for text in texts], dtype=np.int64)
        docids = [text.metadata.get("docid") for text in texts]
        given = np.flatnonzero(rows >= 0)
        if len(given):
            if rows[given].max() >= self.sidecar.num_docs:
                raise IndexError(f"candidate row {rows[given].max()} is beyond the sidecar's "
                                 f"{self.sidecar.num_docs} documents")
            anonymous = [i for i in given if docids[i] is None]
            if anonymous:
                raise ValueError(f"the candidate at row {rows[anonymous[0]]} has no docid, so its row cannot be "
                                 f"checked against sidecar {self.sidecar.path}; give every candidate its docid")
            wrong = given[self.sidecar.docid_mismatches(rows[given], [docids[i] for i in given])]
            if len(wrong):
                if not self.remap_by_docid:
                    raise _row_mismatch(self.sidecar, rows, docids, wrong)
                self._report_remap(len(wrong), len(texts))
                rows[wrong] = -1
        unknown = np.flatnonzero(rows < 0)
        if len(unknown):
            rows[unknown] = self.sidecar.rows_for_docids([docids[i] for i in unknown])
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            listed = ", ".join(str(docids[i]) for i in missing[:5])
            raise KeyError(f"{len(missing)} candidate(s) are not in the sidecar (e.g. {listed})")
        return rows

    def _report_remap(self, remapped: int, candidates: int) -> None:
        if not self._remap_reported:  # once per reranker: with remap_by_docid it is expected, not news
            self._remap_reported = True
            logger.warning("%d of %d candidates have rows (lucene_docid) that hold other documents in sidecar %s "
                           "(hits of another index?); read at the rows of their docids (remap_by_docid=True)",
                           remapped, candidates, self.sidecar.path)

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.close()


def bf16_scoring_copy(model: RankingModel) -> RankingModel:
    """An inference copy of ``model`` with every floating parameter in bfloat16 except LayerNorm's γ and β and
    the parameters of the model's deliberate fp32 steps (``model.capabilities.fp32_parameters``).

    Close to what CPU autocast computes, without its per-call weight casts: matmuls and attention run in bf16 as
    under autocast; LayerNorm keeps autocast's fp32 γ and β and normalises in fp32 (the CPU kernel accumulates bf16
    input in fp32); the models' explicit fp32 steps stay fp32. What differs: the embedding tables are bf16 too, and
    the residual stream stays bf16 where autocast promotes ``x + f(x)`` to fp32, which halves the activation traffic
    between layers. Parameters kept fp32 and the tokenizer are shared, buffers copied; ``model`` is not modified.
    """
    from torch import nn

    keep = {id(parameter) for module in model.modules() if isinstance(module, nn.LayerNorm)
            for parameter in module.parameters(recurse=False)}
    fp32 = model.capabilities.fp32_parameters
    keep |= {id(parameter) for name, parameter in model.named_parameters() if name.startswith(fp32)}
    # deepcopy takes objects already in its memo as they are: pre-seeding it with the cast parameters builds the
    # copy without a transient second fp32 model, and shares what must not be copied.
    memo: dict[int, Any] = {id(model.tokenizer): model.tokenizer}
    for parameter in model.parameters():
        if id(parameter) in keep or not parameter.is_floating_point():
            memo[id(parameter)] = parameter
        else:
            memo[id(parameter)] = nn.Parameter(parameter.detach().to(torch.bfloat16), requires_grad=False)
    return copy.deepcopy(model, memo).eval()


def _copy_key(model: RankingModel) -> tuple:
    """What :func:`bf16_scoring_copy` copies from ``model``, cheaply: a pointer and a counter per tensor (in-place
    updates bump ``_version``, reassignment moves ``data_ptr``) and the config, where every mode the scoring code
    branches on lives."""
    tensors = tuple((tensor.data_ptr(), tensor._version)
                    for tensors in (model.parameters(), model.buffers()) for tensor in tensors)
    return tensors, json.dumps(model.config.to_dict(), sort_keys=True, default=str)


def _row_mismatch(sidecar, rows: np.ndarray, docids: list, wrong: np.ndarray) -> SidecarRowMismatchError:
    """The error for candidates at positions ``wrong`` whose row holds another document in ``sidecar``."""
    first = int(wrong[0])
    row, docid = int(rows[first]), str(docids[first])
    stored = sidecar.docid(row)
    built_from = sidecar.manifest.build.get("source")
    where = f"{built_from}, " if built_from else ""
    return SidecarRowMismatchError(
        f"candidate {docid!r} has row (lucene_docid) {row}, but row {row} of sidecar {sidecar.path} holds "
        f"{stored!r} ({len(wrong)} of {len(rows)} candidates disagree). The candidates come from another index than "
        f"the sidecar's ({where}identity {sidecar.index}) or carry wrong lucene_docids, and would be scored with "
        "other documents' vectors. Search the index the sidecar was built for, rebuild the sidecar for this index, "
        "or pass remap_by_docid=True to read each candidate at the row of its docid",
        docid=docid, row=row, stored_docid=stored, mismatches=len(wrong))


def _check_sidecar_windows(sidecar, windows: WindowOptions | None, capacity: int) -> None:
    """Refuse ``windows`` asked of a reranker whose sidecar stores other windows: a sidecar's windows are cut when
    it is built (``windows`` ``None``: the sidecar's are used)."""
    if windows is None:
        return
    stored = getattr(sidecar, "windows", None) or WindowOptions()
    asked, built = _as_flags(windows, capacity), _as_flags(stored, capacity)
    if asked != built:
        raise _other_windows(asked, built, sidecar.path)


def check_windows_before_loading(sidecar, windows: WindowOptions | None) -> None:
    """Refuse ``windows`` asked of a reranker whose sidecar (a path or an open reader) stores other windows, from
    the sidecar's manifest alone, before a model loads: the manifest of a windowed sidecar records the tokens its
    model reads (``capacity``), so the windows compare as the check when the sidecar attaches compares them; of one
    without (one window per document) only the number of windows is known, which is what differs. Where the
    manifest cannot say, the check when the sidecar attaches decides."""
    path = sidecar if isinstance(sidecar, (str, os.PathLike)) else getattr(sidecar, "path", None)
    if windows is None or path is None:
        return
    settings = recorded_windows(path)
    if settings is None:
        return
    max_windows = settings["max_windows"]
    stored = WindowOptions(settings["window"], settings["stride"], max_windows) if max_windows > 1 else \
        WindowOptions()
    capacity = settings["capacity"]
    if capacity is not None:
        try:
            asked = _as_flags(windows, capacity)
        except UsageError:  # a window longer than the sidecar's model reads: said once the model is known
            return
        built = _as_flags(stored, capacity)
    elif windows.max_windows != max_windows:
        asked, built = _given_flags(windows), _given_flags(stored)
    else:
        return
    if asked != built:
        raise _other_windows(asked, built, path)


def _other_windows(asked: str, built: str, path) -> UsageError:
    return UsageError(f"windows {asked} differ from the {built} sidecar {path} stores; its windows are cut when it "
                      "is built: leave out --window, --stride and --max-windows, or build a sidecar with these "
                      "windows")


def _as_flags(windows: WindowOptions, capacity: int) -> str:
    """``windows`` as the flags that give them, window and stride in tokens for a model that reads ``capacity``."""
    window, stride = windows.resolved(capacity)
    return f"--window {window} --stride {stride} --max-windows {windows.max_windows}"


def _given_flags(windows: WindowOptions) -> str:
    """``windows`` as the flags given for them, where the tokens a model reads are not known yet."""
    given = (("--window", windows.window), ("--stride", windows.stride), ("--max-windows", windows.max_windows))
    return " ".join(f"{flag} {value}" for flag, value in given if value is not None)


# (sidecar path, reranker precision) pairs already warned about in this process.
_warned_build_precisions: set[tuple[str, str]] = set()


def _warn_on_build_precision(sidecar, precision: str, name: str) -> None:
    """Warn, once per sidecar, when an fp32 reranker reads vectors encoded under bf16. A warning, not a refusal:
    bf16-built sidecars are what the embedded default builds where the CPU runs bf16 natively."""
    built = getattr(getattr(sidecar, "manifest", None), "build", {}).get("precision")
    if built != "bf16" or precision != "fp32":
        return
    key = (str(sidecar.path), precision)
    if key in _warned_build_precisions:
        return
    _warned_build_precisions.add(key)
    logger.warning(
        "reranker '%s' scores in fp32, but sidecar %s was encoded under bf16 (its build precision): its scores match "
        "a from-text fp32 run only to bf16 accuracy. For fp32-exact scores rebuild it with `python -m "
        "pyserini_mores.sidecar build --precision fp32 --overwrite` (and the same --index, --reranker, --model and "
        "--output)", name, sidecar.path)


def _default_model(model_type: str) -> str:
    name = default_model(model_type)
    if name in shipped_models():
        return name
    if model_type in SHIPPED_DEFAULTS:
        logger.warning("the trained %s '%s' is not installed: it ships in the %s package (pip install "
                       "./%s from the repository); loading the untrained backbone '%s', whose ranking is not "
                       "meaningful, meanwhile", model_type, SHIPPED_DEFAULTS[model_type], MODELS_PACKAGE,
                       MODELS_PACKAGE, name)
    else:
        logger.warning("no trained %s ships with the package: loading the untrained backbone '%s', whose ranking "
                       "is not meaningful; name a trained checkpoint (--model)", model_type, name)
    return name


def _concat(scores: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(scores) if scores else torch.empty(0)


def _per_document(value: torch.Tensor, batch: int) -> bool:
    return value.dim() > 0 and value.shape[0] == batch


def _require_text(text: Text, name: str) -> str:
    if text.text is None:
        raise ValueError(f"reranker '{name}' has no sidecar, so it needs the text of document {text.id}")
    return text.text


def learned_reranker_factory(model_type: str):
    """A registry factory for ``model_type``: ``model`` (checkpoint dir, shipped model name, backbone name or instance;
    default: the type's shipped trained checkpoint, see :func:`~pyserini_mores.models.default_model`), ``sidecar``
    (path, open reader or None), ``expect_index`` (the identity the sidecar must match), ``batch_size``,
    ``precision``, ``cast_weights``, ``remap_by_docid``, ``device``, ``aggregate``, ``windows`` (see
    :class:`ModelReranker`; checked before the model loads); any other keyword overrides the model config (e.g.
    ``reuse='s1'``). A sidecar is checked to be the model's whether given as a path or open."""

    def factory(model: str | os.PathLike | RankingModel | None = None, sidecar=None, *, expect_index: dict | None = None,
                batch_size: int = 250, precision: str = "auto", cast_weights: bool | None = None,
                remap_by_docid: bool = False, device: str | torch.device | None = "auto",
                aggregate: str = DEFAULT_AGGREGATION, windows: WindowOptions | None = None,
                **model_overrides) -> ModelReranker:
        check_model_name(model)
        check_config(model_type, model_overrides)
        check_aggregation(aggregate, model_type, model_class(model_type).capabilities.scores_cls)
        if windows is not None and not isinstance(windows, WindowOptions):
            raise TypeError(f"windows must be a WindowOptions, not {type(windows).__name__}")
        if not isinstance(device, torch.device):  # a resolved one (RerankerOptions.resolved) is used as it is
            device = resolve_device(device)  # a GPU that is not there fails now, not after the model has loaded
        check_windows_before_loading(sidecar, windows)
        if isinstance(model, RankingModel):
            if model_overrides:
                raise TypeError("config overrides need a model name or path, not a model instance")
            instance = model
        else:
            instance = load_model(model_type, model or _default_model(model_type), **model_overrides)
        reader = sidecar
        if isinstance(sidecar, (str, Path)):
            reader = open_sidecar(sidecar, expect_model_fingerprint=instance.store_fingerprint(),
                                  expect_index=expect_index)
        elif sidecar is not None:
            sidecar.check_built_for(model_fingerprint=instance.store_fingerprint(), index=expect_index)
        return ModelReranker(instance, reader, name=model_type, batch_size=batch_size, precision=precision,
                             cast_weights=cast_weights, remap_by_docid=remap_by_docid, device=device,
                             aggregate=aggregate, windows=windows)

    factory.model_type = model_type
    return factory

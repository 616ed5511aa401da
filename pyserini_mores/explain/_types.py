"""What an explanation holds: attention maps, TK kernel scores, per-document and per-query results — plain numbers
that the figures, the JSON and the HTML page are all made from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def rounded(tensor: torch.Tensor, digits: int = 6):
    """A tensor as (nested) lists of floats rounded for JSON; a 0-d tensor as a float."""
    values = tensor.detach().double().cpu().numpy().round(digits)
    return float(values) if values.ndim == 0 else values.tolist()


@dataclass
class AttentionMap:
    """One attention heatmap: real tokens only, heads combined.

    Attributes:
        key: a short file-safe name (``document_layer6``, ``query_layer4``, ``ib1_cross``, ``joined_layer6``).
        title: what the map shows, for figure titles.
        rows: tokens of the attending positions.
        columns: tokens attended to.
        weights: ``[len(rows), len(columns)]``, each row a distribution over the columns when the columns are all
            the real keys (true for every map made here).
        layer: 1-based layer of the module the map comes from (``None`` for interaction blocks).
        heads: the heads averaged, ``None`` for all.
        split: for joined sequences, the index where the document starts on both axes.
    """

    key: str
    title: str
    rows: list[str]
    columns: list[str]
    weights: torch.Tensor
    layer: int | None = None
    heads: list[int] | None = None
    split: int | None = None

    def to_json(self) -> dict:
        return {"title": self.title, "layer": self.layer, "heads": self.heads if self.heads is not None else "mean",
                "rows": self.rows, "columns": self.columns, "split": self.split, "weights": rounded(self.weights)}


@dataclass
class KernelScores:
    """Why TK gave one document its score for one query (made by :func:`._kernels.tk_kernel_scores`).

    Attributes:
        query_tokens: the query terms that take part in matching (padding and OOV left out), rows below.
        doc_tokens: the document terms that take part in matching, the columns of ``match_matrix``.
        term_offsets: per document term its ``(start, end)`` characters in the text, or ``None`` when the
            tokenizer cannot tell (word-level vocabularies).
        read_chars: how many characters of the text the model read (the rest was cut at ``doc_max_length``), or
            ``None`` when unknown.
        kernel_mus: the kernel centres ``[K]``.
        match_matrix: cosines ``[q, d]``.
        query_kernel_mass: ``K_i^k`` (eq. 6) ``[q, K]``.
        log_pooled, len_pooled: ``s^k_log`` (eq. 7, log base 2) and ``s^k_len`` (eq. 8) ``[K]``, unweighted.
        log_contributions, len_contributions: the same with the learned scale and ``W_log``/``W_len`` applied
            ``[K]`` (the paper's "model weights included" numbers); they sum to ``s_log``/``s_len``.
        beta, gamma: the final weights: ``score = beta * s_log + gamma * s_len``.
        query_term_contributions: each query term's share of the score ``[q]`` (sums to ``score``).
    """

    query_tokens: list[str]
    doc_tokens: list[str]
    term_offsets: list[tuple[int, int]] | None
    read_chars: int | None
    kernel_mus: list[float]
    match_matrix: torch.Tensor
    query_kernel_mass: torch.Tensor
    log_pooled: torch.Tensor
    len_pooled: torch.Tensor
    log_contributions: torch.Tensor
    len_contributions: torch.Tensor
    beta: float
    gamma: float
    s_log: float
    s_len: float
    score: float
    query_term_contributions: torch.Tensor

    @property
    def kernel_contributions(self) -> torch.Tensor:
        """``[K]``: each kernel's share of the score, ``beta * log_k + gamma * len_k`` (sums to ``score``)."""
        return self.beta * self.log_contributions + self.gamma * self.len_contributions

    @property
    def best_match(self) -> torch.Tensor:
        """``[d]``: each document term's highest cosine with any query term (0 without query terms)."""
        if not self.query_tokens:
            return torch.zeros(len(self.doc_tokens))
        return self.match_matrix.max(0).values

    @property
    def best_query_term(self) -> torch.Tensor:
        """``[d]``: the index (in :attr:`query_tokens`) of each document term's best-matching query term."""
        if not self.query_tokens:
            return torch.zeros(len(self.doc_tokens), dtype=torch.long)
        return self.match_matrix.argmax(0)

    @property
    def nearest_kernel(self) -> torch.Tensor:
        """``[d]``: the index of the kernel whose centre is closest to each term's best match (Figure 3's colour)."""
        mus = torch.tensor(self.kernel_mus)
        return (self.best_match[:, None] - mus[None, :]).abs().argmin(1)

    def to_json(self) -> dict:
        return {
            "score": self.score, "s_log": self.s_log, "s_len": self.s_len, "beta": self.beta, "gamma": self.gamma,
            "kernel_mus": self.kernel_mus,
            "query_tokens": self.query_tokens,
            "doc_tokens": self.doc_tokens,
            "term_offsets": self.term_offsets,
            "read_chars": self.read_chars,
            "query_kernel_mass": rounded(self.query_kernel_mass),
            "log_pooled": rounded(self.log_pooled),
            "len_pooled": rounded(self.len_pooled),
            "log_contributions": rounded(self.log_contributions),
            "len_contributions": rounded(self.len_contributions),
            "kernel_contributions": rounded(self.kernel_contributions),
            "query_term_contributions": rounded(self.query_term_contributions),
            "best_match": rounded(self.best_match),
            "best_query_term": self.best_query_term.tolist(),
            "nearest_kernel_mu": [self.kernel_mus[index] for index in self.nearest_kernel.tolist()],
            "match_matrix": rounded(self.match_matrix),
        }


@dataclass
class DocumentExplanation:
    """Why one document got its score.

    Attributes:
        docid: the collection docid.
        text: the document text (as stored in the index).
        score: the reranker's score for the query.
        rank: the document's rank among the candidates the reranker scored (``None`` when not ranked).
        bm25_rank, bm25_score: its first-stage rank and score (``None`` when outside the BM25 depth).
        attention: attention maps (MORES, PreTTR).
        kernels: TK's kernel scores.
    """

    docid: str
    text: str
    score: float
    rank: int | None = None
    bm25_rank: int | None = None
    bm25_score: float | None = None
    attention: list[AttentionMap] = field(default_factory=list)
    kernels: KernelScores | None = None


@dataclass
class Report:
    """An explanation of one query's ranking: its documents, maps shared by all documents (MORES's query module),
    and, for TK, the comparison of the first two documents."""

    query: str
    reranker: str
    model: str | None
    index: str | None
    source: str
    heads: list[int] | None
    documents: list[DocumentExplanation]
    shared: list[AttentionMap] = field(default_factory=list)
    comparison: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self, figures: dict[str, Any] | None = None) -> dict:
        """The numbers behind every figure; ``figures`` maps names to the PNG files written for them."""
        figures = figures or {}
        documents = []
        for number, document in enumerate(self.documents):
            documents.append({
                "docid": document.docid, "score": document.score, "rank": document.rank,
                "bm25_rank": document.bm25_rank, "bm25_score": document.bm25_score, "text": document.text,
                "figures": figures.get(number, {}),
                "attention": {item.key: item.to_json() for item in document.attention},
                "kernels": document.kernels.to_json() if document.kernels is not None else None,
            })
        return {
            "query": self.query, "reranker": self.reranker, "model": self.model, "index": self.index,
            "source": self.source, "heads": self.heads if self.heads is not None else "mean",
            "shared": {item.key: item.to_json() for item in self.shared},
            "shared_figures": figures.get("shared", {}),
            "documents": documents,
            "comparison": self.comparison,
            "comparison_figures": figures.get("comparison", {}),
            "notes": self.notes,
        }

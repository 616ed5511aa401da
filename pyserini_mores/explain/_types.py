"""What an explanation holds: attention maps, TK kernel scores, per-document and per-query results — plain numbers
that the figures, the JSON and the HTML page are all made from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ._kernels import KernelScores


def rounded(tensor: "torch.Tensor", digits: int = 6):
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
    weights: "torch.Tensor"
    layer: int | None = None
    heads: list[int] | None = None
    split: int | None = None

    def to_json(self) -> dict:
        return {"title": self.title, "layer": self.layer, "heads": self.heads if self.heads is not None else "mean",
                "rows": self.rows, "columns": self.columns, "split": self.split, "weights": rounded(self.weights)}


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
    kernels: "KernelScores | None" = None


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

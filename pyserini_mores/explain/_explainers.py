"""Explanations of one query's documents, by model type (:data:`EXPLAINERS`): attention maps from the model's own
layers (:mod:`._attention`: MORES, PreTTR) or kernel scores (TK), read from the reranker's sidecar where it has one
and from the document text otherwise."""
from __future__ import annotations

import logging
from functools import partial
from typing import Callable, Sequence

import torch

from ._attention import JoinedAttention, MoresAttention, mores_attention, prettr_joined_attention
from ._kernels import compare_kernel_scores, tk_kernel_scores
from ._types import AttentionMap, DocumentExplanation, Report

logger = logging.getLogger(__name__)

Explainer = Callable[..., None]


def explain_documents(reranker, query: str, documents: list[DocumentExplanation], *, heads: str | None = None,
                      layer: int | None = None, index: str | None = None) -> Report:
    """A :class:`Report` for ``documents`` (docid and text filled in; scores and ranks as the caller knows them).

    Args:
        reranker: a :class:`~pyserini_mores.rerankers.ModelReranker` whose model type has an explainer
            (:data:`EXPLAINERS`: MORES, PreTTR, TK); its ``sidecar`` (if any) provides the stored document
            representations.
        query: the query text.
        documents: the documents to explain, in display order (TK compares the first two).
        heads: ``"mean"`` (default) or comma-separated 0-based head numbers to average (MORES, PreTTR).
        layer: MORES document-module layer to show, 1-based (default: the last).
        index: the index the documents come from (recorded in the report).

    Raises:
        ValueError: for a model without an explainer, bad heads or layer, or a sidecar that disagrees with a text.
    """
    model = getattr(reranker, "model", None)
    explainer = EXPLAINERS.get(getattr(model, "model_type", None))
    if explainer is None:
        raise ValueError(f"explain supports the rerankers {', '.join(sorted(EXPLAINERS))}; '{reranker.name}' "
                         f"runs {'no learned model' if model is None else f'a {model.model_type!r} model'}")
    sidecar = getattr(reranker, "sidecar", None)
    source = "text" if sidecar is None else f"sidecar {getattr(sidecar, 'path', '')}".rstrip()
    report = Report(query=query, reranker=reranker.name, model=getattr(model, "source", None) or model.config.backbone,
                    index=index, source=source, heads=None, documents=documents)
    if documents:
        model.eval()
        explainer(model, sidecar, report, heads=heads, layer=layer)
    return report


def _stored(sidecar, report: Report) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored vectors ``[B, Lmax, width]`` and lengths ``[B]`` (float32) of each document's first window, which
    is what the model reads of its text (a windowed sidecar stores the rest after it), or ``None`` without sidecar."""
    if sidecar is None:
        return None
    documents = report.documents
    rows = sidecar.rows_for_docids([document.docid for document in documents])
    missing = [document.docid for document, row in zip(documents, rows) if row < 0]
    if missing:
        raise KeyError(f"{len(missing)} document(s) are not in the sidecar (e.g. {', '.join(missing[:3])})")
    starts, lengths, _ = sidecar.window_spans(rows, first_only=True)
    windows = sidecar.window_counts(rows)
    if windows.max(initial=1) > 1:
        report.notes.append(f"The sidecar stores up to {int(windows.max())} windows per document; shown is the "
                            "first window of each, what the model reads of the text (search aggregates every "
                            "window's score).")
    return sidecar.get_spans(starts, lengths, dtype=torch.float32)


def _check_lengths(stored_lengths: torch.Tensor, text_lengths: torch.Tensor, documents, what: str) -> None:
    for document, stored, text in zip(documents, stored_lengths.tolist(), text_lengths.tolist()):
        if stored != text:
            raise ValueError(f"the sidecar holds {stored} {what} for document {document.docid} but its text "
                             f"tokenizes to {text}: was the sidecar built from another text or model?")


def _tokens(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())


# ---- attention maps -------------------------------------------------------------------------------------------------
def combine_heads(probs: torch.Tensor, heads: Sequence[int] | None = None) -> torch.Tensor:
    """``[..., h, r, c]`` → ``[..., r, c]``: the mean over ``heads`` (all heads when ``None``).

    A mean of rows that each sum to 1 still sums to 1, so combined maps stay distributions.
    """
    if heads is None:
        return probs.mean(-3)
    return probs[..., list(heads), :, :].mean(-3)


def parse_heads(text: str | None, num_heads: int) -> list[int] | None:
    """``"mean"``/``None`` → ``None`` (all heads averaged); ``"0,3"`` → ``[0, 3]`` (0-based, checked)."""
    if text is None or text.strip().lower() in ("", "mean", "all"):
        return None
    try:
        heads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--heads takes 'mean' or comma-separated head numbers such as 0,3; got '{text}'") from None
    bad = [head for head in heads if not 0 <= head < num_heads]
    if not heads or bad:
        raise ValueError(f"heads are numbered 0..{num_heads - 1} in this model; got '{text}'")
    return sorted(set(heads))


def explain_mores(model, sidecar, report: Report, *, heads: str | None = None, layer: int | None = None) -> None:
    """Paper Figure 2 from :func:`~._attention.mores_attention`: ``layer`` is the document-module layer shown."""
    _explain_attention(model, sidecar, report, heads, layer, partial(mores_attention, model, document_layer=layer))


def explain_prettr(model, sidecar, report: Report, *, heads: str | None = None, layer: int | None = None) -> None:
    """The first joined layer from :func:`~._attention.prettr_joined_attention` (``layer`` is not used)."""
    _explain_attention(model, sidecar, report, heads, layer, partial(prettr_joined_attention, model))


def _explain_attention(model, sidecar, report: Report, heads: str | None, layer: int | None,
                       take_maps: Callable[..., MoresAttention | JoinedAttention]) -> None:
    """Fill in each document's attention maps from ``take_maps(query_batch, docs=, lengths=, doc_batch=)``, laid out
    by what they are (:data:`ATTENTION_FIGURES`)."""
    documents = report.documents
    report.heads = chosen = parse_heads(heads, model.config.encoder.num_attention_heads)
    query_batch = model.tokenize_queries([report.query])
    doc_batch = model.tokenize_documents([document.text for document in documents])
    stored = _stored(sidecar, report)
    docs, lengths = stored if stored is not None else (None, None)
    if stored is not None:
        _check_lengths(lengths, doc_batch["attention_mask"].sum(1), documents, "tokens")
    maps = take_maps(query_batch, docs=docs, lengths=lengths, doc_batch=doc_batch)
    ATTENTION_FIGURES[type(maps)](model, report, maps, query_batch, doc_batch, chosen, layer)


def _module_figures(model, report: Report, attention: MoresAttention, query_batch: dict, doc_batch: dict,
                    chosen: list[int] | None, layer: int | None) -> None:
    """Paper Figure 2: document-module self-attention (one layer), query-module self-attention (last layer), and
    each interaction block's query→document cross-attention."""
    tokenizer = model.tokenizer
    query_mask = attention.query_mask.cpu()
    query_tokens = _tokens(tokenizer, query_batch["input_ids"][0], query_mask)
    query_map = combine_heads(attention.query[0], chosen).cpu()[query_mask][:, query_mask]
    report.shared.append(AttentionMap(
        key=f"query_layer{attention.query_layer}", rows=query_tokens, columns=query_tokens, weights=query_map,
        title=f"Query representation module, layer {attention.query_layer}: query self-attention",
        layer=attention.query_layer, heads=chosen))
    for row, document in enumerate(report.documents):
        doc_mask = attention.doc_mask[row].cpu()
        doc_tokens = _tokens(tokenizer, doc_batch["input_ids"][row], doc_mask)
        document_map = combine_heads(attention.document[row], chosen).cpu()[doc_mask][:, doc_mask]
        document.attention.append(AttentionMap(
            key=f"document_layer{attention.document_layer}", rows=doc_tokens, columns=doc_tokens,
            weights=document_map, layer=attention.document_layer, heads=chosen,
            title=f"Document representation module, layer {attention.document_layer}: document self-attention"))
        for block, probs in enumerate(attention.cross, start=1):
            cross_map = combine_heads(probs[row], chosen).cpu()[query_mask][:, doc_mask]
            document.attention.append(AttentionMap(
                key=f"ib{block}_cross", rows=query_tokens, columns=doc_tokens, weights=cross_map, heads=chosen,
                title=f"Interaction block {block}: query → document cross-attention"))
    if report.source != "text":
        report.notes.append(f"Cross-attention keys come from the stored Reuse-{model.config.reuse.upper()} "
                            "representations; the document-module self-attention was recomputed from the text.")


def _joined_figures(model, report: Report, joined: JoinedAttention, query_batch: dict, doc_batch: dict,
                    chosen: list[int] | None, layer: int | None) -> None:
    """Query↔document attention in the first joined layer ``l+1`` (rows and columns: real query tokens, then real
    document tokens)."""
    if layer is not None:
        logger.warning("--layer is ignored for PreTTR: its map is the first joined layer (l+1)")
    tokenizer = model.tokenizer
    query_ids, query_mask = query_batch["input_ids"][0], query_batch["attention_mask"][0].bool()
    query_tokens = _tokens(tokenizer, query_ids, query_mask)
    for row, document in enumerate(report.documents):
        mask = joined.mask[row].cpu()
        doc_mask = doc_batch["attention_mask"][row].bool()
        tokens = query_tokens + _tokens(tokenizer, doc_batch["input_ids"][row], doc_mask)
        weights = combine_heads(joined.probs[row], chosen).cpu()[mask][:, mask]
        document.attention.append(AttentionMap(
            key=f"joined_layer{joined.layer}", rows=tokens, columns=tokens, weights=weights, layer=joined.layer,
            heads=chosen, split=len(query_tokens),
            title=f"First joined layer ({joined.layer}): query ↔ document attention"))


#: what a model's attention maps are → how the report lays them out
ATTENTION_FIGURES = {MoresAttention: _module_figures, JoinedAttention: _joined_figures}


# ---- TK -------------------------------------------------------------------------------------------------------------
def explain_tk(model, sidecar, report: Report, *, heads: str | None = None, layer: int | None = None) -> None:
    """Paper Figure 3: kernel mass per query term, per-kernel log/length scores, best matches per document term,
    and the comparison of the first two documents."""
    if heads not in (None, "mean") or layer is not None:
        logger.warning("--heads and --layer are ignored for TK: its scores come from kernels, not attention")
    documents = report.documents
    stored = _stored(sidecar, report)
    docs, lengths = stored if stored is not None else (None, None)
    scores = tk_kernel_scores(model, report.query, [document.text for document in documents], docs=docs,
                              lengths=lengths)
    for document, kernels in zip(documents, scores):
        document.kernels = kernels
    if len(documents) >= 2:
        report.comparison = {"first": documents[0].docid, "second": documents[1].docid,
                             **compare_kernel_scores(scores[0], scores[1])}


#: model type → what explains its scores; a model type without an entry is not explained (a new model adds its own)
EXPLAINERS: dict[str, Explainer] = {"mores": explain_mores, "prettr": explain_prettr, "tk": explain_tk}

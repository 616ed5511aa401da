"""Each model's analytic online FLOPs, in the vocabulary of :mod:`.flops`: one formula per model family (what it
computes once per query, once per scored batch and once per candidate), and how a built model's configuration reads
into it (``*_model_flops``, what :mod:`.model_hooks` registers). The tests check every ``matmul`` term against a real
run of the model.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models.mores import REUSES
from ..models.tk import MODES
from .flops import EncoderShape, FlopCount, Term, attention, bert_layer, cls_only_layer, linear


def cross_encoder_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, num_labels: int = 2) -> FlopCount:
    """The encoder over the joined pair per candidate, its last layer [CLS]-only: ``(L−1)·layer(q + d) +
    cls_layer(q + d) + 4n`` (head ``n→2``). ``query_tokens`` = ``[CLS] q [SEP]``, ``doc_tokens`` = ``d [SEP]``;
    notation in :mod:`.flops`."""
    joint = query_tokens + doc_tokens
    return FlopCount((
        Term("encoder", (shape.layers - 1) * bert_layer(joint, shape)),
        Term("last_layer_cls", cls_only_layer(joint, shape)),
        Term("head", linear(1, shape.hidden, num_labels)),
    ))


def mores_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, interaction_blocks: int, reuse: str,
                num_labels: int = 2, every_row: bool = False, interaction: str = "separate") -> FlopCount:
    """MORES's online FLOPs: the query module once, then ``K`` interaction blocks per candidate.
    ``doc_tokens`` = ``[CLS] d [SEP]``.

    Query: ``(L−K)·layer(q) + 2·q·n²`` (query module + block 1's cross-attention query projection, shared).
    Per candidate and block: cross-attention ``4·q·d·n + 2·q·n²`` (+ ``2·q·n²`` query projection for blocks ≥ 2),
    self-attention ``8·q·n² + 4·q²·n``, FFN ``4·q·n·f`` — except in the last block with [CLS] pooling, where the
    self-attention and FFN are ``cls_layer(q)``; Reuse-S1 adds the document keys/values ``4·d·n²``; head ``4n``.
    ``every_row=False`` counts what the code runs with [CLS] pooling; ``True`` the paper's count, every row of every
    block (mean pooling runs it too). ``interaction='joint'``: :func:`joint_mores_flops`. Notation in :mod:`.flops`.
    """
    if reuse not in REUSES:
        raise ValueError(f"reuse must be s1 or s2, not {reuse!r}")
    if interaction == "joint":
        return joint_mores_flops(shape, query_tokens, doc_tokens, interaction_blocks, reuse, num_labels, every_row)
    n, f, q, d = shape.hidden, shape.ffn, query_tokens, doc_tokens
    terms = [
        Term("query_module", (shape.layers - interaction_blocks) * bert_layer(q, shape), "query"),
        Term("block1_cross_query_projection", linear(q, n, n), "query"),
    ]
    for block in range(1, interaction_blocks + 1):
        prefix = f"block{block}_"
        if reuse == "s1":
            terms.append(Term(prefix + "doc_key_value_projection", 2 * linear(d, n, n)))
        if block > 1:
            terms.append(Term(prefix + "cross_query_projection", linear(q, n, n)))
        terms += [
            Term(prefix + "cross_attention", attention(q, d, n)),
            Term(prefix + "cross_output", linear(q, n, n)),
        ]
        if block == interaction_blocks and not every_row:
            terms.append(Term(prefix + "self_attention_ffn_cls", cls_only_layer(q, shape)))
        else:
            terms += [
                Term(prefix + "self_attention", linear(q, n, 3 * n) + attention(q, q, n) + linear(q, n, n)),
                Term(prefix + "ffn", linear(q, n, f) + linear(q, f, n)),
            ]
    terms.append(Term("head", linear(1, n, num_labels)))
    return FlopCount(tuple(terms))


def joint_mores_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, interaction_blocks: int, reuse: str,
                      num_labels: int = 2, every_row: bool = False) -> FlopCount:
    """MORES with joint interaction blocks: the query module once; per block the query rows' projections
    ``6·q·n²`` (once per query in block 1, whose input is the same for every candidate), one attention over
    ``q + d`` keys ``4·q·(q + d)·n``, its output ``2·q·n²`` and the FFN — in the last block with [CLS] pooling only
    the [CLS] row's query, output and FFN, the query rows' keys and values ``4·q·n²`` and ``4·(q + d)·n`` over the
    projected keys and values; Reuse-S1 adds the document keys/values ``4·d·n²``; head ``4n``."""
    n, f, q, d = shape.hidden, shape.ffn, query_tokens, doc_tokens
    terms = [Term("query_module", (shape.layers - interaction_blocks) * bert_layer(q, shape), "query")]
    for block in range(1, interaction_blocks + 1):
        prefix = f"block{block}_"
        query_side = "query" if block == 1 else "candidate"
        if reuse == "s1":
            terms.append(Term(prefix + "doc_key_value_projection", 2 * linear(d, n, n)))
        if block == interaction_blocks and not every_row:
            terms += [
                Term(prefix + "query_key_value_projection", linear(q, n, 2 * n), query_side),
                Term(prefix + "cls_attention_ffn", linear(1, n, n) + 2 * (2 * (q + d) * n) + linear(1, n, n)
                     + linear(1, n, f) + linear(1, f, n)),
            ]
        else:
            terms += [
                Term(prefix + "query_key_value_projection", linear(q, n, 3 * n), query_side),
                Term(prefix + "joint_attention", attention(q, q + d, n) + linear(q, n, n)),
                Term(prefix + "ffn", linear(q, n, f) + linear(q, f, n)),
            ]
    terms.append(Term("head", linear(1, n, num_labels)))
    return FlopCount(tuple(terms))


def prettr_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, join_layer: int,
                 compression_dim: int | None = None, reuse: str = "states", pooling: str = "cls") -> FlopCount:
    """PreTTR's online FLOPs: layers ``1..l`` of the query once; ``l+1..L`` per candidate, the last one [CLS]-only.

    ``query_tokens`` = the query block ``q``; ``doc_tokens`` = the stored ``d [SEP]`` tokens ``d``; joint
    ``T = q + d``; ``reuse='kv'``: the documents' last-layer keys and values are stored (``l = L−1`` only). Query:
    ``l·layer(q)`` (+ ``4·q·n·e`` compress→decompress of the query states). The last layer computes the [CLS] row
    only, with keys and values folded into the query (``cls_only_layer``): per head the logits and the weighted sum
    act on the unprojected states, ``2·h·n`` per token each, instead of ``2·n²`` projections.

    * ``l = L−1``, uncompressed (or ``e ≥ n``): batch ``4·n² + 2·h·q·n`` ([CLS] query projection, folding,
      query-block logits); candidate ``2·h·d·n + 2·h·(q+d)·n + 4·n² + 4·n·f + 4n`` (+ ``2·d·e·n`` decompression).
    * ``l = L−1``, compressed ``e < n`` (attention in code space, ``CompressedTokenBlock``): batch
      ``4·n² + 2·h·q·n + 2·h·n·e``; candidate ``2·d·e² + 4·h·d·e + 2·h·e·n + 2·h·q·n + 4·n² + 4·n·f + 4n``.
    * ``l = L−1``, stored keys and values: batch ``2·n² + 4·q·n² + 2·q·n`` ([CLS] query, the query block's keys and
      values and logits); candidate ``2·q·n + 4·d·n + 2·n² + 4·n·f + 4n``.
    * ``l < L−1``: candidate ``[2·d·e·n] + (L−1−l)·layer(T) + 8·n² + 4·h·T·n + 4·n·f + 4n``.
    * ``pooling='avg'``: the last layer runs for the ``q`` query-block rows over all ``T`` keys (no folding, no code
      space): candidate ``[2·d·e·n] + [(L−1−l)·layer(T)] + 4·K·n² + 4·q·n² + 4·q·T·n + 4·q·n·f + 4n``, where ``K``
      keys and values are projected per candidate (``d``; ``T`` when ``l < L−1``; none stored: ``reuse='kv'``) and,
      at ``l = L−1``, the query block's keys, values and queries (``6·q·n²``) once per batch instead.

    Notation in :mod:`.flops`.
    """
    n, f, h, L = shape.hidden, shape.ffn, shape.heads, shape.layers
    q, d, e = query_tokens, doc_tokens, compression_dim
    if not 0 <= join_layer < L:
        raise ValueError(f"join_layer must be in [0, {L}), not {join_layer}")
    terms = [Term("query_layers", join_layer * bert_layer(q, shape), "query")]
    if e:
        terms.append(Term("query_compress_roundtrip", linear(q, n, e) + linear(q, e, n), "query"))
    if pooling == "avg":
        return FlopCount(tuple(terms + _averaged_last_layer_terms(shape, q, d, join_layer, e, reuse)))
    # The [CLS]-only last layer's tail: output projection, one FFN row, head.
    tail = [Term("last_output", linear(1, n, n)), Term("last_ffn", linear(1, n, f) + linear(1, f, n)),
            Term("head", linear(1, n, 2))]
    if reuse == "kv":
        if join_layer != L - 1:
            raise ValueError(f"stored keys and values need join_layer = {L - 1}, not {join_layer}")
        return FlopCount(tuple(terms + [
            Term("last_cls_query_projection", linear(1, n, n), "batch"),
            Term("last_query_block_keys_values", linear(q, n, 2 * n), "batch"),
            Term("last_query_block_logits", 2 * q * n, "batch"),
            Term("last_query_block_pool", 2 * q * n),
            Term("last_doc_logits", 2 * d * n),
            Term("last_doc_pool", 2 * d * n),
        ] + tail))
    tail.insert(0, Term("last_value_fold", 2 * h * (n // h) * n))  # keys and values folded into the query
    if join_layer == L - 1:
        terms += [Term("last_cls_query_projection", linear(1, n, n), "batch"),
                  Term("last_key_fold", 2 * h * (n // h) * n, "batch"),
                  Term("last_query_block_logits", 2 * h * q * n, "batch")]
        if e and e < n:
            terms += [
                Term("last_code_query", 2 * h * n * e, "batch"),
                Term("doc_whitening", linear(d, e, e)),
                Term("last_doc_logits", 2 * h * d * e),
                Term("last_doc_pool", 2 * h * d * e + 2 * h * e * n),
                Term("last_query_block_pool", 2 * h * q * n),
            ]
        else:
            if e:
                terms.append(Term("decompress", linear(d, e, n)))
            terms += [Term("last_doc_logits", 2 * h * d * n), Term("last_pool", 2 * h * (q + d) * n)]
        return FlopCount(tuple(terms + tail))
    joint = q + d
    if e:
        terms.append(Term("decompress", linear(d, e, n)))
    terms += [
        Term("joint_layers", (L - 1 - join_layer) * bert_layer(joint, shape)),
        Term("last_cls_query_projection", linear(1, n, n)),
        Term("last_key_fold", 2 * h * (n // h) * n),
        Term("last_logits", 2 * h * joint * n),
        Term("last_pool", 2 * h * joint * n),
    ]
    return FlopCount(tuple(terms + tail))


def _averaged_last_layer_terms(shape: EncoderShape, q: int, d: int, join_layer: int, e: int | None,
                               reuse: str) -> list[Term]:
    """The candidates' work of ``pooling='avg'`` (:func:`prettr_flops`): the joint layers below the last, then the
    last layer for the query block's rows."""
    n, f, L = shape.hidden, shape.ffn, shape.layers
    terms = []
    if reuse == "kv":
        terms.append(Term("last_query_block_keys_values", linear(q, n, 2 * n), "batch"))
    else:
        if e:
            terms.append(Term("decompress", linear(d, e, n)))
        if join_layer == L - 1:
            terms += [Term("last_query_block_keys_values", linear(q, n, 2 * n), "batch"),
                      Term("last_doc_keys_values", linear(d, n, 2 * n))]
        else:
            terms += [Term("joint_layers", (L - 1 - join_layer) * bert_layer(q + d, shape)),
                      Term("last_keys_values", linear(q + d, n, 2 * n))]
    # at l = L - 1 the query rows are the same for every candidate: their queries are projected once per batch
    queries_scope = "batch" if join_layer == L - 1 else "candidate"
    return terms + [
        Term("last_query_rows_queries", linear(q, n, n), queries_scope),
        Term("last_query_rows_attention", attention(q, q + d, n)),
        Term("last_query_rows_output", linear(q, n, n)),
        Term("last_query_rows_ffn", linear(q, n, f) + linear(q, f, n)),
        Term("head", linear(1, n, 2)),
    ]


@dataclass(frozen=True)
class TKShape:
    """The dimensions that decide TK's FLOPs."""

    embedding: int
    layers: int
    heads: int
    head_dim: int
    ffn: int
    kernels: int

    @classmethod
    def from_config(cls, config) -> TKShape:
        """From a :class:`~pyserini_mores.models.tk.TKConfig`."""
        return cls(config.embedding_dim, config.num_layers, config.num_heads, config.head_dim, config.ffn_dim,
                   len(config.kernel_mus))


#: FLOPs of one RBF kernel value: (M − μ), square, exp, sum over the document
KERNEL_FLOPS_PER_VALUE = 4


def tk_layer(tokens: int, shape: TKShape) -> int:
    """``4·T·m·F + 8·T·m·A + 4·T²·A``: FF block, QKV + output projections, attention (``A = heads·head_dim``)."""
    m, width = shape.embedding, shape.heads * shape.head_dim
    return (linear(tokens, m, shape.ffn) + linear(tokens, shape.ffn, m) + linear(tokens, m, 3 * width)
            + attention(tokens, tokens, width) + linear(tokens, width, m))


def tk_flops(shape: TKShape, query_tokens: int, doc_tokens: int, mode: str) -> FlopCount:
    """TK's online FLOPs (embedding ``m``, ``Lt`` layers, ``K`` kernels): the contextualised query
    ``Lt·tk_layer(q)`` (``online``: once per batch, as ``score_texts`` encodes the query per call); per candidate the
    cosine match matrix ``2·q·d·m`` and the final linears ``4K + 4``, and as ``elementwise`` terms (the kernel
    pooling *is* TK's interaction) the document norms ``2·d·m`` and kernels ``4·q·d·K``; ``online`` adds
    ``Lt·tk_layer(d)`` per candidate. Notation in :mod:`.flops`."""
    if mode not in MODES:
        raise ValueError(f"mode must be ctx or online, not {mode!r}")
    m, q, d, k = shape.embedding, query_tokens, doc_tokens, shape.kernels
    query_scope = "query" if mode == "ctx" else "batch"
    terms = [Term("query_contextualiser", shape.layers * tk_layer(q, shape), query_scope)]
    if mode == "online":
        terms.append(Term("doc_contextualiser", shape.layers * tk_layer(d, shape)))
    terms += [
        Term("cosine", 2 * q * d * m),
        Term("doc_norms", 2 * d * m, kind="elementwise"),
        Term("kernels", KERNEL_FLOPS_PER_VALUE * q * d * k, kind="elementwise"),
        Term("scoring_linears", linear(1, k, 1) * 2 + linear(1, 2, 1)),
    ]
    return FlopCount(tuple(terms))


# ---- a built model's configuration → its formula ------------------------------------------------------------------
def cross_encoder_model_flops(model, query_tokens: int, doc_tokens: int) -> FlopCount:
    """:func:`cross_encoder_flops` of a :class:`~pyserini_mores.models.cross_encoder.CrossEncoder` (``doc_tokens`` =
    ``d [SEP]``)."""
    return cross_encoder_flops(EncoderShape.from_dims(model.config.encoder), query_tokens, doc_tokens,
                               model.config.num_labels)


def mores_model_flops(model, query_tokens: int, doc_tokens: int) -> FlopCount:
    """:func:`mores_flops` of a :class:`~pyserini_mores.models.mores.MoresModel`; ``doc_tokens`` counts
    ``[CLS] d [SEP]``."""
    config = model.config
    return mores_flops(EncoderShape.from_dims(config.encoder), query_tokens, doc_tokens,
                       config.n_interaction_blocks, config.reuse, config.num_labels,
                       every_row=config.pooling != "cls", interaction=config.interaction)


def prettr_model_flops(model, query_tokens: int, doc_tokens: int) -> FlopCount:
    """:func:`prettr_flops` of a :class:`~pyserini_mores.models.prettr.PreTTRModel`; ``query_tokens`` is the query
    block, ``doc_tokens`` the stored ``d [SEP]``."""
    config = model.config
    return prettr_flops(EncoderShape.from_dims(config.encoder), query_tokens, doc_tokens, config.join_layer,
                        config.compression_dim, config.reuse, config.pooling)


def tk_model_flops(model, query_tokens: int, doc_tokens: int) -> FlopCount:
    """:func:`tk_flops` of a :class:`~pyserini_mores.models.tk.TKModel` (``doc_tokens``: document terms)."""
    return tk_flops(TKShape.from_config(model.config), query_tokens, doc_tokens, model.config.mode)


__all__ = ["KERNEL_FLOPS_PER_VALUE", "TKShape", "cross_encoder_flops", "cross_encoder_model_flops", "joint_mores_flops",
           "mores_flops", "mores_model_flops", "prettr_flops", "prettr_model_flops", "tk_flops", "tk_layer",
           "tk_model_flops"]

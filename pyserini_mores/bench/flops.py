"""Analytic FLOP counts of each model's *online* work (what runs per query), following SEEDS-SPEC Table 1 with the
constants written out, and counting what the shipped code executes.

Conventions: a multiply-add is 2 FLOPs; a linear map of ``T`` tokens from width ``a`` to ``b`` costs ``2·T·a·b``;
attention of ``Tq`` query rows over ``Tk`` keys at total width ``w`` (all heads) costs ``4·Tq·Tk·w`` (``QKᵀ`` and
``PV``). Biases, LayerNorm, softmax, activations, masks and embedding lookups are not counted (``O(T·n)``), except for
TK, whose kernel pooling *is* its interaction (counted as ``elementwise`` terms, 4 FLOPs per kernel value:
subtract, square, exp, sum). Every ``matmul`` term equals what :class:`torch.utils.flop_counter.FlopCounterMode`
counts when the model runs (the tests check this), so achieved FLOP/s compare with a GEMM peak.

Each count is a list of :class:`Term` with a *scope*: ``query`` (once per query: query encoding), ``batch`` (once
per scored batch, e.g. PreTTR's [CLS] query projection inside ``score``) or ``candidate`` (once per (query,
candidate) pair). ``FlopCount.total(N, batches)`` = query + batches·batch + N·candidate.

Notation: ``n`` hidden width, ``f`` FFN width, ``h`` heads, ``L`` layers, ``q`` query tokens (specials included),
``d`` document tokens as the model sees them (see each function), ``K`` MORES interaction blocks.

* BERT layer over ``T`` tokens: ``layer(T) = 8·T·n² + 4·T²·n + 4·T·n·f`` (Q/K/V/O projections, attention, FFN).
* The [CLS] row only of a layer over ``T`` tokens (``cls_only_attention``: keys and values folded into the query):
  ``cls_layer(T) = 8·n² + 4·h·T·n + 4·n·f`` (query and output projections, key and value folds, logits and pool).
* Cross-encoder, per candidate: ``(L−1)·layer(q + d) + cls_layer(q + d) + 4n`` (head ``n→2``).
* MORES, query: ``(L−K)·layer(q) + 2·q·n²`` (query module + block 1's cross-attention query projection, shared).
  Per candidate and block: cross-attention ``4·q·d·n + 2·q·n²`` (+ ``2·q·n²`` query projection for blocks ≥ 2),
  self-attention ``8·q·n² + 4·q²·n``, FFN ``4·q·n·f`` — except in the last block with [CLS] pooling, where the
  self-attention and FFN are ``cls_layer(q)``; Reuse-S1 adds the document keys/values ``4·d·n²``; head ``4n``.
  (The paper's count, every row of every block, is ``mores_flops(..., every_row=True)``.)
* PreTTR (join layer ``l``, query block ``q``, stored ``d`` tokens, joint ``T = q + d``), query: ``l·layer(q)``
  (+ ``4·q·n·e`` compress→decompress of the query states). Last layer computes the [CLS] row only, with keys and
  values folded into the query (``cls_only_layer``): per head the logits and the weighted sum act on the unprojected
  states, ``2·h·n`` per token each, instead of ``2·n²`` projections.
    - ``l = L−1``, uncompressed (or ``e ≥ n``): batch ``4·n² + 2·h·q·n`` ([CLS] query projection, folding, query-block
      logits); candidate ``2·h·d·n + 2·h·(q+d)·n + 4·n² + 4·n·f + 4n`` (+ ``2·d·e·n`` decompression if ``e``).
    - ``l = L−1``, compressed ``e < n`` (attention in code space, ``CompressedTokenBlock``): batch
      ``4·n² + 2·h·q·n + 2·h·n·e``; candidate ``2·d·e² + 4·h·d·e + 2·h·e·n + 2·h·q·n + 4·n² + 4·n·f + 4n``.
    - ``l = L−1``, stored keys and values (``reuse='kv'``): batch ``2·n² + 4·q·n² + 2·q·n`` ([CLS] query, the
      query block's keys and values and logits); candidate ``2·q·n + 4·d·n + 2·n² + 4·n·f + 4n``.
    - ``l < L−1``: candidate ``[2·d·e·n] + (L−1−l)·layer(T) + 8·n² + 4·h·T·n + 4·n·f + 4n``.
* TK (embedding ``m``, ``Lt`` layers of ``H`` heads × ``hd`` (``A = H·hd``), FFN ``F``, ``K`` kernels): layer over
  ``T`` terms ``tk_layer(T) = 4·T·m·F + 8·T·m·A + 4·T²·A``. Query: ``Lt·tk_layer(q)`` (``online``: once per batch,
  as ``score_texts`` encodes the query per call). Candidate: cosine ``2·q·d·m`` + final linears ``4K + 4``;
  elementwise: document norms ``2·d·m`` and kernels ``4·q·d·K``; ``online`` adds ``Lt·tk_layer(d)``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

SCOPES = ("query", "batch", "candidate")
KINDS = ("matmul", "elementwise")
KERNEL_FLOPS_PER_VALUE = 4  # (M − μ), square, exp, sum over the document: one RBF kernel value


@dataclass(frozen=True)
class Term:
    """One named piece of work: ``flops`` per occurrence of its ``scope``."""

    name: str
    flops: int
    scope: str = "candidate"
    kind: str = "matmul"

    def __post_init__(self):
        if self.scope not in SCOPES or self.kind not in KINDS:
            raise ValueError(f"bad term {self}")


@dataclass(frozen=True)
class FlopCount:
    """The online FLOPs of one model configuration, as a list of :class:`Term`."""

    terms: tuple[Term, ...] = field(default_factory=tuple)

    def sum(self, scope: str | None = None, kind: str | None = None) -> int:
        return sum(t.flops for t in self.terms
                   if (scope is None or t.scope == scope) and (kind is None or t.kind == kind))

    def total(self, candidates: int, batches: int = 1, kind: str | None = None) -> int:
        """FLOPs of one query against ``candidates`` scored in ``batches`` batches."""
        return (self.sum("query", kind) + batches * self.sum("batch", kind)
                + candidates * self.sum("candidate", kind))

    def to_dict(self) -> dict:
        return {"query": self.sum("query"), "per_batch": self.sum("batch"), "per_candidate": self.sum("candidate"),
                "terms": [asdict(t) for t in self.terms]}


@dataclass(frozen=True)
class EncoderShape:
    """The dimensions that decide a BERT-family model's FLOPs."""

    hidden: int
    layers: int
    heads: int
    ffn: int

    @classmethod
    def from_dims(cls, dims) -> "EncoderShape":
        """From a :class:`~pyserini_mores.models._layers.BertDims`."""
        return cls(dims.hidden_size, dims.num_hidden_layers, dims.num_attention_heads, dims.intermediate_size)


def linear(tokens: int, d_in: int, d_out: int) -> int:
    """``2·T·a·b``: a dense map of ``tokens`` rows."""
    return 2 * tokens * d_in * d_out


def attention(query_tokens: int, key_tokens: int, width: int) -> int:
    """``4·Tq·Tk·w``: ``QKᵀ`` and ``PV`` summed over heads of total width ``w``."""
    return 4 * query_tokens * key_tokens * width


def bert_layer(tokens: int, shape: EncoderShape) -> int:
    """``8·T·n² + 4·T²·n + 4·T·n·f``: one post-LN BERT layer over ``tokens`` tokens, every row computed."""
    n, f = shape.hidden, shape.ffn
    return (linear(tokens, n, 3 * n) + attention(tokens, tokens, n) + linear(tokens, n, n)
            + linear(tokens, n, f) + linear(tokens, f, n))


def cls_only_layer(tokens: int, shape: EncoderShape) -> int:
    """``8·n² + 4·h·T·n + 4·n·f``: the [CLS] row of a layer over ``tokens`` tokens, keys and values folded."""
    n, f, h = shape.hidden, shape.ffn, shape.heads
    folds = 2 * (2 * h * (n // h) * n)  # W_k,hᵀ q_h and W_v,h (Σ p s)
    return linear(1, n, n) + folds + 2 * (2 * h * tokens * n) + linear(1, n, n) + linear(1, n, f) + linear(1, f, n)


def cross_encoder_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, num_labels: int = 2) -> FlopCount:
    """The encoder over the joined pair, its last layer [CLS]-only. ``query_tokens`` = ``[CLS] q [SEP]``,
    ``doc_tokens`` = ``d [SEP]``."""
    joint = query_tokens + doc_tokens
    return FlopCount((
        Term("encoder", (shape.layers - 1) * bert_layer(joint, shape)),
        Term("last_layer_cls", cls_only_layer(joint, shape)),
        Term("head", linear(1, shape.hidden, num_labels)),
    ))


def mores_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, interaction_blocks: int, reuse: str,
                num_labels: int = 2, every_row: bool = False) -> FlopCount:
    """MORES: query module once, then ``K`` interaction blocks per candidate. ``doc_tokens`` = ``[CLS] d [SEP]``.

    ``every_row=False`` counts what the shipped code runs with [CLS] pooling (the last block's self-attention and FFN
    for the [CLS] row only); ``True`` the paper's count (mean pooling runs it too).
    """
    if reuse not in ("s1", "s2"):
        raise ValueError(f"reuse must be s1 or s2, not {reuse!r}")
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


def prettr_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int, join_layer: int,
                 compression_dim: int | None = None, reuse: str = "states") -> FlopCount:
    """PreTTR: layers ``1..l`` of the query once; ``l+1..L`` per candidate, the last one [CLS]-only.

    ``query_tokens`` = the query block ``Qb``; ``doc_tokens`` = the stored ``d [SEP]`` tokens; ``reuse='kv'``: the
    documents' last-layer keys and values are stored (``l = L−1`` only).
    """
    n, f, h, L = shape.hidden, shape.ffn, shape.heads, shape.layers
    q, d, e = query_tokens, doc_tokens, compression_dim
    if not 0 <= join_layer < L:
        raise ValueError(f"join_layer must be in [0, {L}), not {join_layer}")
    terms = [Term("query_layers", join_layer * bert_layer(q, shape), "query")]
    if e:
        terms.append(Term("query_compress_roundtrip", linear(q, n, e) + linear(q, e, n), "query"))
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


@dataclass(frozen=True)
class TKShape:
    embedding: int
    layers: int
    heads: int
    head_dim: int
    ffn: int
    kernels: int

    @classmethod
    def from_config(cls, config) -> "TKShape":
        """From a :class:`~pyserini_mores.models.tk.TKConfig`."""
        return cls(config.embedding_dim, config.num_layers, config.num_heads, config.head_dim, config.ffn_dim,
                   len(config.kernel_mus))


def tk_layer(tokens: int, shape: TKShape) -> int:
    """``4·T·m·F + 8·T·m·A + 4·T²·A``: FF block, QKV + output projections, attention (``A = heads·head_dim``)."""
    m, width = shape.embedding, shape.heads * shape.head_dim
    return (linear(tokens, m, shape.ffn) + linear(tokens, shape.ffn, m) + linear(tokens, m, 3 * width)
            + attention(tokens, tokens, width) + linear(tokens, width, m))


def tk_flops(shape: TKShape, query_tokens: int, doc_tokens: int, mode: str) -> FlopCount:
    """TK: contextualised query, cosine match matrix, kernels; ``online`` also contextualises every document."""
    if mode not in ("ctx", "online"):
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


def batches_for(candidates: int, batch_size: int) -> int:
    """How many batches the reranker scores ``candidates`` in."""
    return max(1, math.ceil(candidates / batch_size))


def flop_counter():
    """A :class:`torch.utils.flop_counter.FlopCounterMode` that also counts CPU fused attention (which torch's
    registry leaves out), for checking the formulas against a real run."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        batch, heads, rows, head_dim = query_shape
        keys, value_dim = key_shape[-2], value_shape[-1]
        return 2 * batch * heads * rows * keys * (head_dim + value_dim)

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu}
    return FlopCounterMode(display=False, custom_mapping=mapping)


__all__ = ["Term", "FlopCount", "EncoderShape", "TKShape", "linear", "attention", "bert_layer", "cls_only_layer",
           "tk_layer", "cross_encoder_flops", "mores_flops", "prettr_flops", "tk_flops", "batches_for", "flop_counter"]

"""The benchmark's FLOP accounting: the vocabulary of analytic FLOP counts (what each model's formula in
:mod:`.model_flops` returns, and the costs of the pieces it is written in), how many batches a query is scored in,
and a counter that checks the formulas against a real run.

Conventions: a multiply-add is 2 FLOPs; a linear map of ``T`` tokens from width ``a`` to ``b`` costs ``2·T·a·b``;
attention of ``Tq`` query rows over ``Tk`` keys at total width ``w`` (all heads) costs ``4·Tq·Tk·w`` (``QKᵀ`` and
``PV``). Biases, LayerNorm, softmax, activations, masks and embedding lookups are not counted (``O(T·n)``), except
where they *are* the interaction (TK's kernel pooling, counted as ``elementwise`` terms). Every ``matmul`` term
equals what :class:`torch.utils.flop_counter.FlopCounterMode` counts when the model runs (the tests check this), so
achieved FLOP/s compare with a GEMM peak.

Each count is a list of :class:`Term` with a *scope*: ``query`` (once per query: query encoding), ``batch`` (once
per scored batch, e.g. PreTTR's [CLS] query projection inside ``score``) or ``candidate`` (once per (query,
candidate) pair). ``FlopCount.total(N, batches)`` = query + batches·batch + N·candidate.

Notation: ``n`` hidden width, ``f`` FFN width, ``h`` heads, ``L`` layers, ``q`` query tokens (specials included),
``d`` document tokens as the model reads them.

* BERT layer over ``T`` tokens: ``layer(T) = 8·T·n² + 4·T²·n + 4·T·n·f`` (Q/K/V/O projections, attention, FFN).
* The [CLS] row only of a layer over ``T`` tokens (``cls_only_attention``: keys and values folded into the query):
  ``cls_layer(T) = 8·n² + 4·h·T·n + 4·n·f`` (query and output projections, key and value folds, logits and pool).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

SCOPES = ("query", "batch", "candidate")
KINDS = ("matmul", "elementwise")


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
    def from_dims(cls, dims) -> EncoderShape:
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


__all__ = ["SCOPES", "KINDS", "Term", "FlopCount", "EncoderShape", "linear", "attention", "bert_layer",
           "cls_only_layer", "batches_for", "flop_counter"]

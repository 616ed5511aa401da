"""BERT building blocks written out explicitly, so every model can run layers one by one, attend across sequences
and reuse precomputed keys/values without depending on the internals of a transformers release.

Weights load from any HF BERT-architecture checkpoint (:func:`load_bert_weights`); a test proves the stack equals
``transformers.BertModel`` on the same weights.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BertDims:
    """The hyperparameters of a BERT-architecture encoder (names as in HF ``BertConfig``)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    @classmethod
    def from_hf_config(cls, hf_config) -> "BertDims":
        values = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def key_padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, 1, 1, max_len]`` boolean mask, True where a key position holds a real token."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]


#: Attention over at most this many query rows is written out while training on CPU (see :func:`attention_context`)
WRITTEN_OUT_MAX_QUERIES = 16


def attention_context(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                      scale: float | None = None) -> torch.Tensor:
    """``softmax(Q·Kᵀ·scale) V`` over heads ``[B, h, q|L, d]`` with a boolean ``mask`` (True = may be attended to),
    exactly what ``F.scaled_dot_product_attention`` computes: a row without any key gets zeros.

    While autograd records on CPU, attention of short query sides (≤ :data:`WRITTEN_OUT_MAX_QUERIES` rows: MORES's
    blocks, every model's query encoder) is written out with an fp32 softmax, because the fused CPU kernel's backward
    is slow with few query rows; with many rows the fused kernel is the faster one, so long sequences and every call
    without gradients (reranking, sidecar builds) keep it.
    """
    if queries.shape[-2] > WRITTEN_OUT_MAX_QUERIES or queries.device.type != "cpu" or not (
            torch.is_grad_enabled() and any(t.requires_grad for t in (queries, keys, values))):
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    logits = queries @ keys.transpose(-1, -2)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32 softmax, fp64 stays
    logits = logits * (queries.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:  # finite fill: a key-less row softmaxes to uniform, then the mask zeroes it, as SDPA does
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    if mask is not None:
        probs = probs * mask
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    return probs.to(values.dtype) @ values


def rotated_rows(rows: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``rows [..., n] @ Rᵀ`` in float32, back in ``rows``' dtype: what meets vectors stored rotated (``y = x Rᵀ``)
    as ``rows`` met ``x``, since ``(w Rᵀ) · (x Rᵀ) = w · x`` for an orthogonal ``R [n, n]``. For a linear layer's
    weight ``W [out, n]`` it gives ``W'`` with ``y W'ᵀ = x Wᵀ``."""
    return (rows.float() @ rotation.float().T).to(rows.dtype)


def attention_mask_from_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """HF-style ``[B, L]`` 0/1 mask → ``[B, 1, 1, L]`` boolean key mask."""
    return attention_mask.bool()[:, None, None, :]


def masked_mean(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of the real rows of ``rows [B, T, n]`` (``mask [1|B, T]``, True on real rows): ``[B, n]``."""
    weights = mask.to(rows.dtype)[..., None]
    return (rows * weights).sum(1) / weights.sum(1)


def score_head(head: nn.Linear, pooled: torch.Tensor) -> torch.Tensor:
    """``head(pooled)`` in fp32 whatever the autocast state or the weights' dtype: a bf16 logit keeps 8 significant
    bits, so candidates whose scores differ by less than ~0.4% would tie and be ordered by the input (the trained
    debian MORES 2xIB, 1,000 dev queries x 30 candidates, MRR@10 under bf16 autocast: 0.5379 with a bf16 head, 0.5404
    with this one; fp32 0.5407). The head is one ``n × num_labels`` product per candidate: fp32 costs nothing."""
    with torch.autocast(pooled.device.type, enabled=False):
        bias = head.bias.float() if head.bias is not None else None
        return F.linear(pooled.float(), head.weight.float(), bias)


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout (BERT's input layer)."""

    def __init__(self, dims: BertDims):
        super().__init__()
        self.word_embeddings = nn.Embedding(dims.vocab_size, dims.hidden_size, padding_idx=dims.pad_token_id)
        self.position_embeddings = nn.Embedding(dims.max_position_embeddings, dims.hidden_size)
        self.token_type_embeddings = nn.Embedding(dims.type_vocab_size, dims.hidden_size)
        self.norm = nn.LayerNorm(dims.hidden_size, eps=dims.layer_norm_eps)
        self.dropout = nn.Dropout(dims.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    """Multi-head attention with BERT's post-LN residual: ``LN(x + O(softmax(QKᵀ/√d_head) V))``.

    Keys and values may come from another sequence (cross-attention) or be precomputed
    (:meth:`project_keys_values`), which is what lets MORES Reuse-S2 store them.
    """

    def __init__(self, dims: BertDims):
        super().__init__()
        self.num_heads = dims.num_attention_heads
        self.head_dim = dims.head_dim
        self.query = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.key = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.value = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.output = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.norm = nn.LayerNorm(dims.hidden_size, eps=dims.layer_norm_eps)
        self.attention_dropout = dims.attention_probs_dropout_prob
        self.dropout = nn.Dropout(dims.hidden_dropout_prob)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, L, n]`` → ``[B, h, L, n/h]``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def as_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` split into heads, ``[B, h, L, n/h]``, whether it comes as ``[B, L, n]`` or already split."""
        return x if x.dim() == 4 else self.split_heads(x)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)

    def project_keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``memory [B, L, n]``, biases included, each ``[B, L, n]`` (heads not split)."""
        return self.key(memory), self.value(memory)

    def attend(
        self,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``x [B, q, n]`` over projected ``keys``/``values`` ``[B|1, L, n]`` (or already split into
        heads, ``[B|1, h, L, n/h]``) with a boolean key ``mask [B, 1, 1, L]``; returns the post-LN output
        ``[B, q, n]``."""
        queries = self.split_heads(self.query(x))
        keys, values = self.as_heads(keys), self.as_heads(values)
        if queries.shape[0] == 1 and keys.shape[0] > 1:  # one query side for every candidate: projected once
            queries = queries.expand(keys.shape[0], -1, -1, -1)
        elif keys.shape[0] != queries.shape[0]:
            keys = keys.expand(queries.shape[0], -1, -1, -1)
            values = values.expand(queries.shape[0], -1, -1, -1)
        context = attention_context(
            queries,
            keys,
            values,
            mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
        )
        return self.norm(x + self.dropout(self.output(self.merge_heads(context))))

    def attention_probs(self, x: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Post-softmax attention ``[B, h, q, L]`` of ``x`` over projected ``keys`` ``[B, L, n]`` (or already split
        into heads, ``[B, h, L, n/h]``): what the attention's fused kernel computes without handing it out (for
        explanations and attention-matching losses)."""
        queries = self.split_heads(self.query(x))
        keys = self.as_heads(keys)
        logits = queries @ keys.to(queries.dtype).transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        return logits.softmax(-1)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        keys, values = self.project_keys_values(x if memory is None else memory)
        return self.attend(x, keys, values, mask)


class FeedForward(nn.Module):
    """BERT's position-wise FFN with post-LN residual: ``LN(x + W₂ act(W₁ x))``."""

    def __init__(self, dims: BertDims):
        super().__init__()
        self.intermediate = nn.Linear(dims.hidden_size, dims.intermediate_size)
        self.output = nn.Linear(dims.intermediate_size, dims.hidden_size)
        self.norm = nn.LayerNorm(dims.hidden_size, eps=dims.layer_norm_eps)
        self.activation = _ACTIVATIONS[dims.hidden_act]
        self.dropout = nn.Dropout(dims.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.output(self.activation(self.intermediate(x)))))


class TransformerLayer(nn.Module):
    """One BERT encoder layer: self-attention, then FFN."""

    def __init__(self, dims: BertDims):
        super().__init__()
        self.attention = Attention(dims)
        self.ffn = FeedForward(dims)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The layer's output; with ``attentions`` (a list), its self-attention ``[B, h, L, L]`` is appended too."""
        if attentions is not None:
            attentions.append(self.attention.attention_probs(x, self.attention.key(x), mask))
        return self.ffn(self.attention(x, mask=mask))


class BertEncoder(nn.Module):
    """Embeddings + a stack of :class:`TransformerLayer` (BERT without its pooler)."""

    def __init__(self, dims: BertDims):
        super().__init__()
        self.dims = dims
        self.embeddings = Embeddings(dims)
        self.layers = nn.ModuleList(TransformerLayer(dims) for _ in range(dims.num_hidden_layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        num_layers: int | None = None,
        attentions: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[B, L, n]`` after the first ``num_layers`` layers (all by default); with ``attentions``
        (a list), each layer's self-attention is appended to it."""
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        return self.run_layers(x, attention_mask_from_ids(attention_mask), 0, num_layers, attentions)

    def run_layers(self, x: torch.Tensor, mask: torch.Tensor | None, start: int = 0, stop: int | None = None,
                   attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        for layer in self.layers[start:stop]:
            x = layer(x, mask, attentions)
        return x


# HF BERT parameter names → ours. Only the names differ; shapes and semantics are identical.
_HF_NAME_MAP = [
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("encoder.layer.", "layers."),
    (".attention.self.query.", ".attention.query."),
    (".attention.self.key.", ".attention.key."),
    (".attention.self.value.", ".attention.value."),
    (".attention.output.dense.", ".attention.output."),
    (".attention.output.LayerNorm.", ".attention.norm."),
    (".intermediate.dense.", ".ffn.intermediate."),
    (".output.dense.", ".ffn.output."),
    (".output.LayerNorm.", ".ffn.norm."),
]


def convert_hf_bert_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an HF ``BertModel`` (or ``BertFor*``'s ``bert.``) state dict to :class:`BertEncoder` names."""
    converted = {}
    for name, tensor in state_dict.items():
        if name.startswith("bert."):
            name = name[len("bert."):]
        if name.startswith(("pooler.", "cls.", "classifier.")) or name.endswith("position_ids"):
            continue
        for old, new in _HF_NAME_MAP:
            name = name.replace(old, new)
        converted[name] = tensor
    return converted


def load_bert_weights(encoder: BertEncoder, state_dict: dict[str, torch.Tensor]) -> None:
    """Load HF BERT weights into ``encoder``; fails loudly on any missing or unexpected tensor."""
    converted = convert_hf_bert_state_dict(state_dict)
    encoder.load_state_dict(converted, strict=True)

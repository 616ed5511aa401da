"""The last layer of a ranker computed for its [CLS] row only.

A ranker that scores from the final [CLS] needs, in its last layer, every token's state (as keys and values of the
[CLS] row's attention) but only the [CLS] row's query, output projection and FFN. Computing just that row is exact
and removes most of the last layer: PreTTR's joint layer, the cross-encoder's last layer and MORES's last
interaction block all use it.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F

from ._layers import Attention, FeedForward, TransformerLayer


class AttendedBlock(Protocol):
    """A run of tokens the [CLS] row attends to, seen through head-folded queries (see :func:`cls_only_attention`)."""

    mask: torch.Tensor  # [1|B, T] bool
    batch: int
    length: int

    def logits(self, folded: torch.Tensor) -> torch.Tensor: ...  # [1|B, h, n] -> [Bb, h, T]

    def pool(self, probabilities: torch.Tensor) -> torch.Tensor: ...  # [B, h, T] -> [B, h, n]


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype matrix products run in: the autocast dtype when autocast is on, else the tensor's own."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


class TokenBlock:
    """Token states ``[1|B, T, n]`` with their mask ``[1|B, T]``, as seen by :func:`cls_only_attention`."""

    def __init__(self, states: torch.Tensor, mask: torch.Tensor):
        self.states = states.to(compute_dtype(states))  # cast once, not once per product
        self.mask = mask
        self.batch, self.length = states.shape[0], states.shape[1]

    def logits(self, folded: torch.Tensor) -> torch.Tensor:
        """``[Bb, h, T]`` attention logits for head-folded [CLS] queries ``folded [1|B, h, n]``."""
        folded = folded.to(self.states.dtype)
        if folded.shape[0] == 1:
            return torch.matmul(self.states, folded[0].transpose(0, 1)).transpose(1, 2)  # one GEMM
        return torch.matmul(folded, self.states.transpose(1, 2))

    def pool(self, probabilities: torch.Tensor) -> torch.Tensor:
        """``Σ_j p_hj s_j``: ``[B, h, T]`` → ``[B, h, n]``."""
        states = self.states[0] if self.batch == 1 else self.states
        return torch.matmul(probabilities.to(states.dtype), states)


def cls_only_attention(
    attention: Attention,
    ffn: FeedForward,
    cls: torch.Tensor,
    blocks: list[AttendedBlock | tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The [CLS] row of ``ffn(attention(x))`` where ``x`` is the concatenation of ``blocks`` along tokens.

    Args:
        attention: the layer's self-attention (BERT post-LN).
        ffn: the layer's feed-forward block.
        cls: ``[1|B, n]`` the [CLS] input state (batch 1 when it is shared by every candidate).
        blocks: token blocks whose concatenation along tokens is the sequence: :class:`TokenBlock` (or another
            :class:`AttendedBlock`, e.g. PreTTR's compressed one) or ``(states [1|B, T_i, n], mask [1|B, T_i] bool)``.

    Returns:
        ``[B, n]``, equal to ``ffn(attention(cat(states), mask))[:, 0]``.

    The keys and values of the sequence are never projected. Per head ``h``, ``q_h·(W_k,h s + b_k,h)`` equals
    ``(W_k,hᵀ q_h)·s`` plus a term constant over keys (dropped: softmax ignores it), and
    ``Σ_j p_j (W_v,h s_j + b_v,h) = W_v,h (Σ_j p_j s_j) + b_v,h Σ_j p_j``. So the per-token cost is ``2·h·n`` instead
    of ``2·n²``, and a batch-1 block (the query) is processed once for all candidates.
    """
    heads, head_dim = attention.num_heads, attention.head_dim
    hidden = cls.shape[-1]
    blocks = [TokenBlock(*block) if isinstance(block, tuple) else block for block in blocks]
    batch = max([cls.shape[0]] + [block.batch for block in blocks])
    queries = attention.query(cls).view(-1, heads, head_dim) / math.sqrt(head_dim)  # [Bc, h, dh]
    key_weight = attention.key.weight.view(heads, head_dim, hidden)
    folded = torch.einsum("bhd,hdn->bhn", queries, key_weight.to(queries.dtype))  # [Bc, h, n]

    logits = []
    for block in blocks:
        block_logits = block.logits(folded)  # [Bb, h, T_i]
        block_logits = block_logits.masked_fill(~block.mask[:, None, :], torch.finfo(block_logits.dtype).min)
        logits.append(block_logits.float().expand(batch, -1, -1))
    probabilities = torch.cat(logits, -1).softmax(-1)  # [B, h, T]
    probabilities = F.dropout(probabilities, attention.attention_dropout, attention.training)

    pooled, start = 0, 0  # [B, h, n]: the attention-weighted sum of the (unprojected) token states
    for block in blocks:
        pooled = pooled + block.pool(probabilities[:, :, start:start + block.length])
        start += block.length
    value_weight = attention.value.weight.view(heads, head_dim, hidden)
    context = torch.einsum("bhn,hdn->bhd", pooled, value_weight.to(pooled.dtype))
    context = context + attention.value.bias.view(heads, head_dim) * probabilities.sum(-1)[:, :, None]
    context = context.reshape(batch, heads * head_dim)
    attended = attention.norm(cls + attention.dropout(attention.output(context)))
    return ffn(attended)


def cls_only_attention_stored(attention: Attention, ffn: FeedForward, cls: torch.Tensor, query_states: torch.Tensor,
                              query_mask: torch.Tensor, doc_keys: torch.Tensor, doc_values: torch.Tensor,
                              doc_mask: torch.Tensor) -> torch.Tensor:
    """The [CLS] row of a layer (its ``attention`` and ``ffn``) over a query block followed by documents whose keys
    and values in this layer are already projected (stored): ``[B, n]``, equal to :func:`cls_only_layer` on the
    query block and the documents' input states.

    Args:
        cls: ``[1|B, n]`` the [CLS] input state.
        query_states, query_mask: ``[1|B, Tq, n]`` and ``[1|B, Tq]`` bool, the tokens before the documents (batch 1:
            their keys and values are projected once per call, for every candidate).
        doc_keys, doc_values: ``[B, h, T, n/h]`` head-major, biases included, in the compute dtype.
        doc_mask: ``[B, T]`` bool, True on real tokens.

    Per head and token this is one dot product and one multiply-add of ``n/h`` values: ``2·n`` per token over all
    heads, against ``2·h·n`` when the keys and values are folded into the query (:func:`cls_only_attention`).
    The key biases shift every logit of a head by the same amount, so keeping them (stored keys include them) or
    dropping them (folding) gives the same softmax.
    """
    heads, head_dim = attention.num_heads, attention.head_dim
    batch = max(cls.shape[0], doc_keys.shape[0])
    queries = attention.query(cls).view(-1, heads, head_dim, 1) / math.sqrt(head_dim)  # [Bc, h, dh, 1]
    query_keys, query_values = (attention.split_heads(projection) for projection in
                                attention.project_keys_values(query_states))  # [1|B, h, Tq, dh]
    queries = queries.to(doc_keys.dtype)
    blocks = ((query_keys.to(doc_keys.dtype), query_values.to(doc_keys.dtype), query_mask),
              (doc_keys, doc_values, doc_mask))
    logits = []
    for keys, _, mask in blocks:
        block_logits = torch.matmul(keys, queries).squeeze(-1).float()  # [Bb, h, T]
        block_logits = block_logits.masked_fill(~mask[:, None, :], torch.finfo(block_logits.dtype).min)
        logits.append(block_logits.expand(batch, -1, -1))
    probabilities = torch.cat(logits, -1).softmax(-1)  # [B, h, Tq + T]
    probabilities = F.dropout(probabilities, attention.attention_dropout, attention.training)
    context, start = 0, 0
    for keys, values, _ in blocks:
        length = keys.shape[2]
        weights = probabilities[:, :, None, start:start + length].to(values.dtype)  # [B, h, 1, T]
        context = context + torch.matmul(weights, values).float()  # [B, h, 1, dh]
        start += length
    context = context.reshape(batch, heads * head_dim).to(compute_dtype(attention.output.weight))
    attended = attention.norm(cls + attention.dropout(attention.output(context)))
    return ffn(attended)


def cls_only_layer(layer: TransformerLayer, cls: torch.Tensor,
                   blocks: list[AttendedBlock | tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """:func:`cls_only_attention` of a BERT layer: ``[B, n]`` equal to ``layer(cat(states), mask)[:, 0]``."""
    return cls_only_attention(layer.attention, layer.ffn, cls, blocks)


__all__ = ["AttendedBlock", "TokenBlock", "cls_only_attention", "cls_only_attention_stored", "cls_only_layer",
           "compute_dtype"]

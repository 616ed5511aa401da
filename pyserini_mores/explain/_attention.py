"""Post-softmax attention of MORES and PreTTR, recomputed from the models' public submodules exactly as their scoring
runs them (scoring itself uses fused attention kernels that never materialise the probabilities).

Every function returns padded ``[B, h, rows, keys]`` probabilities plus the masks that say which positions are real:
each row sums to 1 over the real keys, and padded keys get exactly 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..models._layers import attention_mask_from_ids, key_padding_mask


@dataclass
class MoresAttention:
    """Attention inside one MORES query against a batch of documents.

    Attributes:
        query: ``[1, h, q, q]`` query self-attention in the last query-module layer (``query_layer``, 1-based).
        cross: per interaction block, the query→document cross-attention ``[B, h, q, d]``.
        document: ``[B, h, d, d]`` document self-attention in document-module layer ``document_layer`` (1-based),
            or ``None`` when no document text was given.
        query_mask: ``[q]`` True at real query tokens.
        doc_mask: ``[B, d]`` True at real document tokens.
    """

    query: torch.Tensor
    query_layer: int
    cross: list[torch.Tensor]
    document: torch.Tensor | None
    document_layer: int | None
    query_mask: torch.Tensor
    doc_mask: torch.Tensor


@dataclass
class JoinedAttention:
    """PreTTR's first joined layer (``layer = join_layer + 1``, 1-based) over ``[query block ‖ document]``.

    Attributes:
        probs: ``[B, h, T, T]`` with ``T = Qb + Ld``; rows and columns ``0..Qb-1`` are the query block.
        mask: ``[B, T]`` True at real tokens (query-block padding and document padding are False).
        query_block: ``Qb``, where the document starts on both axes.
    """

    probs: torch.Tensor
    mask: torch.Tensor
    query_block: int
    layer: int


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


def _self_attention_probs(layer, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, h, L, L]`` self-attention of a :class:`~pyserini_mores.models._layers.TransformerLayer` on ``x``."""
    attention = layer.attention
    keys, _ = attention.project_keys_values(x)
    return attention.attention_probs(x, keys, mask)


@torch.no_grad()
def mores_attention(model, query_batch: dict, *, docs: torch.Tensor | None = None,
                    lengths: torch.Tensor | None = None, doc_batch: dict | None = None,
                    document_layer: int | None = None) -> MoresAttention:
    """Attention maps of a :class:`~pyserini_mores.models.mores.MoresModel` for one query (paper Figure 2).

    The cross-attention keys come from the stored documents when ``docs``/``lengths`` are given (a sidecar batch
    ``[B, Lmax, store_width]``: Reuse-S1 rows are ``D`` and are projected by each block; Reuse-S2 rows already hold
    every block's keys and values), so no document is re-encoded for them. The document-module self-attention
    needs the text: ``doc_batch`` (``model.tokenize_documents``), run up to ``document_layer`` only when a sidecar
    is given, through the whole module (to get ``D``) otherwise.

    Args:
        model: a MORES model (eval mode).
        query_batch: one tokenized query (``model.tokenize_queries([q])``).
        docs, lengths: stored documents and their real lengths.
        doc_batch: the tokenized document texts, in the same order.
        document_layer: 1-based document-module layer to show (default: the last).
    """
    if docs is None and doc_batch is None:
        raise ValueError("mores_attention needs stored documents (docs, lengths) or their text (doc_batch)")
    weight = model.query_module.embeddings.norm.weight
    device, dtype = weight.device, weight.dtype
    query_batch = {key: value.to(device) for key, value in query_batch.items()}
    if query_batch["input_ids"].shape[0] != 1:
        raise ValueError("explain one query at a time")

    # query representation module: Q, and the self-attention of its last layer
    query_ids, query_attention = query_batch["input_ids"], query_batch["attention_mask"]
    query_mask = attention_mask_from_ids(query_attention)  # [1, 1, 1, q]
    x = model.query_module.embeddings(query_ids)  # segment 0, as MoresModel encodes queries
    layers = model.query_module.layers
    for layer in layers[:-1]:
        x = layer(x, query_mask)
    query_probs = _self_attention_probs(layers[-1], x, query_mask)
    query_hidden = layers[-1](x, query_mask)

    # document representation module (text): its self-attention at one layer, and D when there is no sidecar
    num_layers = model.config.encoder.num_hidden_layers
    document_layer = num_layers if document_layer is None else int(document_layer)
    if not 1 <= document_layer <= num_layers:
        raise ValueError(f"the document module has layers 1..{num_layers}; got layer {document_layer}")
    document_probs, hidden, text_mask = None, None, None
    if doc_batch is not None:
        doc_batch = {key: value.to(device) for key, value in doc_batch.items()}
        text_mask = attention_mask_from_ids(doc_batch["attention_mask"])
        encoder = model.document_module
        # [CLS] d [SEP], positions from 0, segment 0 — as MoresModel encodes documents
        hidden = encoder.embeddings(doc_batch["input_ids"])
        stop = num_layers if docs is None else document_layer
        for index, layer in enumerate(encoder.layers[:stop], start=1):
            if index == document_layer:
                document_probs = _self_attention_probs(layer, hidden, text_mask)
            hidden = layer(hidden, text_mask)

    # interaction blocks: cross-attention from the query states entering each block to the fixed document
    blocks = model.interaction_module.blocks
    width = model.config.encoder.hidden_size
    if docs is not None:
        if lengths is None:
            raise ValueError("stored documents need their lengths")
        if docs.shape[-1] != model.store_width:
            raise ValueError(f"stored documents are {docs.shape[-1]} wide; this MORES (reuse='{model.config.reuse}') "
                             f"expects {model.store_width}")
        docs = docs.to(device=device, dtype=dtype)
        doc_mask = key_padding_mask(lengths.to(device), docs.shape[1])  # [B, 1, 1, d]
        if model.config.reuse == "s1":
            def keys_values(index: int):
                return blocks[index].cross_attention.project_keys_values(docs)
        else:
            def keys_values(index: int):
                start = 2 * index * width
                return docs[..., start:start + width], docs[..., start + width:start + 2 * width]
    else:
        doc_mask = text_mask

        def keys_values(index: int):
            return blocks[index].cross_attention.project_keys_values(hidden)

    cross = []
    x = query_hidden
    for index, block in enumerate(blocks):
        keys, values = keys_values(index)
        cross.append(block.cross_attention.attention_probs(x, keys, doc_mask))
        x = block(x, keys, values, doc_mask, query_mask)
    return MoresAttention(
        query=query_probs, query_layer=len(layers), cross=cross, document=document_probs,
        document_layer=document_layer if document_probs is not None else None,
        query_mask=query_attention[0].bool(), doc_mask=doc_mask[:, 0, 0, :],
    )


@torch.no_grad()
def prettr_joined_attention(model, query_batch: dict, *, docs: torch.Tensor | None = None,
                            lengths: torch.Tensor | None = None, doc_batch: dict | None = None) -> JoinedAttention:
    """Attention of a :class:`~pyserini_mores.models.prettr.PreTTRModel`'s first joined layer (``l+1``).

    Layer-``l`` document states come from the sidecar (``docs``/``lengths``, decompressed when the model
    compresses) or are encoded from ``doc_batch`` (``model.tokenize_documents``); the query block is encoded as in
    scoring. All rows are computed, also when ``l + 1 = L`` and scoring keeps only the [CLS] row.
    """
    if docs is None:
        if doc_batch is None:
            raise ValueError("prettr_joined_attention needs stored documents (docs, lengths) or doc_batch")
        from ..models import pad_documents

        docs, lengths = pad_documents(model.encode_documents(doc_batch))
    if lengths is None:
        raise ValueError("stored documents need their lengths")
    if docs.shape[-1] != model.store_width:
        raise ValueError(f"stored documents are {docs.shape[-1]} wide; this PreTTR expects {model.store_width}")
    state = model.encode_query(query_batch)
    if state.states.shape[0] != 1:
        raise ValueError("explain one query at a time")
    doc_states = model.decompress_documents(docs)
    batch = doc_states.shape[0]
    doc_mask = key_padding_mask(lengths.to(doc_states.device), doc_states.shape[1])[:, 0, 0]
    x = torch.cat([state.states.to(doc_states.dtype).expand(batch, -1, -1), doc_states], 1)
    mask = torch.cat([state.mask.to(doc_mask.device).expand(batch, -1), doc_mask], 1)
    layer = model.encoder.layers[model.join_layer]
    probs = _self_attention_probs(layer, x, mask[:, None, None, :])
    return JoinedAttention(probs=probs, mask=mask, query_block=state.states.shape[1], layer=model.join_layer + 1)

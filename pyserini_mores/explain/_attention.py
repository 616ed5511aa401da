"""Attention maps taken from a model's own layers as they score one query: MORES's three modules (paper Figure 2)
and PreTTR's first joined layer. Each map is post-softmax attention, padded ``[B, h, rows, keys]``: every row sums
to 1 over the real keys, padded keys get exactly 0.

The models record attention when handed a list (``attentions=``, as Hugging Face's ``output_attentions``); what is
recorded, from which inputs, is decided here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import pad_documents
from ..models._layers import attention_mask_from_ids, key_padding_mask


@dataclass
class MoresAttention:
    """Attention inside one MORES query against a batch of documents (paper Figure 2), from
    :func:`mores_attention`.

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
    """PreTTR's first joined layer (``layer = join_layer + 1``, 1-based) over ``[query block ‖ document]``, from
    :func:`prettr_joined_attention`.

    Attributes:
        probs: ``[B, h, T, T]`` post-softmax attention with ``T = Qb + Ld``; rows and columns ``0..Qb-1`` are the
            query block. Each row sums to 1 over the real keys, padded keys get exactly 0.
        mask: ``[B, T]`` True at real tokens (query-block padding and document padding are False).
        query_block: ``Qb``, where the document starts on both axes.
    """

    probs: torch.Tensor
    mask: torch.Tensor
    query_block: int
    layer: int


@torch.no_grad()
def mores_attention(model, query_batch: dict, *, docs: torch.Tensor | None = None,
                    lengths: torch.Tensor | None = None, doc_batch: dict | None = None,
                    document_layer: int | None = None) -> MoresAttention:
    """The attention behind a :class:`~pyserini_mores.models.mores.MoresModel`'s scores of one query.

    The cross-attention keys come from the stored documents when ``docs``/``lengths`` are given (a sidecar batch as
    ``score`` takes it, so no document is re-encoded for them); the document-module self-attention needs the text:
    ``doc_batch`` (``tokenize_documents``), run up to ``document_layer`` (1-based, default: the last) when documents
    are stored, through the whole module (to get ``D``) otherwise.
    """
    if docs is None and doc_batch is None:
        raise ValueError("MORES attention maps need stored documents (docs, lengths) or their text (doc_batch)")
    num_layers = model.config.n_document_layers
    layer = num_layers if document_layer is None else int(document_layer)
    if not 1 <= layer <= num_layers:
        raise ValueError(f"the document module has layers 1..{num_layers}; got layer {layer}")
    device = model.query_module.embeddings.norm.weight.device
    query_batch = {key: value.to(device) for key, value in query_batch.items()}
    if query_batch["input_ids"].shape[0] != 1:
        raise ValueError("explain one query at a time")
    query_maps, document_maps, cross = [], [], []
    state = model.encode_query(query_batch, query_maps)
    if doc_batch is not None:
        doc_batch = {key: value.to(device) for key, value in doc_batch.items()}
        # [CLS] d [SEP], positions from 0, segment 0, as the model encodes documents
        encoded = model.document_module(doc_batch["input_ids"], doc_batch["attention_mask"],
                                        num_layers=None if docs is None else layer, attentions=document_maps)
    if docs is not None:
        if lengths is None:
            raise ValueError("stored documents need their lengths")
        model.score_logits(state, docs, lengths, attentions=cross)
        doc_mask = key_padding_mask(lengths.to(device), docs.shape[-2])
    else:
        doc_mask = attention_mask_from_ids(doc_batch["attention_mask"])
        model.document_states_logits(state, encoded, doc_mask, attentions=cross)
    return MoresAttention(
        query=query_maps[-1], query_layer=len(query_maps), cross=cross,
        document=document_maps[layer - 1] if document_maps else None,
        document_layer=layer if document_maps else None,
        query_mask=query_batch["attention_mask"][0].bool(), doc_mask=doc_mask[:, 0, 0, :],
    )


@torch.no_grad()
def prettr_joined_attention(model, query_batch: dict, *, docs: torch.Tensor | None = None,
                            lengths: torch.Tensor | None = None, doc_batch: dict | None = None) -> JoinedAttention:
    """The attention of a :class:`~pyserini_mores.models.prettr.PreTTRModel`'s first joined layer ``l+1`` for one
    query, taken from the joint layers as they score (all rows, also when ``l + 1 = L`` and scoring keeps only the
    [CLS] row).

    Layer-``l`` document states come from the stored documents ``docs``/``lengths`` (decompressed when the model
    compresses) or from ``doc_batch`` (``tokenize_documents``) encoded as a sidecar stores them.
    """
    if docs is None and doc_batch is None:
        raise ValueError("PreTTR attention maps need stored documents (docs, lengths) or doc_batch")
    if model.stores_keys_values:
        raise ValueError("PreTTR attention maps need layer-l states; this model stores keys and values")
    state = model.encode_query(query_batch)
    if state.states.shape[0] != 1:
        raise ValueError("explain one query at a time")
    if docs is None:
        docs, lengths = pad_documents(model.encode_documents(doc_batch))
    if lengths is None:
        raise ValueError("stored documents need their lengths")
    if docs.shape[-1] != model.store_width:
        raise ValueError(f"stored documents are {docs.shape[-1]} wide; this PreTTR expects {model.store_width}")
    maps = []
    model.score_logits(state, docs, lengths, attentions=maps)
    doc_mask = key_padding_mask(lengths.to(maps[0].device), docs.shape[1])[:, 0, 0]
    return JoinedAttention(probs=maps[0], mask=torch.cat([state.mask.to(doc_mask.device).expand(docs.shape[0], -1),
                                                          doc_mask], 1),
                           query_block=state.states.shape[1], layer=model.join_layer + 1)


__all__ = ["JoinedAttention", "MoresAttention", "mores_attention", "prettr_joined_attention"]

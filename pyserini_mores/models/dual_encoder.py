"""A late-interaction dual encoder (ColBERT-style MaxSim) on a BERT-family backbone.

The smallest real model that exercises the whole stored-representation path: document token vectors are
query-independent, so they go to the sidecar; online work is one query encoding and a batched MaxSim.
``score = Σ_query tokens max_doc tokens ⟨q_i, d_j⟩`` over L2-normalised (optionally projected) token vectors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._layers import BertEncoder, key_padding_mask, load_bert_weights, rotated_rows
from .backbones import DEFAULT_BACKBONE
from .base import ModelCapabilities, RankingConfig, RankingModel
from .code_tables import CodeTables, code_inner_products, query_code_tables
from .loading import backbone_weights


@dataclass
class DualEncoderConfig(RankingConfig):
    projection_dim: int | None = None  # None: no projection, store the encoder's hidden size
    normalize: bool = True


class DualEncoder(RankingModel):
    model_type = "maxsim"
    config_class = DualEncoderConfig
    capabilities = ModelCapabilities(
        default_loss="listwise",  # trained like PreTTR
        encoder_is_a_backbone=True,
    )

    def __init__(self, config: DualEncoderConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.encoder = BertEncoder(config.encoder)
        hidden = config.encoder.hidden_size
        self.projection = nn.Linear(hidden, config.projection_dim, bias=False) if config.projection_dim else None

    @classmethod
    def from_backbone(cls, backbone: str = DEFAULT_BACKBONE, **config_overrides) -> "DualEncoder":
        dims, state_dict, tokenizer = backbone_weights(backbone)
        config = DualEncoderConfig(encoder=dims, backbone=str(backbone), **config_overrides)
        model = cls(config, tokenizer)
        load_bert_weights(model.encoder, state_dict)
        return model.eval()

    @property
    def store_width(self) -> int:
        return self.config.projection_dim or self.config.encoder.hidden_size

    def store_config(self) -> dict:
        return {**super().store_config(), "projection_dim": self.config.projection_dim,
                "normalize": self.config.normalize}

    def _token_vectors(self, batch: dict) -> torch.Tensor:
        hidden = self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        if self.projection is not None:
            hidden = self.projection(hidden)
        return F.normalize(hidden, dim=-1) if self.config.normalize else hidden

    # Contextual vectors of one word gather round a point of their own (ColBERTv2's observation, Santhanam et al.,
    # NAACL 2022), which an rq store's word stage codes exactly.
    stores_every_token = True

    def encode_documents(self, doc_batch: dict) -> list[torch.Tensor]:
        vectors = self._token_vectors(doc_batch)
        lengths = doc_batch["attention_mask"].sum(1).tolist()
        return [vectors[i, :length] for i, length in enumerate(lengths)]

    def encode_query(self, query_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self._token_vectors(query_batch), query_batch["attention_mask"]

    def score(self, query_state, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        query_vectors, query_mask = query_state
        return _maxsim(query_vectors, query_mask, docs.to(query_vectors.dtype), lengths)

    scores_codes = True  # a stored vector's only use is its inner products with the query's vectors

    def code_tables(self, query_state, codebooks: torch.Tensor, words: torch.Tensor | None = None) -> CodeTables:
        """Every query vector's inner product with every entry of ``codebooks [M, K, width]`` (and word mean), once
        per query (:func:`~.code_tables.query_code_tables`)."""
        query_vectors, query_mask = query_state
        return query_code_tables(query_vectors[0], query_mask, codebooks, words)

    def score_codes(self, tables: CodeTables, codes: torch.Tensor, lengths: torch.Tensor,
                    norms: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` MaxSim of documents stored as ``codes [B, Lmax, M]`` against the query of ``tables``
        (:meth:`code_tables`): each inner product by ``M`` look-ups (:func:`~.code_tables.code_inner_products`), no
        norm needed. Equals :meth:`score` of the decoded vectors in float32, to its rounding."""
        return _maxsim_of(code_inner_products(tables, codes), tables.mask, lengths)

    def store_frame(self, rotation: torch.Tensor) -> torch.Tensor:
        return rotation

    def query_in_frame(self, query_state, frame: torch.Tensor):
        """MaxSim of ``y = x Rᵀ`` with ``q Rᵀ`` equals that of ``x`` with ``q`` (``R`` orthogonal)."""
        query_vectors, query_mask = query_state
        return rotated_rows(query_vectors, frame), query_mask

    def forward(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        docs = self._token_vectors(doc_batch)
        return _maxsim(*self.encode_query(query_batch), docs, doc_batch["attention_mask"].sum(1))


def _maxsim(query_vectors, query_mask, docs, doc_lengths) -> torch.Tensor:
    """``query_vectors [B|1, q, W]`` against ``docs [B, L, W]`` → ``[B]``; padded tokens on either side ignored."""
    return _maxsim_of(torch.matmul(query_vectors, docs.transpose(1, 2)), query_mask, doc_lengths)


def _maxsim_of(similarity: torch.Tensor, query_mask: torch.Tensor, doc_lengths: torch.Tensor) -> torch.Tensor:
    """``[B]``: the sum over the query's vectors (``query_mask [B|1, q]``) of each one's largest ``similarity
    [B, q, L]`` with a document vector, padded document positions (past ``doc_lengths [B]``) ignored."""
    doc_mask = key_padding_mask(doc_lengths, similarity.shape[-1])[:, 0]  # [B, 1, L]
    best = similarity.masked_fill(~doc_mask, torch.finfo(similarity.dtype).min).amax(-1)  # [B, q]
    # summed in fp32: a bf16 sum of q maxima keeps 8 significant bits, and close candidates would tie
    return (best.float() * query_mask.float()).sum(-1)

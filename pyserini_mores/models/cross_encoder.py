"""The BERT ranker MORES is measured against (Nogueira & Cho's monoBERT, trained like MORES): one BERT over the
concatenated pair ``[CLS] q [SEP] d [SEP]``, head ``Linear(n, 2)`` on the [CLS] row, score = ``logits[1] −
logits[0]`` (:func:`.losses.ranking_scores`, the same score definition as MORES).

Truncation matches MORES exactly: the query and the document are tokenized separately with MORES's limits
(``query_max_length`` = 16 and ``doc_max_length`` = 128 WordPieces, each *including* its own special tokens) and then
joined — ``[CLS] q [SEP]`` (segment 0) + ``d [SEP]`` (segment 1; the document's own [CLS] is dropped) — so both models
see the same query and document tokens. Nothing can be precomputed (``store_width = None``): the reranker scores it
from text with :meth:`CrossEncoder.score_texts`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from ._cls_only import cls_only_layer
from ._layers import BertEncoder, attention_mask_from_ids, load_bert_weights, score_head
from .backbones import DEFAULT_BACKBONE
from .base import ModelCapabilities, RankingConfig, RankingModel
from .loading import backbone_weights
from .losses import ranking_scores
from .mores import _init_bert_weights


@dataclass
class CrossEncoderConfig(RankingConfig):
    """Cross-encoder hyperparameters (``encoder``: BERT dims; the length limits are :class:`RankingConfig`'s).

    Attributes:
        num_labels: 2 (default) — ``Linear(n, 2)`` trained with 2-class CE, score = ``logits[1] − logits[0]``;
            1 — a single logit used as the score.
    """

    num_labels: int = 2

    def __post_init__(self):
        if self.num_labels not in (1, 2):
            raise ValueError(f"num_labels must be 1 or 2, not {self.num_labels}")


class CrossEncoder(RankingModel):
    """BERT ranker over ``[CLS] q [SEP] d [SEP]``.

    Example:
        >>> model = CrossEncoder.from_backbone("minilm")
        >>> model.score_texts("what is vim", ["Vim is a text editor.", "Python is a language."])  # tensor [2]
    """

    model_type = "cross-encoder"
    config_class = CrossEncoderConfig
    capabilities = ModelCapabilities(
        default_loss="pointwise",  # trained like MORES, the model it is measured against
        new_parameters=("head.",),
        layer_stack="encoder.layers.",
        starts_from_rankers=True,
        encoder_is_a_backbone=True,
        scores_cls=True,
    )
    #: documents per encoder call in :meth:`score_texts` (an attribute, not config: it never changes scores)
    batch_size: int = 64

    def __init__(self, config: CrossEncoderConfig, tokenizer):
        if config.encoder is None:
            raise ValueError("CrossEncoderConfig.encoder (the BERT dims) is required")
        joined = config.query_max_length + config.doc_max_length - 1
        if joined > config.encoder.max_position_embeddings:
            raise ValueError(
                f"query_max_length + doc_max_length − 1 = {joined} exceeds the encoder's "
                f"{config.encoder.max_position_embeddings} positions"
            )
        super().__init__(config, tokenizer)
        self.encoder = BertEncoder(config.encoder)
        self.head = nn.Linear(config.encoder.hidden_size, config.num_labels)
        self.apply(_init_bert_weights)

    @classmethod
    def from_backbone(cls, backbone: str | os.PathLike = DEFAULT_BACKBONE, **config_overrides) -> "CrossEncoder":
        """Encoder from a BERT-architecture checkpoint (hub name, dir, ``minilm``); a new random head."""
        dims, state_dict, tokenizer = backbone_weights(backbone)
        model = cls(CrossEncoderConfig(encoder=dims, backbone=str(backbone), **config_overrides), tokenizer)
        load_bert_weights(model.encoder, state_dict)
        return model.eval()

    # ---- scoring -------------------------------------------------------------------------------------------
    def forward(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        """Training path: ``[B]`` scores of aligned pairs from separately tokenized batches (joined in-graph)."""
        return ranking_scores(self.forward_logits(query_batch, doc_batch))

    def forward_logits(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        """``[B, num_labels]`` head logits of aligned pairs (what :func:`.losses.pointwise_cross_entropy` takes)."""
        return self.logits(*self._join(query_batch, doc_batch))

    def hidden_states(self, query_batch: dict, doc_batch: dict, last: int) -> list[torch.Tensor]:
        """The states ``[B, T, n]`` of the joined pairs ``[CLS] q [SEP] d [SEP]`` after each of the ``last`` top
        layers, every row (as Hugging Face's ``output_hidden_states``; :meth:`logits` computes only [CLS] in the
        last layer): what hidden-state distillation pulls a student's query rows towards."""
        if not 1 <= last <= len(self.encoder.layers):
            raise ValueError(f"last must be between 1 and the {len(self.encoder.layers)} layers, not {last}")
        input_ids, attention_mask, token_type_ids = self._join(query_batch, doc_batch)
        encoder, mask = self.encoder, attention_mask_from_ids(attention_mask)
        first = len(encoder.layers) - last
        x = encoder.run_layers(encoder.embeddings(input_ids, token_type_ids), mask, 0, first)
        states = []
        for index in range(first, len(encoder.layers)):
            x = encoder.run_layers(x, mask, index, index + 1)
            states.append(x)
        return states

    def _join(self, query_batch: dict, doc_batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return join_pairs(query_batch["input_ids"], query_batch["attention_mask"], doc_batch["input_ids"],
                          doc_batch["attention_mask"], pad_token_id=self.tokenizer.pad_token_id or 0,
                          cls_token_id=self.tokenizer.cls_token_id)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor) -> torch.Tensor:
        """``[B, num_labels]`` logits of already joined pairs ``[B, L]``.

        The last layer computes the [CLS] row only (:func:`cls_only_layer`, exact): the head reads nothing else.
        """
        return score_head(self.head, self.cls_vectors(input_ids, attention_mask, token_type_ids))

    def cls_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` the last layer's [CLS] row of already joined pairs ``[B, L]``: what the head reads."""
        encoder = self.encoder
        x = encoder.embeddings(input_ids, token_type_ids)
        x = encoder.run_layers(x, attention_mask_from_ids(attention_mask), 0, len(encoder.layers) - 1)
        return cls_only_layer(encoder.layers[-1], x[:, 0], [(x, attention_mask.bool())])

    def score_from_cls(self, cls: torch.Tensor) -> torch.Tensor:
        """``[B]`` fp32 scores of the head on ``cls [B, n]`` (:meth:`text_cls`'s vectors, or their mean over a
        document's windows)."""
        return ranking_scores(score_head(self.head, cls)).float()

    @torch.no_grad()
    def text_cls(self, query: str, documents: list[str], batch_size: int | None = None) -> torch.Tensor:
        """``[len(documents), n]`` the [CLS] vectors :meth:`score_texts` scores, in input order, computed in the
        same batches: ``score_from_cls(text_cls(q, d)) == score_texts(q, d)`` exactly."""
        return self._pairs(query, documents, batch_size, head_input=True)

    @torch.no_grad()
    def score_texts(self, query: str, documents: list[str], batch_size: int | None = None) -> torch.Tensor:
        """``[len(documents)]`` scores of one query against document texts, in input order.

        The query is tokenized once; documents are tokenized once, sorted by length (less padding), packed with
        the query in batches of ``batch_size`` (default :attr:`batch_size`) padded to each batch's longest pair.
        """
        return self._pairs(query, documents, batch_size)

    def _pairs(self, query: str, documents: list[str], batch_size: int | None = None,
               head_input: bool = False) -> torch.Tensor:
        """:meth:`score_texts` ``[len(documents)]``, or with ``head_input`` :meth:`text_cls` ``[len(documents), n]``."""
        batch_size = batch_size or self.batch_size
        device = self.head.weight.device
        width = (self.config.encoder.hidden_size,) if head_input else ()
        scores = torch.empty((len(documents), *width), dtype=torch.float32, device=device)
        if not documents:
            return scores
        query_ids = self._tokenize_ids([query], self.config.query_max_length)[0]
        doc_ids = [torch.tensor(ids[1:], dtype=torch.long)  # without the document's [CLS]
                   for ids in self._tokenize_ids(documents, self.config.doc_max_length)]
        order = sorted(range(len(doc_ids)), key=lambda i: -len(doc_ids[i]))
        query_tensor = torch.tensor(query_ids, dtype=torch.long, device=device)
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            docs = pad_sequence([doc_ids[i] for i in chunk], batch_first=True, padding_value=pad).to(device)
            lengths = torch.tensor([len(doc_ids[i]) for i in chunk], device=device)
            doc_mask = (torch.arange(docs.shape[1], device=device)[None, :] < lengths[:, None]).long()
            input_ids = torch.cat([query_tensor.expand(len(chunk), -1), docs], dim=1)
            attention_mask = torch.cat([torch.ones_like(input_ids[:, :len(query_ids)]), doc_mask], dim=1)
            token_type_ids = torch.cat([torch.zeros_like(input_ids[:, :len(query_ids)]), doc_mask], dim=1)
            cls = self.cls_vectors(input_ids, attention_mask, token_type_ids)
            scores[torch.tensor(chunk, device=device)] = (cls.float() if head_input else self.score_from_cls(cls))
        return scores

    def _tokenize_ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        return self.call_tokenizer(texts, max_length=max_length, truncation=True)["input_ids"]



def join_pairs(
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    doc_ids: torch.Tensor,
    doc_mask: torch.Tensor,
    pad_token_id: int = 0,
    cls_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Join right-padded ``[CLS] q [SEP]`` ``[B, Lq]`` and ``[CLS] d [SEP]`` ``[B, Ld]`` batches into
    ``[CLS] q [SEP] d [SEP]`` ``[B, T]`` (T = the longest joined pair), without a loop over pairs.

    Returns:
        ``(input_ids, attention_mask, token_type_ids)``, each ``[B, T]``; token types 0 for the query part,
        1 for the document part, 0 on padding.
    """
    if bool((query_mask[:, 1:] > query_mask[:, :-1]).any()) or bool((doc_mask[:, 1:] > doc_mask[:, :-1]).any()):
        raise ValueError("join_pairs needs right-padded batches")
    if cls_token_id is not None and bool((doc_ids[:, 0] != cls_token_id).any()):
        raise ValueError("documents must start with [CLS] (tokenized with special tokens); it is replaced by the join")
    batch = query_ids.shape[0]
    query_lengths = query_mask.sum(1)
    doc_lengths = doc_mask.sum(1) - 1  # without the document's [CLS]
    total = query_lengths + doc_lengths
    positions = torch.arange(int(total.max()), device=query_ids.device)[None, :].expand(batch, -1)
    in_query = positions < query_lengths[:, None]
    real = positions < total[:, None]
    from_query = query_ids.gather(1, positions.clamp(max=query_ids.shape[1] - 1))
    doc_positions = (positions - query_lengths[:, None] + 1).clamp(0, doc_ids.shape[1] - 1)
    from_doc = doc_ids.gather(1, doc_positions)
    input_ids = torch.where(in_query, from_query, from_doc).masked_fill(~real, pad_token_id)
    return input_ids, real.long(), (real & ~in_query).long()


__all__ = ["CrossEncoder", "CrossEncoderConfig", "join_pairs"]

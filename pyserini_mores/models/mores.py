"""MORES (Gao, Dai & Callan; = EARL): a BERT ranker split into a Document Representation Module (offline, stored in
the sidecar), a Query Representation Module (once per query) and K Interaction Blocks (per candidate), where only
query states are updated and document states are fixed.

Module by module::

    D = document_module([CLS] d [SEP])                  full BERT encoder, positions from 0, segment 0   [d, n]
    Q = query_module([CLS] q [SEP])                     own embeddings + the doc encoder's first L−K layers [q, n]
    for each interaction block i = 1..K:                 BERT post-LN, √d_head scaling, GELU
        Q = LN(Attend(Q, D) + Q)                         cross-attention query → document (D fixed)
        Q = LN(Attend(Q, Q) + Q)                         query self-attention
        Q = LN(FFN(Q) + Q)
    logits = head(Pool(Q))                               Pool: [CLS] row, or the masked mean of real query tokens
    score  = logits[1] − logits[0]                       (see :func:`.losses.ranking_scores`)

``interaction='joint'`` (beyond the paper) replaces each block's two attentions by one attention of the query rows
over the query's and the document's keys together, ``Q = LN(Attend(Q, [Q; D]) + Q)``: a cross-encoder layer's
computation for the query rows of ``[CLS] q [SEP] d [SEP]``, with the document rows held at their stored states.
Initialised from a trained cross-encoder with ``document_layers = L − K``, it starts as that cross-encoder with only
the query → document context of the first L − K layers (and the document rows' updates in the last K) cut away,
where the paper's blocks start as two copies of each attention stacked.

What the sidecar stores (``reuse``; scores are identical either way):

* ``s1`` — Reuse-S1: ``D`` itself, all real tokens incl. ``[CLS]``/``[SEP]``; ``store_width = n``. Each block
  projects the stored ``D`` to its keys/values online. Depends only on the document module, so an S1 sidecar
  survives fine-tuning of the interaction blocks.
* ``s2`` (default) — Reuse-S2: every block's keys and values of ``D`` (biases included, heads not split),
  ``[K₁‖V₁‖…‖K_K‖V_K]`` on the feature axis; ``store_width = 2·K·n``. Online work is query-side only. (The paper's
  Table 4 storage numbers are 4K·|D|; its text and the maths are 2K·|D|.) Stored token-major;
  batches may be gathered head-major (``s2_reads``, :attr:`MoresModel.stored_heads`) so attention reads each head's
  keys contiguously.

The paper's three modules can also be stored apart, each deployable on its own: :mod:`.mores_modules`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ._cls_only import TokenBlock, cls_only_attention, cls_only_attention_stored, compute_dtype
from ._layers import (
    Attention,
    BertDims,
    BertEncoder,
    Embeddings,
    FeedForward,
    TransformerLayer,
    attention_context,
    attention_mask_from_ids,
    convert_hf_bert_state_dict,
    key_padding_mask,
    masked_mean,
    rotated_rows,
    score_head,
)
from .backbones import DEFAULT_BACKBONE
from .base import ModelCapabilities, RankingConfig, RankingModel
from .loading import copy_ranker_head, load_backbone_checkpoint
from .losses import ranking_scores
from .mores_modules import is_modules_directory, load_modules, sub_state

POOLINGS = ("cls", "avg")
REUSES = ("s1", "s2")
S2_READS = ("auto", "heads", "tokens")
# Side by side on this project's 2-core CPU (bench, 1000 candidates, bf16): head-major reads were 1.10-1.40x faster
# for BERT-base (64-wide heads) at d = 128 and 512; for MiniLM (32-wide heads) they ranged from 13% slower to 3%
# faster, the gather of 64-byte slices costing what the attention saved.
HEAD_MAJOR_MIN_HEAD_DIM = 64
IB_INITS = ("copy", "random")
INTERACTIONS = ("separate", "joint")
INITIALIZER_RANGE = 0.02  # BERT's init std for new weights (head, random cross-attention)


@dataclass
class MoresConfig(RankingConfig):
    """MORES/EARL hyperparameters (``encoder``: the BERT dims shared by all three modules).

    Attributes:
        n_interaction_blocks: K, the number of Interaction Blocks (paper: 1–4; 2 recommended). The query module
            gets the first ``n_query_layers = L − K`` layers; needs ``1 ≤ K < L``.
        tied: the query module's layers are the *same modules* as the document module's first L−K layers
            (the MORES code; EARL's "Tied"). ``False``: separate copies. The query embeddings are always
            a separate copy.
        pooling: ``"cls"`` — the query's [CLS] row of the last block (MORES, EARL ClsPool); ``"avg"`` — the mean
            over real query tokens incl. [CLS]/[SEP] (EARL AvePool, A7).
        reuse: what the sidecar stores, a runtime choice that never changes scores: ``"s1"`` (D, width n) or
            ``"s2"`` (per-block keys and values of D, width 2·K·n).
        num_labels: 2 (default) — head ``Linear(n, 2)`` trained with 2-class CE (MORES code), ranking score =
            ``logits[1] − logits[0]`` (monotone in P(rel) = softmax[1]); 1 — a single logit used as the score
            (for pairwise/listwise losses).
        ib_init: ``"copy"`` — each block's cross-attention starts as a copy of its BERT layer's self-attention
            (the paper's initialisation); ``"random"`` — BERT-style random init (the paper's ablation, much worse).
            Separate interaction only (joint blocks have no cross-attention).
        interaction: ``"separate"`` — the paper's block: cross-attention to the document, then query
            self-attention, then FFN; ``"joint"`` — one attention over query and document keys, then FFN (see the
            module docstring). Reuse-S2 stores the key/value projections of whichever attention reads documents.
        s2_reads: how Reuse-S2 batches are read, a runtime choice that never changes scores: ``"heads"`` —
            head-major, every attention head's stored keys contiguous (the gather transposes; attention runs
            faster); ``"tokens"`` — as stored; ``"auto"`` (default) — heads when a head is at least
            :data:`HEAD_MAJOR_MIN_HEAD_DIM` wide. See :attr:`MoresModel.stored_heads`.
        document_layers: layers of the document module; ``None`` — all L (the paper). ``L − K`` (or anything from
            ``L − K`` to ``L``) is an ablation beyond the paper: block ``i`` copies layer ``L − K + i``, which in
            the backbone read states of depth ``L − K + i``; with ``L − K`` document layers the first block reads
            document states at exactly the depth its copied weights were trained on (and documents cost fewer
            layers to encode). Untied, it may be fewer than ``L − K`` (a model of K blocks folded from one of more
            keeps that one's document module: :meth:`MoresModel.with_fewer_blocks`).
    """

    n_interaction_blocks: int = 2
    tied: bool = True
    pooling: str = "cls"
    reuse: str = "s2"
    num_labels: int = 2
    ib_init: str = "copy"
    s2_reads: str = "auto"
    document_layers: int | None = None
    interaction: str = "separate"

    def __post_init__(self):
        _check_choice("pooling", self.pooling, POOLINGS)
        _check_choice("interaction", self.interaction, INTERACTIONS)
        if self.interaction == "joint" and self.ib_init != "copy":
            raise ValueError("ib_init chooses the cross-attention's start; joint interaction blocks have none")
        _check_choice("reuse", self.reuse, REUSES)
        _check_choice("s2_reads", self.s2_reads, S2_READS)
        _check_choice("ib_init", self.ib_init, IB_INITS)
        if self.num_labels not in (1, 2):
            raise ValueError(f"num_labels must be 1 or 2, not {self.num_labels}")
        if not isinstance(self.tied, bool):  # the string "False" would silently mean tied
            raise ValueError(f"tied must be true or false, not {self.tied!r}")
        if self.n_interaction_blocks < 1:
            raise ValueError(f"n_interaction_blocks must be at least 1, not {self.n_interaction_blocks}")
        if self.document_layers is not None and self.encoder is not None:
            layers = self.encoder.num_hidden_layers
            if self.tied:  # the query module is the document module's first L − K layers, so it must have them
                lowest = layers - self.n_interaction_blocks
                allowed = f"from L − K = {lowest} to L = {layers} (tied)"
            else:
                lowest, allowed = 1, f"from 1 to L = {layers}"
            if not lowest <= self.document_layers <= layers:
                raise ValueError(f"document_layers must be {allowed}, not {self.document_layers}")
        if self.encoder is not None and self.n_interaction_blocks >= self.encoder.num_hidden_layers:
            raise ValueError(
                f"n_interaction_blocks={self.n_interaction_blocks} needs an encoder with more layers than that "
                f"(the query module keeps L − K ≥ 1 layers); this one has {self.encoder.num_hidden_layers}"
            )

    @property
    def n_document_layers(self) -> int:
        """The layers of the document module (``document_layers``, or all L)."""
        return self.encoder.num_hidden_layers if self.document_layers is None else self.document_layers

    @property
    def n_query_layers(self) -> int:
        """``L − K``: the layers of the query module."""
        return self.encoder.num_hidden_layers - self.n_interaction_blocks

    def to_dict(self) -> dict:
        values = super().to_dict()
        if self.encoder is not None:
            values["n_query_layers"] = self.n_query_layers  # derived; written for readers of config.json
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "MoresConfig":
        values = dict(values)
        n_query_layers = values.pop("n_query_layers", None)
        config = super().from_dict(values)
        if n_query_layers is not None and config.encoder is not None and n_query_layers != config.n_query_layers:
            raise ValueError(
                f"n_query_layers={n_query_layers} contradicts {config.encoder.num_hidden_layers} layers − "
                f"{config.n_interaction_blocks} interaction blocks; set n_interaction_blocks instead"
            )
        return config


def _check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")


@dataclass
class MoresQueryState:
    """What :meth:`MoresModel.encode_query` computes once per query and :meth:`MoresModel.score` broadcasts.

    Attributes:
        hidden: ``[1, q, n]`` query representation Q (output of the query module).
        mask: ``[1, 1, 1, q]`` boolean, True at real query tokens.
        first_block_queries: ``[1, h, q, n/h]`` the first block's cross-attention query projection of Q — the same
            for every candidate, so it is computed here once.
        document_projections: Reuse-S1 stored in a rotated frame (:meth:`MoresModel.query_in_frame`): per block,
            its key and value projections' ``(weight, bias)`` with the rotation folded into the weights; ``None``
            for stored ``D`` itself.
    """

    hidden: torch.Tensor
    mask: torch.Tensor
    first_block_queries: torch.Tensor
    document_projections: tuple | None = None


class QueryRepresentationModule(nn.Module):
    """Own embeddings + ``L − K`` BERT layers (shared with the document module when tied)."""

    def __init__(self, dims: BertDims, layers: nn.ModuleList):
        super().__init__()
        self.embeddings = Embeddings(dims)
        self.layers = layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None,
                attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``[B, q, n]`` query states of ``[CLS] q [SEP]`` (positions from 0); with ``attentions`` (a list), each
        layer's self-attention is appended to it."""
        x = self.embeddings(input_ids, token_type_ids)
        mask = attention_mask_from_ids(attention_mask)
        for layer in self.layers:
            x = layer(x, mask, attentions)
        return x


class InteractionBlock(nn.Module):
    """Separate (the paper): cross-attention (query → fixed document keys/values), query self-attention, FFN.
    Joint: one attention of the query rows over the query's and the fixed document keys/values, FFN. BERT post-LN."""

    def __init__(self, dims: BertDims, joint: bool = False):
        super().__init__()
        self.joint = joint
        self.cross_attention = None if joint else Attention(dims)
        self.self_attention = Attention(dims)
        self.ffn = FeedForward(dims)

    @property
    def document_attention(self) -> Attention:
        """The attention whose key/value projections read the documents (what Reuse-S2 stores)."""
        return self.self_attention if self.joint else self.cross_attention

    def document_attention_probs(self, x: torch.Tensor, doc_keys: torch.Tensor, doc_mask: torch.Tensor,
                                 query_mask: torch.Tensor) -> torch.Tensor:
        """``[B, h, q, d]`` attention of the query rows on the documents' tokens: the cross-attention (rows sum to
        1), or the document columns of the joint attention (rows sum to the share the documents get)."""
        if not self.joint:
            return self.cross_attention.attention_probs(x, doc_keys, doc_mask)
        attention = self.self_attention
        query_keys = attention.split_heads(attention.key(x))
        doc_keys = attention.as_heads(doc_keys)
        batch = doc_keys.shape[0]
        keys = torch.cat([query_keys.to(doc_keys.dtype).expand(batch, -1, -1, -1), doc_keys], dim=2)
        mask = torch.cat([query_mask.expand(batch, -1, -1, -1), doc_mask], dim=-1)
        return attention.attention_probs(x, keys, mask)[..., query_keys.shape[2]:]

    def forward(
        self,
        x: torch.Tensor,
        doc_keys: torch.Tensor,
        doc_values: torch.Tensor,
        doc_mask: torch.Tensor,
        query_mask: torch.Tensor,
        cross_queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Update query states ``x [1|B, q, n]`` against documents' ``doc_keys``/``doc_values [B, d, n]``.

        ``cross_queries [1|B, h, q, n/h]``: the cross-attention query projection of ``x`` when already known
        (the first block, computed once per query); ``doc_mask [B, 1, 1, d]``, ``query_mask [1|B, 1, 1, q]``.
        """
        if self.joint:
            x = _joint_attend(self.self_attention, x, doc_keys, doc_values, doc_mask, query_mask, cross_queries)
        else:
            x = _cross_attend(self.cross_attention, x, doc_keys, doc_values, doc_mask, cross_queries)
            x = self.self_attention(x, mask=query_mask)
        return self.ffn(x)


def _unpack(rows: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Rows ``[T, n]`` of the True slots of ``real [B, d]`` back into ``[B, d, n]``, zeros elsewhere."""
    padded = rows.new_zeros((*real.shape, rows.shape[-1]))
    return padded.index_put((real,), rows)


def _cross_attend(attention: Attention, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
    """:meth:`Attention.attend` that accepts an already projected (and possibly batch-1) query side, and keys and
    values ``[B, d, n]`` or already split into heads ``[B, h, d, n/h]``.

    The query side stays batch-1 when it is (broadcast with ``expand``: no copy); the residual broadcasts.
    """
    if queries is None:
        queries = attention.split_heads(attention.query(x))
    batch = keys.shape[0]
    queries = queries.to(keys.dtype)
    if queries.shape[0] != batch:
        queries = queries.expand(batch, -1, -1, -1)
    if keys.dim() == 3:
        keys, values = attention.split_heads(keys), attention.split_heads(values)
    context = attention_context(
        queries,
        keys,
        values.to(keys.dtype),
        mask,
        dropout_p=attention.attention_dropout if attention.training else 0.0,
    )
    return attention.norm(x + attention.dropout(attention.output(attention.merge_heads(context))))


def _joint_attend(attention: Attention, x: torch.Tensor, doc_keys: torch.Tensor, doc_values: torch.Tensor,
                  doc_mask: torch.Tensor, query_mask: torch.Tensor,
                  queries: torch.Tensor | None = None) -> torch.Tensor:
    """One attention of the query rows ``x [1|B, q, n]`` over their own keys and values followed by the
    documents' (``[B, d, n]`` or split into heads), one softmax over both: a BERT layer's attention for the query
    rows of ``[query; document]``. ``queries``: the query projection of ``x`` when already known; masks as
    :meth:`InteractionBlock.forward` takes them."""
    if queries is None:
        queries = attention.split_heads(attention.query(x))
    if doc_keys.dim() == 3:
        doc_keys, doc_values = attention.split_heads(doc_keys), attention.split_heads(doc_values)
    batch, dtype = doc_keys.shape[0], doc_keys.dtype
    query_keys, query_values = (attention.split_heads(projected).to(dtype).expand(batch, -1, -1, -1)
                                for projected in attention.project_keys_values(x))
    context = attention_context(
        queries.to(dtype).expand(batch, -1, -1, -1),
        torch.cat([query_keys, doc_keys], dim=2),
        torch.cat([query_values, doc_values.to(dtype)], dim=2),
        torch.cat([query_mask.expand(batch, -1, -1, -1), doc_mask], dim=-1),
        dropout_p=attention.attention_dropout if attention.training else 0.0,
    )
    return attention.norm(x + attention.dropout(attention.output(attention.merge_heads(context))))


class InteractionModule(nn.Module):
    """K :class:`InteractionBlock` and the score head (everything that runs once per (query, candidate))."""

    def __init__(self, dims: BertDims, n_blocks: int, num_labels: int, joint: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(InteractionBlock(dims, joint) for _ in range(n_blocks))
        self.head = nn.Linear(dims.hidden_size, num_labels)


class MoresModel(RankingModel):
    """MORES / EARL reranker; see the module docstring. Build with :meth:`from_backbone` (BERT-weight-assisted
    init) or load with :meth:`from_pretrained` (also a :mod:`.mores_modules` directory).

    Example:
        >>> from pyserini_mores.models import pad_documents
        >>> model = MoresModel.from_backbone("minilm", n_interaction_blocks=2, reuse="s2")
        >>> docs = model.encode_documents(model.tokenize_documents(["a passage", "another one"]))  # sidecar rows
        >>> state = model.encode_query(model.tokenize_queries(["what is a passage"]))
        >>> scores = model.score(state, *pad_documents(docs))  # [2]
    """

    model_type = "mores"
    config_class = MoresConfig
    capabilities = ModelCapabilities(
        default_loss="pointwise",  # the MORES code's 2-class cross-entropy
        # the paper's domain adaptation: adapt-interaction and adapt-representation (``--train-modules``)
        trainable_module_groups={
            "interaction": ("interaction_module.",),
            "representation": ("document_module.", "query_module."),
        },
        new_parameters=("interaction_module.head.",),
        # --freeze-layers N freezes the document module's first N layers (an untied query module still trains
        # whole): training the rest from text, its delta stores only the layers above them
        layer_stack="document_module.layers.",
        starts_from_rankers=True,
        # bf16 scores with autocast alone: a bf16 weight copy would keep the query rows' residual stream in bf16
        # through L-K layers and K blocks, which costs ranking quality (autocast keeps it in fp32) and saves no time.
        bf16_weight_copy=False,
        scores_cls=True,
    )
    # the interaction blocks read the query against the document states the representation modules wrote apart
    joint_parameters = ("interaction_module.blocks.",)
    #: documents per encoder call in :meth:`score_texts` (an attribute, not config: it never changes scores)
    batch_size: int = 128

    def __init__(self, config: MoresConfig, tokenizer):
        if config.encoder is None:
            raise ValueError("MoresConfig.encoder (the BERT dims) is required")
        config.__post_init__()  # re-validate: fields may have been changed after construction
        super().__init__(config, tokenizer)
        dims = config.encoder
        self.document_module = BertEncoder(replace(dims, num_hidden_layers=config.n_document_layers))
        n_query = config.n_query_layers
        if config.tied:
            query_layers = nn.ModuleList(self.document_module.layers[:n_query])  # the same module objects
        else:
            query_layers = nn.ModuleList(TransformerLayer(dims) for _ in range(n_query))
        self.query_module = QueryRepresentationModule(dims, query_layers)
        self.interaction_module = InteractionModule(dims, config.n_interaction_blocks, config.num_labels,
                                                    joint=config.interaction == "joint")
        self.apply(_init_bert_weights)

    # ---- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, backbone: str | os.PathLike = DEFAULT_BACKBONE, **config_overrides) -> "MoresModel":
        """BERT-weight-assisted initialisation from a BERT-architecture checkpoint (hub name, dir, ``minilm``).

        Document module = the whole encoder. Query module = its embeddings (a copy) + layers ``0 … L−K−1`` (the
        document module's own layers when tied, equal copies otherwise). Block ``i`` (0-based): self-attention and
        FFN copy layer ``L−K+i``; its cross-attention copies that layer's self-attention (Q, K, V, O, LayerNorm)
        unless ``ib_init='random'``. The head is new (random), or a trained cross-encoder's when the backbone is one.

        Raises:
            ValueError: when the backbone does not have more layers than ``n_interaction_blocks``.
        """
        checkpoint = load_backbone_checkpoint(backbone)  # once: for the encoder and the head
        config = MoresConfig(encoder=checkpoint.dims, backbone=str(backbone), **config_overrides)
        model = cls(config, checkpoint.tokenizer)
        model.load_bert_weights(checkpoint.state_dict)
        copy_ranker_head(model.ranking_head, checkpoint, cls.model_type)
        return model.eval()

    def load_bert_weights(self, hf_state_dict: dict[str, torch.Tensor]) -> None:
        """Initialise every module except the head from one HF BERT state dict (see :meth:`from_backbone`)."""
        weights = convert_hf_bert_state_dict(hf_state_dict)
        kept = self.config.n_document_layers  # a shorter document module takes the backbone's first layers
        self.document_module.load_state_dict(
            {name: value for name, value in weights.items()
             if not (name.startswith("layers.") and int(name.split(".")[1]) >= kept)}, strict=True)
        self.query_module.embeddings.load_state_dict(sub_state(weights, "embeddings."))
        n_query = self.config.n_query_layers
        if not self.config.tied:
            for index, layer in enumerate(self.query_module.layers):
                layer.load_state_dict(sub_state(weights, f"layers.{index}."))
        for index, block in enumerate(self.interaction_module.blocks):
            layer_weights = sub_state(weights, f"layers.{n_query + index}.")
            block.self_attention.load_state_dict(sub_state(layer_weights, "attention."))
            block.ffn.load_state_dict(sub_state(layer_weights, "ffn."))
            if block.joint:
                continue
            if self.config.ib_init == "copy":
                block.cross_attention.load_state_dict(sub_state(layer_weights, "attention."))
            else:
                block.cross_attention.apply(_init_bert_weights)

    def with_fewer_blocks(self, n_interaction_blocks: int) -> "MoresModel":
        """A MORES of ``n_interaction_blocks`` blocks made from this one (beyond the paper): its first
        ``K − n_interaction_blocks`` blocks become the last layers of the query module, each keeping its query
        self-attention and FFN and losing its cross-attention, the only place it read the document (a joint block
        keeps its attention over the query's keys only); the remaining
        blocks, the head, the embeddings and the document module are copied unchanged, so an S1 sidecar of this
        model is the new one's too. A start for a trained MORES with fewer blocks: it needs training, since the
        kept blocks now read query states that never saw the document.

        Raises:
            ValueError: unless ``1 ≤ n_interaction_blocks < K``, or when the query module is tied to the document
                module (the new query layers would have to be document layers too).
        """
        blocks = self.config.n_interaction_blocks
        if not 1 <= n_interaction_blocks < blocks:
            raise ValueError(f"a MORES with {blocks} interaction blocks can become one of 1 to {blocks - 1}, "
                             f"not {n_interaction_blocks}")
        if self.config.tied:
            raise ValueError("the query module is tied to the document module (tied=true): folding blocks into it "
                             "would change the document module too; only an untied MORES can lose blocks")
        folded = blocks - n_interaction_blocks
        smaller = type(self)(replace(self.config, n_interaction_blocks=n_interaction_blocks), self.tokenizer)
        state = {name: value for name, value in self.state_dict().items()
                 if not name.startswith("interaction_module.blocks.")}
        for index, block in enumerate(self.interaction_module.blocks):
            if index < folded:
                prefix = f"query_module.layers.{self.config.n_query_layers + index}."
                state.update(block.self_attention.state_dict(prefix=prefix + "attention."))
                state.update(block.ffn.state_dict(prefix=prefix + "ffn."))
            else:
                state.update(block.state_dict(prefix=f"interaction_module.blocks.{index - folded}."))
        smaller.load_state_dict(state, strict=True)
        smaller.train(self.training)
        return smaller

    @property
    def ranking_head(self) -> nn.Linear:
        """The head on the last block's [CLS] (what a trained cross-encoder's head initialises; see load_model)."""
        return self.interaction_module.head

    # ---- what the sidecar stores ------------------------------------------------------------------------------
    @property
    def store_width(self) -> int:
        hidden = self.config.encoder.hidden_size
        return hidden if self.config.reuse == "s1" else 2 * self.config.n_interaction_blocks * hidden

    @property
    def stored_heads(self) -> int | None:
        """Reuse-S2 batches come head-major (``s2_reads``, by default for heads ≥ 64 wide): each block's stored keys
        and values split into attention heads, every head's rows contiguous, which torch's attention reads ~1.9x
        faster than strided token-major views, at the cost of a slower gather. S1 rows are projected by GEMMs:
        token-major."""
        if self.config.reuse == "s1" or self.config.s2_reads == "tokens":
            return None
        encoder = self.config.encoder
        if self.config.s2_reads == "auto" and encoder.head_dim < HEAD_MAJOR_MIN_HEAD_DIM:
            return None
        return 2 * self.config.n_interaction_blocks * encoder.num_attention_heads

    @property
    def store_variant(self) -> str:
        return "s1" if self.config.reuse == "s1" else f"s2-k{self.config.n_interaction_blocks}"

    def store_parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """S1: the document module only. S2: plus every block's key/value projections of the documents."""
        parameters = dict(self.document_module.state_dict(prefix="document_module."))
        if self.config.reuse == "s2":
            attention_name = "self_attention" if self.config.interaction == "joint" else "cross_attention"
            for index, block in enumerate(self.interaction_module.blocks):
                prefix = f"interaction_module.blocks.{index}.{attention_name}."
                parameters.update(block.document_attention.key.state_dict(prefix=prefix + "key."))
                parameters.update(block.document_attention.value.state_dict(prefix=prefix + "value."))
        return parameters.items()

    def store_config(self) -> dict:
        values = {**super().store_config(), "reuse": self.config.reuse}
        if self.config.reuse == "s2":
            values["n_interaction_blocks"] = self.config.n_interaction_blocks
            if self.config.interaction != "separate":  # absent for the paper's blocks: their sidecars keep their ids
                values["interaction"] = self.config.interaction
        return values

    def set_reuse(self, reuse: str) -> None:
        """Switch what :meth:`encode_documents` produces and :meth:`score` expects (``"s1"``/``"s2"``)."""
        _check_choice("reuse", reuse, REUSES)
        self.config.reuse = reuse

    # ---- the three scoring entry points ---------------------------------------------------------------------
    @torch.no_grad()
    def encode_documents(self, doc_batch: dict) -> list[torch.Tensor]:
        """Offline: one ``[len_i, store_width]`` matrix per document, real tokens only (incl. [CLS]/[SEP])."""
        hidden = self._encode_document_batch(doc_batch)
        if self.config.reuse == "s2":
            projections = []
            for block in self.interaction_module.blocks:
                projections.extend(block.document_attention.project_keys_values(hidden))
            hidden = torch.cat(projections, dim=-1)  # [B, d, 2·K·n] = [K₁‖V₁‖…‖K_K‖V_K]
        lengths = doc_batch["attention_mask"].sum(1).tolist()
        return [hidden[i, :length] for i, length in enumerate(lengths)]

    def encode_query(self, query_batch: dict, attentions: list[torch.Tensor] | None = None) -> MoresQueryState:
        """Online, once per query (batch 1): Q and the first block's query projection (of the attention that reads the
        documents); with ``attentions`` (a list), each query-module layer's self-attention is appended to it."""
        hidden = self._encode_query_batch(query_batch, attentions)
        first = self.interaction_module.blocks[0].document_attention
        return MoresQueryState(
            hidden=hidden,
            mask=attention_mask_from_ids(query_batch["attention_mask"]),
            first_block_queries=first.split_heads(first.query(hidden)),
        )

    def score(self, query_state: MoresQueryState, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` fp32 scores of one query against stored documents ``docs [B, Lmax, store_width]`` (zero-padded,
        any float dtype and device: moved to the query state's device and converted to the model's dtype, or to the
        autocast dtype under autocast) with real lengths ``lengths [B]``; Reuse-S2 also takes them head-major
        (``[B, stored_heads, Lmax, head_dim]``, same scores). No loop over candidates: the batch-1 query state is
        broadcast, and each projection is one batched GEMM."""
        return ranking_scores(self.score_logits(query_state, docs, lengths)).float()

    def score_cls(self, query_state: MoresQueryState, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` the vector the head reads for each stored document (its [CLS] row, or the query rows' mean
        with ``pooling='avg'``): ``score_from_cls(score_cls(q, d, l)) == score(q, d, l)`` exactly."""
        return self.score_logits(query_state, docs, lengths, head_input=True)

    def score_from_cls(self, cls: torch.Tensor) -> torch.Tensor:
        """``[B]`` fp32 scores of the head on ``cls [B, n]`` (:meth:`score_cls`'s vectors, or their mean over a
        document's windows)."""
        return ranking_scores(score_head(self.interaction_module.head, cls)).float()

    def score_logits(self, query_state: MoresQueryState, docs: torch.Tensor, lengths: torch.Tensor,
                     attentions: list[torch.Tensor] | None = None, output_query_states: bool = False,
                     head_input: bool = False):
        """``[B, num_labels]`` head logits behind :meth:`score`; with ``attentions`` (a list), each interaction
        block's cross-attention ``[B, h, q, d]`` is appended to it. ``output_query_states``: ``(logits,
        query_states)`` as :meth:`forward_logits` returns them. ``head_input``: the head's input ``[B, n]`` instead of
        its logits."""
        head_major = docs.dim() == 4
        width = docs.shape[1] * docs.shape[3] if head_major else docs.shape[-1]
        if width != self.store_width or (head_major and docs.shape[1] != self.stored_heads):
            layout = f"{docs.shape[1]} heads x {docs.shape[3]}" if head_major else f"{width} wide"
            raise ValueError(
                f"stored documents are {layout} but MORES reuse='{self.config.reuse}' with "
                f"K={self.config.n_interaction_blocks} expects {self.store_width} wide"
                + (f" in {self.stored_heads} heads" if self.stored_heads else "")
                + " (is the sidecar of another variant?)"
            )
        device = query_state.hidden.device
        # one conversion of the stored rows (e.g. fp16) to the compute dtype; free when they already match
        docs = docs.to(device=device, dtype=compute_dtype(self.query_module.embeddings.norm.weight),
                       non_blocking=True)
        doc_mask = key_padding_mask(lengths.to(device), docs.shape[-2])
        if self.config.reuse == "s1" and query_state.document_projections is not None:
            projections = query_state.document_projections

            def keys_values(index: int):
                (key_weight, key_bias), (value_weight, value_bias) = projections[index]
                return F.linear(docs, key_weight, key_bias), F.linear(docs, value_weight, value_bias)
        elif self.config.reuse == "s1":
            keys_values = self._project_documents(docs, doc_mask)
        elif head_major:  # [B, K₁ heads ‖ V₁ heads ‖ …, Lmax, head_dim]: already split into heads
            heads = self.config.encoder.num_attention_heads

            def keys_values(index: int):
                start = 2 * index * heads
                return docs[:, start:start + heads], docs[:, start + heads:start + 2 * heads]
        else:
            hidden = self.config.encoder.hidden_size

            def keys_values(index: int):
                start = 2 * index * hidden
                return docs[..., start:start + hidden], docs[..., start + hidden:start + 2 * hidden]

        states = [] if output_query_states else None
        logits = self._interact(query_state.hidden, query_state.mask, keys_values, doc_mask,
                                query_state.first_block_queries, attentions, states, head_input)
        return (logits, tuple(states)) if output_query_states else logits

    def store_frame(self, rotation: torch.Tensor) -> tuple | None:
        """Reuse-S1: each block's key and value weights with the rotation folded in (``W Rᵀ``, so that
        ``y (W Rᵀ)ᵀ = x Wᵀ``), once per sidecar; Reuse-S2 stores keys and values, which a rotation mixes across
        heads: ``None``."""
        if self.config.reuse != "s1":
            return None
        projections = []
        for block in self.interaction_module.blocks:
            attention = block.document_attention
            projections.append(tuple((rotated_rows(linear.weight.detach(), rotation), linear.bias.detach())
                                     for linear in (attention.key, attention.value)))
        return tuple(projections)

    def query_in_frame(self, query_state: MoresQueryState, frame: tuple) -> MoresQueryState:
        return replace(query_state, document_projections=frame)

    # ---- training and text paths ----------------------------------------------------------------------------
    def forward(self, query_batch: dict, doc_batch: dict, output_query_states: bool = False):
        """Training path: ``[B]`` ranking scores of aligned (query, document) pairs, both encoded in-graph;
        ``output_query_states``: ``(scores, query_states)`` as :meth:`forward_logits` returns them."""
        if not output_query_states:
            return ranking_scores(self.forward_logits(query_batch, doc_batch))
        logits, states = self.forward_logits(query_batch, doc_batch, output_query_states=True)
        return ranking_scores(logits), states

    def forward_logits(self, query_batch: dict, doc_batch: dict, output_query_states: bool = False):
        """``[B, num_labels]`` head logits of aligned pairs (what :func:`.losses.pointwise_cross_entropy` takes).

        ``output_query_states`` (as Hugging Face's ``output_hidden_states``): ``(logits, query_states)``, where
        ``query_states`` holds the query-token states ``[B, q, n]`` after each of the K interaction blocks — in a
        cross-encoder's terms the query rows of ``[CLS] q [SEP] d [SEP]`` at layers ``L − K + 1 … L``, which
        hidden-state distillation pulls towards a teacher's. The last block then runs every query row, not just
        [CLS] (same logits, a little more work).
        """
        query = self._encode_query_batch(query_batch)
        docs = self._encode_document_batch(doc_batch)
        doc_mask = attention_mask_from_ids(doc_batch["attention_mask"])
        states = [] if output_query_states else None
        logits = self._interact(query, attention_mask_from_ids(query_batch["attention_mask"]),
                                self._project_documents(docs, doc_mask), doc_mask, query_states=states)
        return (logits, tuple(states)) if output_query_states else logits

    @property
    def interaction_layers(self) -> int:
        """K: the layers whose query-token states ``output_query_states`` returns (the interaction blocks)."""
        return self.config.n_interaction_blocks

    @torch.no_grad()
    def score_texts(self, query: str, documents: list[str], batch_size: int | None = None) -> torch.Tensor:
        """``[len(documents)]`` scores from text when no sidecar exists: the query is encoded once; documents are
        encoded in batches of ``batch_size`` (default :attr:`batch_size`) and scored the Reuse-S1 way (identical
        scores)."""
        batch_size = batch_size or self.batch_size
        state = self.encode_query(self.tokenize_queries([query]))
        scores = []
        for start in range(0, len(documents), batch_size):
            doc_batch = self.tokenize_documents(documents[start:start + batch_size])
            doc_batch = {k: v.to(state.hidden.device) for k, v in doc_batch.items()}
            doc_mask = attention_mask_from_ids(doc_batch["attention_mask"])
            logits = self.document_states_logits(state, self._encode_document_batch(doc_batch), doc_mask)
            scores.append(ranking_scores(logits).float())
        return torch.cat(scores) if scores else torch.empty(0)

    def document_states_logits(self, query_state: MoresQueryState, doc_states: torch.Tensor, doc_mask: torch.Tensor,
                               attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``[B, num_labels]`` head logits of one query against the document module's states ``D [B, d, n]``
        (``doc_mask [B, 1, 1, d]``), each block projecting them to its keys and values (the Reuse-S1 way); with
        ``attentions`` (a list), each block's cross-attention ``[B, h, q, d]`` is appended to it."""
        return self._interact(query_state.hidden, query_state.mask, self._project_documents(doc_states, doc_mask),
                              doc_mask, query_state.first_block_queries, attentions)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, **overrides) -> "MoresModel":
        """Load a :meth:`save_pretrained` checkpoint or a :func:`.mores_modules.save_modules` directory."""
        if is_modules_directory(directory):
            return load_modules(directory, model_class=cls, **overrides)
        return super().from_pretrained(directory, **overrides)

    def untied(self) -> "MoresModel":
        """This model with the query module's layers as copies of the shared ones (scores unchanged), so that they
        can train while the document module (and its sidecar) stays fixed."""
        if not self.config.tied:
            return self
        model = type(self)(replace(self.config, tied=False), self.tokenizer)
        model.load_state_dict(self.state_dict())  # a tied state dict names the shared layers under both modules
        return model.train(self.training)

    # ---- internals ----------------------------------------------------------------------------------------------
    def _encode_document_batch(self, doc_batch: dict) -> torch.Tensor:
        # [CLS] d [SEP], positions from 0, segment 0 (A6): token types are not taken from the batch on purpose.
        return self.document_module(doc_batch["input_ids"], doc_batch["attention_mask"])

    def _encode_query_batch(self, query_batch: dict, attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        return self.query_module(query_batch["input_ids"], query_batch["attention_mask"], attentions=attentions)

    def _project_documents(self, docs: torch.Tensor, doc_mask: torch.Tensor):
        """Reuse-S1 keys/values: block ``i``'s projections of ``D [B, d, n]``, computed when the block needs them.

        While training, only real tokens are projected (``doc_mask [B, 1, 1, d]``); padding slots get zero keys and
        values, which the attention masks out like the bias-only rows they would otherwise be. Batches are padded to
        their longest document, so with short documents in long batches much of the projection work (and of its
        weight gradients) would be padding. Reranking keeps the padded product: without gradients, the gather and
        scatter cost what they save.
        """
        blocks = self.interaction_module.blocks
        real = doc_mask[:, 0, 0, :]
        if not torch.is_grad_enabled() or bool(real.all()):
            return lambda index: blocks[index].document_attention.project_keys_values(docs)
        tokens = docs[real]  # [T, n]: the real rows, document after document

        def keys_values(index: int):
            return tuple(_unpack(projected, real)
                         for projected in blocks[index].document_attention.project_keys_values(tokens))

        return keys_values

    def _interact(self, query: torch.Tensor, query_mask: torch.Tensor, keys_values, doc_mask: torch.Tensor,
                  first_block_queries: torch.Tensor | None = None,
                  attentions: list[torch.Tensor] | None = None,
                  query_states: list[torch.Tensor] | None = None, head_input: bool = False) -> torch.Tensor:
        """Run the K blocks on ``query [1|B, q, n]`` against block-wise ``keys_values(i) → ([B, d, n], [B, d, n])``
        (or split into heads) and pool into ``[B, num_labels]`` logits (``head_input``: the head's input ``[B, n]``);
        with ``attentions`` (a list), each block's cross-attention ``[B, h, q, d]`` is appended to it; with
        ``query_states`` (a list), each block's output ``[B, q, n]`` (every query row, so the last block runs in
        full)."""
        head = self.interaction_module.head

        def finish(vectors: torch.Tensor) -> torch.Tensor:
            return vectors if head_input else score_head(head, vectors)

        x = query
        blocks = self.interaction_module.blocks
        cls_pooling = self.config.pooling == "cls"
        cls_only_last = cls_pooling and query_states is None
        for index, block in enumerate(blocks):
            keys, values = keys_values(index)
            cross_queries = first_block_queries if index == 0 else None
            if attentions is not None:
                attentions.append(block.document_attention_probs(x, keys, doc_mask, query_mask))
            if cls_only_last and index == len(blocks) - 1 and block.joint:
                # Only the [CLS] row leaves the last block: its one attention over the query rows and the
                # documents' keys and values, and its FFN, for that row alone (exact).
                keys, values = block.self_attention.as_heads(keys), block.self_attention.as_heads(values)
                pooled = cls_only_attention_stored(block.self_attention, block.ffn, x[:, 0], x,
                                                   query_mask[:, 0, 0, :], keys, values, doc_mask[:, 0, 0, :])
                return finish(pooled)
            if cls_only_last and index == len(blocks) - 1:
                # Only the [CLS] row leaves the last block: after its cross-attention (every row, as keys and
                # values of the self-attention) the self-attention and FFN run for that one row — exact, and it
                # removes most of the block (q - 1 of q FFN rows).
                x = _cross_attend(block.cross_attention, x, keys, values, doc_mask, cross_queries)
                pooled = cls_only_attention(block.self_attention, block.ffn, x[:, 0],
                                            [TokenBlock(x, query_mask[:, 0, 0, :])])
                return finish(pooled)
            x = block(x, keys, values, doc_mask, query_mask, cross_queries)
            if query_states is not None:
                query_states.append(x)
        if cls_pooling:  # the last block ran every row: its query states were asked for
            return finish(x[:, 0])
        return finish(masked_mean(x, query_mask[:, 0, 0, :]))


def _init_bert_weights(module: nn.Module) -> None:
    """BERT's initialisation (normal(0, 0.02) weights, zero biases, unit LayerNorm) for new parameters."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=INITIALIZER_RANGE)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=INITIALIZER_RANGE)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


__all__ = ["MoresConfig", "MoresModel", "MoresQueryState", "InteractionBlock", "InteractionModule",
           "QueryRepresentationModule"]

"""PreTTR (MacAvaney et al., SIGIR 2020): a BERT cross-encoder whose first ``join_layer`` layers see the query and
the document separately, so the document's layer-l token states (optionally compressed) can be stored offline.

Joint layout. With ``Qb = config.query_max_length`` (the query *block* length, [CLS]
and [SEP] included, exactly what :meth:`PreTTRModel.tokenize_queries` pads to)::

    position  0      1 .. k     k+1    k+2 .. Qb-1    Qb  Qb+1 ...  Qb+m-1    (Qb+m .. : document padding)
    token     [CLS]  q_1..q_k   [SEP]  [PAD] ...      d_1 d_2  ...  [SEP]
    segment   0      0          0      0              1   1    ...  1
    mask      1      1          1      0              1   1    ...  1

Document tokens therefore always sit at positions ``Qb + j`` with segment id 1, whatever the query's real length,
so stored states are query-independent and identical to what training saw. (With ``Q = Qb - 2`` query-token slots, the
document starts at position ``Q + 2 = Qb``.) Documents are tokenized exactly as our other models tokenize them
(``[CLS] d [SEP]``, at most ``config.doc_max_length`` WordPieces with the specials, as in the cross-encoder and MORES)
and the [CLS] is dropped: the stored side is ``d [SEP]``, at most ``doc_max_length - 1`` tokens. When the query
fills its block, the joint sequence is token for token the cross-encoder's input.

Layers ``1..l`` run on the query block and the document separately (exactly the block-diagonal join mask of the
paper; :meth:`PreTTRModel.joint_forward_masked` is that reference), layers ``l+1..L-1`` run on the joined sequence,
and layer ``L`` computes only the [CLS] row. The head is ``Linear(n, 2)`` on the final [CLS] with
``score = logit_1 - logit_0`` (:func:`.losses.ranking_scores`, as in the cross-encoder baseline, whose parameter names
``encoder.*``/``head.*`` PreTTR shares: a trained cross-encoder's weights load into PreTTR as they are).

Beyond the paper, ``tied=False`` gives the query block its own copy of layers ``1..l`` (as MORES's untied query
module has): started equal, it scores exactly as the tied model, and it can train while the document's layers, read
from a sidecar, stay fixed.

The optional compressor (the paper's §3.2) sits on the layer-l output: ``r = GELU(s_l W_c + b_c)`` is stored,
``ŝ_l = LayerNorm(r W_d + b_d)`` feeds layer ``l+1``. Query states go through compress→decompress too.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._cls_only import TokenBlock, cls_only_attention_stored, cls_only_layer, compute_dtype
from ._layers import BertEncoder, TransformerLayer, key_padding_mask, load_bert_weights, masked_mean, score_head
from .backbones import DEFAULT_BACKBONE
from .base import ModelCapabilities, RankingConfig, RankingModel
from .loading import copy_ranker_head, load_backbone_checkpoint
from .losses import ranking_scores

DOC_SEGMENT_ID = 1
QUERY_SEGMENT_ID = 0
REUSES = ("states", "kv")
POOLINGS = ("cls", "avg")


@dataclass
class PreTTRConfig(RankingConfig):
    """PreTTR hyperparameters (the inherited fields keep their meaning, made precise for PreTTR).

    Attributes:
        join_layer: ``l``. Layers ``1..l`` encode query and document separately; ``l+1..L`` jointly.
            ``0 <= l < L``. ``None`` means ``L - 1`` (the paper's fastest setting: one CLS-only joint layer).
            ``l = 0`` is a plain cross-encoder; ``l = L`` is rejected (no document signal would reach [CLS]).
        compression_dim: ``e``, width of the stored compressed states (e.g. 384/256/128 for BERT-base), or
            ``None`` for no compressor (store the ``n``-wide layer-l states).
        simulate_fp16_storage: round the compressed states to float16 in every path ([code]'s ``compress_fp16``),
            so training sees the precision the sidecar stores.
        classifier_dropout: dropout on the head's input, the final [CLS] or the pooled query rows (P4; active in
            training only).
        query_max_length: ``Qb``, the fixed length of the query block ``[CLS] q [SEP] <pad>``, specials included.
            Documents start at position ``Qb`` (P1). Changing it invalidates stored documents.
        doc_max_length: document length limit with its own [CLS] and [SEP] (the limit every model applies); the
            [CLS] is dropped, so at most ``doc_max_length - 1`` tokens (``d [SEP]``) are stored per document.
        reuse: what the sidecar stores, a runtime choice that never changes scores: ``"states"`` (default) — the
            layer-l states (compressed if configured), ``store_width = e or n``; ``"kv"`` — only with
            ``join_layer = L − 1``: the last layer's keys and values of those states, ``store_width = 2·n``. At
            ``l = L − 1`` the document's keys and values in the one joint layer depend on the document alone, so
            they can be stored like MORES Reuse-S2: online, the [CLS] row takes one dot product and one weighted
            sum per stored token and head (``2·n`` per token instead of the ``2·h·n`` of attending through the
            states), at twice the storage of uncompressed states. Measured slower than ``"states"`` on this
            project's 2-core CPU, where both are bound by memory traffic, not FLOPs (README, Benchmark).
        pooling: what the head reads of the last layer: ``"cls"`` (the paper) — the [CLS] row; ``"avg"`` — the mean
            of the query block's real rows, [CLS] and [SEP] included (as MORES's ``"avg"``, EARL's AvePool). At
            ``l = L − 1`` [CLS] pooling leaves one attention of one row over the document as the only interaction;
            with ``"avg"`` every query token's attention over the document reaches the score.
        tied: the query block runs through the document's layers ``1..l`` (the paper: one stack computes both).
            ``False``: through its own copy of them (``query_layers``), which can train against a sidecar of the
            document's fixed ones; the sidecar depends on the document's only, so it serves both.
    """

    join_layer: int | None = None
    compression_dim: int | None = None
    simulate_fp16_storage: bool = False
    classifier_dropout: float = 0.1
    reuse: str = "states"
    tied: bool = True
    pooling: str = "cls"

    def to_dict(self) -> dict:
        values = asdict(self)
        # recorded only when not the paper's: the fingerprints of the models before them stay as they were
        if self.tied:
            del values["tied"]
        if self.pooling == "cls":
            del values["pooling"]
        return values

    def __post_init__(self):
        if self.encoder is not None:
            if self.join_layer is None:
                self.join_layer = self.encoder.num_hidden_layers - 1
            validate_config(self)


def validate_config(config: PreTTRConfig) -> None:
    """Raise ``ValueError`` for settings that cannot work (messages say which and why)."""
    layers = config.encoder.num_hidden_layers
    join = config.join_layer
    if join == layers:
        raise ValueError(
            f"join_layer={join} equals the number of layers ({layers}): no layer would see query and document "
            f"together, so every document would get the same score; use 0 <= join_layer < {layers} "
            f"({layers - 1} is the fastest setting)"
        )
    if not 0 <= join < layers:
        raise ValueError(f"join_layer must satisfy 0 <= join_layer < {layers} (the number of layers), got {join}")
    if config.reuse not in REUSES:
        raise ValueError(f"reuse must be one of {', '.join(REUSES)}, not {config.reuse!r}")
    if config.reuse == "kv" and join != layers - 1:
        raise ValueError(
            f"reuse='kv' stores the last layer's document keys and values, which depend on the document alone only "
            f"when the last layer is the only joint one: it needs join_layer={layers - 1}, not {join}"
        )
    if config.pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {config.pooling!r}")
    if not isinstance(config.tied, bool):  # the string "False" would silently mean tied
        raise ValueError(f"tied must be true or false, not {config.tied!r}")
    if config.compression_dim is not None and config.compression_dim <= 0:
        raise ValueError(f"compression_dim must be a positive width or None, got {config.compression_dim}")
    if config.query_max_length < 2:
        raise ValueError(f"query_max_length counts [CLS] and [SEP], so it must be >= 2, got {config.query_max_length}")
    joined = config.query_max_length + config.doc_max_length - 1  # the document's [CLS] is dropped
    if joined > config.encoder.max_position_embeddings:
        raise ValueError(
            f"query_max_length + doc_max_length - 1 = {joined} exceeds the encoder's "
            f"{config.encoder.max_position_embeddings} positions"
        )


class PreTTRQueryState(NamedTuple):
    """Layer-l states of the query block (compress→decompress applied when the model compresses)."""

    states: torch.Tensor  # [Bq, Qb, n], Bq = 1 for one query (broadcast over candidates)
    mask: torch.Tensor  # [Bq, Qb] bool, True on real tokens


class Compressor(nn.Module):
    """``compress``: ``GELU(Linear(n→e))`` (what the sidecar stores); ``decompress``: ``LayerNorm(Linear(e→n))``."""

    def __init__(self, hidden_size: int, compression_dim: int, layer_norm_eps: float, simulate_fp16: bool = False):
        super().__init__()
        self.compress = nn.Linear(hidden_size, compression_dim)
        self.decompress = nn.Linear(compression_dim, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.simulate_fp16 = simulate_fp16

    def encode(self, states: torch.Tensor) -> torch.Tensor:
        """``[..., n]`` → ``[..., e]``."""
        compressed = F.gelu(self.compress(states))
        if self.simulate_fp16:
            compressed = compressed.to(torch.float16).to(compressed.dtype)  # gradient passes straight through
        return compressed

    def decode(self, compressed: torch.Tensor) -> torch.Tensor:
        """``[..., e]`` → ``[..., n]``."""
        return self.norm(self.decompress(compressed))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(states))

    def decoder_geometry(self) -> "DecoderGeometry":
        """The decompressor rewritten for :class:`CompressedTokenBlock` (float32). Cached while gradients are off,
        keyed on the weights' version counters, so in-place updates (optimiser steps, loading) invalidate it."""
        tensors = (self.decompress.weight, self.decompress.bias, self.norm.weight, self.norm.bias)
        key = tuple((t.data_ptr(), t._version, t.device, t.dtype) for t in tensors)
        cached = getattr(self, "_geometry_cache", None)
        if not torch.is_grad_enabled() and cached is not None and cached[0] == key:
            return cached[1]
        weight, bias = self.decompress.weight.float(), self.decompress.bias.float()
        centred_weight = weight - weight.mean(0, keepdim=True)  # C [n, e]: LayerNorm's mean removed up front
        centred_bias = bias - bias.mean()
        q_factor, r_factor = torch.linalg.qr(centred_weight)
        projected_bias = q_factor.transpose(0, 1) @ centred_bias
        geometry = DecoderGeometry(
            centred_weight, centred_bias, r_factor, projected_bias,
            (centred_bias - q_factor @ projected_bias).square().sum(),
            self.norm.weight.float(), self.norm.bias.float(), self.norm.eps,
        )
        if not torch.is_grad_enabled():
            self._geometry_cache = (key, geometry)
        return geometry


class DecoderGeometry(NamedTuple):
    """``LayerNorm(W_d r + b_d)`` as ``γ ∘ (C r + c)/σ + β``; see :class:`CompressedTokenBlock`."""

    centred_weight: torch.Tensor  # C [n, e]
    centred_bias: torch.Tensor  # c [n]
    r_factor: torch.Tensor  # R [e, e] of C = QR
    projected_bias: torch.Tensor  # Qᵀc [e]
    residual: torch.Tensor  # ‖c − QQᵀc‖² []
    gamma: torch.Tensor
    beta: torch.Tensor
    eps: float


class PreTTRModel(RankingModel):
    """PreTTR on a BERT-family encoder. See the module docstring for the layout and what is stored.

    Example::

        model = PreTTRModel.from_backbone("minilm", join_layer=5, compression_dim=128)
        docs = model.encode_documents(model.tokenize_documents(["apt installs packages."]))  # offline: [len, 128]
        state = model.encode_query(model.tokenize_queries(["debian package manager"]))  # once per query
        scores = model.score(state, *pad_documents(docs))  # [1]
    """

    model_type = "prettr"
    config_class = PreTTRConfig
    capabilities = ModelCapabilities(
        default_loss="listwise",  # with one negative, the paper's pairwise softmax loss
        # the compressor is new beside a ranker's weights (pre-trained alone at most), so --head-lr moves it as the
        # head
        new_parameters=("head.", "compressor."),
        # the stack shared by the separate lower layers and the joined upper ones: --freeze-layers N keeps its
        # first N (and, started from a cross-encoder, its delta stores only the layers above them)
        layer_stack="encoder.layers.",
        starts_from_rankers=True,
        scores_cls=True,
    )

    def __init__(self, config: PreTTRConfig, tokenizer):
        if config.join_layer is None:
            config.join_layer = config.encoder.num_hidden_layers - 1
        validate_config(config)
        super().__init__(config, tokenizer)
        dims = config.encoder
        self.encoder = BertEncoder(dims)
        # untied: the query block's own layers 1..l (tied, it runs through the encoder's)
        self.query_layers = None if config.tied else nn.ModuleList(
            TransformerLayer(dims) for _ in range(config.join_layer))
        self.compressor = (
            Compressor(dims.hidden_size, config.compression_dim, dims.layer_norm_eps, config.simulate_fp16_storage)
            if config.compression_dim else None
        )
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.head = nn.Linear(dims.hidden_size, 2)  # same name and shape as the cross-encoder's head
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_backbone(cls, backbone: str = DEFAULT_BACKBONE, **config_overrides) -> "PreTTRModel":
        """BERT weights from ``backbone``; the compressor is randomly initialised, and so is the head unless the
        backbone is a trained cross-encoder (whose head it starts from)."""
        checkpoint = load_backbone_checkpoint(backbone)  # once: for the encoder and the head
        config = PreTTRConfig(encoder=checkpoint.dims, backbone=str(backbone), **config_overrides)
        model = cls(config, checkpoint.tokenizer)
        load_bert_weights(model.encoder, checkpoint.state_dict)
        if model.query_layers is not None:
            model.query_layers.load_state_dict(model.encoder.layers[:model.join_layer].state_dict())
        copy_ranker_head(model.ranking_head, checkpoint, cls.model_type)
        return model.eval()

    def untied(self) -> "PreTTRModel":
        """This model with the query block's layers ``1..l`` as copies of the shared ones (scores unchanged)."""
        if not self.config.tied:
            return self
        model = type(self)(replace(self.config, tied=False), self.tokenizer)
        state = self.state_dict()
        state.update(self.encoder.layers[:self.join_layer].state_dict(prefix="query_layers."))
        model.load_state_dict(state)
        return model.train(self.training)

    # ---- shape of the model -------------------------------------------------------------------------------------
    @property
    def join_layer(self) -> int:
        return self.config.join_layer

    @property
    def joint_parameters(self) -> tuple[str, ...]:
        """The shared stack's layers ``l+1..L``: only the joined sequence runs through them."""
        return tuple(f"{self.capabilities.layer_stack}{index}." for index in range(self.join_layer, self.num_layers))

    @property
    def num_layers(self) -> int:
        return self.config.encoder.num_hidden_layers

    @property
    def query_block_length(self) -> int:
        """``Qb``: the fixed query block length, and the position of the first document token."""
        return self.config.query_max_length

    @property
    def ranking_head(self) -> nn.Linear:
        """The head on the joined [CLS] (a trained cross-encoder's head loads into it; see load_model)."""
        return self.head

    # ---- what the sidecar stores --------------------------------------------------------------------------------
    @property
    def stores_keys_values(self) -> bool:
        return self.config.reuse == "kv"

    @property
    def store_width(self) -> int:
        if self.stores_keys_values:
            return 2 * self.config.encoder.hidden_size
        return self.config.compression_dim or self.config.encoder.hidden_size

    @property
    def stored_heads(self) -> int | None:
        """Stored keys and values come head-major (``[B, 2·h, Lmax, n/h]``, keys' heads first): the [CLS] row's
        logits and weighted sum are then one batched matrix-vector product per head. Read as stored, they would
        need the ``h``-times wider products of attending through states. States: token-major."""
        return 2 * self.config.encoder.num_attention_heads if self.stores_keys_values else None

    @property
    def store_variant(self) -> str:
        variant = f"l{self.join_layer}-e{self.config.compression_dim or 'none'}"
        return f"{variant}-kv" if self.stores_keys_values else variant

    def store_parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Embeddings, layers ``1..l`` and the compressing half of the compressor; stored keys and values add the
        decompressing half and the last layer's key and value projections."""
        prefixes = ("encoder.embeddings.", "compressor.compress.") + tuple(
            f"encoder.layers.{index}." for index in range(self.join_layer)
        )
        if self.stores_keys_values:
            last = f"encoder.layers.{self.num_layers - 1}.attention."
            prefixes += ("compressor.decompress.", "compressor.norm.", last + "key.", last + "value.")
        return [(name, tensor) for name, tensor in self.state_dict().items() if name.startswith(prefixes)]

    def store_config(self) -> dict:
        values = {
            **super().store_config(),
            "join_layer": self.join_layer,
            "compression_dim": self.config.compression_dim,
            "simulate_fp16_storage": self.config.simulate_fp16_storage,
            "doc_position_offset": self.query_block_length,
            "doc_segment_id": DOC_SEGMENT_ID,
            "doc_special_tokens": "trailing [SEP] only",
        }
        if self.stores_keys_values:  # added only here: the fingerprints of state sidecars stay as they were
            values["reuse"] = "kv"
        return values

    # ---- tokenization -------------------------------------------------------------------------------------------
    def tokenize_queries(self, texts: list[str]) -> dict:
        """``[CLS] q [SEP]`` padded to exactly ``query_max_length``: ``input_ids``/``attention_mask`` ``[B, Qb]``."""
        batch = self.call_tokenizer(texts, max_length=self.query_block_length, truncation=True,
                                    padding="max_length", return_tensors="pt")
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def tokenize_documents(self, texts: list[str]) -> dict:
        """``d [SEP]`` (the tokenizer's [CLS] dropped), at most ``doc_max_length - 1`` tokens, right-padded:
        ``input_ids``/``attention_mask`` ``[B, Ld]``."""
        batch = self.call_tokenizer(texts, max_length=self.config.doc_max_length, truncation=True,
                                    padding=True, return_tensors="pt")
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        if not bool((input_ids[:, 0] == self.tokenizer.cls_token_id).all()):
            raise ValueError("the tokenizer did not put [CLS] first; PreTTR needs a BERT-style tokenizer")
        return {"input_ids": input_ids[:, 1:].contiguous(), "attention_mask": attention_mask[:, 1:].contiguous()}

    def _query_inputs(self, query_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids``, boolean mask ``[B, Qb]``; shorter batches are right-padded to ``Qb``."""
        input_ids, mask = query_batch["input_ids"], query_batch["attention_mask"].bool()
        block = self.query_block_length
        if input_ids.shape[1] > block:
            raise ValueError(f"query batch is {input_ids.shape[1]} tokens wide, more than query_max_length={block}; "
                             "tokenize with model.tokenize_queries")
        if bool((input_ids[:, 0] != self.tokenizer.cls_token_id).any()):
            raise ValueError("queries must be '[CLS] q [SEP]'; tokenize with model.tokenize_queries")
        if input_ids.shape[1] < block:
            missing = block - input_ids.shape[1]
            input_ids = F.pad(input_ids, (0, missing), value=self.config.encoder.pad_token_id)
            mask = F.pad(mask, (0, missing), value=False)
        return input_ids, mask

    def _doc_inputs(self, doc_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids, mask = doc_batch["input_ids"], doc_batch["attention_mask"].bool()
        if bool((input_ids[:, 0] == self.tokenizer.cls_token_id).any()):
            raise ValueError("PreTTR documents are 'd [SEP]' without [CLS]; tokenize with model.tokenize_documents")
        if self.query_block_length + input_ids.shape[1] > self.config.encoder.max_position_embeddings:
            raise ValueError(f"documents of {input_ids.shape[1]} tokens do not fit after a query block of "
                             f"{self.query_block_length} in {self.config.encoder.max_position_embeddings} positions")
        return input_ids, mask

    # ---- layers 1..l, separately ----------------------------------------------------------------------------------
    def _embed(self, input_ids: torch.Tensor, segment: int, first_position: int) -> torch.Tensor:
        positions = first_position + torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        segments = torch.full_like(input_ids, segment)
        return self.encoder.embeddings(input_ids, segments, positions)

    def _lower_layers(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder.run_layers(x, mask[:, None, None, :], 0, self.join_layer)

    def _query_layer_l(self, query_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Uncompressed layer-l states of the query block ``[B, Qb, n]`` and its mask ``[B, Qb]``."""
        input_ids, mask = self._query_inputs(query_batch)
        x = self._embed(input_ids, QUERY_SEGMENT_ID, 0)
        if self.query_layers is None:
            return self._lower_layers(x, mask), mask
        for layer in self.query_layers:
            x = layer(x, mask[:, None, None, :])
        return x, mask

    def _doc_layer_l(self, doc_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Uncompressed layer-l states of ``d [SEP]`` ``[B, Ld, n]`` (positions from ``Qb``) and mask ``[B, Ld]``."""
        input_ids, mask = self._doc_inputs(doc_batch)
        x = self._embed(input_ids, DOC_SEGMENT_ID, self.query_block_length)
        return self._lower_layers(x, mask), mask

    def _roundtrip(self, states: torch.Tensor) -> torch.Tensor:
        return states if self.compressor is None else self.compressor(states)

    # ---- layers l+1..L on the joined sequence ---------------------------------------------------------------------
    def _joint_score(self, query_states: torch.Tensor, query_mask: torch.Tensor, doc_states: torch.Tensor,
                     doc_mask: torch.Tensor, attentions: list[torch.Tensor] | None = None,
                     block_states: list[torch.Tensor] | None = None, head_input: bool = False) -> torch.Tensor:
        """``[B]`` scores (``head_input``: the head's input ``[B, n]``) from layer-l (decompressed) states: query
        ``[1|B, Qb, n]``, documents ``[B, Ld, n]``.
        With ``attentions`` (a list), the self-attention ``[B, h, T, T]`` of every joint layer ``l+1..L`` is
        appended to it, all rows (scoring computes the last layer's [CLS] row only); with ``block_states`` (a
        list), the query block's states ``[B, Qb, n]`` after every joint layer (the last one then runs every
        row)."""
        doc_states = doc_states.to(query_states.dtype)
        self._check_batches(query_states, doc_states)
        batch = doc_states.shape[0]
        if block_states is not None:
            x = torch.cat([query_states.expand(batch, -1, -1), doc_states], 1)
            mask = torch.cat([query_mask.expand(batch, -1), doc_mask], 1)[:, None, None, :]
            for index in range(self.join_layer, self.num_layers):
                x = self.encoder.run_layers(x, mask, index, index + 1, attentions)
                block_states.append(x[:, :query_states.shape[1]])
            return self._finish(self._pool(x, query_mask), head_input)
        if self.join_layer == self.num_layers - 1:
            if attentions is not None:
                self._all_rows_attention(attentions, torch.cat([query_states.expand(batch, -1, -1), doc_states], 1),
                                         torch.cat([query_mask.expand(batch, -1), doc_mask], 1))
            if self.config.pooling == "avg":
                return self._query_rows_averaged(query_states, query_mask,
                                                 *self._last_layer_keys_values(doc_states), doc_mask, head_input)
            # The last layer is the first joint one: the query block stays batch-1 (never copied per candidate).
            blocks = [TokenBlock(query_states, query_mask), TokenBlock(doc_states, doc_mask)]
            return self._finish(cls_only_layer(self.encoder.layers[-1], query_states[:, 0], blocks), head_input)
        x = torch.cat([query_states.expand(batch, -1, -1), doc_states], 1)
        mask = torch.cat([query_mask.expand(batch, -1), doc_mask], 1)
        x = self.encoder.run_layers(x, mask[:, None, None, :], self.join_layer, self.num_layers - 1, attentions)
        if attentions is not None:
            self._all_rows_attention(attentions, x, mask)
        if self.config.pooling == "avg":
            query_length = query_states.shape[1]
            return self._query_rows_averaged(x[:, :query_length], mask[:, :query_length],
                                             *self._last_layer_keys_values(x[:, query_length:]),
                                             mask[:, query_length:], head_input)
        return self._finish(cls_only_layer(self.encoder.layers[-1], x[:, 0], [TokenBlock(x, mask)]), head_input)

    def _last_layer_keys_values(self, doc_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.layers[-1].attention.project_keys_values(doc_states)

    def _query_rows_averaged(self, query_rows: torch.Tensor, query_mask: torch.Tensor, doc_keys: torch.Tensor,
                             doc_values: torch.Tensor, doc_mask: torch.Tensor, head_input: bool = False
                             ) -> torch.Tensor:
        """``[B]`` scores of ``avg`` pooling: the last layer run for the query block's rows ``[1|B, Qb, n]`` alone
        (the rows the mean reads), over their own keys and values and the documents' projected ``doc_keys``/
        ``doc_values`` ``[B, Ld, n]`` or head-major ``[B, h, Ld, n/h]`` (key mask ``[B, Ld]``)."""
        last, batch = self.encoder.layers[-1], doc_keys.shape[0]
        attention = last.attention
        # the query block's keys and values once, for a batch-1 query block
        query_keys, query_values = (attention.split_heads(projected).expand(batch, -1, -1, -1)
                                    for projected in attention.project_keys_values(query_rows))
        keys = torch.cat([query_keys, attention.as_heads(doc_keys).to(query_keys.dtype)], 2)
        values = torch.cat([query_values, attention.as_heads(doc_values).to(query_values.dtype)], 2)
        mask = torch.cat([query_mask.expand(batch, -1), doc_mask], 1)[:, None, None, :]
        rows = last.ffn(attention.attend(query_rows, keys, values, mask))
        return self._finish(self._pool(rows, query_mask), head_input)

    def _pool(self, x: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
        """The head's input ``[B, n]`` from the last layer's rows ``x [B, T, n]``, the query block first: its [CLS]
        row, or with ``pooling='avg'`` the mean of the query block's real rows (``query_mask [1|B, Qb]``)."""
        if self.config.pooling == "cls":
            return x[:, 0]
        return masked_mean(x[:, :query_mask.shape[1]], query_mask)

    def _all_rows_attention(self, attentions: list[torch.Tensor], x: torch.Tensor, mask: torch.Tensor) -> None:
        """Append the last layer's self-attention of every row of ``x [B, T, n]`` (key mask ``[B, T]``)."""
        attention = self.encoder.layers[-1].attention
        attentions.append(attention.attention_probs(x, attention.key(x), mask[:, None, None, :]))

    @staticmethod
    def _check_batches(query_states: torch.Tensor, docs: torch.Tensor) -> None:
        if query_states.shape[0] not in (1, docs.shape[0]):
            raise ValueError(f"a query state of batch {query_states.shape[0]} cannot score {docs.shape[0]} documents")

    def _head(self, cls: torch.Tensor) -> torch.Tensor:
        return ranking_scores(score_head(self.head, self.dropout(cls)))

    def _finish(self, cls: torch.Tensor, head_input: bool) -> torch.Tensor:
        """The scores of the head's input ``cls [B, n]``, or ``cls`` itself when ``head_input``."""
        return cls if head_input else self._head(cls)

    # ---- the contract -----------------------------------------------------------------------------------------------
    def encode_documents(self, doc_batch: dict) -> list[torch.Tensor]:
        """Offline: per document ``[len_i, store_width]``: layer-l states of ``d [SEP]``, compressed if configured;
        with ``reuse='kv'`` the last layer's keys and values of the (decompressed) states, ``[K ‖ V]``."""
        states, mask = self._doc_layer_l(doc_batch)
        if self.stores_keys_values:
            keys, values = self.encoder.layers[-1].attention.project_keys_values(self._roundtrip(states))
            states = torch.cat([keys, values], -1)
        elif self.compressor is not None:
            states = self.compressor.encode(states)
        return [states[i, :length] for i, length in enumerate(mask.sum(1).tolist())]

    def encode_query(self, query_batch: dict) -> PreTTRQueryState:
        """Online, once per query: layer-l states of the padded query block (batch 1 to broadcast in :meth:`score`)."""
        states, mask = self._query_layer_l(query_batch)
        return PreTTRQueryState(self._roundtrip(states), mask)

    def decompress_documents(self, docs: torch.Tensor) -> torch.Tensor:
        """Stored ``[B, Lmax, store_width]`` → the ``[B, Lmax, n]`` layer-l states layer ``l+1`` consumes."""
        weight = self.head.weight
        docs = docs.to(device=weight.device, dtype=weight.dtype)
        return docs if self.compressor is None else self.compressor.decode(docs)

    def score_logits(self, query_state: PreTTRQueryState, docs: torch.Tensor, lengths: torch.Tensor,
                     output_query_states: bool = False, attentions: list[torch.Tensor] | None = None):
        """:meth:`score`; ``output_query_states``: ``(scores, query_states)`` as :meth:`forward` returns them (from
        stored layer-l states: ``reuse='kv'`` stores no document states for the joint layers' query rows). With
        ``attentions`` (a list), the self-attention ``[B, h, T, T]`` of every joint layer ``l+1..L`` is appended to
        it, all rows (also from stored layer-l states)."""
        if not output_query_states and attentions is None:
            return self.score(query_state, docs, lengths)
        if self.stores_keys_values:
            raise ValueError("reuse='kv' stores only the last layer's document keys and values, not the document "
                             "states the query rows of the joint layers attend to: output_query_states needs "
                             "reuse='states' (so do attentions)")
        doc_states = self.decompress_documents(docs)
        doc_mask = key_padding_mask(lengths.to(doc_states.device), docs.shape[1])[:, 0, 0]
        states = [] if output_query_states else None
        scores = self._joint_score(query_state.states, query_state.mask, doc_states, doc_mask, attentions, states)
        return (scores, tuple(states)) if output_query_states else scores

    def score(self, query_state: PreTTRQueryState, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` scores of one query against stored documents ``docs [B, Lmax, store_width]`` (zero-padded)."""
        return self._score(query_state, docs, lengths)

    def score_cls(self, query_state: PreTTRQueryState, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` the vector the head reads for each stored document (the last layer's [CLS] row, or the query
        block's mean with ``pooling='avg'``): ``score_from_cls(score_cls(q, d, l)) == score(q, d, l)`` exactly."""
        return self._score(query_state, docs, lengths, head_input=True)

    def score_from_cls(self, cls: torch.Tensor) -> torch.Tensor:
        """``[B]`` scores of the head on ``cls [B, n]`` (:meth:`score_cls`'s vectors, or their mean over a
        document's windows: PreTTR's ranker over long documents, after CEDR)."""
        return self._head(cls)

    def _score(self, query_state: PreTTRQueryState, docs: torch.Tensor, lengths: torch.Tensor,
               head_input: bool = False) -> torch.Tensor:
        if self.stores_keys_values:
            return self._score_stored_keys_values(query_state, docs, lengths, head_input)
        doc_mask = key_padding_mask(lengths.to(docs.device), docs.shape[1])[:, 0, 0]
        compressor = self.compressor
        if (compressor is not None and self.join_layer == self.num_layers - 1 and self.config.pooling == "cls"
                and self.config.compression_dim < self.config.encoder.hidden_size):
            # Only the CLS-only layer follows: attend to the stored codes through the decompressor directly.
            self._check_batches(query_state.states, docs)
            weight = compressor.decompress.weight
            codes = docs.to(device=weight.device, dtype=compute_dtype(weight))
            blocks = [TokenBlock(query_state.states, query_state.mask),
                      CompressedTokenBlock(codes, doc_mask.to(weight.device), compressor)]
            return self._finish(cls_only_layer(self.encoder.layers[-1], query_state.states[:, 0], blocks), head_input)
        doc_states = self.decompress_documents(docs)
        return self._joint_score(query_state.states, query_state.mask, doc_states, doc_mask.to(doc_states.device),
                                 head_input=head_input)

    def _score_stored_keys_values(self, query_state: PreTTRQueryState, docs: torch.Tensor,
                                  lengths: torch.Tensor, head_input: bool = False) -> torch.Tensor:
        """``score`` for ``reuse='kv'``: ``docs`` are the last layer's keys and values, head-major
        ``[B, 2·h, Lmax, n/h]`` (as ``get_batch(heads=stored_heads)`` reads them) or as stored ``[B, Lmax, 2·n]``."""
        self._check_batches(query_state.states, docs)
        heads = self.config.encoder.num_attention_heads
        if docs.dim() == 3:
            docs = docs.unflatten(-1, (2 * heads, -1)).transpose(1, 2)
        if docs.shape[1] != 2 * heads:
            raise ValueError(f"stored keys and values come as [B, {2 * heads}, Lmax, head_dim] or "
                             f"[B, Lmax, {self.store_width}], not {list(docs.shape)}")
        weight = self.head.weight
        docs = docs.to(device=weight.device, dtype=compute_dtype(weight))
        doc_mask = key_padding_mask(lengths.to(weight.device), docs.shape[2])[:, 0, 0]
        last = self.encoder.layers[-1]
        if self.config.pooling == "avg":
            return self._query_rows_averaged(query_state.states, query_state.mask, docs[:, :heads], docs[:, heads:],
                                             doc_mask, head_input)
        pooled = cls_only_attention_stored(last.attention, last.ffn, query_state.states[:, 0], query_state.states,
                                           query_state.mask, docs[:, :heads], docs[:, heads:], doc_mask)
        return self._finish(pooled, head_input)

    def forward(self, query_batch: dict, doc_batch: dict, output_query_states: bool = False):
        """Training: ``[B]`` scores of aligned pairs (a batch-1 query is broadcast), identical to
        ``score(encode_query(q), pad_documents(encode_documents(d)))``.

        ``output_query_states`` (as Hugging Face's ``output_hidden_states``): ``(scores, query_states)``, where
        ``query_states`` holds the query block's states ``[B, Qb, n]`` after each joint layer ``l+1 … L`` — the
        query rows of a cross-encoder's ``[CLS] q [SEP] d [SEP]`` at those layers, which hidden-state distillation
        pulls towards a teacher's. The last layer then runs every row, not just [CLS] (same scores).
        """
        query_states, query_mask = self._query_layer_l(query_batch)
        doc_states, doc_mask = self._doc_layer_l(doc_batch)
        states = [] if output_query_states else None
        scores = self._joint_score(self._roundtrip(query_states), query_mask, self._roundtrip(doc_states), doc_mask,
                                   block_states=states)
        return (scores, tuple(states)) if output_query_states else scores

    def forward_logits(self, query_batch: dict, doc_batch: dict, output_query_states: bool = False):
        """The pointwise loss's input: PreTTR's ``[B]`` scores (:meth:`forward`, with the same option)."""
        return self(query_batch, doc_batch, output_query_states=output_query_states)

    @property
    def interaction_layers(self) -> int:
        """``L − l``: the joint layers whose query-block states ``output_query_states`` returns."""
        return self.num_layers - self.join_layer

    def score_texts(self, query: str, documents: list[str]) -> torch.Tensor:
        """``[len(documents)]`` scores from text, the query encoded once and broadcast."""
        return self(self.tokenize_queries([query]), self.tokenize_documents(documents))

    # ---- the reference path -------------------------------------------------------------------------------------
    def joined_inputs(self, query_batch: dict, doc_batch: dict) -> dict:
        """The joint layout as one sequence: ``input_ids``, ``attention_mask``, ``token_type_ids``,
        ``position_ids`` ``[B, Qb + Ld]`` (positions are simply ``0..Qb+Ld-1``)."""
        query_ids, query_mask = self._query_inputs(query_batch)
        doc_ids, doc_mask = self._doc_inputs(doc_batch)
        query_ids, query_mask = query_ids.expand(doc_ids.shape[0], -1), query_mask.expand(doc_ids.shape[0], -1)
        input_ids = torch.cat([query_ids, doc_ids], 1)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.cat([query_mask, doc_mask], 1).long(),
            "token_type_ids": torch.cat([torch.full_like(query_ids, QUERY_SEGMENT_ID),
                                         torch.full_like(doc_ids, DOC_SEGMENT_ID)], 1),
            "position_ids": torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand_as(input_ids),
        }

    def joint_forward_masked(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        """Reference: the plain cross-encoder on the joined sequence with the paper's block-diagonal mask on layers
        ``1..l``, the compressor on every token of the layer-l output, and full (all-row) layers ``l+1..L``."""
        if self.query_layers is not None:
            raise ValueError("the block-diagonal reference runs one stack over query and document; this PreTTR's "
                             "query block has its own layers (tied=false)")
        x, mask = self._joint_layer_l(self.joined_inputs(query_batch, doc_batch))
        x = self.encoder.run_layers(self._roundtrip(x), mask[:, None, None, :], self.join_layer, None)
        return self._head(self._pool(x, mask[:, :self.query_block_length]))

    def _joint_layer_l(self, joined: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-l states of the joined sequence under the block-diagonal mask, and the key mask ``[B, T]``."""
        mask = joined["attention_mask"].bool()
        segments = joined["token_type_ids"]
        x = self.encoder.embeddings(joined["input_ids"], segments, joined["position_ids"])
        same_segment = segments[:, :, None] == segments[:, None, :]  # [B, T, T]
        block_mask = (same_segment & mask[:, None, :])[:, None]  # [B, 1, T, T]
        return self.encoder.run_layers(x, block_mask, 0, self.join_layer), mask

    # ---- compressor pre-training (the paper's first stage) --------------------------------------------------------
    def compressor_parameters(self) -> list[nn.Parameter]:
        if self.compressor is None:
            raise ValueError("this PreTTR model has no compressor (compression_dim=None)")
        return list(self.compressor.parameters())

    def freeze_all_but_compressor(self) -> list[nn.Parameter]:
        """``requires_grad=False`` on every weight except the compressor's; returns the compressor's parameters."""
        trainable = self.compressor_parameters()
        keep = {id(parameter) for parameter in trainable}
        for parameter in self.parameters():
            parameter.requires_grad_(id(parameter) in keep)
        return trainable

    def attention_mse_loss(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        """Mean over layers ``l+1..L`` of the MSE between post-softmax attention probabilities computed with and
        without the compressor (teacher: this model without the compressor, no gradient; P5).

        Averaged over heads and over the (row, column) pairs of real tokens of each joined sequence; padding never
        counts. Runs with dropout off (the teacher must be deterministic and the student must be the same network);
        the module's train/eval mode is restored afterwards.
        """
        if self.compressor is None:
            raise ValueError("attention_mse_loss needs a compressor (compression_dim=None)")
        was_training = self.training
        self.eval()
        try:
            query_states, query_mask = self._query_layer_l(query_batch)
            doc_states, doc_mask = self._doc_layer_l(doc_batch)
            batch = doc_states.shape[0]
            mask = torch.cat([query_mask.expand(batch, -1), doc_mask], 1)
            with torch.no_grad():
                teacher_input = torch.cat([query_states.expand(batch, -1, -1), doc_states], 1)
                teacher = self._upper_attention(teacher_input, mask)
            student_input = torch.cat(
                [self.compressor(query_states).expand(batch, -1, -1), self.compressor(doc_states)], 1)
            student = self._upper_attention(student_input, mask)
        finally:
            self.train(was_training)
        pairs = (mask[:, :, None] & mask[:, None, :])[:, None]  # [B, 1, T, T]
        denominator = pairs.sum() * self.config.encoder.num_attention_heads
        losses = [((s - t).square() * pairs).sum() / denominator for s, t in zip(student, teacher)]
        return torch.stack(losses).mean()

    def _upper_attention(self, x: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Post-softmax attention ``[B, h, T, T]`` of every layer ``l+1..L`` (all rows)."""
        key_mask = mask[:, None, None, :]
        probabilities = []
        for layer in self.encoder.layers[self.join_layer:]:
            keys, values = layer.attention.project_keys_values(x)
            probabilities.append(layer.attention.attention_probs(x, keys, key_mask))
            x = layer.ffn(layer.attention.attend(x, keys, values, key_mask))
        return probabilities


class CompressedTokenBlock:
    """Stored compressed states ``r [B, T, e]`` seen through the decompressor ``ŝ = LayerNorm(W_d r + b_d)``
    without ever materialising ``ŝ`` at width ``n``.

    With ``C = W_d`` centred over its output rows, ``c = b_d`` centred, and ``C = QR`` (reduced QR):
    ``ŝ_j = γ ∘ (C r_j + c) / σ_j + β`` with ``σ_j² = (‖R r_j + Qᵀc‖² + ‖c − QQᵀc‖²) / n + ε``. Logits and the
    attention-weighted sums are then taken in the ``e``-dimensional space, so the per-token cost is ``e² + 2·e·h``
    instead of the ``e·n + 2·n·h`` of decompressing first (worth it when ``e < n``).
    """

    def __init__(self, codes: torch.Tensor, mask: torch.Tensor, compressor: Compressor):
        geometry = compressor.decoder_geometry()
        self.centred_weight, self.centred_bias = geometry.centred_weight, geometry.centred_bias
        self.gamma, self.beta = geometry.gamma, geometry.beta
        self.codes = codes.to(compute_dtype(codes))
        batch, length, width = codes.shape
        whitened = torch.addmm(geometry.projected_bias.to(self.codes.dtype), self.codes.reshape(-1, width),
                               geometry.r_factor.transpose(0, 1).to(self.codes.dtype))  # R r_j + Qᵀc
        norms = torch.linalg.vector_norm(whitened, dim=-1, dtype=torch.float32).view(batch, length)
        variance = (norms.square() + geometry.residual) / self.centred_weight.shape[0]
        self.inverse_sigma = torch.rsqrt(variance + geometry.eps)  # [B, T]
        self.mask = mask
        self.batch, self.length = batch, length

    def logits(self, folded: torch.Tensor) -> torch.Tensor:
        folded = folded.float()
        scaled = folded * self.gamma  # [Bc, h, n]
        code_query = (scaled @ self.centred_weight).to(self.codes.dtype)  # [Bc, h, e]
        offset = (scaled @ self.centred_bias)[:, :, None]  # [Bc, h, 1]
        shift = (folded @ self.beta)[:, :, None]
        if code_query.shape[0] == 1:
            raw = torch.matmul(self.codes, code_query[0].transpose(0, 1)).transpose(1, 2)  # [B, h, T]
        else:
            raw = torch.matmul(code_query, self.codes.transpose(1, 2))
        return (raw.float() + offset) * self.inverse_sigma[:, None, :] + shift

    def pool(self, probabilities: torch.Tensor) -> torch.Tensor:
        weights = probabilities * self.inverse_sigma[:, None, :]  # [B, h, T]
        code_sums = torch.matmul(weights.to(self.codes.dtype), self.codes).float()  # [B, h, e]
        centred = code_sums @ self.centred_weight.transpose(0, 1) + weights.sum(-1)[:, :, None] * self.centred_bias
        return self.gamma * centred + self.beta * probabilities.sum(-1)[:, :, None]

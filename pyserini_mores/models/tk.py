"""TK (Transformer-Kernel, Hofstätter et al. 2020): term embeddings contextualised by a small shared Transformer,
one cosine match matrix, RBF kernel pooling with log and document-length normalisation.

Two modes over the same weights: ``ctx`` stores the mixed contextualised document terms (L2-normalised, one row per
term that takes part in matching) in the sidecar, so only the query is contextualised online; ``online`` is the
paper's setting, where documents are contextualised per query from text (``store_width`` is ``None``). Scoring
divides the match matrix by the stored vectors' norms, so fp16 rounding of the norms (or a store of un-normalised
vectors) changes nothing; with unit vectors the cosine is the plain dot product.

Choices the paper leaves open and how they are resolved here:

* T1 layer: ``x = LN(x + FF(x))`` then ``x = LN(x + MultiHead(x))`` (AllenNLP's stacked self-attention block, the
  paper's code), FF = Linear(dim→ffn_dim) → ReLU → Linear(ffn_dim→dim); every dropout is 0.
* T2 heads: ``num_heads × head_dim`` is the total attention projection (paper-literal 16 × 32 = 512), projected back
  to ``embedding_dim`` by ``W^O``; scores are scaled by ``1/√head_dim`` (the paper's ``√d_k``).
* T3 positions: additive, non-learned sinusoids (AllenNLP layout: sines then cosines, timescales 1…1e4).
* T4 kernels: the 11 centres of :data:`TK_KERNEL_MUS`, σ = 0.1, no exact-match kernel.
* T5 numerics: ``log2(clamp(K_i, 1e-10))``; padded query rows are masked after the log; both pooled paths are
  multiplied by one learned scale (init 0.01) before ``W_log``/``W_len``; the length path divides by ``d_len``
  (the number of matching document terms, clamped to ≥ 1 so an empty document scores finitely).
* T6 init: α = 0.5; ``W_log``, ``W_len`` ~ U(−0.014, 0.014), no bias; β, γ = a bias-free ``Linear(2, 1)``
  (``scoring_init="paper"``, the default). ``scoring_init="exact-match"`` with ``mixer_init=1.0`` is a warm start
  for short training budgets: the model starts as a log-tf exact-match scorer (all weight on the kernel at μ = 1,
  β = 1, no context), which on debian-packages dev already ranks BM25's top 20 at MRR@10 0.72; from the paper's
  init, 250–400 CPU steps stayed at a random order's 0.15–0.19 (the random contextualiser's unit-variance output
  outweighs the term embeddings, so at step 0 no match is exact and the kernels see noise).
* T8 vocabulary: word-level GloVe (:meth:`TKModel.from_glove`, :class:`WordTokenizer`) or the backbone's WordPiece
  (:meth:`TKModel.from_backbone`). TK has no special tokens, so WordPiece input is tokenized *without*
  ``[CLS]``/``[SEP]``. Out-of-vocabulary terms (``[UNK]``, and any special token that appears literally in a text)
  keep their position but are masked like padding: they are no attention key, no row/column of the match matrix and
  do not count in ``d_len``; the ``attention_mask`` that :meth:`TKModel.tokenize_documents` returns already has 0
  there. ``query_max_length``/``doc_max_length`` count tokens of the model's tokenizer (WordPiece pieces or words).

Numerics under ``torch.autocast``: the contextualiser follows autocast (bf16 is fine there), but the match matrix,
kernels, pooling and the final linears always run in fp32 with autocast disabled. With σ = 0.1 a kernel's slope
reaches ~6/unit of cosine, and bf16 (8 mantissa bits) would move cosines by up to ~4e-3 and ``log2`` sums by far
more; the interaction part is also cheap (``q·d·dim`` + ``q·d·K`` per pair) so fp32 costs little.
"""
from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._layers import attention_context, rotated_rows
from .backbones import DEFAULT_BACKBONE
from .base import ModelCapabilities, RankingConfig, RankingModel, pad_documents, read_checkpoint_config
from .code_tables import CodeTables, code_inner_products, query_code_tables
from .loading import backbone_weights

logger = logging.getLogger(__name__)

#: The kernel centres of the paper's code (T4): "spread from −1 to +1", no exact match.
TK_KERNEL_MUS = (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5, -0.7, -0.9)

LOG_CLAMP_MIN = 1e-10  # T5: smallest kernel mass fed to log2
_FAR_FROM_EVERY_KERNEL = 1e4  # a scaled cosine whose kernel values underflow to exactly 0
MODES = ("ctx", "online")
TOKENIZER_TYPES = ("wordpiece", "word")
SCORING_INITS = ("paper", "exact-match")


@dataclass
class TKConfig(RankingConfig):
    """Hyperparameters of TK. ``encoder`` (a BERT shape) stays ``None``: TK has no BERT.

    Attributes:
        embedding_dim: width of the term embeddings and of everything the contextualiser outputs (300 for GloVe,
            the backbone's hidden size, e.g. 384, for WordPiece embeddings taken from a backbone).
        vocab_size: rows of the embedding matrix (the tokenizer's vocabulary size).
        num_layers: contextualising Transformer layers (the paper evaluates 1–3; TK-2 is its recommendation).
        num_heads: attention heads per layer (paper: 16).
        head_dim: width of one head (paper: 32); the total projection is ``num_heads * head_dim`` (T2).
        ffn_dim: hidden width of each layer's feed-forward block (paper: 100).
        kernel_mus: RBF kernel centres (T4).
        kernel_sigma: width of every kernel (paper: 0.1).
        mixer_init: α of eq. 1 before training (T6: 0.5; 1.0 starts from the plain term embeddings).
        scoring_init: ``"paper"`` (T6: small random ``W_log``/``W_len``, random β, γ) or ``"exact-match"``
            (``W_log`` one-hot on the kernel at μ = 1, β = 1, small random ``W_len`` and γ): see T6 above.
        freeze_embeddings: exclude the embedding matrix from training (``requires_grad=False``). The paper trains
            GloVe (False, the default here and for :meth:`TKModel.from_glove`); :meth:`TKModel.from_backbone`
            freezes the borrowed WordPiece embeddings unless told otherwise.
        mode: ``"ctx"`` stores contextualised document terms in a sidecar; ``"online"`` scores from text only.
        tokenizer_type: ``"wordpiece"`` (an HF tokenizer saved with the checkpoint) or ``"word"``
            (:class:`WordTokenizer`, its vocabulary saved as ``tk_vocab.txt``).
        query_max_length: query cap in tokens (paper: 30).
        doc_max_length: document cap in tokens (paper: 200).
    """

    query_max_length: int = 30
    doc_max_length: int = 200
    embedding_dim: int = 300
    vocab_size: int = 30522
    num_layers: int = 2
    num_heads: int = 16
    head_dim: int = 32
    ffn_dim: int = 100
    kernel_mus: list[float] = field(default_factory=lambda: list(TK_KERNEL_MUS))
    kernel_sigma: float = 0.1
    mixer_init: float = 0.5
    scoring_init: str = "paper"
    freeze_embeddings: bool = False
    mode: str = "ctx"
    tokenizer_type: str = "wordpiece"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"TK mode must be one of {MODES}, not {self.mode!r}")
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(f"TK tokenizer_type must be one of {TOKENIZER_TYPES}, not {self.tokenizer_type!r}")
        if self.num_layers < 1:
            raise ValueError(f"TK needs at least one contextualising layer, got num_layers={self.num_layers}")
        if not self.kernel_mus or self.kernel_sigma <= 0:
            raise ValueError("TK needs at least one kernel centre and kernel_sigma > 0")
        self.kernel_mus = [float(mu) for mu in self.kernel_mus]
        if self.scoring_init not in SCORING_INITS:
            raise ValueError(f"TK scoring_init must be one of {SCORING_INITS}, not {self.scoring_init!r}")
        if self.scoring_init == "exact-match" and 1.0 not in self.kernel_mus:
            raise ValueError("TK scoring_init='exact-match' needs a kernel centred at 1.0 in kernel_mus")
        if not 0.0 <= self.mixer_init <= 1.0:
            raise ValueError(f"TK mixer_init (alpha) must lie in [0, 1], not {self.mixer_init}")


class TKQueryState(NamedTuple):
    """What :meth:`TKModel.encode_query` returns: unit-length query terms ``[Bq, q, dim]`` (fp32) and the mask of
    terms that take part in matching ``[Bq, q]`` (False for padding and OOV). ``Bq`` is 1 for one query."""

    vectors: torch.Tensor
    mask: torch.Tensor


# ---- word-level tokenizer for GloVe vocabularies ---------------------------------------------------------------------
class WordTokenizer:
    """Lowercasing word tokenizer over a fixed vocabulary: runs of word characters, and every other non-space
    character as a token of its own (``"TK's (AR)"`` → ``tk ' s ( ar )``), as GloVe's CommonCrawl vocabulary has them.

    Called like an HF tokenizer (``tokenizer(texts, max_length=..., truncation=True, padding=True,
    return_tensors="pt")`` → ``input_ids``/``attention_mask``) so that :class:`TKModel` treats both alike. Id 0 is
    ``[PAD]``, id 1 ``[UNK]`` (every out-of-vocabulary word); ``attention_mask`` is 1 for every real token, OOV
    included (the model masks OOV itself).
    """

    pad_token = "[PAD]"
    unk_token = "[UNK]"
    pad_token_id = 0
    unk_token_id = 1
    do_lower_case = True
    vocab_file_name = "tk_vocab.txt"
    _token_pattern = re.compile(r"\w+|[^\w\s]")

    def __init__(self, words: Iterable[str]):
        self.id_to_token: list[str] = [self.pad_token, self.unk_token]
        self.token_to_id: dict[str, int] = {self.pad_token: 0, self.unk_token: 1}
        for word in words:
            if word in self.token_to_id:
                raise ValueError(f"word {word!r} appears twice in the vocabulary")
            self.token_to_id[word] = len(self.id_to_token)
            self.id_to_token.append(word)

    # the parts of the HF tokenizer interface the model, the fingerprint and the rerankers use
    @property
    def all_special_tokens(self) -> list[str]:
        return [self.pad_token, self.unk_token]

    @property
    def all_special_ids(self) -> list[int]:
        return [self.pad_token_id, self.unk_token_id]

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def __len__(self) -> int:
        return len(self.id_to_token)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.token_to_id)

    def tokenize(self, text: str) -> list[str]:
        return self._token_pattern.findall(text.lower())

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.token_to_id.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token[int(i)] for i in ids]

    def __call__(self, texts: str | list[str], max_length: int | None = None, truncation: bool = False,
                 padding: bool = True, return_tensors: str | None = "pt", add_special_tokens: bool = False,
                 **unused) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` ``[B, L]`` (right-padded to the longest text; ``add_special_tokens``
        is accepted and ignored: this vocabulary has none)."""
        if return_tensors not in ("pt", None):
            raise ValueError("WordTokenizer only returns torch tensors (return_tensors='pt')")
        texts = [texts] if isinstance(texts, str) else list(texts)
        sequences = [self.convert_tokens_to_ids(self.tokenize(text)) for text in texts]
        if truncation and max_length is not None:
            sequences = [ids[:max_length] for ids in sequences]
        width = max((len(ids) for ids in sequences), default=0)
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write the vocabulary, one token per line, line number = id (``[PAD]``, ``[UNK]`` first)."""
        path = Path(directory) / self.vocab_file_name
        path.write_text("".join(token + "\n" for token in self.id_to_token), encoding="utf-8")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "WordTokenizer":
        path = Path(directory) / cls.vocab_file_name
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {cls.vocab_file_name} (the vocabulary of a word-level TK)")
        tokens = path.read_text(encoding="utf-8").split("\n")[:-1]
        if tokens[:2] != [cls.pad_token, cls.unk_token]:
            raise ValueError(f"{path} must start with {cls.pad_token} and {cls.unk_token}")
        return cls(tokens[2:])


def load_glove_embeddings(path: str | os.PathLike, max_words: int | None = None,
                          lowercase: bool = True) -> tuple[list[str], torch.Tensor]:
    """Words and vectors ``[num_words, dim]`` (fp32) of a GloVe-format text file (``word v1 v2 … v_dim`` a line).

    The dimension comes from the first line (a word2vec ``count dim`` header line is skipped). Words containing
    whitespace (never produced by :class:`WordTokenizer`) are skipped; with ``lowercase`` a word is lowercased and
    only its first occurrence is kept (GloVe files are frequency-ordered). ``max_words`` keeps the first N words.
    """
    words: list[str] = []
    rows: list[list[float]] = []
    seen: set[str] = set()
    dim = None
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            parts = line.rstrip("\n\r").rstrip(" ").split(" ")
            if dim is None:
                if len(parts) == 2 and all(part.isdigit() for part in parts):
                    continue  # word2vec header
                dim = len(parts) - 1
                if dim < 1:
                    raise ValueError(f"{path}:{number}: expected 'word v1 v2 ...', got {line[:80]!r}")
            if len(parts) == 1 and not parts[0]:
                continue  # blank line
            if len(parts) < dim + 1:
                raise ValueError(f"{path}:{number}: expected {dim} values after the word, got {len(parts) - 1}")
            word = " ".join(parts[:-dim])
            if lowercase:
                word = word.lower()
            if not word or any(ch.isspace() for ch in word) or word in seen:
                continue
            if word in (WordTokenizer.pad_token, WordTokenizer.unk_token):
                continue
            try:
                rows.append([float(value) for value in parts[-dim:]])
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}") from None
            seen.add(word)
            words.append(word)
            if max_words is not None and len(words) >= max_words:
                break
    if dim is None:
        raise ValueError(f"{path} holds no vectors")
    logger.info("loaded %d %d-d vectors from %s", len(words), dim, path)
    return words, torch.tensor(rows, dtype=torch.float32).reshape(len(rows), dim)


# ---- blocks ----------------------------------------------------------------------------------------------------------
def sinusoidal_positions(length: int, dim: int, device=None, dtype=torch.float32,
                         min_timescale: float = 1.0, max_timescale: float = 1.0e4) -> torch.Tensor:
    """``[length, dim]`` non-learned positional features (T3), laid out as AllenNLP's ``add_positional_features``:
    ``dim // 2`` geometric timescales, sines in the first half, cosines in the second, a zero column if odd."""
    num_timescales = dim // 2
    timesteps = torch.arange(length, device=device, dtype=torch.float32)
    increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    inverse = min_timescale * torch.exp(torch.arange(num_timescales, device=device, dtype=torch.float32) * -increment)
    scaled = timesteps[:, None] * inverse[None, :]
    features = torch.cat([torch.sin(scaled), torch.cos(scaled), scaled.new_zeros(length, dim % 2)], dim=1)
    return features.to(dtype)


class TKSelfAttention(nn.Module):
    """Multi-head self-attention whose total projection (``num_heads × head_dim``) need not equal the input width:
    ``softmax(QKᵀ/√head_dim) V`` per head, concatenated and projected back by ``W^O`` (paper eq. 3)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim)
        self.output = nn.Linear(num_heads * head_dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x [B, L, dim]``, ``key_mask [B, L]`` (True = may be attended to) → ``[B, L, dim]``."""
        batch, length, _ = x.shape
        queries, keys, values = (
            self.qkv(x).view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )
        # A sequence without any key (every term OOV) attends to all positions instead of producing NaN; its rows
        # are masked downstream anyway.
        key_mask = key_mask | ~key_mask.any(-1, keepdim=True)
        context = attention_context(queries, keys, values, key_mask[:, None, None, :],
                                    scale=1.0 / math.sqrt(self.head_dim))  # [B, h, L, head_dim]
        return self.output(context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class TKLayer(nn.Module):
    """One contextualising layer (T1): ``x = LN(x + FF(x))``, then ``x = LN(x + MultiHead(x))``."""

    def __init__(self, config: TKConfig):
        super().__init__()
        dim = config.embedding_dim
        self.feed_forward = nn.Sequential(nn.Linear(dim, config.ffn_dim), nn.ReLU(), nn.Linear(config.ffn_dim, dim))
        self.feed_forward_norm = nn.LayerNorm(dim)
        self.attention = TKSelfAttention(dim, config.num_heads, config.head_dim)
        self.attention_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = self.feed_forward_norm(x + self.feed_forward(x))
        return self.attention_norm(x + self.attention(x, key_mask))


class TKContextualizer(nn.Module):
    """``context(t_{1:n})``: add sinusoidal positions, run ``num_layers`` :class:`TKLayer` s (shared by query and
    document)."""

    def __init__(self, config: TKConfig):
        super().__init__()
        self.layers = nn.ModuleList(TKLayer(config) for _ in range(config.num_layers))

    def forward(self, embeddings: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        _, length, dim = embeddings.shape
        x = embeddings + sinusoidal_positions(length, dim, embeddings.device, embeddings.dtype)
        for layer in self.layers:
            x = layer(x, key_mask)
        return x


class KernelFeatures(NamedTuple):
    """Kernel pooling of one batch: per query term and kernel the mass ``K_i^k`` ``[B, q, K]`` (0 on masked query
    terms), and per document the paper's ``s^k_log`` (eq. 7) and ``s^k_len`` (eq. 8), each ``[B, K]``."""

    query_kernel_mass: torch.Tensor
    log_pooled: torch.Tensor
    len_pooled: torch.Tensor


class KernelPooling(nn.Module):
    """RBF kernels over a match matrix, summed over document terms, then log2- and length-normalised pooling over
    query terms (paper eqs. 5–8). No weights; call it in fp32."""

    def __init__(self, mus: Iterable[float], sigma: float):
        super().__init__()
        # not persistent: the centres are config, not weights
        self.register_buffer("mus", torch.tensor(list(mus), dtype=torch.float32), persistent=False)
        self.sigma = float(sigma)

    def forward(self, match_matrix: torch.Tensor, query_mask: torch.Tensor, doc_mask: torch.Tensor) -> KernelFeatures:
        """``match_matrix [B, q, L]``; ``query_mask [B|1, q]`` and ``doc_mask [B, L]`` (True = real term)."""
        # exp(-(M - mu)^2 / 2σ^2) = exp(-(M·s - mu·s)^2) with s = 1/(σ√2): the constant folds into the small
        # [B, q, L] and [K] operands, and padded document columns are moved so far from every centre that each
        # kernel is exactly 0 there (masking before the sum over j without another pass over [B, q, K, L]).
        scale = 1.0 / (self.sigma * math.sqrt(2.0))
        scaled = (match_matrix * scale).masked_fill(~doc_mask[:, None, :], _FAR_FROM_EVERY_KERNEL)
        differences = scaled.unsqueeze(2) - (self.mus * scale)[:, None]  # [B, q, K, L]: the doc axis innermost
        mass = differences.square().neg_().exp_().sum(-1)  # K_i^k (eq. 6), [B, q, K]
        query_weight = query_mask[..., None].to(mass.dtype)
        log_pooled = (torch.log2(mass.clamp(min=LOG_CLAMP_MIN)) * query_weight).sum(1)  # query pads out after log
        doc_lengths = doc_mask.sum(1).clamp(min=1).to(mass.dtype)
        mass = mass * query_weight
        len_pooled = mass.sum(1) / doc_lengths[:, None]
        return KernelFeatures(mass, log_pooled, len_pooled)


# ---- the model -------------------------------------------------------------------------------------------------------
class TKModel(RankingModel):
    """TK reranker. See the module docstring for the architecture and the resolved ambiguities.

    Example:
        >>> model = TKModel.from_backbone("minilm", num_layers=2)            # doctest: +SKIP
        >>> model.score_texts("androgen receptor define", ["The androgen receptor (AR) ...", "..."])  # doctest: +SKIP
        >>> state = model.encode_query(model.tokenize_queries(["androgen receptor define"]))   # doctest: +SKIP
        >>> docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(texts)))  # doctest: +SKIP
        >>> model.score(state, docs, lengths)                               # [len(texts)]; doctest: +SKIP
    """

    model_type = "tk"
    config_class = TKConfig
    capabilities = ModelCapabilities(
        default_loss="pairwise",  # the paper's hinge
        # the kernel-scoring weights (§4.3: trained at 1e-3, the embeddings and contextualiser at 1e-4)
        new_parameters=("pooled_scale", "log_weights.", "len_weights.", "combine."),
        starts_from_glove=True,  # the paper's word-level embeddings (:meth:`from_glove`)
        fp32_parameters=("log_weights.", "len_weights.", "combine.", "pooled_scale"),  # kernel pooling and scoring
        explains_scores=True,  # :meth:`explain`
    )

    def __init__(self, config: TKConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.embeddings.weight.requires_grad_(not config.freeze_embeddings)
        self.contextualizer = TKContextualizer(config)
        # shape [1], not a 0-d scalar: the shared fingerprint cannot hash 0-d tensors
        # α of eq. 1: t̂ = α·t + (1 − α)·context(t)
        self.mixer = nn.Parameter(torch.full((1,), float(config.mixer_init)))
        self.kernel_pooling = KernelPooling(config.kernel_mus, config.kernel_sigma)
        self.pooled_scale = nn.Parameter(torch.full((1,), 0.01))  # T5: learned scale on both pooled paths
        num_kernels = len(config.kernel_mus)
        self.log_weights = nn.Linear(num_kernels, 1, bias=False)  # W_log
        self.len_weights = nn.Linear(num_kernels, 1, bias=False)  # W_len
        self.combine = nn.Linear(2, 1, bias=False)  # (β, γ)
        nn.init.uniform_(self.log_weights.weight, -0.014, 0.014)
        nn.init.uniform_(self.len_weights.weight, -0.014, 0.014)
        if config.scoring_init == "exact-match":
            with torch.no_grad():
                self.log_weights.weight.zero_()
                self.log_weights.weight[0, config.kernel_mus.index(1.0)] = 1.0
                # γ small but not 0: with γ = 0 and W_len ≈ 0 neither would receive a gradient worth the name
                self.combine.weight.copy_(torch.tensor([[1.0, 0.0]]))
                nn.init.uniform_(self.combine.weight[:, 1:], -0.014, 0.014)
        masked_ids = sorted(set(getattr(tokenizer, "all_special_ids", [])) | {tokenizer.unk_token_id})
        self.register_buffer("masked_token_ids", torch.tensor(masked_ids, dtype=torch.long), persistent=False)

    # ---- constructors -------------------------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, backbone: str = DEFAULT_BACKBONE, **config_overrides) -> "TKModel":
        """A new TK over a BERT-family backbone's WordPiece vocabulary, its term embeddings initialised from the
        backbone's input embedding matrix (frozen unless ``freeze_embeddings=False``); everything else random."""
        _, state_dict, tokenizer = backbone_weights(backbone)
        word_embeddings = state_dict["embeddings.word_embeddings.weight"]
        values = {"freeze_embeddings": True, **config_overrides}
        config = TKConfig(embedding_dim=word_embeddings.shape[1], vocab_size=word_embeddings.shape[0],
                          tokenizer_type="wordpiece", backbone=str(backbone), **values)
        model = cls(config, tokenizer)
        with torch.no_grad():
            model.embeddings.weight.copy_(word_embeddings)
        return model.eval()

    @classmethod
    def from_glove(cls, path: str | os.PathLike, max_words: int | None = None, **config_overrides) -> "TKModel":
        """A new word-level TK whose vocabulary and embeddings come from a GloVe-format text file
        (:func:`load_glove_embeddings`); ``[PAD]``/``[UNK]`` rows are zero. Embeddings are trained by default, as in
        the paper. The checkpoint keeps the vocabulary in ``tk_vocab.txt``, the vectors in ``model.safetensors``."""
        words, vectors = load_glove_embeddings(path, max_words=max_words)
        tokenizer = WordTokenizer(words)
        config = TKConfig(embedding_dim=vectors.shape[1], vocab_size=len(tokenizer), tokenizer_type="word",
                          backbone=str(path), **config_overrides)
        model = cls(config, tokenizer)
        with torch.no_grad():
            model.embeddings.weight.zero_()
            model.embeddings.weight[2:].copy_(vectors)
        return model.eval()

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, **overrides) -> "TKModel":
        """Load a checkpoint; WordPiece checkpoints go through the shared loader, word-level ones read
        ``tk_vocab.txt``. ``overrides`` replace config fields (e.g. ``mode="online"``)."""
        values = read_checkpoint_config(directory)
        if values.get("tokenizer_type", "wordpiece") != "word":
            return super().from_pretrained(directory, **overrides)
        from safetensors.torch import load_model

        if values.get("model_type") != cls.model_type:
            raise ValueError(f"{directory} holds a '{values.get('model_type')}' model, not '{cls.model_type}'")
        model = cls(cls.config_class.from_dict({**values, **overrides}), WordTokenizer.from_pretrained(directory))
        load_model(model, str(Path(directory) / "model.safetensors"), strict=True)
        return model.eval()

    def with_wider_feed_forward(self, ffn_dim: int, seed: int = 0) -> "TKModel":
        """This TK with ``ffn_dim`` hidden units in every layer's feed-forward block instead of
        ``config.ffn_dim`` (beyond the paper), scoring exactly as this one: the existing units are copied, each new
        unit's input weights and bias start as ``nn.Linear`` initialises them (seeded by ``seed``) and its output
        weights at zero. A start for a trained TK with more capacity: the new units' output weights receive a
        gradient from the first step (their ReLU inputs are not all zero), so training decides what they add.

        Raises:
            ValueError: unless ``ffn_dim`` is larger than ``config.ffn_dim``.
        """
        if ffn_dim <= self.config.ffn_dim:
            raise ValueError(f"this TK's feed-forward blocks have {self.config.ffn_dim} hidden units; widening "
                             f"needs more, not {ffn_dim}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            wider = type(self)(replace(self.config, ffn_dim=ffn_dim), self.tokenizer)
        state = wider.state_dict()
        for name, tensor in self.state_dict().items():
            grown = state[name]
            if grown.shape == tensor.shape:
                state[name] = tensor.clone()
            elif name.endswith(("feed_forward.0.weight", "feed_forward.0.bias")):  # [ffn_dim, dim] / [ffn_dim]
                grown[: tensor.shape[0]] = tensor
            else:  # feed_forward.2.weight, [dim, ffn_dim]: the new units' columns stay zero
                grown.zero_()
                grown[:, : tensor.shape[1]] = tensor
        wider.load_state_dict(state, strict=True)
        wider.train(self.training)
        return wider

    # ---- what the sidecar stores ----------------------------------------------------------------------------------
    @property
    def store_width(self) -> int | None:
        return self.config.embedding_dim if self.config.mode == "ctx" else None

    @property
    def store_variant(self) -> str:
        return self.config.mode

    def store_parameters(self):
        """Embeddings, contextualiser and α: the stored ``d̂`` depends on nothing else (X2)."""
        return [(name, tensor) for name, tensor in self.state_dict().items()
                if name.startswith(("embeddings.", "contextualizer.")) or name == "mixer"]

    def store_config(self) -> dict:
        config = self.config
        return {"embedding_dim": config.embedding_dim, "vocab_size": config.vocab_size,
                "num_layers": config.num_layers, "num_heads": config.num_heads, "head_dim": config.head_dim,
                "ffn_dim": config.ffn_dim, "doc_max_length": config.doc_max_length,
                "tokenizer_type": config.tokenizer_type, "special_tokens": False, "oov": "dropped",
                "positional_encoding": "sinusoidal", "normalized": True}

    # ---- tokenization -------------------------------------------------------------------------------------------
    def _tokenize(self, texts: list[str], max_length: int) -> dict:
        """``input_ids``/``attention_mask`` ``[B, L]`` without special tokens; the mask is 0 on padding *and* OOV."""
        batch = self.call_tokenizer(texts, max_length=max_length, truncation=True, padding=True,
                                    return_tensors="pt", add_special_tokens=False)
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        if input_ids.shape[1] == 0:  # every text empty: keep one padded column so shapes stay valid
            input_ids = input_ids.new_full((input_ids.shape[0], 1), self.tokenizer.pad_token_id)
            attention_mask = attention_mask.new_zeros((input_ids.shape[0], 1))
        return {"input_ids": input_ids, "attention_mask": self._term_mask(input_ids, attention_mask).long()}

    def _term_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` True where a token takes part in matching: real, in vocabulary, not a special token."""
        return attention_mask.bool() & ~torch.isin(input_ids, self.masked_token_ids.to(input_ids.device))

    # ---- representations ------------------------------------------------------------------------------------------
    def represent(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-length hybrid term vectors ``t̂`` ``[B, L, dim]`` (fp32, zero on masked terms) and the term mask
        ``[B, L]`` of a tokenized batch (steps 1–3; the same for queries and documents)."""
        input_ids = batch["input_ids"]
        mask = self._term_mask(input_ids, batch["attention_mask"])
        embedded = self.embeddings(input_ids)
        context = self.contextualizer(embedded, mask)
        mixed = self.mixer * embedded + (1 - self.mixer) * context
        mixed = mixed.float() * mask[..., None]
        return F.normalize(mixed, dim=-1), mask

    def encode_documents(self, doc_batch: dict) -> list[torch.Tensor]:
        """``ctx`` mode: per document the unit-length ``d̂`` of its matching terms ``[d_len_i, dim]`` (fp32). OOV
        terms were contextualised at their position but are dropped here, so ``len_i`` is the ``d_len`` of eq. 8."""
        if self.config.mode != "ctx":
            raise NotImplementedError(
                "a TK in mode='online' stores nothing; load it with mode='ctx' to build a sidecar")
        return _compact(*self.represent(doc_batch))

    @property
    def stored_vocabulary(self) -> int:
        return int(self.embeddings.num_embeddings)

    def stored_token_ids(self, doc_batch: dict) -> list[torch.Tensor]:
        """Per document the ids of the terms :meth:`encode_documents` stores (its matching terms, in order): a
        stored term is 95% its word's embedding (the mixer) and lies close to its word's mean, which an ``rq`` word
        stage codes exactly."""
        input_ids = doc_batch["input_ids"]
        return _compact(input_ids, self._term_mask(input_ids, doc_batch["attention_mask"]))

    def encode_query(self, query_batch: dict) -> TKQueryState:
        """Online, once per query: the contextualised query terms (see :class:`TKQueryState`)."""
        return TKQueryState(*self.represent(query_batch))

    # ---- scoring ----------------------------------------------------------------------------------------------------
    def score(self, query_state: TKQueryState, docs: torch.Tensor, lengths: torch.Tensor,
              norms: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` scores of one query against stored ``docs [B, Lmax, dim]`` (any float dtype, zero-padded).
        ``norms [B, Lmax]``: the stored vectors' norms as the store gives them, which the cosines divide by (default:
        computed from ``docs``; see :meth:`score_codes`)."""
        return self._interaction(query_state, *self._stored(docs, lengths), norms=norms)["score"]

    scores_codes = True  # a stored term's only use is its cosines with the query terms, given its norm
    code_scores_need_norms = True

    def code_tables(self, query_state: TKQueryState, codebooks: torch.Tensor,
                    words: torch.Tensor | None = None) -> CodeTables:
        """Every unit query term's inner product with every entry of ``codebooks [M, K, dim]`` (and word mean),
        once per query (:func:`~.code_tables.query_code_tables`)."""
        vectors, mask = query_state
        return query_code_tables(vectors[0], mask, codebooks, words)

    def score_codes(self, tables: CodeTables, codes: torch.Tensor, lengths: torch.Tensor,
                    norms: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` scores of stored terms coded as ``codes [B, Lmax, M]`` against the query of ``tables``
        (:meth:`code_tables`), with the norms ``[B, Lmax]`` their store gives (the look-ups do not give ``‖x̂‖``):
        ``q · x̂`` by ``M`` look-ups (:func:`~.code_tables.code_inner_products`), then divided by the norm. Equals
        :meth:`score` of the decoded terms with the same ``norms``, to float32 rounding."""
        if norms is None:
            raise ValueError("TK scores codes with the norms of the terms they decode to (an rq store with norms)")
        with torch.autocast(device_type=codes.device.type, enabled=False):
            match_matrix = code_inner_products(tables, codes) / norms.float().clamp(min=1e-12)[:, None, :]
            return self._pooled(match_matrix, tables.mask, self._stored(codes, lengths)[1])["score"]

    def store_frame(self, rotation: torch.Tensor) -> torch.Tensor:
        return rotation

    def query_in_frame(self, query_state: TKQueryState, frame: torch.Tensor) -> TKQueryState:
        """Cosines of ``y = x Rᵀ`` with ``q Rᵀ`` equal those of ``x`` with ``q`` (``R`` orthogonal: norms kept)."""
        return TKQueryState(rotated_rows(query_state.vectors, frame), query_state.mask)

    def explain(self, query_state: TKQueryState, docs: torch.Tensor, lengths: torch.Tensor) -> dict:
        """Everything behind :meth:`score` that the paper's Figure 3 shows, as plain tensors:

        * ``match_matrix [B, q, Lmax]``: cosines (0 on masked cells);
        * ``query_kernel_mass [B, q, K]``: ``K_i^k`` (eq. 6) per query term, 0 on masked query terms;
        * ``log_pooled``/``len_pooled [B, K]``: ``s^k_log`` (eq. 7, log base 2) and ``s^k_len`` (eq. 8), unweighted;
        * ``log_contributions``/``len_contributions [B, K]``: the same times the learned scale and ``W_log``/``W_len``
          (the paper's "model weights included" kernel numbers), whose sums are ``s_log``/``s_len [B]``;
        * ``beta``, ``gamma``: the final weights, ``score = β·s_log + γ·s_len`` ``[B]``; ``kernel_mus [K]``.
        """
        return self._interaction(query_state, *self._stored(docs, lengths), explain=True)

    def forward(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        """Training path: ``[B]`` scores of aligned (query, document) pairs, both sides contextualised in-graph."""
        return self._interaction(self.encode_query(query_batch), *self.represent(doc_batch))["score"]

    @torch.no_grad()
    def score_texts(self, query: str, documents: list[str], batch_size: int | None = None) -> torch.Tensor:
        """``[len(documents)]`` scores from text (the ``online`` path): the query is contextualised once and
        broadcast; documents are contextualised in batches of ``batch_size`` (all at once by default)."""
        query_state = self.encode_query(self.tokenize_queries([query]))
        step = batch_size or max(len(documents), 1)
        scores = [self._interaction(query_state, *self.represent(self.tokenize_documents(documents[i:i + step])))
                  ["score"] for i in range(0, len(documents), step)]
        return torch.cat(scores) if scores else torch.zeros(0)

    @torch.no_grad()
    def explain_texts(self, query: str, documents: list[str]) -> dict:
        """:meth:`explain` from text, plus ``query_tokens`` (every query position, masked ones included) and
        ``doc_tokens`` (per document its matching terms, the columns of ``match_matrix``)."""
        query_batch = self.tokenize_queries([query])
        doc_batch = self.tokenize_documents(documents)
        vectors, mask = self.represent(doc_batch)
        docs, lengths = pad_documents(_compact(vectors, mask))
        explanation = self.explain(self.encode_query(query_batch), docs, lengths)
        ids = self.tokenizer.convert_ids_to_tokens
        explanation["query_tokens"] = ids(query_batch["input_ids"][0].tolist())
        explanation["doc_tokens"] = [ids(row[keep].tolist()) for row, keep in zip(doc_batch["input_ids"], mask)]
        return explanation

    def _stored(self, docs: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(docs.shape[1], device=docs.device)
        return docs, positions[None, :] < lengths.to(docs.device)[:, None]

    def _interaction(self, query_state: TKQueryState, doc_vectors: torch.Tensor, doc_mask: torch.Tensor,
                     explain: bool = False, norms: torch.Tensor | None = None) -> dict:
        """Steps 4–8 of unit-length query terms ``[1|B, q, dim]`` against documents ``[B, L, dim]`` (term mask
        ``[B, L]``), in fp32: ``{"score": [B]}``, plus the :meth:`explain` entries when ``explain``."""
        query_vectors, query_mask = query_state
        with torch.autocast(device_type=doc_vectors.device.type, enabled=False):
            query_vectors, doc_vectors = query_vectors.float(), doc_vectors.float()
            # one query state broadcast over the candidates (a stride-0 view, not a copy); one batched matmul
            query_vectors = query_vectors.expand(doc_vectors.shape[0], -1, -1)
            match_matrix = torch.bmm(query_vectors, doc_vectors.transpose(1, 2))  # [B, q, L]
            # cosine: dividing by the document norms on [B, q, L] instead of renormalising [B, L, dim] undoes the
            # fp16 rounding of stored norms (and accepts un-normalised stores); zero padding stays 0
            if norms is None:
                norms = torch.linalg.vector_norm(doc_vectors, dim=-1)
            match_matrix = match_matrix / norms.float().clamp(min=1e-12)[:, None, :]
            return self._pooled(match_matrix, query_mask, doc_mask, explain)

    def _pooled(self, match_matrix: torch.Tensor, query_mask: torch.Tensor, doc_mask: torch.Tensor,
                explain: bool = False) -> dict:
        """Steps 5–8 from the cosines ``match_matrix [B, q, L]`` (fp32; any value on masked cells)."""
        with torch.autocast(device_type=match_matrix.device.type, enabled=False):
            features = self.kernel_pooling(match_matrix, query_mask, doc_mask)
            log_scaled = features.log_pooled * self.pooled_scale
            len_scaled = features.len_pooled * self.pooled_scale
            s_log = self.log_weights(log_scaled).squeeze(-1)
            s_len = self.len_weights(len_scaled).squeeze(-1)
            score = self.combine(torch.stack([s_log, s_len], dim=-1)).squeeze(-1)
            if not explain:
                return {"score": score}
            beta, gamma = self.combine.weight[0]
            return {
                "score": score, "s_log": s_log, "s_len": s_len, "beta": beta, "gamma": gamma,
                "log_pooled": features.log_pooled, "len_pooled": features.len_pooled,
                "log_contributions": log_scaled * self.log_weights.weight[0],
                "len_contributions": len_scaled * self.len_weights.weight[0],
                "query_kernel_mass": features.query_kernel_mass,
                "match_matrix": match_matrix * query_mask[..., None] * doc_mask[:, None, :],
                "kernel_mus": self.kernel_pooling.mus,
            }

    # ---- training helpers -------------------------------------------------------------------------------------------
    def parameter_groups(self, contextualizer_lr: float = 1e-4, scoring_lr: float = 1e-3) -> list[dict]:
        """Adam parameter groups as in the paper (§4.3): embeddings, contextualiser and α at ``contextualizer_lr``,
        the kernel-scoring weights (the capabilities' ``new_parameters``) at ``scoring_lr``. Frozen parameters are
        left out."""
        contextual, scoring = [], []
        for name, parameter in self.named_parameters():
            if parameter.requires_grad:
                (scoring if name.startswith(self.capabilities.new_parameters) else contextual).append(parameter)
        return [{"params": contextual, "lr": contextualizer_lr}, {"params": scoring, "lr": scoring_lr}]

    def optimizer_groups(self, lr: float, head_lr: float | None = None,
                         joint_lr: float | None = None) -> list[dict]:
        """:meth:`parameter_groups`: the two groups always, the scoring weights at ``head_lr`` when given."""
        self._check_joint_lr(joint_lr)
        return self.parameter_groups(contextualizer_lr=lr, scoring_lr=head_lr if head_lr is not None else lr)



def _compact(vectors: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per row the vectors of its masked-in terms: ``[B, L, dim]`` + ``[B, L]`` → list of ``[n_i, dim]``."""
    return [row[keep] for row, keep in zip(vectors, mask)]


__all__ = ["TKConfig", "TKModel", "TKQueryState", "KernelPooling", "KernelFeatures", "WordTokenizer",
           "load_glove_embeddings", "sinusoidal_positions", "TK_KERNEL_MUS"]

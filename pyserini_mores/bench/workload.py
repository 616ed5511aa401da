"""What is benchmarked: backbones, model variants (each built at the same backbone dims), synthetic candidates
whose token counts are exact, and the sidecar each precomputing variant reads, written to disk with
:class:`~pyserini_mores.sidecar.SidecarWriter`.

Stored rows are random vectors of the exact shape the model's ``encode_documents`` produces (checked on a short
document): encoding 1000 documents of 512 tokens with a 12-layer encoder would cost as much as the cross-encoder
run itself, and values do not change the time of any kernel.

What differs between models — their variants, how they read a document, their FLOP count — is declared per model
type in :mod:`.model_hooks`; this module holds none of it.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..models.registry import model_class, model_types
from . import model_hooks
from .flops import FlopCount

logger = logging.getLogger(__name__)

PRETTR_COMPRESSION_DIM = 128
#: TK-2 (the paper's recommended trade-off) with the paper's contextualiser
PAPER_TK = {"num_layers": 2, "num_heads": 16, "head_dim": 32, "ffn_dim": 100}


@dataclass(frozen=True)
class Backbone:
    """A BERT shape the models are built at. ``pretrained``: load real weights with ``from_backbone`` (MiniLM);
    otherwise random weights on the real MiniLM WordPiece tokenizer. ``model_options``: per model type, config
    values the models take at this backbone beyond its BERT shape (TK's contextualiser)."""

    name: str
    pretrained: str | None = None
    dims: dict = field(default_factory=dict)  # BertDims fields for random-weight backbones
    model_options: dict = field(default_factory=lambda: {"tk": PAPER_TK})
    extend_positions: bool = True  # random weights: let joint models see q + d tokens even past 512
    compression_dim: int = PRETTR_COMPRESSION_DIM  # compressed stores' width (PreTTR's smallest in the paper)


BACKBONES = {
    "bert-base": Backbone("bert-base", dims=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                  intermediate_size=3072)),
    "minilm": Backbone("minilm", pretrained="minilm", extend_positions=False),
    # hidden: for the smoke test
    "tiny": Backbone("tiny", dims=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64),
                     model_options={"tk": {**PAPER_TK, "num_heads": 4, "head_dim": 8, "ffn_dim": 16}},
                     compression_dim=16),
}
PUBLIC_BACKBONES = ("bert-base", "minilm")


@dataclass(frozen=True)
class Variant:
    """One row of the benchmark: a model family and its settings (``options`` go to the model config)."""

    model: str
    variant: str
    options: tuple = ()  # sorted (key, value) pairs

    @property
    def config(self) -> dict:
        return dict(self.options)

    @property
    def key(self) -> str:
        return f"{self.model}:{self.variant}"


def variants_for(num_layers: int, compression_dim: int = PRETTR_COMPRESSION_DIM) -> list[Variant]:
    """Every variant the benchmark knows for an encoder of ``num_layers`` layers: those of each registered model
    type that it measures (:attr:`.model_hooks.BenchmarkHooks.variants`), in registry order."""
    return [Variant(model_type, name, tuple(sorted(options.items())))
            for model_type in model_types() if model_type in model_hooks.BENCHMARKS
            for name, options in model_hooks.BENCHMARKS[model_type].variants(num_layers, compression_dim)]


def feasible(variant: Variant, num_layers: int) -> str | None:
    """Why ``variant`` cannot be built at ``num_layers`` layers, or ``None``."""
    return model_hooks.benchmark_hooks(variant.model).skip_reason(variant.config, num_layers)


def backbone_variants(backbone: str) -> list[Variant]:
    """Every variant of :func:`variants_for` at ``backbone``'s depth and compression width."""
    return variants_for(backbone_dims(backbone).num_hidden_layers, BACKBONES[backbone].compression_dim)


def select_variants(selectors: list[str] | None, backbone: str) -> list[Variant]:
    """Variants matching ``selectors`` (``MODEL`` or ``MODEL:VARIANT``; all when None), in benchmark order."""
    known = backbone_variants(backbone)
    if not selectors:
        return known
    chosen = []
    for variant in known:
        if any(s == variant.model or s == variant.key for s in selectors):
            chosen.append(variant)
    return chosen


def check_selectors(selectors: list[str], backbones: list[str]) -> None:
    """Raise ``ValueError`` for a selector that matches no variant at any of the backbones."""
    known = list(dict.fromkeys(variant.model for backbone in backbones for variant in backbone_variants(backbone)))
    for selector in selectors:
        model = selector.split(":", 1)[0]
        if model not in known:
            raise ValueError(f"unknown model '{model}' in --models; known: {', '.join(known)}")
        if not any(select_variants([selector], backbone) for backbone in backbones):
            names = sorted({v.key for b in backbones for v in backbone_variants(b) if v.model == model})
            raise ValueError(f"no variant '{selector}'; {model} has: {', '.join(names)}")


# ---- backbones ---------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from ..models.backbones import offline_minilm_path

    return AutoTokenizer.from_pretrained(str(offline_minilm_path()), trust_remote_code=False)


@lru_cache(maxsize=4)
def backbone_dims(name: str):
    """The :class:`~pyserini_mores.models._layers.BertDims` of a backbone (real config for pretrained ones)."""
    from ..models._layers import BertDims

    backbone = BACKBONES[name]
    if backbone.pretrained:
        from transformers import AutoConfig

        from ..models.backbones import resolve_backbone

        return BertDims.from_hf_config(AutoConfig.from_pretrained(resolve_backbone(backbone.pretrained),
                                                                     trust_remote_code=False))
    return BertDims(**backbone.dims)


@dataclass(frozen=True)
class Lengths:
    """Token counts of one (backbone, doc_len) cell, per model family, as each model sees them.

    ``doc_len`` is the document with its own ``[CLS]``/``[SEP]`` (what MORES stores). Joint models (cross-encoder,
    PreTTR) drop the document's ``[CLS]``: they see ``joint_doc_len - 1`` document tokens after the query block, where
    ``joint_doc_len`` = ``doc_len`` unless the backbone's positions force truncation (real-weight MiniLM at 512).
    TK uses no special tokens: ``doc_len`` words and ``query_len`` query words.
    """

    query_len: int
    doc_len: int
    joint_doc_len: int
    max_positions: int


def cell_lengths(backbone: str, query_len: int, doc_len: int) -> Lengths:
    dims = backbone_dims(backbone)
    needed = query_len + doc_len - 1
    if BACKBONES[backbone].extend_positions:
        positions = max(dims.max_position_embeddings, needed)
        return Lengths(query_len, doc_len, doc_len, positions)
    positions = dims.max_position_embeddings
    return Lengths(query_len, doc_len, min(doc_len, positions - query_len + 1), positions)


def doc_tokens(variant: Variant, lengths: Lengths) -> int:
    """The document tokens the model of ``variant`` reads in this cell (see :class:`Lengths`), which are also the
    rows it stores per document."""
    return lengths.joint_doc_len - 1 if model_hooks.benchmark_hooks(variant.model).joint_input else lengths.doc_len


def build_model(variant: Variant, backbone: str, lengths: Lengths):
    """The model of ``variant`` at ``backbone`` dims, in eval mode (random weights unless the backbone is real)."""
    import torch

    spec = BACKBONES[backbone]
    cls, hooks = model_class(variant.model), model_hooks.benchmark_hooks(variant.model)
    options = {**spec.model_options.get(variant.model, {}), **variant.config}
    limits = {"query_max_length": lengths.query_len,
              "doc_max_length": lengths.joint_doc_len if hooks.joint_input else lengths.doc_len}
    if spec.pretrained:
        return cls.from_backbone(spec.pretrained, **limits, **options).eval()
    dims = replace(backbone_dims(backbone), max_position_embeddings=lengths.max_positions)
    tokenizer = minilm_tokenizer()
    torch.manual_seed(0)
    config = hooks.random_config(cls, dims, tokenizer, backbone=f"random:{backbone}", **limits, **options)
    return cls(config, tokenizer).eval()


def flop_count(variant: Variant, model, lengths: Lengths) -> FlopCount:
    """The analytic online FLOPs of ``model`` (built from ``variant``) on this cell's token counts."""
    return model_hooks.benchmark_hooks(variant.model).flops(model, lengths.query_len, doc_tokens(variant, lengths))


def stored_doc_tokens(variant: Variant, lengths: Lengths) -> int:
    """Rows per document in the sidecar of a precomputing variant (MORES: ``[CLS] d [SEP]``; PreTTR: ``d [SEP]``;
    TK: the words)."""
    return doc_tokens(variant, lengths)


def check_stored_shape(model, variant: Variant, words: list[str]) -> None:
    """Encode one short document and check that its stored shape follows :func:`stored_doc_tokens`."""
    import torch

    short = Lengths(query_len=16, doc_len=8, joint_doc_len=8, max_positions=512)
    # 8 tokens with the model's special tokens: 6 words + [CLS]/[SEP] for BERT models, 8 words for TK
    text = " ".join(words[:8 - model_hooks.benchmark_hooks(variant.model).document_special_tokens])
    with torch.inference_mode():
        reps = model.encode_documents(model.tokenize_documents([text]))
    expected = (stored_doc_tokens(variant, short), model.store_width)
    if tuple(reps[0].shape) != expected:
        raise RuntimeError(f"{variant.key} stores {tuple(reps[0].shape)} for an 8-token document, the benchmark "
                           f"assumed {expected}")


# ---- candidates ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=2)
def single_piece_words(tokenizer) -> tuple[str, ...]:
    """Vocabulary words that the tokenizer keeps as exactly one WordPiece, so a text of k of them is k tokens."""
    special = set(tokenizer.all_special_tokens)
    vocab = tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3
                   and w not in special)
    encoded = tokenizer(words, add_special_tokens=False)["input_ids"]
    kept = tuple(w for w, ids in zip(words, encoded) if ids == [vocab[w]])
    if len(kept) < 100:
        raise RuntimeError("the tokenizer has too few single-piece words to build synthetic text")
    return kept


def synthetic_texts(words: tuple[str, ...], count: int, length: int, seed: int) -> list[str]:
    """``count`` texts of ``length`` random single-piece words each."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(words), size=(count, length))
    vocabulary = np.array(words, dtype=object)
    return [" ".join(row) for row in vocabulary[picks]]


def write_sidecar(path: Path, model, variant: Variant, backbone: str, lengths: Lengths, num_docs: int,
                  seed: int, dtype: str = "float16", codec: str = "fp16") -> dict:
    """Write ``num_docs`` documents of :func:`stored_doc_tokens` random rows each (``dtype`` vectors, or a compressed
    ``codec`` trained on them), as the sidecar build would; returns the identity to open it with (``expect_*``).

    The documents repeat a pool of 16 random documents, or of as many as hold the token vectors the codec needs
    to train (distinct vectors: k-means fits no more centroids than it sees points).

    Raises:
        ValueError: the documents hold fewer token vectors than ``codec`` trains on (see
            :func:`.runner.check_codec_workload`).
    """
    from ..sidecar import SidecarWriter
    from ..sidecar.codecs import TokenCodec, is_compressed

    width, tokens = model.store_width, stored_doc_tokens(variant, lengths)
    needed = TokenCodec(codec, width).min_training_tokens if is_compressed(codec) else 1
    if num_docs * tokens < needed:
        raise ValueError(f"the {codec} codec trains on at least {needed:,} token vectors, but the {variant.key} "
                         f"sidecar holds {num_docs:,} documents x {tokens} tokens")
    identity = f"bench:{backbone}:{variant.key}:q{lengths.query_len}:d{lengths.doc_len}:{model.store_variant}"
    fingerprint = hashlib.sha256(identity.encode()).hexdigest()
    index = {"num_docs": num_docs, "signature": "pyserini-mores-bench-synthetic"}
    rng = np.random.default_rng(seed)
    pool_docs = max(1, min(num_docs, max(16, -(-needed // max(1, tokens)))))
    pool = rng.standard_normal((pool_docs, tokens, width), dtype=np.float32)
    if model_hooks.benchmark_hooks(variant.model).stores_unit_vectors:
        pool /= np.linalg.norm(pool, axis=-1, keepdims=True)
    if dtype != "bfloat16":  # numpy has no bfloat16: the writer rounds float32 rows itself
        pool = pool.astype(dtype)
    writer = SidecarWriter(path, dim=width, dtype=dtype, docids=[f"doc{row}" for row in range(num_docs)],
                           model={"model_type": model.model_type, "store_variant": model.store_variant,
                                  "fingerprint": fingerprint},
                           index=index, build={"source": "pyserini_mores.bench (random rows)"},
                           commit_every_docs=num_docs + 1, codec=codec)
    try:
        for start in range(0, num_docs, pool_docs):
            count = min(pool_docs, num_docs - start)
            writer.add([pool[i] for i in range(count)])
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    return {"expect_model_fingerprint": fingerprint, "expect_index": index, "expect_dim": width,
            "expect_dtype": writer.dtype}


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def default_work_dir() -> str | None:
    """Where sidecars go: ``$PYSERINI_MORES_BENCH_DIR`` or the system temp dir."""
    return os.environ.get("PYSERINI_MORES_BENCH_DIR")


__all__ = ["BACKBONES", "PUBLIC_BACKBONES", "Variant", "Lengths", "variants_for",
           "select_variants", "check_selectors", "backbone_variants", "feasible", "cell_lengths", "build_model",
           "doc_tokens", "flop_count", "stored_doc_tokens", "check_stored_shape", "single_piece_words",
           "synthetic_texts", "write_sidecar", "backbone_dims", "minilm_tokenizer", "directory_bytes"]

"""The contract every learned reranking model implements, and the checkpoint format they share.

A model splits scoring into an offline part (``encode_documents``: what the sidecar stores), an online once-per-query
part (``encode_query``) and an online per-candidate part (``score``). ``forward`` is the training path that encodes
both sides in-graph; tests prove ``forward(q, d) == score(encode_query(q), encode_documents(d))``.

A model class also declares, in one :class:`ModelCapabilities`, what training, loading and reranking ask of it (its
default loss, trainable module groups, new parameters, fp32 steps under bf16, ...), so a new model is one module plus
one line in :mod:`.registry`. What the benchmark and the explanations need of a model (FLOP formulas, benchmark
variants, attention maps) lives beside them, in :mod:`pyserini_mores.bench` and :mod:`pyserini_mores.explain`.

A checkpoint is a directory: ``config.json`` (with ``model_type``), ``model.safetensors`` and the tokenizer files.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Iterable, Mapping

import torch
from torch import nn

from ._layers import BertDims
from .trust import check_model_directory

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
#: Either holds the vocabulary; save_pretrained writes tokenizer.json (transformers 5) or both (transformers 4).
TOKENIZER_VOCAB_NAMES = ("tokenizer.json", "vocab.txt")
#: the seed new parameters (heads, compressors, TK's contextualiser) are drawn from when a model is built from a
#: backbone: the same backbone and config give the same model — and so the same fingerprint and sidecar — in every
#: process (see :meth:`RankingModel.initialised`)
INIT_SEED = 0

#: serialises the models' tokenizer calls (see :meth:`RankingModel.call_tokenizer`); one for every model, as models
#: loaded from the same files may share one tokenizer object
_TOKENIZER_LOCK = threading.Lock()


@dataclass
class RankingConfig:
    """Fields every model has. Subclasses add their own hyperparameters as explicit, documented fields."""

    encoder: BertDims | None = None
    query_max_length: int = 16
    doc_max_length: int = 128
    backbone: str | None = None  # where the initial weights came from; informational

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "RankingConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known - {"model_type", "format_version"}
        if unknown:
            raise ValueError(f"{cls.__name__} does not know the fields {sorted(unknown)}")
        kwargs = {k: v for k, v in values.items() if k in known}
        if isinstance(kwargs.get("encoder"), dict):
            kwargs["encoder"] = BertDims(**kwargs["encoder"])
        return cls(**kwargs)


QueryBatch = dict  # tokenizer output: input_ids, attention_mask, (token_type_ids) as [B, L] tensors
DocBatch = dict


@dataclass(frozen=True)
class ModelCapabilities:
    """What the package asks of a model class beyond its scoring entry points, declared once per class as
    ``capabilities = ModelCapabilities(...)``; every field defaults to what a plain model needs.

    Attributes:
        default_loss: the loss training uses unless told otherwise (the model's paper's; see
            :mod:`pyserini_mores.train.objectives`).
        trainable_module_groups: module groups that can train alone (``--train-modules NAME``): name →
            parameter-name prefixes.
        layer_stack: parameter-name prefix of its one stack of Transformer layers (``PREFIX{i}.``), for models that
            have one: ``--freeze-layers N`` keeps the first ``N`` of them at their initial values.
        new_parameters: parameter-name prefixes of the layers the model adds to its backbone (score heads):
            ``--head-lr`` is theirs.
        starts_from_rankers: its encoder can start from a trained cross-encoder's or MaxSim's (``--init`` such a
            checkpoint).
        encoder_is_a_backbone: a trained checkpoint of it is a BERT backbone (its ``encoder``) for the models that
            start from rankers.
        starts_from_glove: it can start from a GloVe-format text file (``--init vectors.txt``): its class method
            ``from_glove(path, max_words=None, **config_overrides)`` builds it.
        fp32_parameters: name prefixes of parameters used in fp32 on purpose, with autocast disabled: a bf16 scoring
            copy keeps them fp32, or those steps would meet bf16 weights.
        bf16_weight_copy: under bf16, a reranker scores with a copy of the weights cast to bf16 once (``True``) or
            with autocast alone (``False``): the copy's residual stream stays bf16 between layers, which some
            models' rankings feel.
        explains_scores: it takes its scores apart: ``explain(query_state, docs, lengths)`` returns the numbers
            behind :meth:`RankingModel.score` as tensors (TK's kernels; ``rerank(..., explain=True)``).
        scores_cls: its score is a head on one vector, which a long document's windows can average (``--aggregate
            avgcls``): ``score_from_cls(cls [B, n]) -> [B]`` and, to get the vectors, ``score_cls(query_state,
            docs, lengths) -> [B, n]`` for a model that stores documents or ``text_cls(query, documents) -> [B, n]``
            for one that scores text, with ``score_from_cls(score_cls(...)) == score(...)`` exactly.
    """

    default_loss: str = "pointwise"
    trainable_module_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    layer_stack: str | None = None
    new_parameters: tuple[str, ...] = ()
    starts_from_rankers: bool = False
    encoder_is_a_backbone: bool = False
    starts_from_glove: bool = False
    fp32_parameters: tuple[str, ...] = ()
    bf16_weight_copy: bool = True
    explains_scores: bool = False
    scores_cls: bool = False

    def __post_init__(self):
        # read-only, so that no reader can change a class's groups for every model of it
        object.__setattr__(self, "trainable_module_groups", MappingProxyType(dict(self.trainable_module_groups)))


#: the field names of :class:`ModelCapabilities`
CAPABILITY_NAMES = frozenset(f.name for f in dataclasses.fields(ModelCapabilities))


class RankingModel(nn.Module):
    """Base class of all learned rerankers. See the module docstring for the contract."""

    model_type: ClassVar[str]
    config_class: ClassVar[type[RankingConfig]] = RankingConfig

    #: what training, loading and reranking ask of the model class (declared once per class)
    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities()
    #: held by every call of a model's tokenizer (see :meth:`call_tokenizer`); code that calls ``self.tokenizer``
    #: itself (e.g. for character offsets) holds it too
    tokenizer_lock: ClassVar[Any] = _TOKENIZER_LOCK

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a capability set as a class attribute would be silently ignored: refuse it where the class is defined
        stray = sorted(name for name in vars(cls) if name in CAPABILITY_NAMES)
        if stray:
            raise TypeError(f"{cls.__name__} sets {', '.join(stray)} as class attributes; declare them as "
                            "capabilities = ModelCapabilities(...)")

    def __init__(self, config: RankingConfig, tokenizer):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer

    # ---- what the sidecar stores -------------------------------------------------------------------------------
    @property
    def store_width(self) -> int | None:
        """Width of one stored token vector, or ``None`` when documents cannot be precomputed (scored from text)."""
        return None

    @property
    def stored_heads(self) -> int | None:
        """How :meth:`score` wants sidecar batches laid out: ``None``, token-major ``[B, Lmax, store_width]``; an
        int ``h``, head-major ``[B, h, Lmax, store_width / h]`` (``SidecarReader.get_batch(heads=h)``), for stored
        vectors that are attention keys and values. :meth:`score` accepts token-major batches either way."""
        return None

    @property
    def store_variant(self) -> str:
        """Names what is stored (e.g. ``s1``/``s2`` for MORES), part of the sidecar's identity."""
        return "default"

    def store_parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The parameters the stored representations depend on (all by default). A sidecar is bound to them."""
        return self.state_dict().items()

    def store_config(self) -> dict:
        """The configuration the stored representations depend on."""
        return {"encoder": self.config.encoder.to_dict() if self.config.encoder else None,
                "doc_max_length": self.config.doc_max_length}

    def store_fingerprint(self) -> str:
        """Hash of what a sidecar built by this model depends on: model type, variant, config, weights, tokenizer."""
        header = {"model_type": self.model_type, "variant": self.store_variant, "config": self.store_config()}
        return _fingerprint(header, self.store_parameters(), self.tokenizer)

    def fingerprint(self) -> str:
        """Hash of the whole model: config, every weight, the tokenizer."""
        return _fingerprint({"model_type": self.model_type, "config": self.config.to_dict()},
                            self.state_dict().items(), self.tokenizer)

    # ---- tokenization -------------------------------------------------------------------------------------------
    def tokenize_queries(self, texts: list[str]) -> QueryBatch:
        return self._tokenize(texts, self.config.query_max_length)

    def tokenize_documents(self, texts: list[str]) -> DocBatch:
        return self._tokenize(texts, self.config.doc_max_length)

    def call_tokenizer(self, texts: list[str], **options) -> dict:
        """``self.tokenizer(texts, **options)``, one call at a time: a Hugging Face fast tokenizer sets its
        truncation and padding on the shared Rust tokenizer at every call, so a query batch tokenized on one thread
        while a document batch is on another could cut the documents at the query length (measured: 38 of 300
        document batches at 16 tokens). Every tokenization of a model goes through here."""
        with _TOKENIZER_LOCK:
            return self.tokenizer(list(texts), **options)

    def _tokenize(self, texts: list[str], max_length: int) -> dict:
        batch = self.call_tokenizer(texts, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
        return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    # ---- the three scoring entry points and the training forward --------------------------------------------------
    def encode_documents(self, doc_batch: DocBatch) -> list[torch.Tensor]:
        """Offline: one ``[len_i, store_width]`` matrix per document (only real tokens)."""
        raise NotImplementedError(f"{type(self).__name__} does not store document representations")

    def encode_query(self, query_batch: QueryBatch) -> Any:
        """Online, once per query: a state (batch of 1) that :meth:`score` broadcasts over candidates."""
        raise NotImplementedError

    def score(self, query_state: Any, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Online: ``[B]`` scores of one query against stored documents ``docs [B, Lmax, store_width]``
        (zero-padded; ``lengths [B]`` real token counts)."""
        raise NotImplementedError

    def store_frame(self, rotation: torch.Tensor) -> Any | None:
        """What :meth:`query_in_frame` needs to score documents stored in a rotated frame, ``docs`` holding
        ``y = x Rᵀ`` for each stored vector ``x`` (``rotation`` R ``[store_width, store_width]``, orthogonal, on this
        model's device: an ``opq`` sidecar's, see ``SidecarReader.store_rotation``), made once per sidecar; ``None``
        (the default) when this model needs ``x`` itself. A model whose first use of ``x`` is linear scores ``y``
        exactly as ``x`` by rotating its own side, which saves rotating every stored token back."""
        return None

    def query_in_frame(self, query_state: Any, frame: Any) -> Any:
        """``query_state`` (from :meth:`encode_query`) for :meth:`score` of documents in the rotated frame that
        ``frame`` (from :meth:`store_frame`) describes."""
        raise NotImplementedError(f"{type(self).__name__} scores stored vectors in their own frame only")

    #: True for a model that scores documents stored as additive codes without decoding them (:meth:`code_tables`,
    #: :meth:`score_codes`): one whose only use of a stored vector is its inner products with a few query vectors
    #: looks them up, ``M`` per product, in a table of every query vector against every codebook entry
    #: (:mod:`.code_tables`).
    scores_codes = False
    #: With :attr:`scores_codes`: True for a model that also needs each stored vector's norm (a cosine), which the
    #: codes then carry (an ``rq`` store with norms); a store without them is read decoded.
    code_scores_need_norms = False

    def code_tables(self, query_state: Any, codebooks: torch.Tensor, words: torch.Tensor | None = None) -> Any:
        """What :meth:`score_codes` needs, made once per query: each stored vector is the sum of one entry of each
        codebook of ``codebooks [M, K, store_width]`` (on this model's device: an ``rq`` sidecar's, see
        ``SidecarReader.store_codebooks``) and, with a word stage, of one of the word means ``words [V,
        store_width]``."""
        raise NotImplementedError(f"{type(self).__name__} scores decoded vectors only")

    def score_codes(self, tables: Any, codes: torch.Tensor, lengths: torch.Tensor,
                    norms: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` scores of documents stored as ``codes [B, Lmax, M]`` (integer codebook entries, after a word
        stage's two id bytes where the tables have one; anything after
        each of ``lengths [B]`` ignored) with the ``tables`` of :meth:`code_tables`, and (where
        :attr:`code_scores_need_norms`) the norms ``[B, Lmax]`` of the vectors they decode to as the store gives them
        (a code's entries tell inner products, not norms)."""
        raise NotImplementedError(f"{type(self).__name__} scores decoded vectors only")

    #: True for a model whose :meth:`encode_documents` stores one vector per real token of a document, in order
    #: ([CLS] and [SEP] included), each near a point of its word's (MaxSim's): :meth:`stored_token_ids` are then the
    #: input ids. (MORES's S1 states store the same way, but its word stage measured no better than rq alone.)
    stores_every_token = False

    @property
    def stored_vocabulary(self) -> int:
        """How many token ids :meth:`stored_token_ids` can give (the vocabulary size), 0 for a model that gives
        none."""
        return len(self.tokenizer) if self.stores_every_token else 0

    def stored_token_ids(self, doc_batch: DocBatch) -> list[torch.Tensor] | None:
        """Per document of ``doc_batch`` the token id of each vector :meth:`encode_documents` stores, in its order,
        for a model whose stored vectors are one per input token and lie near a point of their token's (TK's terms;
        a model that :attr:`stores_every_token`: an ``rq`` store's word stage codes the id, see ``sidecar.rq``);
        ``None`` for every other model."""
        if not self.stores_every_token:
            return None
        lengths = doc_batch["attention_mask"].sum(1).tolist()
        return [doc_batch["input_ids"][i, :length] for i, length in enumerate(lengths)]

    def forward(self, query_batch: QueryBatch, doc_batch: DocBatch) -> torch.Tensor:
        """Training path: ``[B]`` scores of aligned (query, document) pairs, both encoded in-graph."""
        raise NotImplementedError

    def forward_logits(self, query_batch: QueryBatch, doc_batch: DocBatch) -> torch.Tensor:
        """What the pointwise loss takes: ``[B, num_labels]`` head logits for a model with a classification head
        (2-class CE), the ``[B]`` ranking scores of :meth:`forward` otherwise (binary CE)."""
        return self(query_batch, doc_batch)

    def score_logits(self, query_state: Any, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """:meth:`forward_logits` of stored documents: what the pointwise loss takes when training against a
        sidecar (:meth:`score` by default)."""
        return self.score(query_state, docs, lengths)

    def score_texts(self, query: str, documents: list[str]) -> torch.Tensor:
        """``[len(documents)]`` scores of one query against document texts (the path for text-only models)."""
        query_batch = self.tokenize_queries([query] * len(documents))
        return self(query_batch, self.tokenize_documents(documents))

    # ---- training ---------------------------------------------------------------------------------------------------
    @property
    def joint_parameters(self) -> tuple[str, ...]:
        """Parameter-name prefixes of the layers that read query and document together above layers that read them
        apart (``--joint-lr`` is theirs); empty for a model without both kinds."""
        return ()

    def _check_joint_lr(self, joint_lr: float | None) -> None:
        if joint_lr is not None and not self.joint_parameters:
            raise ValueError(f"{self.model_type} has no layers that read query and document together above layers "
                             "that read them apart: --joint-lr applies to PreTTR and MORES")

    def optimizer_groups(self, lr: float, head_lr: float | None = None,
                         joint_lr: float | None = None) -> list[dict]:
        """Optimiser parameter groups of the trainable parameters: everything at ``lr``, except that with ``head_lr``
        the capabilities' ``new_parameters`` form a group of their own at ``head_lr``, and with ``joint_lr`` the rest
        of the :attr:`joint_parameters` one at ``joint_lr``."""
        self._check_joint_lr(joint_lr)
        new, joint = self.capabilities.new_parameters, self.joint_parameters
        body, head, joined = [], [], []
        for name, parameter in self.named_parameters():
            if not parameter.requires_grad:
                continue
            if head_lr is not None and new and name.startswith(new):
                head.append(parameter)
            elif joint_lr is not None and name.startswith(joint):
                joined.append(parameter)
            else:
                body.append(parameter)
        groups = [{"params": body, "lr": lr}, {"params": head, "lr": head_lr}]
        return groups + [{"params": joined, "lr": joint_lr}] if joint_lr is not None else groups

    # ---- checkpoints ------------------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> None:
        from safetensors.torch import save_model

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"model_type": self.model_type, **self.config.to_dict()}
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_model(self, str(directory / WEIGHTS_NAME))  # handles tied (shared) tensors
        self.tokenizer.save_pretrained(str(directory))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, **overrides) -> "RankingModel":
        """Load a checkpoint directory written by :meth:`save_pretrained`; ``overrides`` replace config fields."""
        directory = Path(directory)
        values = read_checkpoint_config(directory)
        if values.get("model_type") != cls.model_type:
            raise ValueError(f"{directory} holds a '{values.get('model_type')}' model, not '{cls.model_type}'")
        return cls.load_overridden(directory, values, overrides,
                                   lambda **given: cls._load_checkpoint(directory, {**values, **given}))

    @classmethod
    def _load_checkpoint(cls, directory: Path, values: dict) -> "RankingModel":
        from safetensors.torch import load_model
        from transformers import AutoTokenizer, PretrainedConfig

        config = cls.config_class.from_dict(values)
        check_tokenizer_files(directory)
        # An empty config keeps transformers from reading our config.json as if it were its own.
        tokenizer = AutoTokenizer.from_pretrained(str(directory), config=PretrainedConfig(), trust_remote_code=False)
        model = cls(config, tokenizer)
        load_model(model, str(directory / WEIGHTS_NAME), strict=True)
        model.eval()
        return model

    @classmethod
    def load_overridden(cls, directory: str | os.PathLike, stored: dict, overrides: dict,
                        load: Callable[..., "RankingModel"]) -> "RankingModel":
        """``load(**overrides)``: how the model stored in ``directory`` (config ``stored``) loads with config
        ``overrides``. A model whose query may share the document's layers (a ``tied`` config field: MORES, PreTTR)
        stores shared layers once, so ``tied=False`` over a tied checkpoint loads it tied and unties it (``untied()``,
        scores unchanged), e.g. a tied checkpoint as ``--init`` of an untied recipe; the reverse is refused."""
        stored_tied = stored.get("tied", True)
        if "tied" in overrides and bool(overrides["tied"]) != stored_tied:
            if not stored_tied:
                raise ValueError(f"{directory} holds a {cls.model_type} model whose query has its own layers; tying "
                                 "them to the document's would drop them (leave tied as stored)")
            return load(**{**overrides, "tied": True}).untied()
        return load(**overrides)

    @classmethod
    def from_backbone(cls, backbone: str, **config_overrides) -> "RankingModel":
        """A new model initialised from a pretrained BERT-family checkpoint (hub name, local dir or ``minilm``)."""
        raise NotImplementedError

    @classmethod
    def initialised(cls, backbone: str | os.PathLike, **config_overrides) -> "RankingModel":
        """:meth:`from_backbone` with its new parameters drawn from :data:`INIT_SEED` (the global random state is left
        as it was): how :func:`~.loading.load_model` builds a model, and how a delta checkpoint is rebuilt."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            return cls.from_backbone(str(backbone), **config_overrides)

    @property
    def ranking_head(self) -> nn.Linear | None:
        """The score head on a [CLS] row, which a trained cross-encoder's head can initialise, or ``None``."""
        return None


def read_checkpoint_config(directory: str | os.PathLike) -> dict:
    """The ``config.json`` of a checkpoint directory, with a clear error when it is not one."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a pyserini_mores checkpoint (no {CONFIG_NAME})")
    check_model_directory(directory)
    values = json.loads(path.read_text())
    if "model_type" not in values:
        raise ValueError(f"{path} has no 'model_type'; it is not a pyserini_mores checkpoint")
    if not (Path(directory) / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"checkpoint {directory} has a config but no {WEIGHTS_NAME}")
    return values


def check_tokenizer_files(directory: str | os.PathLike) -> None:
    """Refuse a checkpoint whose tokenizer files are missing, naming them.

    Without them transformers does not fail: it quietly builds another tokenizer (without ``tokenizer.json``, a
    5-token vocabulary that maps every word to [UNK]; without ``tokenizer_config.json``, one that does not lower-case).
    """
    directory = Path(directory)
    check_model_directory(directory)  # the tokenizer's own files may ask to run code
    if not (directory / TOKENIZER_CONFIG_NAME).is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no {TOKENIZER_CONFIG_NAME} (its tokenizer is incomplete)")
    if not any((directory / name).is_file() for name in TOKENIZER_VOCAB_NAMES):
        raise FileNotFoundError(f"checkpoint {directory} has no {' or '.join(TOKENIZER_VOCAB_NAMES)} (its tokenizer's "
                                "vocabulary is missing)")


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of what decides token ids: the vocabulary, casing and special tokens."""
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(json.dumps(getattr(tokenizer, "do_lower_case", None)).encode())
    digest.update(json.dumps(tokenizer.all_special_tokens).encode())
    return digest.hexdigest()


def _fingerprint(header: dict, parameters: Iterable[tuple[str, torch.Tensor]], tokenizer) -> str:
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for name, tensor in sorted(parameters, key=lambda item: item[0]):
        digest.update(name.encode())
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(str(tensor.dtype).encode() + str(tuple(tensor.shape)).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    digest.update(tokenizer_fingerprint(tokenizer).encode())
    return digest.hexdigest()


def pad_documents(doc_reps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged ``[len_i, W]`` matrices into a zero-padded ``[B, Lmax, W]`` tensor and ``[B]`` lengths."""
    lengths = torch.tensor([rep.shape[0] for rep in doc_reps], dtype=torch.long)
    return torch.nn.utils.rnn.pad_sequence(doc_reps, batch_first=True), lengths

"""Compressed token codecs for the sidecar: faiss's scalar quantisers (8, 6 or 4 bits per value), product
quantisation (M sub-quantisers of 256 centroids, one byte each), optimised product quantisation (a learned rotation,
then PQ: :mod:`.opq`), residual vector quantisation (M full-width codebooks summed: :mod:`.rq`), and the
ColBERTv2-style residual codec of :mod:`.residual` (a centroid id plus 1-8 bits per kept dimension), trained on the
first token vectors a build writes and decoded in batches at read time.

A compressed sidecar stores ``tokens.bin`` as uint8 codes ``[num_tokens, code_size]``; its manifest ``dtype`` is the
codec name, so a reader that predates codecs refuses it instead of misreading bytes, and ``codec`` records the codec
and its settings. The trained parameters go to ``codec.bin`` as flat little-endian float32, checksummed like every
data file: for the scalar quantisers faiss's per-dimension minimum and range (``[2, dim]``), for PQ the centroids
(``[M, 256, dim / M]``), for ``opq`` its rotation ``[dim, dim]`` then its PQ centroids (see :mod:`.opq`), for
``residual`` its centroids, kept dimensions, bucket cutoffs and weights (see :mod:`.residual`), for ``rq`` its
codebooks ``[M, 256, dim]`` (after its word means ``[V, dim]`` with a word stage: see :mod:`.rq`). ``fp16`` is the
identity: the uncompressed store of before (``--dtype``, float16 by default).

Needs numpy only until a codec is built: faiss is imported then (``sidecar info`` stays light).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ._training import warn_if_few_training_points
from .format import CODE_DTYPE, CODEC_DTYPES, CODEC_PARAMETER_DTYPE, SidecarCorruptError, checked_codec_parameters
from .opq import OptimizedProductQuantizer
from .residual import DEFAULT_NUM_CENTROIDS, ResidualQuantizer
from .rq import ResidualVectorQuantizer

logger = logging.getLogger(__name__)

IDENTITY = "fp16"
CODECS = (IDENTITY, *CODEC_DTYPES)
# faiss ScalarQuantizer types; codes are packed, so 6 bits per value cost 6/8 of a byte.
_SCALAR_TYPES = {"sq8": "QT_8bit", "sq6": "QT_6bit", "sq4": "QT_4bit"}
PQ_BITS = 8  # 256 centroids per sub-quantiser: one byte per code, the layout faiss decodes fastest
# The training sample: the first tokens written, up to this many bytes of float32 (and never more than
# DEFAULT_SAMPLE_TOKENS). PQ's k-means wants >= 39 x 256 points per sub-quantiser; faiss subsamples to 256 x 256.
DEFAULT_SAMPLE_TOKENS = 65536
DEFAULT_SAMPLE_BYTES = 128 * 1024 * 1024
# An rq word stage's sample gives each word its mean, and a word it misses is coded whole, far worse: it takes 16 times
# as many tokens (a word's mean costs a sum; the codebooks' k-means subsample as ever).
WORD_STAGE_SAMPLE_TOKENS = 1024 * 1024
WORD_STAGE_SAMPLE_BYTES = 2 * 1024 * 1024 * 1024
RESIDUAL = "residual"
RESIDUAL_OPTIONS = ("nbits", "num_centroids", "residual_dims")
OPQ = "opq"
PQ_CODECS = ("pq", OPQ)  # the codecs that take pq_subquantizers
RQ = "rq"
# codec.options' keys
MANIFEST_OPTIONS = ("sample_tokens", "pq_subquantizers", *RESIDUAL_OPTIONS, "rq_codebooks", "rq_norms", "rq_words")


def is_compressed(name: str | None) -> bool:
    """True for a codec that stores codes (every codec but the identity ``fp16``)."""
    return name is not None and name != IDENTITY


def default_pq_subquantizers(dim: int) -> int:
    """``M`` when none is given: one byte per 4 dimensions (2 bits per value, 1/8 of float16), or the largest
    divisor of ``dim`` below that."""
    for m in range(max(1, dim // 4), 0, -1):
        if dim % m == 0:
            return m
    return 1


class Codebooks(NamedTuple):
    """An additive codec's codebooks: ``entries [M, K, dim]`` float32 (``M`` bytes of a code pick one entry of each,
    and the entries sum to its vector); when its codes end in a norm byte, ``norm_levels [256]`` float32 (the norm
    of the vector each value of that byte stands for), else ``None``; with a word stage, ``words [V, dim]`` float32,
    the word means that the two bytes before the entries' pick one of and that add to the sum, else ``None``."""

    entries: np.ndarray
    norm_levels: np.ndarray | None
    words: np.ndarray | None = None


class TokenCodec:
    """One trained (or trainable) codec of ``dim``-wide token vectors.

    Args:
        name: ``sq8``, ``sq6``, ``sq4``, ``pq``, ``opq``, ``residual`` or ``rq``.
        dim: vector width.
        pq_subquantizers: ``M`` of ``pq`` and ``opq`` (must divide ``dim``; default :func:`default_pq_subquantizers`).
        nbits, num_centroids, residual_dims: the ``residual`` codec's settings (see
            :class:`.residual.ResidualQuantizer`; by default 1 bit, 4,096 centroids, and the kept dimensions that
            make a code ``dim / 8`` bytes).
        rq_codebooks: ``M`` of ``rq`` (:class:`.rq.ResidualVectorQuantizer`), 1 … 256 (default ``dim / 8``).
        rq_norms: 1 for ``rq`` codes that end in a byte of the reconstruction's norm (what scoring cosines from
            codes needs, see :attr:`norm_levels`).
        rq_words: the vocabulary size of an ``rq`` word stage: each code starts with its token's id (2 bytes), whose
            word mean the codebooks add to; :meth:`train` and :meth:`encode` then need the token ids.
        sample_tokens: how many of the first token vectors train it (default: :data:`DEFAULT_SAMPLE_TOKENS`, capped
            at :data:`DEFAULT_SAMPLE_BYTES` of float32; with ``rq_words`` :data:`WORD_STAGE_SAMPLE_TOKENS`, capped at
            :data:`WORD_STAGE_SAMPLE_BYTES`).

    Example::

        codec = TokenCodec("sq8", dim=128)
        codec.train(first_vectors)                     # [n, 128] float32
        codes = codec.encode(vectors)                  # [m, 128] uint8
        approx = codec.decode(codes)                   # [m, 128] float32
    """

    def __init__(self, name: str, dim: int, *, pq_subquantizers: int | None = None, sample_tokens: int | None = None,
                 nbits: int | None = None, num_centroids: int | None = None, residual_dims: int | None = None,
                 rq_codebooks: int | None = None, rq_norms: int | None = None, rq_words: int | None = None):
        if name not in CODEC_DTYPES:
            raise ValueError(f"unknown codec {name!r}; known: {', '.join(CODECS)}")
        if dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        self.name, self.dim = name, int(dim)
        if name in PQ_CODECS:
            m = default_pq_subquantizers(self.dim) if pq_subquantizers is None else int(pq_subquantizers)
            if m <= 0 or self.dim % m:
                raise ValueError(f"{name} needs a number of sub-quantisers M that divides the dim {self.dim}, not {m}")
            self.pq_subquantizers: int | None = m
        elif pq_subquantizers is not None:
            raise ValueError(f"pq_subquantizers applies to the pq codec, not {name} (and to the opq codec)")
        else:
            self.pq_subquantizers = None
        residual_options = {"nbits": nbits, "num_centroids": num_centroids, "residual_dims": residual_dims}
        self._residual: ResidualQuantizer | None = None
        if name == RESIDUAL:
            self._residual = ResidualQuantizer(
                self.dim, nbits=1 if nbits is None else int(nbits),
                num_centroids=DEFAULT_NUM_CENTROIDS if num_centroids is None else int(num_centroids),
                residual_dims=residual_dims)
        elif any(value is not None for value in residual_options.values()):
            given = sorted(key for key, value in residual_options.items() if value is not None)
            raise ValueError(f"{', '.join(given)} apply to the residual codec, not {name}")
        # a word the sample misses has no mean: a word stage's sample must hold nearly every word the store will
        tokens, sample_bytes = ((WORD_STAGE_SAMPLE_TOKENS, WORD_STAGE_SAMPLE_BYTES) if rq_words
                                else (DEFAULT_SAMPLE_TOKENS, DEFAULT_SAMPLE_BYTES))
        budget = max(1, sample_bytes // (4 * self.dim))
        self.sample_tokens = int(sample_tokens) if sample_tokens else min(tokens, budget)
        if self.sample_tokens <= 0:
            raise ValueError(f"sample_tokens must be positive, not {sample_tokens}")
        self._opq = OptimizedProductQuantizer(self.dim, self.pq_subquantizers) if name == OPQ else None
        codebooks = max(1, self.dim // 8) if rq_codebooks is None else int(rq_codebooks)
        if rq_norms not in (None, 1):
            raise ValueError(f"rq_norms is 1 (a norm byte) when given, not {rq_norms}")
        self._rq = (ResidualVectorQuantizer(self.dim, codebooks, norms=bool(rq_norms), words=rq_words or 0)
                    if name == RQ else None)
        given_rq = [key for key, value in (("rq_codebooks", rq_codebooks), ("rq_norms", rq_norms),
                                           ("rq_words", rq_words)) if value is not None]
        if name != RQ and given_rq:
            raise ValueError(f"{given_rq[0]} applies to the rq codec, not {name}")
        self._model = self._residual or self._opq or self._rq  # a codec of this package's own, not a faiss index
        self.trained_on = 0
        self._index = self._new_index() if self._model is None else None

    # ---- what it is ------------------------------------------------------------------------------------------------
    @property
    def code_size(self) -> int:
        """Bytes per stored token vector."""
        if self._model is not None:
            return self._model.code_size
        return int(self._index.sa_code_size())

    @property
    def trained(self) -> bool:
        if self._model is not None:
            return self._model.trained
        return bool(self._index.is_trained)

    @property
    def rotation(self) -> np.ndarray | None:
        """The ``opq`` codec's rotation ``R [dim, dim]`` (float32; a vector ``x`` is coded as ``y = R x``), which
        :meth:`decode` with ``rotated=True`` leaves to the consumer; ``None`` for every other codec."""
        return self._opq.rotation if self._opq is not None else None

    @property
    def codebooks(self) -> Codebooks | None:
        """The ``rq`` codec's codebooks, for a consumer that scores codes by look-up tables instead of decoding them;
        ``None`` for every other codec."""
        if self._rq is None:
            return None
        return Codebooks(self._rq.codebooks_array, self._rq.norm_levels, self._rq.word_means)

    @property
    def needs_token_ids(self) -> bool:
        """True for a codec that codes each vector's token id (``rq`` with a word stage): :meth:`train` and
        :meth:`encode` need the ids."""
        return self._rq is not None and bool(self._rq.words)

    @property
    def min_training_tokens(self) -> int:
        """k-means needs at least one point per centroid; a scalar quantiser, one vector."""
        if self._residual is not None:
            return self._residual.num_centroids
        return 2 ** PQ_BITS if self.name in (*PQ_CODECS, RQ) else 1

    @property
    def too_few_tokens_hint(self) -> str:
        """What to do when a collection holds fewer tokens than :attr:`min_training_tokens`."""
        if self._residual is not None:
            return "lower num_centroids (--num-centroids)"
        return "use sq8 (or no codec) for so small a collection"

    @property
    def options(self) -> dict[str, Any]:
        """What the codec was made with, as the manifest and the build journal record it."""
        options: dict[str, Any] = {"sample_tokens": self.sample_tokens}
        if self.pq_subquantizers is not None:
            options["pq_subquantizers"] = self.pq_subquantizers
        if self._residual is not None:
            options.update(self._residual.options)
        if self._rq is not None:
            options.update(self._rq.options)
        return options

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``codec`` field (:func:`codec_from_manifest` reads it back)."""
        import faiss

        return {"name": self.name, "code_size": self.code_size, "parameter_count": int(self.parameters().size),
                "options": self.options, "trained_on_tokens": self.trained_on, "faiss_version": faiss.__version__}

    def __repr__(self) -> str:
        return (f"TokenCodec({self.name!r}, dim={self.dim}, code_size={self.code_size}, "
                f"trained={self.trained})")

    # ---- training, parameters ----------------------------------------------------------------------------------
    def train(self, sample: np.ndarray, token_ids: np.ndarray | None = None) -> None:
        """Fit the codec to ``sample [n, dim]`` (per-dimension ranges, or k-means per sub-space for PQ);
        ``token_ids [n]``: the sample's token ids, for a codec that :attr:`needs_token_ids` (else ignored)."""
        sample = _float32_rows(sample, self.dim)
        if len(sample) < self.min_training_tokens:
            raise ValueError(f"the {self.name} codec needs at least {self.min_training_tokens} token vectors to train, "
                             f"got {len(sample)}; {self.too_few_tokens_hint}")
        if self._model is not None:
            if self.needs_token_ids:
                self._rq.train(sample, token_ids)
            else:
                self._model.train(sample)
            self.trained_on = len(sample)
            return
        self._index = self._new_index()
        if self.name == "pq":
            warn_if_few_training_points("pq", len(sample))
            self._index.pq.cp.min_points_per_centroid = 1  # warned above, once, through logging
        self._index.train(sample)
        self.trained_on = len(sample)

    def parameters(self) -> np.ndarray:
        """The trained parameters as flat float32 (what ``codec.bin`` holds)."""
        import faiss

        self._check_trained()
        if self._model is not None:
            return self._model.parameters().astype(CODEC_PARAMETER_DTYPE, copy=False)
        vector = self._index.pq.centroids if self.name == "pq" else self._index.sq.trained
        return faiss.vector_to_array(vector).astype(CODEC_PARAMETER_DTYPE, copy=False)

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore a trained codec from :meth:`parameters` (e.g. read back from ``codec.bin``)."""
        import faiss

        parameters = np.ascontiguousarray(parameters, dtype=np.float32).reshape(-1)
        if self._model is not None:
            self._model.load_parameters(parameters)
            return
        parameters = checked_codec_parameters(parameters, self._parameter_count(), self.name,
                                              f"the {self.name} codec of dim {self.dim}")
        self._index = self._new_index()
        trained = self._index.pq.centroids if self.name == "pq" else self._index.sq.trained
        faiss.copy_array_to_vector(parameters, trained)
        self._index.is_trained = True

    # ---- encode / decode -------------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray, token_ids: np.ndarray | None = None) -> np.ndarray:
        """``[n, code_size]`` uint8 codes of ``vectors [n, dim]`` (values outside the trained range are clamped);
        ``token_ids [n]``: their token ids, for a codec that :attr:`needs_token_ids` (else ignored)."""
        self._check_trained()
        vectors = _float32_rows(vectors, self.dim)
        if self.needs_token_ids:
            return self._rq.encode(vectors, token_ids)
        if not len(vectors):
            return np.zeros((0, self.code_size), dtype=CODE_DTYPE)
        if self._model is not None:
            return self._model.encode(vectors)
        return self._index.sa_encode(vectors)

    def decode(self, codes: np.ndarray, out: np.ndarray | None = None, rotated: bool = False) -> np.ndarray:
        """``[n, dim]`` float32 vectors of ``codes [n, code_size]``, in one faiss call, into ``out`` when given (a
        preallocated C-contiguous float32 ``[n, dim]`` array) so a batch of reads allocates nothing more.
        ``rotated``: the vectors in the codec's rotated frame ``y ≈ R x``, not rotated back (``opq`` only: see
        :attr:`rotation`)."""
        if rotated and self._opq is None:
            raise ValueError(f"the {self.name} codec has no rotated frame (only opq has)")
        self._check_trained()
        codes = np.ascontiguousarray(codes, dtype=CODE_DTYPE)
        if codes.ndim != 2 or codes.shape[1] != self.code_size:
            raise ValueError(f"expected codes of shape [n, {self.code_size}], got {codes.shape}")
        if out is None:
            out = np.empty((len(codes), self.dim), dtype=np.float32)
        elif out.shape != (len(codes), self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(len(codes), self.dim)}")
        if len(codes):
            if rotated:
                self._opq.decode_rotated(codes, out)
            elif self._model is not None:
                self._model.decode(codes, out)
            else:
                self._index.sa_decode(codes, out)
        return out

    # ---- internals -------------------------------------------------------------------------------------------------
    def _new_index(self):
        import faiss

        if self.name == "pq":
            return faiss.IndexPQ(self.dim, self.pq_subquantizers, PQ_BITS)
        return faiss.IndexScalarQuantizer(self.dim, getattr(faiss.ScalarQuantizer, _SCALAR_TYPES[self.name]))

    def _parameter_count(self) -> int:
        if self._model is not None:
            return self._model.parameter_count
        if self.name == "pq":
            return self.dim * 2 ** PQ_BITS  # M x 256 centroids of dim/M values
        return 2 * self.dim  # per-dimension minimum and range

    def parameters_size(self) -> int:
        """How many float32 parameters the trained codec has (the size of ``codec.bin`` / 4)."""
        return self._parameter_count()

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError(f"the {self.name} codec is not trained yet")


def codec_from_manifest(entry: Mapping[str, Any], dim: int, parameters: np.ndarray,
                        source: str = "manifest.json") -> TokenCodec:
    """The trained codec a manifest's ``codec`` field and its ``codec.bin`` parameters describe."""
    options = entry.get("options") or {}
    if not isinstance(options, Mapping):
        raise SidecarCorruptError(f"{source}: field 'codec.options' is {options!r}, not a mapping")
    for key, value in options.items():
        if key not in MANIFEST_OPTIONS:
            raise SidecarCorruptError(f"{source}: field 'codec.options' has an unknown option {key!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SidecarCorruptError(f"{source}: field 'codec.options': option {key!r} is {value!r}, not a "
                                      "positive integer")
    try:
        codec = TokenCodec(str(entry["name"]), dim, pq_subquantizers=options.get("pq_subquantizers"),
                           sample_tokens=options.get("sample_tokens"), rq_codebooks=options.get("rq_codebooks"),
                           rq_norms=options.get("rq_norms"), rq_words=options.get("rq_words"),
                           **{key: options.get(key) for key in RESIDUAL_OPTIONS})
    except (KeyError, TypeError, ValueError) as error:
        raise SidecarCorruptError(f"{source}: field 'codec' does not describe a codec: {error}") from None
    if codec.parameters_size() != int(entry.get("parameter_count", -1)):
        raise SidecarCorruptError(f"{source}: codec {codec.name} ({codec.options}) of dim {dim} has "
                                  f"{codec.parameters_size()} parameters, the manifest records "
                                  f"{entry.get('parameter_count')}")
    if codec.code_size != int(entry.get("code_size", -1)):
        raise SidecarCorruptError(f"{source}: codec {codec.name} of dim {dim} makes {codec.code_size}-byte codes, "
                                  f"the manifest records {entry.get('code_size')}")
    try:
        codec.load_parameters(parameters)
    except SidecarCorruptError as error:
        raise SidecarCorruptError(f"{source} is damaged: {error}; rebuild or transcode the sidecar again") from None
    codec.trained_on = int(entry.get("trained_on_tokens", 0))
    return codec


def code_size(name: str, dim: int, pq_subquantizers: int | None = None, **options: int | None) -> int:
    """Bytes per token vector of codec ``name`` at ``dim`` (``2 * dim`` for the float16 identity)."""
    if not is_compressed(name):
        return 2 * dim
    return TokenCodec(name, dim, pq_subquantizers=pq_subquantizers, **options).code_size


def codec_options(codec: str, *, pq_subquantizers: int | None = None, nbits: int | None = None,
                  num_centroids: int | None = None, residual_dims: int | None = None,
                  rq_codebooks: int | None = None, rq_norms: bool = False,
                  sample_tokens: int | None = None) -> dict[str, int] | None:
    """The options dict of ``codec`` from its command-line settings (``None`` when none is set), checked before any
    work starts: each setting belongs to its codec and lies in its range (the dim-dependent checks come when the
    codec is made; ``--rq-word-stage``, which takes its vocabulary from the model, is checked by the build). Raises
    ``ValueError`` naming the flag."""
    from .residual import MAX_CENTROIDS, NBITS
    from .rq import MAX_CODEBOOKS

    settings = {"pq_subquantizers": pq_subquantizers, "nbits": nbits, "num_centroids": num_centroids,
                "residual_dims": residual_dims, "rq_codebooks": rq_codebooks, "rq_norms": 1 if rq_norms else None,
                "sample_tokens": sample_tokens}
    given = {key: int(value) for key, value in settings.items() if value is not None}
    owners = {"pq_subquantizers": PQ_CODECS, **{key: (RESIDUAL,) for key in RESIDUAL_OPTIONS}, "rq_codebooks": (RQ,),
              "rq_norms": (RQ,)}
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if key == "sample_tokens":  # every codec but fp16 is trained
            if codec == IDENTITY:
                raise ValueError(f"{flag} applies to a codec that is trained (every --codec but {IDENTITY})")
        elif codec not in owners[key]:
            others = "".join(f"; --codec {other} takes it too" for other in owners[key][1:])
            raise ValueError(f"{flag} applies to --codec {owners[key][0]}, not {codec}{others}")
        if value <= 0:
            raise ValueError(f"{flag} must be positive, not {value}")
    if "nbits" in given and given["nbits"] not in NBITS:
        raise ValueError(f"--nbits must be one of {', '.join(map(str, NBITS))}, not {given['nbits']}")
    if "num_centroids" in given and not 2 <= given["num_centroids"] <= MAX_CENTROIDS:
        raise ValueError(f"--num-centroids must be between 2 and {MAX_CENTROIDS}, not {given['num_centroids']}")
    if "rq_codebooks" in given and given["rq_codebooks"] > MAX_CODEBOOKS:
        raise ValueError(f"--rq-codebooks must be between 1 and {MAX_CODEBOOKS}, not {given['rq_codebooks']}")
    if "residual_dims" in given and given["residual_dims"] % (8 // given.get("nbits", 1)):
        raise ValueError(f"--residual-dims must be a multiple of {8 // given.get('nbits', 1)} (8 / --nbits), "
                         f"not {given['residual_dims']}")
    return given or None


def _float32_rows(vectors: np.ndarray, dim: int) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"expected vectors of shape [n, {dim}], got {vectors.shape}")
    return vectors


__all__ = ["CODECS", "Codebooks", "IDENTITY", "OPQ", "RESIDUAL", "RQ", "TokenCodec", "codec_from_manifest",
           "codec_options", "code_size", "default_pq_subquantizers", "is_compressed"]

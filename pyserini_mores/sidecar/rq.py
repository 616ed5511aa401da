"""Residual vector quantisation of token vectors (additive quantisation, Chen et al., "Approximate Nearest Neighbor
Search by Residual Vector Quantization", Sensors 2010; faiss's ``ResidualQuantizer``): ``M`` codebooks of 256
full-width vectors, one byte each, and a vector decodes to the sum of one entry of every codebook, so a code is ``M``
bytes like PQ's and OPQ's.

Codebook ``m`` is k-means on what codebooks ``0 … m-1`` leave of the training sample; a vector is encoded greedily
(beam width :data:`BEAM_WIDTH`), each codebook's entry nearest to what the ones before leave. Unlike PQ, which splits a
vector into slices of ``dim / M`` dimensions, every codebook spans the whole width: vectors that crowd around a few
thousand points (TK's term vectors, 95% word embedding) can be coded much better, since the first codebooks can hold
such points whole.

Decoding is a sum of ``M`` codebook rows per code in float32, the same for every row whatever the batch. A consumer
whose use of a stored vector ``x̂`` is its inner products with a few vectors ``q`` can skip decoding: ``q · x̂`` is the
sum of ``q · C_m[c_m]`` over the codebooks, ``M`` look-ups in a table of every ``q`` against every codebook entry
made once per query (Jégou et al.'s asymmetric distance computation, TPAMI 2011), instead of ``M × dim`` adds. A
consumer of cosines also needs ``‖x̂‖``, which the look-ups do not give: with ``norms`` a code ends in one more byte,
``‖x̂‖`` quantised uniformly to 256 levels between the smallest and largest norm of the training sample's
reconstructions (faiss's ``ST_norm_qint8`` layout), so ``M`` codebooks and the norm make an ``M + 1``-byte code.

With a word stage (``words = V``, the tokenizer's vocabulary size) a code starts with the token's WordPiece id, two
bytes little-endian, which decodes to that word's mean stored vector in the training sample; the codebooks code what
that mean leaves. Vectors that crowd around their word (TK's terms, 95% their word's embedding) are then coded far
more closely at the same size: the id holds the word exactly, and every codebook goes to what the context adds.
Encoding needs each vector's token id (the model gives them,
:meth:`~pyserini_mores.models.base.RankingModel.stored_token_ids`); decoding reads it from the code. A word the
sample never showed has no mean: its vector is coded whole, by codebooks that learnt to code whole vectors too (the
sample's second half is coded against means from its first half while they train, so they meet unseen words as often
as new documents bring them).

The trained parameters are one flat float32 vector (``codec.bin``): with a word stage the word means ``[V, dim]``
(zero for a word the sample did not hold), then the codebooks ``[M, 256, dim]``, then with ``norms`` the norm
range's ends ``[lowest, highest]``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._training import require_training_points
from .format import CODE_DTYPE, SidecarCorruptError, checked_codec_parameters

BITS = 8  # 256 entries per codebook: one byte per code
BEAM_WIDTH = 1  # greedy encoding: faiss's default of 5 costs five times as much for a small gain
KMEANS_ITERATIONS = 10  # per codebook
MAX_CODEBOOKS = 256
WORD_ID_BYTES = 2  # a word stage's id: two bytes, little-endian
MAX_WORDS = 2 ** (8 * WORD_ID_BYTES)
MEAN_CHUNK = 65536  # token vectors summed at a time into the word means
WORD_STAGE_CODEBOOK_POINTS = 65536  # residuals that train a word stage's codebooks (as many as rq's default sample)
NORM_LEVELS = 256  # one byte per quantised norm
NORM_SPAN_MIN = 1e-6  # a sample whose reconstructions all have one norm still gets a range to quantise into


class ResidualVectorQuantizer:
    """Additive codec of ``dim``-wide vectors with ``codebooks`` one-byte codes (1 … :data:`MAX_CODEBOOKS`); with
    ``words`` (a vocabulary size, 1 … :data:`MAX_WORDS`) a two-byte word id before them, and with ``norms`` a byte of
    the reconstruction's norm after them."""

    def __init__(self, dim: int, codebooks: int, norms: bool = False, words: int = 0):
        self.dim, self.codebooks, self.norms, self.words = int(dim), int(codebooks), bool(norms), int(words)
        if self.dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        if not 1 <= self.codebooks <= MAX_CODEBOOKS:
            raise ValueError(f"rq needs between 1 and {MAX_CODEBOOKS} codebooks, not {codebooks}")
        if not 0 <= self.words <= MAX_WORDS:
            raise ValueError(f"rq's word stage takes a vocabulary of 1 to {MAX_WORDS} words, not {words}")
        self.word_bytes = WORD_ID_BYTES if self.words else 0
        self.code_size = self.word_bytes + self.codebooks + self.norms
        self._rq = None  # faiss.ResidualQuantizer
        self._entries: np.ndarray | None = None  # codebooks_array, copied out of faiss once
        self.word_means: np.ndarray | None = None  # [words, dim] float32 (with a word stage)
        self.norm_range: tuple[float, float] | None = None  # lowest and highest reconstruction norm (with norms)

    @property
    def trained(self) -> bool:
        return self._rq is not None

    @property
    def parameter_count(self) -> int:
        return (self.words + self.codebooks * 2 ** BITS) * self.dim + 2 * self.norms

    @property
    def options(self) -> dict[str, Any]:
        return {"rq_codebooks": self.codebooks, **({"rq_norms": 1} if self.norms else {}),
                **({"rq_words": self.words} if self.words else {})}

    @property
    def norm_levels(self) -> np.ndarray | None:
        """``[256]`` float32: the norm each value of a code's last byte stands for (with ``norms``; else None)."""
        if self.norm_range is None:
            return None
        lowest, highest = self.norm_range
        return (lowest + (highest - lowest) * np.arange(NORM_LEVELS, dtype=np.float64) / (NORM_LEVELS - 1)
                ).astype(np.float32)

    @property
    def codebooks_array(self) -> np.ndarray:
        """The codebooks ``[M, 256, dim]`` float32, read-only: a code ``c`` decodes to ``Σ_m codebooks[m, c[m]]``.
        Copied out of faiss once (18.9 MB at M = 48, dim 384): a reader asks for them at every read of codes."""
        import faiss

        self._check_trained()
        if self._entries is None:
            self._entries = faiss.vector_to_array(self._rq.codebooks).astype(np.float32).reshape(
                self.codebooks, 2 ** BITS, self.dim)
            self._entries.flags.writeable = False
        return self._entries

    def _new(self):
        import faiss

        rq = faiss.ResidualQuantizer(self.dim, self.codebooks, BITS)
        rq.max_beam_size = BEAM_WIDTH
        rq.cp.niter = KMEANS_ITERATIONS
        rq.cp.min_points_per_centroid = 1  # warned in train, once, through logging
        return rq

    # ---- training, parameters ------------------------------------------------------------------------------------
    def train(self, sample: np.ndarray, token_ids: np.ndarray | None = None) -> None:
        """Fit the codebooks, one after the other, to ``sample [n, dim]`` (with a word stage: to what the means of
        its words, ``token_ids [n]``, leave of it)."""
        sample = np.ascontiguousarray(sample, dtype=np.float32)
        require_training_points("rq", len(sample))
        rq = self._new()
        if self.words:
            token_ids = self._checked_ids(token_ids, len(sample))
            # Cross-fitted: the codebooks train on the second half coded against the first half's means, so that
            # they learn the whole vectors of words no mean holds as often as unseen words will come.
            half = len(sample) // 2
            first_means = self._word_means(sample[:half], token_ids[:half])
            # The means take every token; the codebooks, whose k-means costs grow with their points, a draw of them.
            drawn = np.sort(np.random.default_rng(0).permutation(len(sample))[:WORD_STAGE_CODEBOOK_POINTS])
            rq.train(np.ascontiguousarray(sample[drawn] - first_means[token_ids[drawn]]))
            self.word_means = self._word_means(sample, token_ids)
            sample, token_ids = sample[drawn], token_ids[drawn]  # the norm range: of the codebooks' points too
        else:
            rq.train(sample)
        self._rq, self._entries = rq, None
        if self.norms:
            norms = np.linalg.norm(self._decoded(self.encode(sample, token_ids, norms=False)), axis=1)
            lowest, highest = np.float32(norms.min()), np.float32(max(norms.max(), norms.min() + NORM_SPAN_MIN))
            self.norm_range = (float(lowest), float(highest))  # as codec.bin keeps them: encode and read agree

    def parameters(self) -> np.ndarray:
        """The trained codebooks as one flat float32 vector ``[M * 256 * dim]``, then the norm range (``norms``)."""
        import faiss

        self._check_trained()
        parts = [faiss.vector_to_array(self._rq.codebooks).astype(np.float32)]
        if self.words:
            parts.insert(0, self.word_means.reshape(-1))
        if self.norms:
            parts.append(np.asarray(self.norm_range, dtype=np.float32))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore from :meth:`parameters`; refuses (:class:`SidecarCorruptError`) a vector of another size or with a
        non-finite value."""
        import faiss

        parameters = checked_codec_parameters(parameters, self.parameter_count, "rq",
                                              f"the rq codec (dim {self.dim}, {self.codebooks} codebooks"
                                              f"{', norms' if self.norms else ''}"
                                              f"{f', {self.words} words' if self.words else ''})")
        word_values = self.words * self.dim
        entries = word_values + self.codebooks * 2 ** BITS * self.dim
        if self.norms:
            lowest, highest = (float(value) for value in parameters[entries:])
            if not 0 <= lowest < highest:
                raise SidecarCorruptError(f"the rq codec's norm range [{lowest}, {highest}] is not 0 <= lowest < "
                                          "highest")
            self.norm_range = (lowest, highest)
        rq = self._new()
        faiss.copy_array_to_vector(np.ascontiguousarray(parameters[word_values:entries]), rq.codebooks)
        rq.is_trained = True
        self.word_means = parameters[:word_values].reshape(self.words, self.dim).copy() if self.words else None
        self._rq, self._entries = rq, None

    # ---- encode / decode -----------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray, token_ids: np.ndarray | None = None, *, norms: bool = True) -> np.ndarray:
        """``[n, code_size]`` uint8 codes of ``vectors [n, dim]`` float32: with a word stage the word id of each
        (``token_ids [n]``, required then), the codebooks' entries, then with ``norms`` the level nearest to the norm
        of the vector they decode to (clamped to the trained range). ``norms=False``: without that byte (training)."""
        self._check_trained()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if not len(vectors):
            return np.zeros((0, self.code_size if norms else self.code_size - self.norms), dtype=CODE_DTYPE)
        if self.words:
            token_ids = self._checked_ids(token_ids, len(vectors))
            residuals = np.ascontiguousarray(vectors - self.word_means[token_ids])
            codes = np.concatenate([token_ids.astype("<u2").view(CODE_DTYPE).reshape(-1, WORD_ID_BYTES),
                                    self._rq.compute_codes(residuals)], axis=1)
        else:
            codes = self._rq.compute_codes(vectors)
        if not (self.norms and norms):
            return codes
        lowest, highest = self.norm_range
        decoded_norms = np.linalg.norm(self._decoded(codes), axis=1).astype(np.float64)
        levels = np.rint((np.clip(decoded_norms, lowest, highest) - lowest) / (highest - lowest) * (NORM_LEVELS - 1))
        return np.concatenate([codes, levels.astype(CODE_DTYPE)[:, None]], axis=1)

    def decode(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, code_size]`` into ``out [n, dim]`` float32 (C-contiguous): the sum of each code's
        codebook entries (and its word's mean), written straight into ``out`` (faiss's ``decode`` would return a new
        array to copy from)."""
        import faiss

        self._check_trained()
        if out.shape != (len(codes), self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(len(codes), self.dim)}")
        # the norm byte is not decoded
        entries = np.ascontiguousarray(codes[:, self.word_bytes:self.word_bytes + self.codebooks], dtype=CODE_DTYPE)
        if len(codes):
            self._rq.decode_c(faiss.swig_ptr(entries), faiss.swig_ptr(out), len(codes))
            if self.words:
                ids = word_ids(codes)
                if int(ids.max()) >= self.words:
                    raise SidecarCorruptError(f"an rq code holds word id {int(ids.max())}, beyond the codec's "
                                              f"{self.words} words")
                out += self.word_means[ids]
        return out

    def _decoded(self, codes: np.ndarray) -> np.ndarray:
        return self.decode(codes, np.empty((len(codes), self.dim), dtype=np.float32))

    def _word_means(self, vectors: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        """``[words, dim]`` float32: each word's mean vector among ``vectors``, zero for a word they do not hold."""
        counts = np.bincount(token_ids, minlength=self.words).astype(np.float64)
        sums = np.zeros((self.words, self.dim), dtype=np.float64)
        for start in range(0, len(vectors), MEAN_CHUNK):  # summed in float64, a chunk at a time (a sample of 2^20)
            rows = slice(start, start + MEAN_CHUNK)
            order = np.argsort(token_ids[rows], kind="stable")
            ids = token_ids[rows][order]
            firsts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            sums[ids[firsts]] += np.add.reduceat(vectors[rows][order].astype(np.float64), firsts)
        return (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)

    def _checked_ids(self, token_ids: np.ndarray | None, count: int) -> np.ndarray:
        if token_ids is None:
            raise ValueError("the rq codec's word stage codes each vector's token id: pass token_ids")
        token_ids = np.asarray(token_ids).reshape(-1)
        if len(token_ids) != count:
            raise ValueError(f"{len(token_ids)} token ids for {count} vectors")
        if count and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.words):
            raise ValueError(f"token ids must lie in 0 … {self.words - 1} (the codec's {self.words} words), not "
                             f"{int(token_ids.min())} … {int(token_ids.max())}")
        return token_ids.astype(np.int64)

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError("the rq codec is not trained yet")


def word_ids(codes: np.ndarray) -> np.ndarray:
    """``[n]`` int64: the word ids that a word stage's ``codes [n, code_size]`` start with."""
    return codes[:, 0].astype(np.int64) | (codes[:, 1].astype(np.int64) << 8)


__all__ = ["MAX_CODEBOOKS", "MAX_WORDS", "ResidualVectorQuantizer", "WORD_ID_BYTES", "word_ids"]

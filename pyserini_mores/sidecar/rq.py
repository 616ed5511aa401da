"""Residual vector quantisation of token vectors (additive quantisation, Chen et al., "Approximate Nearest Neighbor
Search by Residual Vector Quantization", Sensors 2010; faiss's ``ResidualQuantizer``): ``M`` codebooks of 256
full-width vectors, one byte each, and a vector decodes to the sum of one entry of every codebook, so a code is ``M``
bytes like PQ's and OPQ's.

Codebook ``m`` is k-means on what codebooks ``0 … m-1`` leave of the training sample; a vector is encoded greedily
(beam width :data:`BEAM_WIDTH`), each codebook's entry nearest to what the ones before leave. Unlike PQ, which splits a
vector into slices of ``dim / M`` dimensions, every codebook spans the whole width: vectors that crowd around a few
thousand points (TK's term vectors, 95% word embedding) can be coded much better, since the first codebooks can hold
such points whole.

Decoding is a sum of ``M`` codebook rows per code in float32, the same for every row whatever the batch.

The trained parameters are one flat float32 vector (``codec.bin``): the codebooks ``[M, 256, dim]``.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .format import CODE_DTYPE, checked_codec_parameters

logger = logging.getLogger(__name__)

BITS = 8  # 256 entries per codebook: one byte per code
BEAM_WIDTH = 1  # greedy encoding: faiss's default of 5 costs five times as much for a small gain
KMEANS_ITERATIONS = 10  # per codebook
MAX_CODEBOOKS = 256
POINTS_PER_CENTROID = 39  # below this many training points per centroid k-means is poorly fit (faiss's advice)


class ResidualVectorQuantizer:
    """Additive codec of ``dim``-wide vectors with ``codebooks`` one-byte codes (1 … :data:`MAX_CODEBOOKS`)."""

    def __init__(self, dim: int, codebooks: int):
        self.dim, self.codebooks = int(dim), int(codebooks)
        if self.dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        if not 1 <= self.codebooks <= MAX_CODEBOOKS:
            raise ValueError(f"rq needs between 1 and {MAX_CODEBOOKS} codebooks, not {codebooks}")
        self.code_size = self.codebooks
        self._rq = None  # faiss.ResidualQuantizer

    @property
    def trained(self) -> bool:
        return self._rq is not None

    @property
    def parameter_count(self) -> int:
        return self.codebooks * 2 ** BITS * self.dim

    @property
    def options(self) -> dict[str, Any]:
        return {"rq_codebooks": self.codebooks}

    def _new(self):
        import faiss

        rq = faiss.ResidualQuantizer(self.dim, self.codebooks, BITS)
        rq.max_beam_size = BEAM_WIDTH
        rq.cp.niter = KMEANS_ITERATIONS
        rq.cp.min_points_per_centroid = 1  # warned in train, once, through logging
        return rq

    # ---- training, parameters ------------------------------------------------------------------------------------
    def train(self, sample: np.ndarray) -> None:
        """Fit the codebooks, one after the other, to ``sample [n, dim]``."""
        sample = np.ascontiguousarray(sample, dtype=np.float32)
        if len(sample) < 2 ** BITS:
            raise ValueError(f"the rq codec needs at least {2 ** BITS} token vectors to train, got {len(sample)}")
        if len(sample) < POINTS_PER_CENTROID * 2 ** BITS:
            logger.warning("training the rq codec on %d token vectors (k-means fits 256 centroids well from %d on): "
                           "expect a larger reconstruction error", len(sample), POINTS_PER_CENTROID * 2 ** BITS)
        rq = self._new()
        rq.train(sample)
        self._rq = rq

    def parameters(self) -> np.ndarray:
        """The trained codebooks as one flat float32 vector ``[M * 256 * dim]``."""
        import faiss

        self._check_trained()
        return faiss.vector_to_array(self._rq.codebooks).astype(np.float32)

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore from :meth:`parameters`; refuses (:class:`SidecarCorruptError`) a vector of another size or with a
        non-finite value."""
        import faiss

        parameters = checked_codec_parameters(parameters, self.parameter_count, "rq",
                                              f"the rq codec (dim {self.dim}, {self.codebooks} codebooks)")
        rq = self._new()
        faiss.copy_array_to_vector(parameters, rq.codebooks)
        rq.is_trained = True
        self._rq = rq

    # ---- encode / decode -----------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """``[n, M]`` uint8 codes of ``vectors [n, dim]`` float32."""
        self._check_trained()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if not len(vectors):
            return np.zeros((0, self.code_size), dtype=CODE_DTYPE)
        return self._rq.compute_codes(vectors)

    def decode(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, M]`` into ``out [n, dim]`` float32 (C-contiguous): the sum of each code's codebook
        entries, written straight into ``out`` (faiss's ``decode`` would return a new array to copy from)."""
        import faiss

        self._check_trained()
        codes = np.ascontiguousarray(codes, dtype=CODE_DTYPE)
        if out.shape != (len(codes), self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(len(codes), self.dim)}")
        if len(codes):
            self._rq.decode_c(faiss.swig_ptr(codes), faiss.swig_ptr(out), len(codes))
        return out

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError("the rq codec is not trained yet")


__all__ = ["MAX_CODEBOOKS", "ResidualVectorQuantizer"]

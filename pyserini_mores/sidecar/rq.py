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

The trained parameters are one flat float32 vector (``codec.bin``): the codebooks ``[M, 256, dim]``, then with
``norms`` the norm range's ends ``[lowest, highest]``.
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
NORM_LEVELS = 256  # one byte per quantised norm
NORM_SPAN_MIN = 1e-6  # a sample whose reconstructions all have one norm still gets a range to quantise into


class ResidualVectorQuantizer:
    """Additive codec of ``dim``-wide vectors with ``codebooks`` one-byte codes (1 … :data:`MAX_CODEBOOKS`), and
    with ``norms`` a byte of the reconstruction's norm after them."""

    def __init__(self, dim: int, codebooks: int, norms: bool = False):
        self.dim, self.codebooks, self.norms = int(dim), int(codebooks), bool(norms)
        if self.dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        if not 1 <= self.codebooks <= MAX_CODEBOOKS:
            raise ValueError(f"rq needs between 1 and {MAX_CODEBOOKS} codebooks, not {codebooks}")
        self.code_size = self.codebooks + self.norms
        self._rq = None  # faiss.ResidualQuantizer
        self.norm_range: tuple[float, float] | None = None  # lowest and highest reconstruction norm (with norms)

    @property
    def trained(self) -> bool:
        return self._rq is not None

    @property
    def parameter_count(self) -> int:
        return self.codebooks * 2 ** BITS * self.dim + 2 * self.norms

    @property
    def options(self) -> dict[str, Any]:
        return {"rq_codebooks": self.codebooks, **({"rq_norms": 1} if self.norms else {})}

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
        """The codebooks ``[M, 256, dim]`` float32: a code ``c`` decodes to ``Σ_m codebooks[m, c[m]]``."""
        import faiss

        self._check_trained()
        return faiss.vector_to_array(self._rq.codebooks).astype(np.float32).reshape(self.codebooks, 2 ** BITS,
                                                                                     self.dim)

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
        require_training_points("rq", len(sample))
        rq = self._new()
        rq.train(sample)
        self._rq = rq
        if self.norms:
            norms = np.linalg.norm(self._decoded(rq.compute_codes(sample)), axis=1)
            lowest, highest = np.float32(norms.min()), np.float32(max(norms.max(), norms.min() + NORM_SPAN_MIN))
            self.norm_range = (float(lowest), float(highest))  # as codec.bin keeps them: encode and read agree

    def parameters(self) -> np.ndarray:
        """The trained codebooks as one flat float32 vector ``[M * 256 * dim]``, then the norm range (``norms``)."""
        import faiss

        self._check_trained()
        codebooks = faiss.vector_to_array(self._rq.codebooks).astype(np.float32)
        if not self.norms:
            return codebooks
        return np.concatenate([codebooks, np.asarray(self.norm_range, dtype=np.float32)])

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore from :meth:`parameters`; refuses (:class:`SidecarCorruptError`) a vector of another size or with a
        non-finite value."""
        import faiss

        parameters = checked_codec_parameters(parameters, self.parameter_count, "rq",
                                              f"the rq codec (dim {self.dim}, {self.codebooks} codebooks"
                                              f"{', norms' if self.norms else ''})")
        entries = self.codebooks * 2 ** BITS * self.dim
        if self.norms:
            lowest, highest = (float(value) for value in parameters[entries:])
            if not 0 <= lowest < highest:
                raise SidecarCorruptError(f"the rq codec's norm range [{lowest}, {highest}] is not 0 <= lowest < "
                                          "highest")
            self.norm_range = (lowest, highest)
        rq = self._new()
        faiss.copy_array_to_vector(np.ascontiguousarray(parameters[:entries]), rq.codebooks)
        rq.is_trained = True
        self._rq = rq

    # ---- encode / decode -----------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """``[n, code_size]`` uint8 codes of ``vectors [n, dim]`` float32: the codebooks' entries, then with
        ``norms`` the level nearest to the norm of their sum (clamped to the trained range)."""
        self._check_trained()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if not len(vectors):
            return np.zeros((0, self.code_size), dtype=CODE_DTYPE)
        codes = self._rq.compute_codes(vectors)
        if not self.norms:
            return codes
        lowest, highest = self.norm_range
        norms = np.linalg.norm(self._decoded(codes), axis=1).astype(np.float64)
        levels = np.rint((np.clip(norms, lowest, highest) - lowest) / (highest - lowest) * (NORM_LEVELS - 1))
        return np.concatenate([codes, levels.astype(CODE_DTYPE)[:, None]], axis=1)

    def decode(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, M]`` into ``out [n, dim]`` float32 (C-contiguous): the sum of each code's codebook
        entries, written straight into ``out`` (faiss's ``decode`` would return a new array to copy from)."""
        import faiss

        self._check_trained()
        codes = np.ascontiguousarray(codes[:, :self.codebooks], dtype=CODE_DTYPE)  # the norm byte is not decoded
        if out.shape != (len(codes), self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(len(codes), self.dim)}")
        if len(codes):
            self._rq.decode_c(faiss.swig_ptr(codes), faiss.swig_ptr(out), len(codes))
        return out

    def _decoded(self, codes: np.ndarray) -> np.ndarray:
        return self.decode(codes, np.empty((len(codes), self.dim), dtype=np.float32))

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError("the rq codec is not trained yet")


__all__ = ["MAX_CODEBOOKS", "ResidualVectorQuantizer"]

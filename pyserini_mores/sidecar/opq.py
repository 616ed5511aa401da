"""Optimised product quantisation of token vectors (Ge et al., "Optimized Product Quantization", TPAMI 2014): a
learned rotation ``R`` (orthogonal, ``[dim, dim]``), then product quantisation of the rotated vector ``y = R x`` with
``M`` sub-quantisers of 256 centroids (one byte each), so a code is ``M`` bytes like plain PQ's.

Plain PQ cuts a vector into ``M`` contiguous slices and quantises each alone: hidden states whose variance sits in a
few directions spread across the slices (MORES, PreTTR, TK) lose most of it. The rotation, trained by faiss's
``OPQMatrix`` (alternating PQ training and the orthogonal Procrustes solution), mixes those directions so every slice
carries a balanced share of the variance and the slices are closer to independent.

Decoding is the PQ centroid gather, ``y``, then ``x = Rᵀ y`` as one float32 matrix product per batch. The gather is
exact: a batch gathers each row bit for bit as :meth:`OptimizedProductQuantizer.decode_reference` gathers it alone.
The product is not: a BLAS kernel computes rows in tiles (of 6 or 12 rows on some CPUs) whose positions take
different instruction paths, so a row's last bits depend on where in the batch it sits; the batch equals the reference
to float32 rounding of the product (a relative error ~1e-7), which the tests bound.

A consumer whose first use of a stored vector is linear can skip the rotation back: :meth:`decode_rotated` is the
centroid gather alone, ``y = R x`` approximately, and since ``x · w = y · (R w)`` the consumer rotates its own,
fewer, vectors instead (a query's terms, or a projection's weights once per sidecar): at depth 1000 the rotation back
is ``dim²`` multiply-adds for each of ~70,000 stored tokens, more than the gather.

The trained parameters are one flat float32 vector (``codec.bin``): the rotation ``R`` ``[dim, dim]`` row-major
(``y = R x``), then the PQ centroids ``[M, 256, dim / M]``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._training import require_training_points
from .format import CODE_DTYPE, SidecarCorruptError, checked_codec_parameters

BITS = 8  # 256 centroids per sub-quantiser: one byte per code
ITERATIONS = 25  # faiss OPQMatrix's alternations of PQ training and rotation update
ORTHOGONALITY_TOLERANCE = 1e-3  # |R Rᵀ - I| bound of a stored rotation; a trained one is within ~1e-6


class OptimizedProductQuantizer:
    """Rotation + PQ codec of ``dim``-wide vectors with ``subquantizers`` one-byte codes (``dim % M == 0``)."""

    def __init__(self, dim: int, subquantizers: int):
        self.dim, self.subquantizers = int(dim), int(subquantizers)
        if self.dim <= 0 or self.subquantizers <= 0 or self.dim % self.subquantizers:
            raise ValueError(f"opq needs a number of sub-quantisers M that divides the dim {dim}, not {subquantizers}")
        self.code_size = self.subquantizers
        self.rotation: np.ndarray | None = None  # [dim, dim] float32, y = R x
        self._pq = None  # faiss.IndexPQ on rotated vectors

    @property
    def trained(self) -> bool:
        return self.rotation is not None

    @property
    def parameter_count(self) -> int:
        return self.dim * self.dim + self.dim * 2 ** BITS

    @property
    def options(self) -> dict[str, Any]:
        return {"pq_subquantizers": self.subquantizers}

    # ---- training, parameters ------------------------------------------------------------------------------------
    def train(self, sample: np.ndarray) -> None:
        """Fit the rotation (faiss ``OPQMatrix``, :data:`ITERATIONS` alternations) and then the PQ centroids of the
        rotated ``sample [n, dim]``."""
        import faiss

        sample = np.ascontiguousarray(sample, dtype=np.float32)
        require_training_points("opq", len(sample))
        opq = faiss.OPQMatrix(self.dim, self.subquantizers)
        opq.niter = ITERATIONS
        opq.max_train_points = len(sample)
        inner = faiss.ProductQuantizer(self.dim, self.subquantizers, BITS)  # the PQ the rotation is fitted for
        inner.cp.min_points_per_centroid = 1  # warned above, once, through logging
        opq.pq = inner
        opq.train(sample)
        rotation = faiss.vector_to_array(opq.A).reshape(self.dim, self.dim).astype(np.float32)
        pq = faiss.IndexPQ(self.dim, self.subquantizers, BITS)
        pq.pq.cp.min_points_per_centroid = 1  # warned above, once, through logging
        pq.train(np.ascontiguousarray(sample @ rotation.T))
        self.rotation, self._pq = rotation, pq

    def parameters(self) -> np.ndarray:
        """The trained parameters as one flat float32 vector (layout in the module docstring)."""
        import faiss

        self._check_trained()
        centroids = faiss.vector_to_array(self._pq.pq.centroids)
        return np.concatenate([self.rotation.ravel(), centroids]).astype(np.float32)

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore from :meth:`parameters`; refuses (:class:`SidecarCorruptError`) a vector of another size, with a
        non-finite value, or whose rotation is not orthogonal."""
        import faiss

        parameters = checked_codec_parameters(parameters, self.parameter_count, "opq",
                                              f"the opq codec (dim {self.dim}, M {self.subquantizers})")
        square = self.dim * self.dim
        rotation = np.ascontiguousarray(parameters[:square].reshape(self.dim, self.dim))
        deviation = float(np.abs(rotation.astype(np.float64) @ rotation.T.astype(np.float64)
                                 - np.eye(self.dim)).max())
        if deviation > ORTHOGONALITY_TOLERANCE:
            raise SidecarCorruptError(f"the opq codec's rotation is not orthogonal (|R Rᵀ - I| reaches "
                                      f"{deviation:.3g}, above {ORTHOGONALITY_TOLERANCE})")
        pq = faiss.IndexPQ(self.dim, self.subquantizers, BITS)
        faiss.copy_array_to_vector(np.ascontiguousarray(parameters[square:]), pq.pq.centroids)
        pq.is_trained = True
        self.rotation, self._pq = rotation, pq

    # ---- encode / decode -----------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """``[n, M]`` uint8 codes of ``vectors [n, dim]`` float32: the nearest centroid of each slice of ``R x``."""
        self._check_trained()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if not len(vectors):
            return np.zeros((0, self.code_size), dtype=CODE_DTYPE)
        return self._pq.sa_encode(np.ascontiguousarray(vectors @ self.rotation.T))

    def decode(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, M]`` into ``out [n, dim]`` float32: the centroids of each slice, rotated back by
        ``Rᵀ``."""
        self._check_trained()
        codes = np.ascontiguousarray(codes, dtype=CODE_DTYPE)
        if len(codes):
            np.matmul(self._pq.sa_decode(codes), self.rotation, out=out)
        return out

    def decode_rotated(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, M]`` into ``out [n, dim]`` float32 in the rotated frame: the centroids of each slice,
        ``y ≈ R x`` (:meth:`decode` is ``y @ R``)."""
        self._check_trained()
        codes = np.ascontiguousarray(codes, dtype=CODE_DTYPE)
        if len(codes):
            self._pq.sa_decode(codes, out)
        return out

    def decode_reference(self, code: np.ndarray, rotated: bool = False) -> np.ndarray:
        """One code decoded alone, the definition a batch must meet: its centroids looked up slice by slice (``y``,
        what :meth:`decode_rotated` gives, exactly), then unless ``rotated`` ``x = Rᵀ y`` in float64, rounded once
        to float32 (what :meth:`decode` gives to float32 rounding of its product)."""
        import faiss

        self._check_trained()
        sub = self.dim // self.subquantizers
        centroids = faiss.vector_to_array(self._pq.pq.centroids).reshape(self.subquantizers, 2 ** BITS, sub)
        gathered = np.concatenate([centroids[m, int(code[m])] for m in range(self.subquantizers)])
        if rotated:
            return gathered
        return (gathered.astype(np.float64) @ self.rotation.astype(np.float64)).astype(np.float32)

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError("the opq codec is not trained yet")


__all__ = ["ITERATIONS", "OptimizedProductQuantizer"]

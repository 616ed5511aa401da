"""Residual compression of token vectors after ColBERTv2 (Santhanam et al., NAACL 2022, Sec. 3.2): the nearest of
``num_centroids`` k-means centroids, plus the residual ``x - centroid`` quantised to ``nbits`` bits per dimension
with per-dimension bucket cutoffs and weights, on the ``residual_dims`` dimensions whose residuals vary most.

A code is ``[id_bytes][residual_dims * nbits / 8]`` bytes: the centroid id little-endian (1 byte up to 256
centroids, 2 up to 65,536), then the bucket of each kept dimension packed low bits first. Decoding is two gathers and
an add in float32 (centroid row, then the bucket's weight on each kept dimension), so a batch decode equals decoding
row by row bit for bit, and a dimension that is not kept is its centroid's value. Unlike ColBERTv2, whose vectors are
L2-normalised and share one set of cutoffs, the cutoffs and weights are per dimension: unnormalised hidden states
(MORES, PreTTR, K/V) have dimensions whose residual ranges differ by orders of magnitude.

The trained parameters are one flat float32 vector (``codec.bin``): centroids ``[C, dim]``, the kept dimensions
``[r]`` (integers), bucket cutoffs ``[r, 2^nbits - 1]`` (non-decreasing per row), bucket weights ``[r, 2^nbits]``.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .format import CODE_DTYPE, SidecarCorruptError, checked_codec_parameters

logger = logging.getLogger(__name__)

NBITS = (1, 2, 4, 8)
MAX_CENTROIDS = 65536  # two-byte ids
DEFAULT_NUM_CENTROIDS = 4096
KMEANS_ITERATIONS = 10
KMEANS_SEED = 1234  # a fixed seed: the same sample trains the same codec
_ASSIGN_BATCH = 65536  # tokens per nearest-centroid search, bounding its distance matrix


def id_bytes(num_centroids: int) -> int:
    """Bytes of a centroid id: 1 up to 256 centroids, else 2."""
    return 1 if num_centroids <= 256 else 2


def default_residual_dims(dim: int, nbits: int, num_centroids: int) -> int:
    """The kept dimensions that make a code ``dim / 8`` bytes (16 x smaller than float16) with its centroid id: the
    largest multiple of ``8 / nbits`` that fits, at most ``dim``, at least ``8 / nbits``."""
    per_byte = 8 // nbits
    budget_bytes = max(1, dim // 8 - id_bytes(num_centroids))
    return max(per_byte, min(budget_bytes * per_byte, dim - dim % per_byte or per_byte))


class ResidualQuantizer:
    """Centroid + per-dimension quantised residual codec of ``dim``-wide vectors.

    Args:
        dim: vector width.
        nbits: bits per kept dimension's residual (1, 2, 4 or 8).
        num_centroids: k-means centroids (2 .. 65,536).
        residual_dims: dimensions whose residual is stored (a multiple of ``8 / nbits``, at most ``dim``; default
            :func:`default_residual_dims`).
    """

    def __init__(self, dim: int, *, nbits: int = 1, num_centroids: int = DEFAULT_NUM_CENTROIDS,
                 residual_dims: int | None = None):
        self.dim, self.nbits, self.num_centroids = int(dim), int(nbits), int(num_centroids)
        if self.nbits not in NBITS:
            raise ValueError(f"nbits must be one of {', '.join(map(str, NBITS))}, not {nbits}")
        if not 2 <= self.num_centroids <= MAX_CENTROIDS:
            raise ValueError(f"num_centroids must be between 2 and {MAX_CENTROIDS}, not {num_centroids}")
        per_byte = 8 // self.nbits
        self.residual_dims = (default_residual_dims(self.dim, self.nbits, self.num_centroids)
                              if residual_dims is None else int(residual_dims))
        if not 0 < self.residual_dims <= self.dim or self.residual_dims % per_byte:
            raise ValueError(f"residual_dims must be a positive multiple of {per_byte} (8 / nbits) up to the dim "
                             f"{self.dim}, not {residual_dims}")
        self.levels = 2 ** self.nbits
        self.id_bytes = id_bytes(self.num_centroids)
        self.code_size = self.id_bytes + self.residual_dims * self.nbits // 8
        # bucket of each kept dimension within one byte, for every byte value: [256, 8 / nbits]
        shifts = np.arange(per_byte, dtype=np.uint8) * self.nbits
        self._unpack = ((np.arange(256, dtype=np.uint16)[:, None] >> shifts) & (self.levels - 1)).astype(np.uint8)
        self.centroids: np.ndarray | None = None  # [C, dim] float32
        self.kept: np.ndarray | None = None  # [r] int64, increasing
        self.cutoffs: np.ndarray | None = None  # [r, levels - 1] float32
        self.weights: np.ndarray | None = None  # [r, levels] float32
        self._flat_weights: np.ndarray | None = None
        self._assign = None  # faiss index over the centroids, for encoding

    @property
    def trained(self) -> bool:
        return self.centroids is not None

    @property
    def parameter_count(self) -> int:
        r = self.residual_dims
        return self.num_centroids * self.dim + r + r * (self.levels - 1) + r * self.levels

    @property
    def options(self) -> dict[str, Any]:
        return {"nbits": self.nbits, "num_centroids": self.num_centroids, "residual_dims": self.residual_dims}

    # ---- training, parameters ------------------------------------------------------------------------------------
    def train(self, sample: np.ndarray) -> None:
        """Fit the centroids (faiss k-means), choose the kept dimensions, and set each one's bucket cutoffs (the
        residual's quantiles at ``k / 2^nbits``) and weights (the mean residual within each bucket)."""
        import faiss

        sample = np.ascontiguousarray(sample, dtype=np.float32)
        if len(sample) < self.num_centroids:
            raise ValueError(f"the residual codec with {self.num_centroids} centroids needs at least that many token "
                             f"vectors to train, got {len(sample)}; lower num_centroids")
        kmeans = faiss.Kmeans(self.dim, self.num_centroids, niter=KMEANS_ITERATIONS, seed=KMEANS_SEED,
                              min_points_per_centroid=1, max_points_per_centroid=256, verbose=False)
        kmeans.train(sample)
        centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)
        self._set_centroids(centroids)
        residuals = sample - centroids[self._nearest(sample)]
        kept = np.sort(np.argsort(-residuals.var(axis=0), kind="stable")[:self.residual_dims])
        residuals = residuals[:, kept]
        quantiles = np.arange(1, self.levels) / self.levels
        cutoffs = np.quantile(residuals, quantiles, axis=0).T.astype(np.float32)  # [r, levels - 1]
        buckets = self._buckets(residuals, cutoffs)
        weights = np.empty((self.residual_dims, self.levels), dtype=np.float64)
        midpoints = np.quantile(residuals, (np.arange(self.levels) + 0.5) / self.levels, axis=0).T
        for level in range(self.levels):
            inside = buckets == level
            counts = inside.sum(axis=0)
            sums = np.where(inside, residuals, 0).sum(axis=0, dtype=np.float64)
            # an empty bucket (ties at a cutoff) falls back to its quantile midpoint
            weights[:, level] = np.where(counts > 0, sums / np.maximum(counts, 1), midpoints[:, level])
        self.kept, self.cutoffs = kept.astype(np.int64), cutoffs
        self._set_weights(weights.astype(np.float32))

    def parameters(self) -> np.ndarray:
        """The trained parameters as one flat float32 vector (layout in the module docstring)."""
        self._check_trained()
        return np.concatenate([self.centroids.ravel(), self.kept.astype(np.float32), self.cutoffs.ravel(),
                               self.weights.ravel()]).astype(np.float32)

    def load_parameters(self, parameters: np.ndarray) -> None:
        """Restore from :meth:`parameters`; refuses (:class:`SidecarCorruptError`) a vector of another size, with a
        non-finite value, kept dimensions that are not increasing integers below ``dim``, or decreasing cutoffs."""
        parameters = checked_codec_parameters(parameters, self.parameter_count, "residual",
                                              f"the residual codec ({self._describe()})")
        r, levels = self.residual_dims, self.levels
        sizes = [self.num_centroids * self.dim, r, r * (levels - 1), r * levels]
        centroids, kept, cutoffs, weights = np.split(parameters, np.cumsum(sizes)[:-1])
        if (not np.array_equal(kept, np.round(kept)) or kept.min() < 0 or kept.max() >= self.dim
                or (np.diff(kept) <= 0).any()):
            raise SidecarCorruptError(f"the residual codec's kept dimensions are not {r} increasing integers "
                                      f"below the dim {self.dim}")
        cutoffs = cutoffs.reshape(r, levels - 1)
        if (np.diff(cutoffs, axis=1) < 0).any():
            raise SidecarCorruptError("the residual codec's bucket cutoffs decrease within a dimension")
        self._set_centroids(np.ascontiguousarray(centroids.reshape(self.num_centroids, self.dim)))
        self.kept, self.cutoffs = kept.astype(np.int64), np.ascontiguousarray(cutoffs)
        self._set_weights(np.ascontiguousarray(weights.reshape(r, levels)))

    # ---- encode / decode -----------------------------------------------------------------------------------------
    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """``[n, code_size]`` uint8 codes of ``vectors [n, dim]`` float32."""
        self._check_trained()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        codes = np.empty((len(vectors), self.code_size), dtype=CODE_DTYPE)
        if not len(vectors):
            return codes
        ids = self._nearest(vectors)
        codes[:, :self.id_bytes] = ids.astype("<u2").view(np.uint8).reshape(-1, 2)[:, :self.id_bytes]
        residuals = vectors[:, self.kept] - self.centroids[ids][:, self.kept]
        buckets = self._buckets(residuals, self.cutoffs)  # [n, r] in [0, levels)
        per_byte = 8 // self.nbits
        shifts = (np.arange(per_byte, dtype=np.uint8) * self.nbits)
        grouped = buckets.reshape(len(vectors), -1, per_byte) << shifts
        codes[:, self.id_bytes:] = np.bitwise_or.reduce(grouped, axis=2)
        return codes

    def decode(self, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``codes [n, code_size]`` into ``out [n, dim]`` float32: ``centroids[id]`` then, on each kept
        dimension, plus the weight of its bucket. Refuses an id beyond the centroids (a damaged ``tokens.bin``)."""
        self._check_trained()
        ids = codes[:, 0].astype(np.int64)
        if self.id_bytes == 2:
            ids |= codes[:, 1].astype(np.int64) << 8
        if len(ids) and int(ids.max()) >= self.num_centroids:
            raise SidecarCorruptError(f"a token code names centroid {int(ids.max())} of a residual codec with "
                                      f"{self.num_centroids}: the sidecar's tokens.bin is damaged")
        np.take(self.centroids, ids, axis=0, out=out)
        buckets = self._unpack[codes[:, self.id_bytes:]].reshape(len(codes), self.residual_dims)
        # one flat gather: weight of (dimension j, bucket b) at j * levels + b
        residuals = np.take(self._flat_weights, buckets + self._weight_rows)
        out[:, self.kept] += residuals
        return out

    def decode_reference(self, code: np.ndarray) -> np.ndarray:
        """One code decoded the plain way (a loop over dimensions), the definition :meth:`decode` must equal."""
        self._check_trained()
        centroid = int.from_bytes(bytes(code[:self.id_bytes]), "little")
        vector = self.centroids[centroid].copy()
        bits = int.from_bytes(bytes(code[self.id_bytes:]), "little")
        for j, dimension in enumerate(self.kept):
            bucket = (bits >> (j * self.nbits)) & (self.levels - 1)
            vector[dimension] = np.float32(vector[dimension] + self.weights[j, bucket])
        return vector

    # ---- internals -----------------------------------------------------------------------------------------------
    def _set_centroids(self, centroids: np.ndarray) -> None:
        self.centroids = centroids.astype(np.float32, copy=False)
        self._assign = None  # built on the first encode: decoding needs no faiss

    def _set_weights(self, weights: np.ndarray) -> None:
        self.weights = weights
        self._flat_weights = weights.ravel()
        self._weight_rows = (np.arange(self.residual_dims, dtype=np.int64) * self.levels)[None, :]

    def _nearest(self, vectors: np.ndarray) -> np.ndarray:
        """``[n]`` int64 id of each vector's nearest centroid (L2, faiss's exact search)."""
        if self._assign is None:
            import faiss

            self._assign = faiss.IndexFlatL2(self.dim)
            self._assign.add(self.centroids)
        ids = np.empty(len(vectors), dtype=np.int64)
        for start in range(0, len(vectors), _ASSIGN_BATCH):
            _, nearest = self._assign.search(vectors[start:start + _ASSIGN_BATCH], 1)
            ids[start:start + _ASSIGN_BATCH] = nearest[:, 0]
        return ids

    @staticmethod
    def _buckets(residuals: np.ndarray, cutoffs: np.ndarray) -> np.ndarray:
        """``[n, r]`` uint8 bucket of each residual: how many of its dimension's cutoffs it exceeds."""
        buckets = np.zeros(residuals.shape, dtype=np.uint8)
        for level in range(cutoffs.shape[1]):
            buckets += residuals > cutoffs[:, level]
        return buckets

    def _describe(self) -> str:
        return (f"dim {self.dim}, {self.num_centroids} centroids, {self.residual_dims} residual dims x "
                f"{self.nbits} bits")

    def _check_trained(self) -> None:
        if not self.trained:
            raise RuntimeError("the residual codec is not trained yet")


__all__ = ["DEFAULT_NUM_CENTROIDS", "MAX_CENTROIDS", "NBITS", "ResidualQuantizer", "default_residual_dims",
           "id_bytes"]

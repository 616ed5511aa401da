"""Opens a finished sidecar read-only: cheap validation at open (manifest + file sizes), lazy memmaps, batched reads.

Opening costs one JSON parse and a few ``stat`` calls whatever the collection size; torch is imported only when
:meth:`SidecarReader.get_batch` builds tensors. Memmaps are read-only, so any number of processes can share a sidecar.
"""
from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .format import (
    CODEC,
    CODEC_PARAMETER_DTYPE,
    DOCIDS,
    DOCIDS_SORTED,
    DOCIDS_SORTED_ROWS,
    OFFSETS,
    TOKENS,
    Manifest,
    SidecarCorruptError,
    SidecarMismatchError,
    check_directory,
    check_expectations,
    read_manifest,
    size_problems,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_TORCH_DTYPE_NAMES = ("float32", "float16", "bfloat16")


class ManifestMetadata:
    """What a reader tells from its ``manifest`` alone (shared by the single and the sharded reader)."""

    manifest: Any

    @property
    def num_docs(self) -> int:
        return self.manifest.num_docs

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def dtype(self) -> str:
        """Storage dtype name: ``float16``, ``float32`` or ``bfloat16``, or the codec of a compressed sidecar
        (``sq8``, ``sq6``, ``sq4``, ``pq``: see :mod:`.codecs`)."""
        return self.manifest.dtype

    @property
    def model(self) -> dict[str, Any]:
        return self.manifest.model

    @property
    def index(self) -> dict[str, Any]:
        return self.manifest.index


class SidecarReader(ManifestMetadata):
    """Read-only access to a sidecar's per-document token matrices, addressed by row (= Lucene internal docid).

    Args:
        path: the sidecar directory.
        expect_model_fingerprint: refuse a sidecar built by another model (``model.store_fingerprint()``).
        expect_index: refuse a sidecar built for another index (the index identity dict given to the writer).
        expect_dtype: refuse another storage dtype (``float16``, ``float32``, ``bfloat16``).
        expect_dim: refuse another vector width (the model's ``store_width``).

    Raises:
        SidecarNotFoundError: missing directory, or only an unfinished ``<path>.partial`` build.
        SidecarMismatchError: other format version, model, index, dtype or dim.
        SidecarCorruptError: unreadable manifest, or a data file whose size disagrees with it (e.g. truncated).

    Example::

        with SidecarReader(path, expect_model_fingerprint=model.store_fingerprint()) as sidecar:
            docs, lengths = sidecar.get_batch([hit.lucene_docid for hit in hits])  # [B, Lmax, dim], [B]
    """

    # A shard alone holds rows of a slice of the index, numbered from 0: only its sharded sidecar may open it.
    _part_of_sharded = False

    def __init__(self, path: str | os.PathLike, *, expect_model_fingerprint: str | None = None,
                 expect_index: Mapping[str, Any] | None = None, expect_dtype: str | None = None,
                 expect_dim: int | None = None):
        self.path = Path(path)
        self._expect = {"expect_model_fingerprint": expect_model_fingerprint, "expect_index": expect_index,
                        "expect_dtype": expect_dtype, "expect_dim": expect_dim}
        check_directory(self.path)
        self.manifest: Manifest = read_manifest(self.path)
        if self.manifest.shard and not self._part_of_sharded:
            shard = self.manifest.shard
            raise SidecarMismatchError(
                f"{self.path} is shard {shard.get('index')} of {shard.get('count')} (rows [{shard.get('row_start')}, "
                f"{shard.get('row_end')})) of a sharded sidecar, not a whole one; open the sidecar assembled from "
                f"its shards (`python -m pyserini_mores.sidecar assemble --output DIR SHARD...`)")
        check_expectations(self.manifest, self.path, model_fingerprint=expect_model_fingerprint,
                           index=expect_index, dtype=expect_dtype, dim=expect_dim)
        problems = size_problems(self.manifest, self.path)
        if problems:
            raise SidecarCorruptError(
                f"sidecar {self.path} is damaged: {'; '.join(problems)}. Rebuild it "
                f"(`python -m pyserini_mores.sidecar verify {self.path}` lists every problem)")
        self._layout = self.manifest.expected_layout()
        # The files this manifest describes. A rebuild with overwrite=True replaces the directory under an open
        # reader: a file mapped lazily after that would be the new build's, read with this (old) manifest.
        self._file_identity = {name: _identity(os.stat(self.path / name)) for name in self._layout}
        self._maps: dict[str, np.ndarray] = {}
        self._codec = None  # a compressed sidecar's trained codec, loaded on first decode

    # ---- metadata (num_docs, num_tokens, dim, dtype, model, index: ManifestMetadata) ---------------------------
    @property
    def bytes_per_token(self) -> int:
        """Stored bytes of one token vector (a compressed sidecar's code size)."""
        return self.manifest.bytes_per_token

    @property
    def codec(self):
        """The trained :class:`~.codecs.TokenCodec` of a compressed sidecar (faiss is loaded on first use), or
        ``None``."""
        if self._codec is None and self.manifest.compressed:
            from .codecs import codec_from_manifest

            parameters = np.asarray(self._array(CODEC), dtype=CODEC_PARAMETER_DTYPE)
            self._codec = codec_from_manifest(self.manifest.codec, self.dim, parameters,
                                              source=str(self.path / CODEC))
        return self._codec

    @property
    def bytes_per_doc(self) -> float:
        """Mean bytes of token vectors per document (``tokens.bin`` size / ``num_docs``)."""
        return self.manifest.files[TOKENS].bytes / max(1, self.num_docs)

    # ---- raw arrays (lazy memmaps) -------------------------------------------------------------------------------
    def _array(self, name: str) -> np.ndarray:
        array = self._maps.get(name)
        if array is None:
            dtype, shape = self._layout[name]
            if int(np.prod(shape, dtype=np.int64)) == 0:
                array = np.zeros(shape, dtype=dtype)  # mmap cannot map an empty file
                array.flags.writeable = False
            else:
                with open(self.path / name, "rb") as stream:
                    if _identity(os.fstat(stream.fileno())) != self._file_identity[name]:
                        raise SidecarCorruptError(f"sidecar {self.path} was replaced after it was opened ({name} is "
                                                  "another file now); open it again")
                    array = np.memmap(stream, dtype=dtype, mode="r", shape=shape)
                if name == TOKENS:
                    _advise_random_access(array)
            self._maps[name] = array
        return array

    @property
    def tokens(self) -> np.ndarray:
        """``[num_tokens, dim]`` stored vectors (read-only memmap; bfloat16 appears as its raw uint16 bits; a
        compressed sidecar's ``[num_tokens, code_size]`` uint8 codes)."""
        return self._array(TOKENS)

    @property
    def offsets(self) -> np.ndarray:
        """``[num_docs + 1]`` int64: row i's tokens are ``tokens[offsets[i]:offsets[i + 1]]``."""
        return self._array(OFFSETS)

    # ---- documents by row ----------------------------------------------------------------------------------------
    def lengths(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """``[len(rows)]`` int64 token counts (every row's when ``rows`` is None)."""
        offsets = self.offsets
        if rows is None:
            return np.diff(offsets)
        rows = self._check_rows(rows)
        return offsets[rows + 1] - offsets[rows]

    def get(self, row: int) -> np.ndarray:
        """``[len, dim]`` vectors of one document: float16/float32 as stored (read-only view), bfloat16 and codec
        codes decoded to float32."""
        row = int(self._check_rows([row])[0])
        start, end = self.offsets[row], self.offsets[row + 1]
        stored = self.tokens[start:end]
        if self.manifest.compressed:
            return self.codec.decode(stored)
        if self.dtype == "bfloat16":
            # bfloat16 is the top half of a float32: widening the bits is exact and needs no torch.
            return (np.asarray(stored, dtype=np.uint32) << 16).view(np.float32)
        return np.asarray(stored)

    def get_batch(self, rows: Sequence[int] | np.ndarray, device: "str | torch.device" = "cpu",
                  dtype: "torch.dtype | str | None" = "float32") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Zero-padded vectors of ``rows`` (any order, repeats allowed) for scoring.

        Args:
            rows: ``[B]`` row numbers (Lucene internal docids).
            device: where the tensors go; data travels in the stored precision and is converted there.
            dtype: ``torch.float32`` (default), ``torch.float16``/``torch.bfloat16`` (no conversion when stored so),
                or ``None`` for the stored precision (float32 for a compressed sidecar, whose codes are decoded).

        Returns:
            ``docs [B, Lmax, dim]`` with zeros after each document's length, and ``lengths [B]`` (int64), both on
            ``device``. ``Lmax`` is the longest of the batch (0 when every document is empty).
        """
        import torch

        rows = self._check_rows(rows)
        offsets, tokens = self.offsets, self.tokens
        starts = np.asarray(offsets[rows])
        lengths = np.asarray(offsets[rows + 1]) - starts
        batch, total = len(rows), int(lengths.sum())
        max_len = int(lengths.max()) if batch else 0
        # One gather of every needed token row, then one scatter into the padded buffer: no per-document loop.
        doc_of_token = np.repeat(np.arange(batch), lengths)
        position = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded = np.zeros((batch, max_len, tokens.shape[1]), dtype=tokens.dtype)
        if total:
            padded[doc_of_token, position] = tokens[starts[doc_of_token] + position]
        if self.manifest.compressed:
            padded = self._decode_padded(padded, lengths)
        if self.dtype == "bfloat16":
            docs = torch.from_numpy(padded.view(np.int16)).view(torch.bfloat16)
        else:
            docs = torch.from_numpy(padded)
        docs = docs.to(device)
        if dtype is not None:
            docs = docs.to(_torch_dtype(dtype))
        return docs, torch.from_numpy(lengths.astype(np.int64)).to(device)

    def _decode_padded(self, codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """``[B, Lmax, dim]`` float32 vectors of padded ``codes [B, Lmax, code_size]``: every row of the batch in one
        faiss call, straight into the padded buffer (candidates arrive sorted by length, so padding is little); the
        padding, whose zero codes decode to a non-zero vector, is zeroed after."""
        batch, max_len, width = codes.shape
        padded = np.empty((batch, max_len, self.dim), dtype=np.float32)
        self.codec.decode(codes.reshape(-1, width), out=padded.reshape(-1, self.dim))
        padded[np.arange(max_len)[None, :] >= lengths[:, None]] = 0
        return padded

    # ---- docids --------------------------------------------------------------------------------------------------
    def docid(self, row: int) -> str:
        """The external docid of ``row``."""
        row = int(self._check_rows([row])[0])
        return bytes(self._array(DOCIDS)[row]).decode("utf-8")

    def docids(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """The external docids of ``rows``."""
        stored = self._array(DOCIDS)[self._check_rows(rows)]
        return [bytes(docid).decode("utf-8") for docid in stored]

    def rows_for_docids(self, docids: Sequence[str]) -> np.ndarray:
        """``[len(docids)]`` int64 rows of external docids, -1 for docids not in the sidecar.

        Binary search on the sorted docid memmap: touches O(log num_docs) pages per docid, builds nothing per document.
        """
        keys = [docid.encode("utf-8") for docid in docids]
        rows = np.full(len(keys), -1, dtype=np.int64)
        if not keys or not self.num_docs:
            return rows
        sorted_docids = self._array(DOCIDS_SORTED)
        width = sorted_docids.dtype.itemsize
        # A longer key cannot be stored, and casting it to S{width} would truncate it into a false match.
        fits = np.fromiter((len(key) <= width for key in keys), dtype=bool, count=len(keys))
        query = np.array([key if fit else b"" for key, fit in zip(keys, fits)], dtype=sorted_docids.dtype)
        # Same dtype on both sides, so numpy searches the memmap in place instead of casting a copy of it.
        positions = np.minimum(np.searchsorted(sorted_docids, query), self.num_docs - 1)
        found = fits & (np.asarray(sorted_docids[positions]) == query)
        rows[found] = self._array(DOCIDS_SORTED_ROWS)[positions[found]]
        return rows

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the memmaps (arrays handed out earlier keep their own mapping alive)."""
        self._maps.clear()

    def __enter__(self) -> "SidecarReader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        # Worker processes reopen (and re-validate) the sidecar instead of pickling memmaps.
        return (_reopen, (str(self.path), self._expect))

    def __repr__(self) -> str:
        return (f"SidecarReader({str(self.path)!r}, num_docs={self.num_docs}, num_tokens={self.num_tokens}, "
                f"dim={self.dim}, dtype={self.dtype!r}, model_type={self.model.get('model_type')!r})")

    def _check_rows(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size:
            bad = rows[(rows < 0) | (rows >= self.num_docs)]
            if bad.size:
                hint = " (-1 marks a docid that is not in the sidecar)" if bad[0] == -1 else ""
                raise IndexError(f"row {int(bad[0])} is out of range for sidecar {self.path} with "
                                 f"{self.num_docs} documents{hint}")
        return rows


def _advise_random_access(array: np.memmap) -> None:
    """Candidates are scattered rows: without this hint every page fault also reads the device's readahead window
    around it (8 MiB on the virtio disk measured), and a cold fetch of 1000 random candidates of a 1M-document
    sidecar read 6.4 GB from storage instead of 30 MB (integrations/scale/measure_store.py)."""
    mapped = getattr(array, "_mmap", None)  # numpy keeps the mmap.mmap object there
    if mapped is not None and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _reopen(path: str, expect: dict[str, Any]) -> SidecarReader:
    return SidecarReader(path, **expect)


def _torch_dtype(dtype: "torch.dtype | str") -> "torch.dtype":
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"dtype must be a torch dtype or one of {_TORCH_DTYPE_NAMES}, not {dtype!r}")
    return getattr(torch, dtype)


def open_sidecar(path: str | os.PathLike, **expect: Any) -> SidecarReader:
    """Open a sidecar: ``open_sidecar(path, expect_model_fingerprint=..., expect_index=..., ...)``.

    A sharded sidecar (see :mod:`.shards`) opens as a :class:`~.shards.ShardedSidecarReader`, which has the same API.
    """
    from .shards import ShardedSidecarReader, is_sharded

    if is_sharded(path):
        return ShardedSidecarReader(path, **expect)  # type: ignore[return-value]  # same API; shares ManifestMetadata, not SidecarReader
    return SidecarReader(path, **expect)

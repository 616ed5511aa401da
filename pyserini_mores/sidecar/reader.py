"""Opens a finished sidecar read-only: cheap validation at open (manifest, file sizes, offsets), lazy memmaps, batched
reads whose bytes are checked against their block checksums on first read (:mod:`.integrity`).

Opening costs one JSON parse, a few ``stat`` calls, the crc32 of ``offsets.bin`` and one vectorised pass over it (8
bytes per document); torch is imported only when :meth:`SidecarReader.get_batch` builds tensors. Memmaps are
read-only, so any number of processes can share a sidecar.
"""
from __future__ import annotations

import logging
import mmap
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._io import evict_from_page_cache
from .codecs import Codebooks, codec_from_manifest
from .format import (
    CODEC,
    CODEC_PARAMETER_DTYPE,
    CONTENT,
    DOCIDS,
    DOCIDS_SORTED,
    DOCIDS_SORTED_ROWS,
    INDEX_DTYPE,
    LEGACY_FORMATS,
    OFFSETS,
    REBUILD_ADVICE,
    TOKENS,
    WINDOW_OFFSETS,
    WINDOWS,
    Manifest,
    SidecarContentMismatchError,
    SidecarCorruptError,
    SidecarMismatchError,
    check_directory,
    check_expectations,
    legacy_notice,
    offset_problems,
    read_manifest,
    size_problems,
    window_problems,
)
from .integrity import SidecarIntegrityError, block_checker

if TYPE_CHECKING:
    from ..windows import WindowOptions

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_TORCH_DTYPE_NAMES = ("float32", "float16", "bfloat16")
_TORCH_TOKENS = "tokens.bin as torch"  # cache key beside the memmaps (dropped with them on close)


class ManifestMetadata:
    """What a reader tells from its ``manifest`` alone (shared by the single and the sharded reader)."""

    manifest: Any
    path: Path

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

    @property
    def format_version(self) -> int:
        """The sidecar format of the stored files (a sharded sidecar's oldest shard's)."""
        return self.manifest.format_version

    @property
    def lacks(self) -> str | None:
        """What the stored format lacks against the current one (``"windows"`` for format 2), or None."""
        return LEGACY_FORMATS.get(self.format_version)

    def legacy_notice(self) -> str | None:
        """One line on what the stored format lacks (for format 2: windows, so a windowed aggregation reads one
        window per document) and how to rebuild it, or None for the current format."""
        if self.lacks is None:
            return None
        return legacy_notice(self.path, self.format_version)

    def check_built_for(self, *, model_fingerprint: str | None = None,
                        index: Mapping[str, Any] | None = None) -> None:
        """Refuse (:class:`SidecarMismatchError`) when the sidecar was built by another model or for another index
        than given: the checks of opening with ``expect_model_fingerprint`` / ``expect_index``, for a reader that
        was opened without them."""
        try:
            check_expectations(self.manifest, self.path, model_fingerprint=model_fingerprint, index=index,
                               format_version=self.format_version)
        except SidecarContentMismatchError as error:
            raise self.changed_documents_error(error, index) from None

    def changed_documents_error(self, error: SidecarContentMismatchError,
                                index: Mapping[str, Any] | None) -> SidecarContentMismatchError:
        """``error`` naming the documents whose text changed: the rows whose stored text hash differs from the
        index's (``index.content_hashes()``, an :class:`~pyserini_mores.index.IndexIdentity`'s), first docids and
        count."""
        loader = getattr(index, "content_hashes", None)
        stored = self.content_hashes()
        if loader is None or len(stored) != self.num_docs:
            return error
        current = np.asarray(loader())
        if current.shape != stored.shape:
            return error
        changed = np.flatnonzero(current != stored)
        examples = self.docids(changed[:5])
        shown = ", ".join(examples) + (", ..." if len(changed) > len(examples) else "")
        where = getattr(index, "path", None) or "the index"
        summary = (f"sidecar {self.path} was built from other texts than {where} holds now: {len(changed)} of "
                   f"{self.num_docs} documents changed ({shown}); their stored vectors are stale")
        return SidecarContentMismatchError(summary, REBUILD_ADVICE.format(path=self.path), changed=len(changed),
                                           examples=examples)


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
        SidecarCorruptError: unreadable manifest, a data file whose size disagrees with it (e.g. truncated), or
            offsets that are not int64, do not start at 0, decrease somewhere or do not end at ``num_tokens``.

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
        stale = None  # named after the files are checked: naming the changed documents reads two of them
        try:
            check_expectations(self.manifest, self.path, model_fingerprint=expect_model_fingerprint,
                               index=expect_index, dtype=expect_dtype, dim=expect_dim)
        except SidecarContentMismatchError as error:
            stale = error
        problems = size_problems(self.manifest, self.path)
        if problems:
            raise SidecarCorruptError(
                f"sidecar {self.path} is damaged: {'; '.join(problems)}. Rebuild it "
                f"(`python -m pyserini_mores.sidecar verify {self.path}` lists every problem)")
        self._layout = self.manifest.expected_layout()
        # The files this manifest describes. A rebuild with overwrite=True replaces the directory under an open
        # reader: a file mapped lazily after that would be the new build's, read with this (old) manifest.
        self._file_identity = {name: _identity(os.stat(self.path / name)) for name in self._layout}
        self._maps: dict[str, Any] = {}  # memmaps by file name, and their torch view
        self._codec = None  # a compressed sidecar's trained codec, loaded on first decode
        # Every byte a read hands out is checked against checksums.bin the first time its block is read.
        self._blocks = block_checker(self.path, self.manifest, self._array)
        # Every read trusts the offsets (a row's slice of tokens.bin, its length): a damaged offsets.bin of the right
        # size would hand out other documents' vectors or empty ones. One vectorised pass over num_docs + 1 int64 says
        # how they break the format (a writer's bug would not show in a checksum computed after it), then their
        # checksums, through a mapping of their own: files are still mapped on first use (the pages stay cached).
        offsets = self._map(OFFSETS)
        problems = offset_problems(offsets, self.num_tokens, self.manifest.files[OFFSETS].dtype)
        if problems:
            raise SidecarCorruptError(
                f"sidecar {self.path} is damaged ({self.path / OFFSETS}): {'; '.join(problems)}. Rebuild it "
                f"(`python -m pyserini_mores.sidecar verify {self.path}` lists every problem)")
        self._blocks.check_file(OFFSETS, offsets)
        self._check_window_map(offsets)
        if self.manifest.compressed:
            # The codec's parameters are checked now (checksum, sizes, finite values, their own invariants), not at
            # the first decode in the middle of a search.
            _ = self.codec
        if stale is not None:
            raise self.changed_documents_error(stale, expect_index)
        if self.manifest.lacks_integrity and not self._part_of_sharded:  # a sharded sidecar says it once for its shards
            warn_legacy_once(self.path, legacy_notice(self.path, self.manifest.format_version))

    def _check_window_map(self, offsets: np.ndarray) -> None:
        """Refuse a window map that breaks the format (see :func:`.format.window_problems`) or its checksums: every
        windowed read trusts it as reads trust the offsets. Two passes of 8 bytes per document and per window."""
        if not self.manifest.has_windows:
            return
        windows, window_offsets = self._map(WINDOWS), self._map(WINDOW_OFFSETS)
        for name in (WINDOWS, WINDOW_OFFSETS):
            if self.manifest.files[name].dtype != INDEX_DTYPE.str:
                raise SidecarCorruptError(f"sidecar {self.path} is damaged ({self.path / name}): dtype is "
                                          f"{self.manifest.files[name].dtype!r}, not int64")
        problems = window_problems(windows, window_offsets, offsets, self.manifest.num_windows)
        if problems:
            raise SidecarCorruptError(
                f"sidecar {self.path} is damaged ({', '.join(str(self.path / name) for name in _named(problems))}): "
                f"{'; '.join(problems)}. Rebuild it (`python -m pyserini_mores.sidecar verify {self.path}` lists "
                "every problem)")
        self._blocks.check_file(WINDOWS, windows)
        self._blocks.check_file(WINDOW_OFFSETS, window_offsets)

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
            self._blocks.check_file(CODEC)
            parameters = np.asarray(self._array(CODEC), dtype=CODEC_PARAMETER_DTYPE)
            self._codec = codec_from_manifest(self.manifest.codec, self.dim, parameters,
                                              source=str(self.path / CODEC))
        return self._codec

    @property
    def store_rotation(self) -> np.ndarray | None:
        """The rotation ``R [dim, dim]`` of an ``opq`` sidecar, whose codes :meth:`get_spans` with ``rotated=True``
        decodes without rotating back (``x ≈ y @ R``); ``None`` for every other store."""
        return self.codec.rotation if self.manifest.compressed else None

    @property
    def store_codebooks(self) -> Codebooks | None:
        """The codebooks of an ``rq`` sidecar (and its norm levels when its codes end in a norm byte), whose codes
        (:meth:`get_spans` with ``codes=True``) a model can score through look-up tables without decoding them;
        ``None`` for every other store."""
        return self.codec.codebooks if self.manifest.compressed else None

    @property
    def bytes_per_doc(self) -> float:
        """Mean bytes of token vectors per document (``tokens.bin`` size / ``num_docs``)."""
        return self.manifest.files[TOKENS].bytes / max(1, self.num_docs)

    # ---- raw arrays (lazy memmaps) -------------------------------------------------------------------------------
    def _array(self, name: str) -> np.ndarray:
        array = self._maps.get(name)
        if array is None:
            array = self._maps[name] = self._map(name)
        return array

    def _map(self, name: str) -> np.ndarray:
        """A new read-only memmap of data file ``name``, refused when the file is no longer the one opened."""
        dtype, shape = self._layout[name]
        if int(np.prod(shape, dtype=np.int64)) == 0:
            array = np.zeros(shape, dtype=dtype)  # mmap cannot map an empty file
            array.flags.writeable = False
            return array
        with open(self.path / name, "rb") as stream:
            if _identity(os.fstat(stream.fileno())) != self._file_identity[name]:
                raise SidecarCorruptError(f"sidecar {self.path} was replaced after it was opened ({name} is "
                                          "another file now); open it again")
            array = np.memmap(stream, dtype=dtype, mode="r", shape=shape)
        if name == TOKENS:
            _advise_random_access(array)
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
        self._check_tokens(np.array([start]), np.array([end - start]))
        stored = self.tokens[start:end]
        if self.manifest.compressed:
            return self.codec.decode(stored)
        if self.dtype == "bfloat16":
            # bfloat16 is the top half of a float32: widening the bits is exact and needs no torch.
            return (np.asarray(stored, dtype=np.uint32) << 16).view(np.float32)
        return np.asarray(stored)

    def prefetch(self, rows: Sequence[int] | np.ndarray) -> None:
        """Ask the kernel to start reading the vectors of ``rows`` now (``madvise(MADV_WILLNEED)`` on each row's
        bytes, in the given order) and return once the reads are issued. On a cold sidecar they are then in flight
        together and overlap the scoring of the first batches, instead of one synchronous page fault at a time
        (readahead is off: see :func:`_advise_random_access`); rows in the page cache cost a look-up per page."""
        mapped = getattr(self.tokens, "_mmap", None)
        if mapped is None or not hasattr(mmap, "MADV_WILLNEED"):
            return
        rows = self._check_rows(rows)
        if not len(rows):
            return
        starts = np.asarray(self.offsets[rows]) * self.bytes_per_token
        ends = np.asarray(self.offsets[rows + 1]) * self.bytes_per_token
        pages = starts - starts % mmap.PAGESIZE  # madvise takes page-aligned starts
        for start, end in zip(pages.tolist(), ends.tolist()):
            if end > start:
                mapped.madvise(mmap.MADV_WILLNEED, start, end - start)

    @property
    def windows(self) -> WindowOptions | None:
        """How the build cut documents into windows (window and stride as resolved for the model, in tokens; None
        where the build did not record them; a build of one window per document is ``WindowOptions()``, what the
        model reads), or None for a format-2 or older sidecar (one window per row)."""
        if not self.manifest.has_windows:
            return None
        from ..windows import WindowOptions

        settings = self.manifest.windows
        if int(settings["max_windows"]) == 1:
            return WindowOptions()
        return WindowOptions(window=settings.get("window"), stride=settings.get("stride"),
                             max_windows=int(settings["max_windows"]))

    def window_counts(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """``[len(rows)]`` int64 windows stored per row (every row's when ``rows`` is None; 1 each without a window
        map)."""
        if rows is None:
            return np.diff(self._array(WINDOWS)) if self.manifest.has_windows else np.ones(self.num_docs, np.int64)
        rows = self._check_rows(rows)
        if not self.manifest.has_windows:
            return np.ones(len(rows), dtype=np.int64)
        windows = self._array(WINDOWS)
        return np.asarray(windows[rows + 1]) - np.asarray(windows[rows])

    def window_spans(self, rows: Sequence[int] | np.ndarray, first_only: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the windows of ``rows`` lie in ``tokens.bin``: ``(starts, lengths, owners)``, ``[W]`` int64 each, the
        windows of ``rows[i]`` consecutive (its first window first) with ``owners == i``; only each row's first
        window when ``first_only``. A sidecar built without windows has one window per row: the row itself."""
        rows = self._check_rows(rows)
        if not self.manifest.has_windows:
            starts = np.asarray(self.offsets[rows])
            lengths = np.asarray(self.offsets[rows + 1]) - starts
            return starts, lengths, np.arange(len(rows), dtype=np.int64)
        windows, window_offsets = self._array(WINDOWS), self._array(WINDOW_OFFSETS)
        first = np.asarray(windows[rows])
        counts = np.ones(len(rows), dtype=np.int64) if first_only else np.asarray(windows[rows + 1]) - first
        owners = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        # Window k of the batch is the (k - first window of its row's batch position)-th of its row.
        within = np.arange(len(owners), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        index = first[owners] + within
        starts = np.asarray(window_offsets[index])
        lengths = np.asarray(window_offsets[index + 1]) - starts
        return starts, lengths, owners

    def get_spans(self, starts: np.ndarray, lengths: np.ndarray, device: str | torch.device = "cpu",
                  dtype: torch.dtype | str | None = "float32", buffer: BatchBuffer | None = None,
                  heads: int | None = None, rotated: bool = False,
                  codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`get_batch` of token spans (``tokens[starts[i]:starts[i] + lengths[i]]``, e.g. from
        :meth:`window_spans`) instead of rows."""
        import torch

        if rotated and self.store_rotation is None:
            raise ValueError(f"sidecar {self.path} has no rotated frame (only an opq codec has one)")
        check_code_read(self, codes, heads, rotated)
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(starts) and (starts.min() < 0 or int((starts + lengths).max()) > self.num_tokens):
            raise IndexError(f"token spans reach beyond the {self.num_tokens} tokens of sidecar {self.path}")
        check_heads(heads, self.dim)
        max_len = int(lengths.max()) if len(starts) else 0
        self._check_tokens(starts, lengths)
        if codes:
            return self._gather_padded(starts, lengths, max_len, buffer).to(device), \
                torch.from_numpy(lengths.astype(np.int64)).to(device)
        if self.manifest.compressed:  # codes are decoded token-major, then transposed
            padded = self._gather_padded(starts, lengths, max_len, buffer)
            padded = torch.from_numpy(self._decode_padded(padded.numpy(), lengths, rotated))
            if heads is not None:
                padded = head_major(padded, heads)
        else:
            padded = self._gather_padded(starts, lengths, max_len, buffer, heads)
        docs = padded.to(device)
        target = None if dtype is None else torch_dtype(dtype)
        if target is not None and target != docs.dtype:
            if buffer is not None and docs.device.type == "cpu":
                docs = buffer.take("converted", docs.shape, target).copy_(docs)
            else:
                docs = docs.to(target)
        return docs, torch.from_numpy(lengths.astype(np.int64)).to(device)

    def get_batch(self, rows: Sequence[int] | np.ndarray, device: str | torch.device = "cpu",
                  dtype: torch.dtype | str | None = "float32", buffer: BatchBuffer | None = None,
                  heads: int | None = None, rotated: bool = False,
                  codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-padded vectors of ``rows`` (any order, repeats allowed) for scoring.

        Args:
            rows: ``[B]`` row numbers (Lucene internal docids).
            device: where the tensors go; data travels in the stored precision and is converted there.
            dtype: ``torch.float32`` (default), ``torch.float16``/``torch.bfloat16`` (no conversion when stored so),
                or ``None`` for the stored precision (float32 for a compressed sidecar, whose codes are decoded).
            buffer: reusable memory for the batch (see :class:`BatchBuffer`); the returned ``docs`` then live in it
                and stay valid until the next call with the same buffer.
            heads: head-major batches (see :func:`head_major`): each stored vector is ``heads`` equal slices (MORES
                Reuse-S2 stores every block's keys and values, attention heads side by side) and ``docs`` comes as
                ``[B, heads, Lmax, dim / heads]``, every head's rows contiguous. The gather itself transposes, so
                attention reads contiguous keys without a transposing copy of the batch.
            rotated: the vectors of an ``opq`` sidecar in its codec's rotated frame, not rotated back (see
                :attr:`store_rotation`), for a consumer that folds the rotation into its own vectors.
            codes: the stored codes of an ``rq`` sidecar, undecoded, as ``docs [B, Lmax, code_size]`` uint8 (zero
                after each length; ``dtype`` does not apply), for a consumer that scores them through look-up tables
                (see :attr:`store_codebooks`).

        Returns:
            ``docs [B, Lmax, dim]`` (or head-major, above) with zeros after each document's length, and
            ``lengths [B]`` (int64), both on ``device``. ``Lmax`` is the longest of the batch (0 when every document
            is empty).
        """
        rows = self._check_rows(rows)
        starts = np.asarray(self.offsets[rows])
        lengths = np.asarray(self.offsets[rows + 1]) - starts
        return self.get_spans(starts, lengths, device, dtype, buffer, heads, rotated, codes)

    def _gather_padded(self, starts: np.ndarray, lengths: np.ndarray, max_len: int,
                       buffer: BatchBuffer | None, heads: int | None = None) -> torch.Tensor:
        """``[B, Lmax, width]`` stored rows (bfloat16 as such, codes as uint8) with zeros after each length, or
        ``[B, heads, Lmax, width / heads]`` when ``heads`` is given.

        Every document's rows are contiguous in ``tokens.bin``, so slot ``j`` of document ``i`` is row
        ``start_i + j``: one multi-threaded ``index_select`` straight from the memmap into the padded batch (padding
        slots read the document's own rows and are zeroed after), instead of a gather and a scatter. Head-major, the
        store is viewed as rows of one head slice (``heads`` per token) and the same ``index_select`` puts head
        ``h`` of slot ``j`` at ``[i, h, j]``.
        """
        import torch

        tokens = self._torch_tokens()
        parts = heads or 1
        width = tokens.shape[1] // parts
        slot_shape = (len(starts), parts, max_len)
        shape = (*slot_shape, width) if heads else (len(starts), max_len, width)
        if buffer is not None:
            padded = buffer.take("stored", shape, tokens.dtype)
        else:
            padded = torch.empty(shape, dtype=tokens.dtype)
        if padded.numel() == 0:
            return padded
        slots = np.arange(max_len)
        source = starts[:, None] + np.minimum(slots[None, :], np.maximum(lengths - 1, 0)[:, None])
        # Offsets are validated at open, so only an empty document's padding slot can point past the last row (an
        # empty document at the end starts at num_tokens); it is zeroed below whatever it reads.
        np.minimum(source, max(len(tokens) - 1, 0), out=source)
        if heads:  # row of (document i, head h, slot j) in the store viewed as [num_tokens * heads, width]
            source = source[:, None, :] * heads + np.arange(heads)[None, :, None]
        flat = padded.view(-1, width)
        if len(tokens):
            torch.index_select(tokens.view(-1, width), 0, torch.from_numpy(source.reshape(-1)), out=flat)
        padding = np.flatnonzero(np.broadcast_to(slots[None, None, :] >= lengths[:, None, None], slot_shape))
        if len(padding):
            flat.index_fill_(0, torch.from_numpy(padding), 0)
        return padded

    def _check_tokens(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Check the blocks of ``tokens.bin`` that rows ``[starts, starts + lengths)`` lie in (first read only)."""
        width = self.bytes_per_token
        self._blocks.check_ranges(TOKENS, starts * width, (starts + lengths) * width)

    def _check_entries(self, name: str, positions: np.ndarray) -> None:
        """Check the blocks of fixed-width table ``name`` that entries ``positions`` lie in (first read only)."""
        width = self._layout[name][0].itemsize
        positions = np.asarray(positions, dtype=np.int64)
        self._blocks.check_ranges(name, positions * width, (positions + 1) * width)

    def content_hashes(self) -> np.ndarray:
        """``[num_docs]`` uint64 hash of the text each row's vectors were encoded from (see
        :mod:`pyserini_mores.index.content`); empty when the index stored no text."""
        if CONTENT not in self._layout:
            return np.zeros(0, dtype=np.uint64)
        self._blocks.check_file(CONTENT)
        return np.asarray(self._array(CONTENT))

    def _torch_tokens(self) -> torch.Tensor:
        """``tokens`` as a torch tensor sharing the memmap (bfloat16 bits viewed as bfloat16; never written)."""
        import torch

        cached = self._maps.get(_TORCH_TOKENS)
        if cached is None:
            array = self.tokens
            if self.dtype == "bfloat16":
                array = array.view(np.int16)
            with warnings.catch_warnings():  # read-only memmap: torch warns that it could be written; it never is
                warnings.simplefilter("ignore", UserWarning)
                cached = torch.from_numpy(array)
            if self.dtype == "bfloat16":
                cached = cached.view(torch.bfloat16)
            self._maps[_TORCH_TOKENS] = cached
        return cached

    def _decode_padded(self, codes: np.ndarray, lengths: np.ndarray, rotated: bool = False) -> np.ndarray:
        """``[B, Lmax, dim]`` float32 vectors of padded ``codes [B, Lmax, code_size]``: every row of the batch in one
        faiss call, straight into the padded buffer (candidates arrive sorted by length, so padding is little); the
        padding, whose zero codes decode to a non-zero vector, is zeroed after."""
        batch, max_len, width = codes.shape
        padded = np.empty((batch, max_len, self.dim), dtype=np.float32)
        self.codec.decode(codes.reshape(-1, width), out=padded.reshape(-1, self.dim), rotated=rotated)
        padded[np.arange(max_len)[None, :] >= lengths[:, None]] = 0
        return padded

    # ---- docids --------------------------------------------------------------------------------------------------
    def docid(self, row: int) -> str:
        """The external docid of ``row``."""
        row = int(self._check_rows([row])[0])
        self._check_entries(DOCIDS, np.array([row]))
        return bytes(self._array(DOCIDS)[row]).decode("utf-8")

    def docids(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """The external docids of ``rows``."""
        rows = self._check_rows(rows)
        self._check_entries(DOCIDS, rows)
        stored = self._array(DOCIDS)[rows]
        return [bytes(docid).decode("utf-8") for docid in stored]

    def docid_mismatches(self, rows: Sequence[int] | np.ndarray, docids: Sequence[str]) -> np.ndarray:
        """Positions ``i`` (int64, ascending) where row ``rows[i]`` holds another docid than ``docids[i]``: the check
        that candidates are the documents stored at their rows, one gather from ``docids.bin`` and one comparison
        for the whole batch."""
        rows = self._check_rows(rows)
        if len(rows) != len(docids):
            raise ValueError(f"{len(rows)} rows but {len(docids)} docids")
        self._check_entries(DOCIDS, rows)
        stored = np.asarray(self._array(DOCIDS)[rows])
        return _mismatches(stored, docids)

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
        self._check_entries(DOCIDS_SORTED, positions)
        found = fits & (np.asarray(sorted_docids[positions]) == query)
        if not found[fits].all():
            # A damaged byte anywhere on a binary search's path can hide a docid: "not in the sidecar" is only
            # said of a table that is intact (checked whole once, 8 + docid_width bytes per document).
            try:
                self._blocks.check_file(DOCIDS_SORTED)
            except SidecarIntegrityError as error:
                raise SidecarIntegrityError(f"{error}; {int((fits & ~found).sum())} docid(s) could not be looked "
                                            f"up in it") from None
        self._check_entries(DOCIDS_SORTED_ROWS, positions[found])
        rows[found] = self._array(DOCIDS_SORTED_ROWS)[positions[found]]
        return rows

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the memmaps (arrays handed out earlier keep their own mapping alive)."""
        self._maps.clear()

    def evict_from_page_cache(self) -> None:
        """Make the next reads cold (come from storage), as for a query whose candidates no earlier query touched:
        the memmaps are dropped — the kernel keeps mapped pages — and the files evicted from the page cache. The
        reader stays usable; arrays handed out earlier keep their pages mapped."""
        self.close()
        evict_from_page_cache(self.path / name for name in self._layout)

    def __enter__(self) -> SidecarReader:
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
        return checked_rows(rows, self.num_docs, self.path)


_WARNED_LEGACY: set[str] = set()


def warn_legacy_once(path: Path, notice: str) -> None:
    """Log ``notice`` (what an older-format sidecar lacks) at WARNING, once per sidecar per process: every open of
    it (workers, re-opens after a check) would otherwise repeat it."""
    key = os.path.realpath(path)
    if key not in _WARNED_LEGACY:
        _WARNED_LEGACY.add(key)
        logger.warning(notice)


def _named(problems: list[str]) -> list[str]:
    """The window-map files that ``problems`` (each starting with a file name) are about, in order."""
    return [name for name in (WINDOWS, WINDOW_OFFSETS) if any(problem.startswith(name) for problem in problems)]


def checked_rows(rows: Sequence[int] | np.ndarray, num_docs: int, path: Path) -> np.ndarray:
    """``rows`` as a flat int64 array, or an ``IndexError`` naming the first row outside ``[0, num_docs)`` of the
    sidecar at ``path``."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size:
        bad = rows[(rows < 0) | (rows >= num_docs)]
        if bad.size:
            hint = " (-1 marks a docid that is not in the sidecar)" if bad[0] == -1 else ""
            raise IndexError(f"row {int(bad[0])} is out of range for sidecar {path} with {num_docs} documents{hint}")
    return rows


def head_major(docs: torch.Tensor, heads: int) -> torch.Tensor:
    """``docs [B, L, dim]`` as ``[B, heads, L, dim / heads]`` (a contiguous copy): what ``get_batch(heads=...)``
    returns, for batches assembled elsewhere (decoded codes, batches spanning shards)."""
    return docs.unflatten(-1, (heads, -1)).transpose(1, 2).contiguous()


def check_heads(heads: int | None, dim: int) -> None:
    if heads is not None and (heads <= 0 or dim % heads):
        raise ValueError(f"cannot split {dim}-wide stored vectors into {heads} equal heads")


def check_code_read(reader, codes: bool, heads: int | None, rotated: bool) -> None:
    """A read of undecoded codes needs a store of codebooks (``rq``) and takes neither ``heads`` nor ``rotated``."""
    if not codes:
        return
    if reader.store_codebooks is None:
        raise ValueError(f"sidecar {reader.path} stores no codes scored by look-up tables (only an rq codec's are)")
    if heads is not None or rotated:
        raise ValueError("codes are read as stored: without heads or a rotated frame")


class BatchBuffer:
    """Reusable memory for :meth:`SidecarReader.get_batch`, owned by one caller (one thread).

    A 1000-candidate MORES Reuse-S2 batch is hundreds of MB. A fresh tensor that size is mapped anew by the allocator
    and costs a page fault per 4 KiB on first touch — measured here at 96 ms to fill 196 MB fresh against 20 ms
    reused, more than the copy itself. A batch written into a buffer is valid until the next ``get_batch`` with it.

    For a GPU the buffer is pinned (page-locked) host memory, which the device copies from asynchronously and at
    full bus speed: the copy reads the buffer after ``to(device, non_blocking=True)`` returns, so the caller marks it
    with :meth:`in_flight` and the next :meth:`take` first waits for that copy to finish.
    """

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory
        self._memory: dict[str, torch.Tensor] = {}
        self._copy_done = None  # a CUDA event: the last copy out of this buffer

    def take(self, role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised ``shape`` tensor of ``dtype`` for ``role`` (``stored``, ``converted``), grown on demand."""
        import torch

        if self._copy_done is not None:
            self._copy_done.synchronize()
            self._copy_done = None
        numel = int(np.prod(shape, dtype=np.int64))
        memory = self._memory.get(role)
        if memory is None or memory.dtype != dtype or memory.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
                memory = torch.empty(numel, dtype=dtype, pin_memory=self.pin_memory)
            self._memory[role] = memory
        return memory[:numel].view(shape)

    def in_flight(self, device: torch.device) -> None:
        """An asynchronous copy out of this buffer to ``device`` was just queued: the next :meth:`take` waits for it."""
        import torch

        if self.pin_memory and device.type == "cuda":
            self._copy_done = torch.cuda.Event()
            self._copy_done.record(torch.cuda.current_stream(device))


def _advise_random_access(array: np.memmap) -> None:
    """Candidates are scattered rows: without this hint every page fault also reads the device's readahead window
    around it (8 MiB on the virtio disk measured), and a cold fetch of 1000 random candidates of a 1M-document
    sidecar read 6.4 GB from storage instead of 30 MB (integrations/scale/measure_store.py)."""
    mapped = getattr(array, "_mmap", None)  # numpy keeps the mmap.mmap object there
    if mapped is not None and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)


def _mismatches(stored: np.ndarray, docids: Sequence[str]) -> np.ndarray:
    """Positions where the ``S{w}`` docids ``stored`` differ from ``docids`` (a docid longer than ``w`` bytes, which
    cannot be stored, always differs: casting it would truncate it into a false match)."""
    width = stored.dtype.itemsize
    keys = [str(docid).encode("utf-8") for docid in docids]
    fits = np.fromiter((len(key) <= width for key in keys), dtype=bool, count=len(keys))
    expected = np.array([key if fit else b"" for key, fit in zip(keys, fits)], dtype=stored.dtype)
    return np.flatnonzero(~fits | (stored != expected)).astype(np.int64)


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _reopen(path: str, expect: dict[str, Any]) -> SidecarReader:
    return SidecarReader(path, **expect)


def torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"dtype must be a torch dtype or one of {_TORCH_DTYPE_NAMES}, not {dtype!r}")
    return getattr(torch, dtype)


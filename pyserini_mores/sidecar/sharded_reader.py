"""Reads a sharded sidecar (see :mod:`.shards`) with the :class:`~.reader.SidecarReader` API, and opens any sidecar,
sharded or not (:func:`open_sidecar`)."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .codecs import Codebooks
from .format import (
    MANIFEST,
    SidecarContentMismatchError,
    SidecarCorruptError,
    SidecarMismatchError,
    SidecarNotFoundError,
    check_directory,
    check_expectations,
    legacy_notice,
)
from .reader import (
    BatchBuffer,
    ManifestMetadata,
    SidecarReader,
    check_code_read,
    check_heads,
    checked_rows,
    head_major,
    torch_dtype,
    warn_legacy_once,
)
from .shards import (
    coverage_problems,
    entry_problem,
    is_sharded,
    read_sharded_manifest,
    rows_text,
    shards_format_version,
)

if TYPE_CHECKING:
    import torch


class _ShardReader(SidecarReader):
    """A shard opened as part of its sharded sidecar (a lone shard is refused: its rows are not Lucene docids)."""

    _part_of_sharded = True

    def __reduce__(self):
        return (_ShardReader, (str(self.path),))


class ShardedSidecarReader(ManifestMetadata):
    """Read-only access to a sharded sidecar with the :class:`SidecarReader` API: rows are global (Lucene internal
    docids) and batches may span shards.

    Opening validates the top-level manifest, the row coverage and every shard (exists, finished, of this build,
    file sizes), then keeps one lazy :class:`SidecarReader` per shard.

    Raises:
        SidecarNotFoundError: the sidecar or one of its shards is missing (the message names the shard).
        SidecarMismatchError: other model, index, dtype or dim; a shard of another build or changed since assembly.
        SidecarCorruptError: unreadable manifests, gaps or overlaps, a shard's file of the wrong size.
    """

    def __init__(self, path: str | os.PathLike, *, expect_model_fingerprint: str | None = None,
                 expect_index: Mapping[str, Any] | None = None, expect_dtype: str | None = None,
                 expect_dim: int | None = None):
        self.path = Path(path)
        self._expect = {"expect_model_fingerprint": expect_model_fingerprint, "expect_index": expect_index,
                        "expect_dtype": expect_dtype, "expect_dim": expect_dim}
        check_directory(self.path)
        self.manifest = read_sharded_manifest(self.path)
        # Peeked before the shards are opened: it says which index identity the manifest records.
        self._format_version = shards_format_version(self.manifest, self.path)
        stale = None
        try:
            check_expectations(self.manifest, self.path, model_fingerprint=expect_model_fingerprint,
                               index=expect_index, dtype=expect_dtype, dim=expect_dim,
                               format_version=self._format_version)
        except SidecarContentMismatchError as error:
            stale = error
        entries = self.manifest.shards
        problems = coverage_problems([(entry.path, entry.row_start, entry.row_end) for entry in entries],
                                     self.manifest.num_docs)
        if problems:
            raise SidecarCorruptError(f"{self.path / MANIFEST}: {'; '.join(problems)}")
        self.shards: list[SidecarReader] = [self._open_shard(position) for position in range(len(entries))]
        self._row_starts = np.array([entry.row_start for entry in entries], dtype=np.int64)
        self._row_ends = np.array([entry.row_end for entry in entries], dtype=np.int64)
        # Token positions of the whole sidecar: shard s's tokens follow those of the shards before it.
        self._token_ends = np.cumsum([shard.num_tokens for shard in self.shards], dtype=np.int64)
        self._token_starts = self._token_ends - np.array([shard.num_tokens for shard in self.shards], dtype=np.int64)
        if stale is not None:
            raise self.changed_documents_error(stale, expect_index)
        legacy = [shard for shard in self.shards if shard.manifest.lacks_integrity]
        if legacy:
            self._format_version = min(shard.format_version for shard in self.shards)
            subject = (f"sharded sidecar {self.path} has {len(legacy)} of {len(self.shards)} shards in format "
                       f"{self._format_version}: they have")
            notice = legacy_notice(self.path, self._format_version, subject)
            warn_legacy_once(self.path, notice)

    @property
    def format_version(self) -> int:
        """The sidecar format of its oldest shard."""
        return self._format_version

    def content_hashes(self) -> np.ndarray:
        """``[num_docs]`` uint64 text hash of every row (see :meth:`SidecarReader.content_hashes`)."""
        parts = [shard.content_hashes() for shard in self.shards]
        if any(len(part) != shard.num_docs for part, shard in zip(parts, self.shards)):
            return np.zeros(0, dtype=np.uint64)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def _open_shard(self, position: int) -> SidecarReader:
        entry = self.manifest.shards[position]
        shard_path = entry.resolve(self.path)
        where = (f"shard {position} ({rows_text(entry.row_start, entry.row_end)}) of sharded sidecar {self.path}")
        try:
            check_directory(shard_path)
        except SidecarNotFoundError as error:
            raise SidecarNotFoundError(f"{where} is missing: {error}") from None
        reader = _ShardReader(shard_path)
        problem = entry_problem(self.manifest, self.path, position, reader.manifest)
        if problem:
            raise SidecarMismatchError(f"{where}: {problem}")
        return reader

    # ---- metadata (num_docs, num_tokens, dim, dtype, model, index: ManifestMetadata) ---------------------------
    @property
    def bytes_per_doc(self) -> float:
        """Mean bytes of stored vectors per document over every shard."""
        total = sum(shard.bytes_per_doc * shard.num_docs for shard in self.shards)
        return total / max(1, self.num_docs)

    # ---- documents by row ----------------------------------------------------------------------------------------
    def lengths(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """``[len(rows)]`` int64 token counts (every row's when ``rows`` is None)."""
        if rows is None:
            return np.concatenate([shard.lengths() for shard in self.shards]).astype(np.int64)
        rows = self._check_rows(rows)
        lengths = np.empty(len(rows), dtype=np.int64)
        for shard, where, local in self._split(rows):
            lengths[where] = shard.lengths(local)
        return lengths

    def get(self, row: int) -> np.ndarray:
        """``[len, dim]`` vectors of one document (see :meth:`SidecarReader.get`)."""
        (shard, _, local), = self._split(self._check_rows([row]))
        return shard.get(int(local[0]))

    @property
    def store_rotation(self) -> np.ndarray | None:
        """The rotation every shard's ``opq`` codec shares (see :attr:`SidecarReader.store_rotation`); ``None`` when
        a shard has none or the shards' codecs were trained apart (their rotated frames differ)."""
        if not hasattr(self, "_store_rotation"):  # the shards' codecs never change: compared once
            rotations = [shard.store_rotation for shard in self.shards]
            shared = bool(rotations) and all(rotation is not None and np.array_equal(rotations[0], rotation)
                                             for rotation in rotations)
            self._store_rotation = rotations[0] if shared else None
        return self._store_rotation

    @property
    def store_codebooks(self) -> Codebooks | None:
        """The codebooks every shard's ``rq`` codec shares (see :attr:`SidecarReader.store_codebooks`); ``None`` when
        a shard has none or the shards' codecs were trained apart (their codes index other codebooks)."""
        if not hasattr(self, "_store_codebooks"):  # the shards' codecs never change: compared once
            codebooks = [shard.store_codebooks for shard in self.shards]
            first = codebooks[0] if codebooks else None
            shared = first is not None and all(
                books is not None and np.array_equal(first.entries, books.entries)
                and (first.norm_levels is None) == (books.norm_levels is None)
                and (first.norm_levels is None or np.array_equal(first.norm_levels, books.norm_levels))
                and (first.words is None) == (books.words is None)
                and (first.words is None or np.array_equal(first.words, books.words))
                for books in codebooks)
            self._store_codebooks = codebooks[0] if shared else None
        return self._store_codebooks

    def get_batch(self, rows: Sequence[int] | np.ndarray, device: str | torch.device = "cpu",
                  dtype: torch.dtype | str | None = "float32", buffer: BatchBuffer | None = None,
                  heads: int | None = None, rotated: bool = False,
                  codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-padded ``docs [B, Lmax, dim]`` (or head-major, or codes) and ``lengths [B]`` of ``rows``, exactly as
        :meth:`SidecarReader.get_batch` gives them for an unsharded sidecar (rows may span shards). ``buffer`` is
        used when the rows come from one shard (batches spanning shards are assembled in fresh memory)."""

        rows = self._check_rows(rows)
        check_heads(heads, self.dim)
        self._check_rotated(rotated)
        check_code_read(self, codes, heads, rotated)
        split = self._split(rows)
        if len(split) == 1:  # every row in one shard, in input order: its batch is already the answer
            shard, _, local = split[0]
            return shard.get_batch(local, device, dtype, buffer, heads, rotated, codes)
        parts = [(where, *shard.get_batch(local, dtype=None, rotated=rotated, codes=codes))
                 for shard, where, local in split]
        if not parts:  # no rows: the empty batch of the stored dtype
            return self._joined([self.shards[0].get_batch(rows, dtype=None, codes=codes)], len(rows), device,
                                dtype, heads, codes)
        return self._joined(parts, len(rows), device, dtype, heads, codes)

    # ---- windows -------------------------------------------------------------------------------------------------
    @property
    def windows(self):
        """How the build cut documents into windows (see :attr:`SidecarReader.windows`; its shards agree, their
        build id covers it), or None when a shard has no window map."""
        settings = [shard.windows for shard in self.shards]
        return None if not settings or None in settings else settings[0]

    def window_counts(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """``[len(rows)]`` int64 windows stored per row (see :meth:`SidecarReader.window_counts`)."""
        if rows is None:
            return np.concatenate([shard.window_counts() for shard in self.shards]).astype(np.int64)
        rows = self._check_rows(rows)
        counts = np.empty(len(rows), dtype=np.int64)
        for shard, where, local in self._split(rows):
            counts[where] = shard.window_counts(local)
        return counts

    def window_spans(self, rows: Sequence[int] | np.ndarray, first_only: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`SidecarReader.window_spans` over every shard: ``starts`` are positions in the shards' tokens one
        after the other (shard order), which :meth:`get_spans` takes."""
        rows = self._check_rows(rows)
        counts = np.ones(len(rows), dtype=np.int64) if first_only else self.window_counts(rows)
        owners = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        starts = np.empty(len(owners), dtype=np.int64)
        lengths = np.empty(len(owners), dtype=np.int64)
        firsts = np.cumsum(counts) - counts  # where each row's windows start in the answer
        for shard, where, local in self._split(rows):
            shard_starts, shard_lengths, shard_owners = shard.window_spans(local, first_only)
            shard_counts = counts[where]
            within = np.arange(len(shard_owners)) - np.repeat(np.cumsum(shard_counts) - shard_counts, shard_counts)
            slots = firsts[where][shard_owners] + within
            starts[slots] = shard_starts + self._token_starts[self.shards.index(shard)]
            lengths[slots] = shard_lengths
        return starts, lengths, owners

    def get_spans(self, starts: np.ndarray, lengths: np.ndarray, device: str | torch.device = "cpu",
                  dtype: torch.dtype | str | None = "float32", buffer: BatchBuffer | None = None,
                  heads: int | None = None, rotated: bool = False,
                  codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`SidecarReader.get_spans` of spans from :meth:`window_spans` (spans may lie in several shards)."""

        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        check_heads(heads, self.dim)
        self._check_rotated(rotated)
        check_code_read(self, codes, heads, rotated)
        if len(starts) and (starts.min() < 0 or int((starts + lengths).max()) > self.num_tokens):
            raise IndexError(f"token spans reach beyond the {self.num_tokens} tokens of sidecar {self.path}")
        # A span lies in the first shard ending after its start (an empty span at the very end: the last shard).
        owner = np.minimum(np.searchsorted(self._token_ends, starts, side="right"), len(self.shards) - 1)
        split = [(self.shards[p], np.flatnonzero(owner == p)) for p in np.unique(owner)]
        split = [(shard, where, starts[where] - self._token_starts[self.shards.index(shard)])
                 for shard, where in split]
        if len(split) == 1:
            shard, _, local = split[0]
            return shard.get_spans(local, lengths, device, dtype, buffer, heads, rotated, codes)
        parts = [(where, *shard.get_spans(local, lengths[where], dtype=None, rotated=rotated, codes=codes))
                 for shard, where, local in split]
        if not parts:
            return self._joined([self.shards[0].get_spans(starts, lengths, dtype=None, codes=codes)], len(starts),
                                device, dtype, heads, codes)
        return self._joined(parts, len(starts), device, dtype, heads, codes)

    def _check_rotated(self, rotated: bool) -> None:
        if rotated and self.store_rotation is None:
            raise ValueError(f"sharded sidecar {self.path} has no rotated frame its shards share (only opq codecs "
                             "trained once for every shard have one)")

    def _joined(self, parts: list, count: int, device, dtype, heads: int | None,
                codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One padded batch of ``count`` items from each shard's part ``(where, docs, lengths)`` (``where``: the
        part's positions in the batch; a lone ``(docs, lengths)`` is the whole, empty batch), on ``device``; codes
        (``codes``) as they are, in no other dtype."""
        import torch

        if len(parts[0]) == 2:
            docs, lengths = parts[0]
        else:
            max_len = max(part_docs.shape[1] for _, part_docs, _ in parts)
            docs = torch.zeros((count, max_len, parts[0][1].shape[-1]), dtype=parts[0][1].dtype)
            lengths = torch.empty(count, dtype=torch.int64)
            for where, part_docs, part_lengths in parts:
                index = torch.from_numpy(where)
                docs[index, :part_docs.shape[1]] = part_docs
                lengths[index] = part_lengths
        if heads is not None:
            docs = head_major(docs, heads)
        docs = docs.to(device)
        if dtype is not None and not codes:
            docs = docs.to(torch_dtype(dtype))
        return docs, lengths.to(device)

    # ---- docids --------------------------------------------------------------------------------------------------
    def prefetch(self, rows: Sequence[int] | np.ndarray) -> None:
        """As :meth:`SidecarReader.prefetch`: each shard's rows, in their order within the shard."""
        for shard, _, local in self._split(self._check_rows(rows)):
            shard.prefetch(local)

    def docid(self, row: int) -> str:
        (shard, _, local), = self._split(self._check_rows([row]))
        return shard.docid(int(local[0]))

    def docids(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        rows = self._check_rows(rows)
        docids: list[str] = [""] * len(rows)
        for shard, where, local in self._split(rows):
            for position, docid in zip(where, shard.docids(local)):
                docids[position] = docid
        return docids

    def docid_mismatches(self, rows: Sequence[int] | np.ndarray, docids: Sequence[str]) -> np.ndarray:
        """Positions ``i`` (ascending) where global row ``rows[i]`` holds another docid than ``docids[i]`` (see
        :meth:`SidecarReader.docid_mismatches`)."""
        rows = self._check_rows(rows)
        if len(rows) != len(docids):
            raise ValueError(f"{len(rows)} rows but {len(docids)} docids")
        found = [where[shard.docid_mismatches(local, [docids[i] for i in where])]
                 for shard, where, local in self._split(rows)]
        return np.sort(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)

    def rows_for_docids(self, docids: Sequence[str]) -> np.ndarray:
        """``[len(docids)]`` int64 global rows of external docids, -1 for docids in no shard."""
        docids = list(docids)
        rows = np.full(len(docids), -1, dtype=np.int64)
        pending = np.arange(len(docids))
        for shard, start in zip(self.shards, self._row_starts):
            if not pending.size:
                break
            found = shard.rows_for_docids([docids[i] for i in pending])
            hit = found >= 0
            rows[pending[hit]] = found[hit] + start
            pending = pending[~hit]
        return rows

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def evict_from_page_cache(self) -> None:
        """As :meth:`SidecarReader.evict_from_page_cache`, for every shard."""
        for shard in self.shards:
            shard.evict_from_page_cache()

    def close(self) -> None:
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> ShardedSidecarReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        return (_reopen_sharded, (str(self.path), self._expect))

    def __repr__(self) -> str:
        return (f"ShardedSidecarReader({str(self.path)!r}, shards={len(self.shards)}, num_docs={self.num_docs}, "
                f"num_tokens={self.num_tokens}, dim={self.dim}, dtype={self.dtype!r}, "
                f"model_type={self.model.get('model_type')!r})")

    def _check_rows(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        return checked_rows(rows, self.num_docs, self.path)

    def _split(self, rows: np.ndarray) -> list[tuple[SidecarReader, np.ndarray, np.ndarray]]:
        """``(shard reader, positions in rows, shard-local rows)`` for every shard that ``rows`` touch."""
        # The first shard ending after a row holds it (empty shards end where they start, so they never match).
        owner = np.searchsorted(self._row_ends, rows, side="right")
        parts = []
        for position in np.unique(owner):
            where = np.flatnonzero(owner == position)
            parts.append((self.shards[position], where, rows[where] - self._row_starts[position]))
        return parts


def _reopen_sharded(path: str, expect: dict[str, Any]) -> ShardedSidecarReader:
    return ShardedSidecarReader(path, **expect)


def open_sidecar(path: str | os.PathLike, **expect: Any) -> SidecarReader:
    """Open a sidecar: ``open_sidecar(path, expect_model_fingerprint=..., expect_index=..., ...)``.

    A sharded sidecar (see :mod:`.shards`) opens as a :class:`ShardedSidecarReader`, which has the same API.
    """
    if is_sharded(path):
        return ShardedSidecarReader(path, **expect)  # type: ignore[return-value]  # same API; shares ManifestMetadata, not SidecarReader
    return SidecarReader(path, **expect)

"""Streams document representations into ``<path>.partial/``, resumable after a crash; ``finalize`` renames it.

The partial directory holds the data files plus ``_journal/``: ``state.json`` (rows and bytes committed, the build
parameters) and one append-only ``<file>.blocks`` list of finished block digests per growing file, so that resuming
truncates the files to the committed lengths and re-reads at most one checksum block per file. A full disk stops the
build with a :class:`SidecarDiskFullError` naming the file; the partial build stays resumable like after a crash.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .._io import fsync_dir, write_json_atomic, write_text_atomic
from .codecs import CODECS, TokenCodec, codec_from_manifest, is_compressed
from .format import (
    BLOCK_CHECKSUMS,
    CHECKSUM_ALGORITHM,
    CODE_DTYPE,
    CODEC,
    CODEC_PARAMETER_DTYPE,
    CONTENT,
    CONTENT_DTYPE,
    DEFAULT_BLOCK_BYTES,
    DOCIDS,
    DOCIDS_SORTED,
    DOCIDS_SORTED_ROWS,
    FORMAT_VERSION,
    INDEX_DTYPE,
    MANIFEST,
    OFFSETS,
    READ_BLOCK_BYTES,
    READ_CHECKSUM_ALGORITHM,
    READ_CHECKSUM_DTYPES,
    STORAGE_DTYPES,
    TOKENS,
    WINDOW_OFFSETS,
    WINDOWS,
    BlockHasher,
    FileEntry,
    Manifest,
    SidecarCorruptError,
    SidecarError,
    SidecarExistsError,
    SidecarMismatchError,
    docid_dtype,
    json_normalized,
    partial_path,
)
from .integrity import block_hashes

logger = logging.getLogger(__name__)

JOURNAL_DIR = "_journal"
JOURNAL_STATE = "state.json"
_GROWING_FILES = (TOKENS, OFFSETS, WINDOWS, WINDOW_OFFSETS)
# A window setting the writer was not told (a store written without a build's windows): recorded as null.
_WINDOW_SETTINGS = ("window", "stride", "max_windows", "capacity")
_DOCID_CHUNK = 1 << 20  # docids encoded per chunk, to bound the temporary list of bytes objects
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class SidecarDiskFullError(SidecarError, OSError):
    """The disk (or a quota) filled up during a build. Everything committed before stays in ``<path>.partial``: free
    space and run the same build again to resume. ``errno`` is the original ENOSPC/EDQUOT; ``path`` the file."""

    def __init__(self, file: Path, partial: Path, cause: OSError):
        super().__init__(f"the disk is full: writing {file} failed ({cause.strerror or os.strerror(cause.errno)}). "
                         f"The partial build {partial} keeps every document committed so far; free space on its "
                         "disk and run the same build again to resume it")
        self.errno = cause.errno  # without strerror, str() stays the message above
        self.path = Path(file)


class SidecarWriter:
    """Writes one sidecar: documents are appended in row order (row i = Lucene internal docid i).

    Args:
        path: the sidecar directory to create; work happens in ``<path>.partial`` until :meth:`finalize`.
        dim: width of one stored token vector.
        dtype: ``float16`` (default), ``float32`` or ``bfloat16``.
        docids: the external docid of every row, in row order; ``len(docids)`` is the number of documents.
        model: at least ``model_type``, ``store_variant`` and ``fingerprint`` (hex) of the model that encodes.
        index: identity of the Lucene index, e.g. ``{"num_docs": N, "signature": "..."}``; readers compare it.
        build: free-form provenance (max_length, truncated documents, reranker, backbone, source, timings...).
        shard: for one shard of a sharded sidecar (see :mod:`.shards`): ``build_id``, ``index``, ``count``,
            ``row_start``, ``row_end`` (its global rows; ``docids`` are theirs) and ``num_docs`` of the whole index.
        overwrite: replace an existing complete sidecar at ``path`` when finalizing.
        restart: discard an existing ``.partial`` build instead of resuming it.
        block_bytes: checksum block size (see :mod:`.format`).
        commit_every_docs: commit the journal once at least this many documents were added since the last commit
            (1: after every :meth:`add`). A crash loses at most the uncommitted documents.
        codec: ``fp16`` / ``None`` (vectors stored in ``dtype``) or a compressed codec of :mod:`.codecs` (``sq8``,
            ``sq6``, ``sq4``, ``pq``, ``opq``, ``residual``, ``rq``; ``dtype`` is then ignored). It is trained on the
            first documents added (they wait in memory until its sample is full, or until :meth:`finalize`), or on a
            sample given to :meth:`train_codec` before them, then every document is encoded.
        codec_options: ``pq_subquantizers`` (PQ's M), ``nbits``, ``num_centroids``, ``residual_dims`` (the residual
            codec's), ``rq_codebooks`` and ``rq_norms`` (the rq codec's M and norm byte), ``sample_tokens`` (see
            :class:`.codecs.TokenCodec`).
        windows: how the build cut documents into windows (:mod:`pyserini_mores.windows`): ``window`` and
            ``stride`` in tokens, ``max_windows``, and ``capacity`` (the tokens the model reads of one); default one
            window per document, with window, stride and capacity not recorded (null).

    Example::

        with SidecarWriter(path, dim=32, docids=docids, model=model_info, index=index_info) as writer:
            for start in range(writer.rows_done, len(docids), 64):
                writer.add(model.encode_documents(batch_of(start, start + 64)))
        # a clean exit with every row written finalizes; an exception keeps the partial build for resuming
    """

    def __init__(self, path: str | os.PathLike, *, dim: int, dtype: str = "float16", docids: Sequence[str],
                 model: Mapping[str, Any], index: Mapping[str, Any], build: Mapping[str, Any] | None = None,
                 shard: Mapping[str, Any] | None = None, overwrite: bool = False, restart: bool = False,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, commit_every_docs: int = 1, codec: str | None = None,
                 codec_options: Mapping[str, Any] | None = None, content_hashes: np.ndarray | None = None,
                 windows: Mapping[str, Any] | None = None):
        self.path = Path(path)
        self.partial_path = partial_path(self.path)
        self.dim = int(dim)
        self.dtype = str(dtype)
        self.overwrite = overwrite
        self.block_bytes = int(block_bytes)
        self.commit_every_docs = max(1, int(commit_every_docs))
        if self.dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(STORAGE_DTYPES)}, not {dtype!r}")
        if self.dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        self._codec = _make_codec(codec, self.dim, codec_options)  # None: vectors stored as they are
        if self._codec is not None:
            self.dtype = self._codec.name  # the manifest dtype of a compressed sidecar
        # (window lengths, float32 tokens, windows per document, token ids or None) awaiting the codec
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
        self.windows = _check_windows(windows)
        self.model = _check_model(model)
        self.index = json_normalized(dict(index))
        self.build_info: dict[str, Any] = json_normalized(dict(build or {}))
        self.shard: dict[str, Any] = json_normalized(dict(shard or {}))
        self._check_target()

        docid_array = _encode_docids(docids)
        self.num_docs = len(docid_array)
        if self.shard:
            _check_shard(self.shard, self.num_docs, self.index)
        elif "num_docs" in self.index and int(self.index["num_docs"]) != self.num_docs:
            raise ValueError(f"{self.num_docs} docids given but the index has {self.index['num_docs']} documents: "
                             f"sidecar rows must line up with the index's internal docids")
        sorted_rows = np.argsort(docid_array, kind="stable").astype(INDEX_DTYPE)
        docids_sorted = docid_array[sorted_rows]
        duplicates = np.flatnonzero(docids_sorted[1:] == docids_sorted[:-1])
        if len(duplicates):
            raise ValueError(f"docids must be unique: {docids_sorted[duplicates[0]].decode('utf-8')!r} "
                             f"appears more than once")
        self._content_hashes = _check_content(content_hashes, self.index, self.num_docs, bool(self.shard))
        docid_checksum = _hash_bytes(docid_array, self.block_bytes)
        self._params = json_normalized({
            "format_version": FORMAT_VERSION, "dim": self.dim, "dtype": self.dtype, "num_docs": self.num_docs,
            "docid_width": docid_array.dtype.itemsize, "docids_sha256": docid_checksum, "model": self.model,
            "index": self.index, "block_bytes": self.block_bytes, "windows": self.windows})
        if self.shard:
            self._params["shard"] = self.shard  # a partial shard resumes only as the same shard of the same build
        if self._codec is not None:
            self._params["codec"] = json_normalized({"name": self._codec.name, **self._codec.options})
        self.docid_width = docid_array.dtype.itemsize
        self._storage_dtype = CODE_DTYPE if self._codec is not None else STORAGE_DTYPES[self.dtype]
        self._closed = False
        self._finalized = False
        self._broken = False
        self._uncommitted_docs = 0
        self._logged_blocks = {name: 0 for name in _GROWING_FILES}
        self._static_files: dict[str, dict[str, Any]] = {}

        state = self._load_state() if self.partial_path.exists() else None
        if state is not None and restart:
            logger.info("discarding the partial sidecar build %s (restart=True)", self.partial_path)
            shutil.rmtree(self.partial_path)
            state = None
        if state is not None:
            if state["params"] != self._params:
                differing = sorted(key for key in self._params if state["params"].get(key) != self._params[key])
                raise SidecarMismatchError(
                    f"{self.partial_path} is a partial build with other parameters (differing: "
                    f"{', '.join(differing)}); pass restart=True to discard it, or build with its parameters")
            self._resume(state, docid_array, docids_sorted, sorted_rows)
        else:
            self._start(docid_array, docids_sorted, sorted_rows)

    # ---- public API ----------------------------------------------------------------------------------------------
    @property
    def rows_done(self) -> int:
        """Documents added (written, and durable once committed; under a codec still untrained, some may wait in
        memory). A resumed build continues at this row."""
        return self._rows_done + sum(len(counts) for _, _, counts, _ in self._pending)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def add(self, reps: Sequence[Any], windows: Sequence[int] | np.ndarray | None = None, capped: int = 0,
            token_ids: Sequence[Any] | None = None) -> int:
        """Append the next documents. Each of ``reps`` is a ``[len_i, dim]`` numpy array or torch tensor: one per
        document, or with ``windows`` one per window, ``windows[d]`` consecutive windows (at least 1) for the
        ``d``-th document added (a document's stored rows are its windows' rows one after the other).

        ``len_i`` may be 0 (an empty document). ``capped``: how many of these documents had windows the build's
        ``max_windows`` left out (recorded in the manifest's ``windows``). ``token_ids``: for a codec that codes
        them (:attr:`.codecs.TokenCodec.needs_token_ids`, and only then), each rep's ``[len_i]`` token ids.
        Returns :attr:`rows_done`.
        """
        self._check_writable()
        counts = (np.ones(len(reps), dtype=np.int64) if windows is None
                  else np.asarray(windows, dtype=np.int64).reshape(-1))
        if windows is not None and (int(counts.sum()) != len(reps) or (counts < 1).any()):
            raise ValueError(f"{len(reps)} windows added for window counts summing to {int(counts.sum())} (every "
                             "document needs at least one window)")
        if len(counts) and int(counts.max()) > self.windows["max_windows"]:
            raise ValueError(f"a document of {int(counts.max())} windows, but the sidecar stores at most "
                             f"max_windows={self.windows['max_windows']}")
        if self.rows_done + len(counts) > self.num_docs:
            raise ValueError(f"{len(counts)} documents added at row {self.rows_done}, but the sidecar has only "
                             f"{self.num_docs} rows")
        ids = self._checked_token_ids(reps, token_ids)
        if not len(counts):
            return self.rows_done
        self._capped += int(capped)
        if self._codec is None:
            self._write_rows(*_to_storage(reps, self.dim, self.dtype, first_row=self._rows_done), counts)
            return self._rows_done
        lengths, tokens = _to_storage(reps, self.dim, "float32", first_row=self.rows_done)
        if self._codec.trained:
            self._write_rows(lengths, self._codec.encode(tokens, ids), counts)
        else:
            self._pending.append((lengths, tokens, counts, ids))
            if sum(len(pending) for _, pending, _, _ in self._pending) >= self._codec.sample_tokens:
                self._train_codec()
        return self.rows_done

    def add_codes(self, lengths: Sequence[int] | np.ndarray, codes: np.ndarray) -> int:
        """Append the next ``len(lengths)`` documents, one window each, already encoded by this writer's trained
        codec: ``codes [sum(lengths), code_size]`` uint8, the documents' tokens one after the other (what
        ``tokens.bin`` holds).
        For codes made elsewhere with the same codec parameters, or synthetic stores; the codes are not checked
        against the codec (a reader refuses a residual centroid id beyond its centroids). Returns :attr:`rows_done`.
        """
        self._check_writable()
        if self._codec is None or not self._codec.trained or self._pending:
            raise ValueError("add_codes needs a compressed codec trained before any document was added "
                             "(train_codec, or a resumed build)")
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if len(lengths) and lengths.min() < 0:
            raise ValueError("document lengths must not be negative")
        if self.rows_done + len(lengths) > self.num_docs:
            raise ValueError(f"{len(lengths)} documents added at row {self.rows_done}, but the sidecar has only "
                             f"{self.num_docs} rows")
        codes = np.asarray(codes)
        expected = (int(lengths.sum()), self._codec.code_size)
        if codes.dtype != CODE_DTYPE or codes.shape != expected:
            raise ValueError(f"expected codes of shape [{expected[0]}, {expected[1]}] and dtype uint8, got "
                             f"{list(codes.shape)} {codes.dtype}")
        if len(lengths):
            self._write_rows(lengths, codes, np.ones(len(lengths), dtype=np.int64))  # one window per document
        return self.rows_done

    def _write_rows(self, lengths: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> None:
        """Append windows of ``lengths`` whose token rows (in the storage dtype, or codes) are ``tokens``,
        ``counts[d]`` of them for each document ``d``."""
        window_offsets = (self._num_tokens + np.cumsum(lengths, dtype=np.int64)).astype(INDEX_DTYPE)
        ends = np.cumsum(counts, dtype=np.int64)  # each document's last window + 1, counted from this call's first
        offsets = window_offsets[ends - 1]
        windows = (self._num_windows + ends).astype(INDEX_DTYPE)
        try:
            # Offsets after tokens: a crash between them leaves extra bytes, which resuming truncates.
            self._append(TOKENS, tokens)
            self._append(WINDOW_OFFSETS, window_offsets)
            self._append(OFFSETS, offsets)
            self._append(WINDOWS, windows)
        except BaseException:
            self._fail()
            raise
        self._rows_done += len(counts)
        self._num_windows += len(lengths)
        self._num_tokens += int(lengths.sum())
        self._uncommitted_docs += len(counts)
        if self._uncommitted_docs >= self.commit_every_docs:
            self.commit()

    def update_build(self, info: Mapping[str, Any]) -> None:
        """Add provenance to the manifest's ``build`` dict; it is journalled at the next commit, so it survives a
        resume (counters such as truncated documents can be accumulated across interruptions)."""
        self.build_info.update(json_normalized(dict(info)))

    def commit(self) -> None:
        """Make everything added so far durable: fsync data, append finished block digests, then the journal."""
        if self._closed:
            return
        file = self.partial_path  # what is being written, for the message of a full disk
        try:
            for name in _GROWING_FILES:
                file, stream = self.partial_path / name, self._files[name]
                stream.flush()
                os.fsync(stream.fileno())
            for name in _GROWING_FILES:
                new = self._hashers[name].block_digests[self._logged_blocks[name]:]
                if new:
                    file = self._journal / f"{name}.blocks"
                    with open(file, "a", encoding="ascii") as log:
                        log.write("".join(digest.hex() + "\n" for digest in new))
                        log.flush()
                        os.fsync(log.fileno())
                    self._logged_blocks[name] += len(new)
            file = self._journal / JOURNAL_STATE
            write_json_atomic(file, {
                "params": self._params, "rows_done": self._rows_done, "num_tokens": self._num_tokens,
                "num_windows": self._num_windows, "capped_documents": self._capped,
                "bytes": self._growing_bytes(self._rows_done, self._num_tokens, self._num_windows),
                "static_files": self._static_files, "build": self.build_info, "updated": time.time()})
        except BaseException as error:
            self._fail()
            _raise_if_disk_full(error, file, self.partial_path)
            raise
        self._uncommitted_docs = 0

    def finalize(self, build: Mapping[str, Any] | None = None) -> Path:
        """Write the manifest (last), rename ``<path>.partial`` to ``<path>`` and return ``<path>``.

        ``build`` adds provenance known only at the end (timings, truncated documents...).
        """
        self._check_writable()
        if self._pending:
            self._train_codec()  # a collection smaller than the codec's sample trains it on all of its tokens
        if self._rows_done != self.num_docs:
            raise SidecarError(f"cannot finalize {self.path}: {self._rows_done} of {self.num_docs} documents "
                               f"written")
        if build:
            self.update_build(build)
        self.commit()
        self._close_files()
        if self._content_hashes is not None:
            self._write_static(CONTENT, self._content_hashes)
        checksums = {name: (hasher.num_bytes, hasher.hexdigest()) for name, hasher in self._hashers.items()}
        checksums.update({name: (entry["bytes"], entry["sha256"]) for name, entry in self._static_files.items()})
        manifest = Manifest(
            dim=self.dim, dtype=self.dtype, num_docs=self.num_docs, num_tokens=self._num_tokens,
            docid_width=self.docid_width, files={}, model=self.model, index=self.index, build=self.build_info,
            shard=self.shard, codec=self._codec.manifest_entry() if self._codec is not None else {},
            windows={**self.windows, "num_windows": self._num_windows, "capped_documents": self._capped},
            checksum={"algorithm": CHECKSUM_ALGORITHM, "block_bytes": self.block_bytes,
                      "read_algorithm": READ_CHECKSUM_ALGORITHM, "read_block_bytes": READ_BLOCK_BYTES},
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            library={"name": "pyserini_mores", "version": __version__})
        # The read-path block checksums are computed from the files as they are on disk, after the last write.
        hashes = [block_hashes(self.partial_path / name, READ_BLOCK_BYTES, READ_CHECKSUM_ALGORITHM)
                  for name in manifest.block_files]
        self._write_static(BLOCK_CHECKSUMS, np.concatenate(hashes) if hashes else
                           np.zeros(0, dtype=READ_CHECKSUM_DTYPES[READ_CHECKSUM_ALGORITHM]))
        checksums[BLOCK_CHECKSUMS] = tuple(self._static_files[BLOCK_CHECKSUMS].values())
        for name, (dtype, shape) in manifest.expected_layout().items():
            size, checksum = checksums[name]
            if size != (self.partial_path / name).stat().st_size:
                raise SidecarCorruptError(f"{self.partial_path / name} changed size while finalizing")
            manifest.files[name] = FileEntry(bytes=size, sha256=checksum, dtype=dtype.str, shape=list(shape))
        try:
            write_json_atomic(self.partial_path / MANIFEST, manifest.sealed())
        except OSError as error:
            _raise_if_disk_full(error, self.partial_path / MANIFEST, self.partial_path)
            raise
        self._replace_target()
        # The journal goes after the rename: a crash before it leaves a resumable partial, after it a harmless dir.
        shutil.rmtree(self.path / JOURNAL_DIR, ignore_errors=True)
        self._finalized = True
        logger.info("sidecar %s: %d documents, %d tokens, dim %d, %s", self.path, self.num_docs, self._num_tokens,
                    self.dim, self.dtype)
        return self.path

    def close(self) -> None:
        """Commit and close without finalizing: the partial build stays on disk and a new writer resumes it."""
        if self._closed:
            return
        try:
            # After a failed write the files may hold a torn tail; the last committed journal stays authoritative.
            if not self._broken:
                self.commit()
        finally:
            self._close_files()

    def abort(self) -> None:
        """Stop and delete the partial build."""
        self._close_files()
        shutil.rmtree(self.partial_path, ignore_errors=True)

    def __enter__(self) -> SidecarWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._closed:
            return
        if exc_type is None and self.rows_done == self.num_docs:
            self.finalize()
            return
        if exc_type is None:
            logger.warning("sidecar writer for %s closed after %d of %d documents: the partial build is kept for "
                           "resuming", self.path, self._rows_done, self.num_docs)
        self.close()

    def __repr__(self) -> str:
        return (f"SidecarWriter({str(self.path)!r}, dim={self.dim}, dtype={self.dtype!r}, "
                f"rows_done={self._rows_done}/{self.num_docs})")

    # ---- start / resume ------------------------------------------------------------------------------------------
    @property
    def _journal(self) -> Path:
        return self.partial_path / JOURNAL_DIR

    def _token_bytes(self, num_tokens: int) -> int:
        width = self._codec.code_size if self._codec is not None else self.dim
        return num_tokens * width * self._storage_dtype.itemsize

    def _growing_bytes(self, rows: int, tokens: int, windows: int) -> dict[str, int]:
        """Bytes of each growing file after ``rows`` documents of ``tokens`` tokens in ``windows`` windows."""
        return {TOKENS: self._token_bytes(tokens), OFFSETS: (rows + 1) * INDEX_DTYPE.itemsize,
                WINDOWS: (rows + 1) * INDEX_DTYPE.itemsize, WINDOW_OFFSETS: (windows + 1) * INDEX_DTYPE.itemsize}

    def _start(self, docid_array: np.ndarray, docids_sorted: np.ndarray, sorted_rows: np.ndarray) -> None:
        if self.partial_path.exists():
            # A partial dir without a journal died before its first commit: nothing in it is worth keeping.
            logger.warning("discarding %s: it has no journal (interrupted before its first commit)",
                           self.partial_path)
            shutil.rmtree(self.partial_path)
        self._journal.mkdir(parents=True)
        self._write_docid_files(docid_array, docids_sorted, sorted_rows)
        self._rows_done = 0
        self._num_tokens = 0
        self._num_windows = 0
        self._capped = 0
        self._hashers = {name: BlockHasher(self.block_bytes) for name in _GROWING_FILES}
        # Open for the writer's lifetime (closed by close() or finalize()), not one block.
        self._files = {name: open(self.partial_path / name, "wb") for name in _GROWING_FILES}  # noqa: SIM115
        for name in (OFFSETS, WINDOWS, WINDOW_OFFSETS):
            self._append(name, np.zeros(1, dtype=INDEX_DTYPE))
        self.commit()

    def _write_docid_files(self, docid_array: np.ndarray, docids_sorted: np.ndarray,
                           sorted_rows: np.ndarray) -> None:
        for name, array in ((DOCIDS, docid_array), (DOCIDS_SORTED, docids_sorted),
                            (DOCIDS_SORTED_ROWS, sorted_rows)):
            self._write_static(name, array)

    def _write_static(self, name: str, array: np.ndarray) -> None:
        """Write a file known whole at once (docid tables, content hashes, block checksums), durably."""
        try:
            with open(self.partial_path / name, "wb") as out:
                out.write(_as_bytes(array))
                out.flush()
                os.fsync(out.fileno())
        except OSError as error:
            _raise_if_disk_full(error, self.partial_path / name, self.partial_path)
            raise
        self._static_files[name] = {"bytes": array.nbytes, "sha256": _hash_bytes(array, self.block_bytes)}

    def _load_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads((self._journal / JOURNAL_STATE).read_text(encoding="utf-8"))
            return state if isinstance(state, dict) and "params" in state else None
        except (OSError, ValueError):
            return None

    def _resume(self, state: dict[str, Any], docid_array: np.ndarray, docids_sorted: np.ndarray,
                sorted_rows: np.ndarray) -> None:
        rows, tokens, windows = int(state["rows_done"]), int(state["num_tokens"]), int(state["num_windows"])
        lengths = self._growing_bytes(rows, tokens, windows)
        for name, length in lengths.items():
            file = self.partial_path / name
            actual = file.stat().st_size if file.exists() else -1
            if actual < length:
                raise SidecarCorruptError(
                    f"cannot resume {self.partial_path}: the journal records {length} bytes of {name} but only "
                    f"{max(actual, 0)} are on disk; pass restart=True to start over")
        for name, length in lengths.items():
            os.truncate(self.partial_path / name, length)  # drop whatever was written after the last commit
        for name, position, expected, unit in ((OFFSETS, rows, tokens, "token"),
                                               (WINDOW_OFFSETS, windows, tokens, "token"),
                                               (WINDOWS, rows, windows, "window")):
            with open(self.partial_path / name, "rb") as stream:
                stream.seek(position * INDEX_DTYPE.itemsize)
                last = int(np.frombuffer(stream.read(INDEX_DTYPE.itemsize), dtype=INDEX_DTYPE)[0])
            if last != expected:
                raise SidecarCorruptError(f"cannot resume {self.partial_path}: {name} ends at {unit} {last} but "
                                          f"the journal records {expected}; pass restart=True to start over")
        self._static_files = dict(state.get("static_files", {}))
        docid_files_ok = all(
            name in self._static_files and (self.partial_path / name).exists()
            and (self.partial_path / name).stat().st_size == self._static_files[name]["bytes"]
            for name in (DOCIDS, DOCIDS_SORTED, DOCIDS_SORTED_ROWS))
        if not docid_files_ok:
            self._write_docid_files(docid_array, docids_sorted, sorted_rows)
        if self._codec is not None and (rows or CODEC in self._static_files):
            self._load_codec_file()  # trained before the interruption: the rows written are its codes
        self._hashers = {}
        for name, length in lengths.items():
            saved = _read_block_log(self._journal / f"{name}.blocks")
            hasher = BlockHasher.restore(self.partial_path / name, length, self.block_bytes, saved)
            self._hashers[name] = hasher
            # Keep the log equal to the restored digests, so later appends continue it.
            _write_block_log(self._journal / f"{name}.blocks", hasher.block_digests)
            self._logged_blocks[name] = len(hasher.block_digests)
        self._rows_done, self._num_tokens, self._num_windows = rows, tokens, windows
        self._capped = int(state.get("capped_documents", 0))
        self.build_info = {**state.get("build", {}), **self.build_info}
        self._files = {name: open(self.partial_path / name, "ab") for name in _GROWING_FILES}  # noqa: SIM115
        logger.info("resuming sidecar build %s at row %d of %d", self.partial_path, rows, self.num_docs)

    # ---- the codec ---------------------------------------------------------------------------------------------
    @property
    def codec(self) -> TokenCodec | None:
        """The codec that encodes this sidecar's rows (``None`` under ``fp16``); trained once
        :attr:`codec_sample_tokens` is 0."""
        return self._codec

    @property
    def codec_sample_tokens(self) -> int:
        """How many token vectors the codec wants to train on; 0 when there is no codec or it is trained (a
        resumed build)."""
        return 0 if self._codec is None or self._codec.trained else self._codec.sample_tokens

    def train_codec(self, sample: np.ndarray, token_ids: np.ndarray | None = None) -> None:
        """Train the codec now on ``sample [n, dim]`` (float32; ``token_ids [n]`` for a codec that codes them)
        instead of on the first documents added, e.g. on documents drawn across a whole store (see
        :func:`.transcode.transcode_sidecar`), and store its parameters. Only before any document is added."""
        self._check_writable()
        if self._codec is None or self._codec.trained:
            raise ValueError("train_codec needs an untrained codec (none, or trained before an interruption)")
        if self.rows_done or self._pending:
            raise ValueError("train_codec must come before the first document is added")
        self._codec.train(np.ascontiguousarray(sample, dtype=np.float32), token_ids)
        self._store_codec()

    def adopt_codec(self, parameters: np.ndarray, trained_on: int = 0) -> None:
        """Use a codec trained elsewhere instead of training one: ``parameters`` are a trained codec's
        :meth:`.codecs.TokenCodec.parameters` with this writer's codec settings, e.g. one codec trained once for every
        shard of a build; ``trained_on`` is the number of tokens it was trained on (for the manifest). Only before
        any document is added."""
        self._check_writable()
        if self._codec is None or self._codec.trained:
            raise ValueError("adopt_codec needs an untrained codec (none, or trained before an interruption)")
        if self.rows_done or self._pending:
            raise ValueError("adopt_codec must come before the first document is added")
        self._codec.load_parameters(np.asarray(parameters, dtype=CODEC_PARAMETER_DTYPE))
        self._codec.trained_on = int(trained_on)
        self._store_codec()

    def _train_codec(self) -> None:
        """Train the codec on the first tokens waiting, store its parameters, then write every waiting document."""
        size = self._codec.sample_tokens
        sample = np.concatenate([tokens for _, tokens, _, _ in self._pending])[:size]
        ids = (np.concatenate([ids for _, _, _, ids in self._pending])[:size] if self._codec.needs_token_ids
               else None)
        self._codec.train(sample, ids)
        self._store_codec()
        pending, self._pending = self._pending, []
        for lengths, tokens, counts, ids in pending:
            self._write_rows(lengths, self._codec.encode(tokens, ids), counts)

    def _checked_token_ids(self, reps: Sequence[Any], token_ids: Sequence[Any] | None) -> np.ndarray | None:
        """``token_ids`` as one int64 array of every rep's ids in order when the codec codes them, else None; refuses
        ids missing, unasked for or of other lengths than their reps, before anything is written."""
        wanted = self._codec is not None and self._codec.needs_token_ids
        if token_ids is None:
            if wanted:
                raise ValueError(f"the {self._codec.name} codec codes each token's id (a word stage): pass token_ids")
            return None
        if not wanted:
            raise ValueError("token_ids are for a codec that codes them (rq with a word stage), not this sidecar's")
        if len(token_ids) != len(reps):
            raise ValueError(f"{len(token_ids)} token id arrays for {len(reps)} reps")
        arrays = [np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids, dtype=np.int64).reshape(-1)
                  for ids in token_ids]
        for position, (ids, rep) in enumerate(zip(arrays, reps)):
            if len(ids) != len(rep):
                raise ValueError(f"rep {position} has {len(rep)} vectors but {len(ids)} token ids")
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)

    def _store_codec(self) -> None:
        """Write the trained codec's parameters to ``codec.bin`` (fsynced) and record them for the manifest."""
        parameters = self._codec.parameters()
        file = self.partial_path / CODEC
        try:
            with open(file, "wb") as out:
                out.write(_as_bytes(parameters))
                out.flush()
                os.fsync(out.fileno())
        except OSError as error:
            _raise_if_disk_full(error, file, self.partial_path)
            raise
        self._static_files[CODEC] = {"bytes": parameters.nbytes, "sha256": _hash_bytes(parameters, self.block_bytes),
                                     "codec": self._codec.manifest_entry()}

    def _load_codec_file(self) -> None:
        entry, file = self._static_files.get(CODEC), self.partial_path / CODEC
        if entry is None or not file.exists() or file.stat().st_size != entry["bytes"]:
            raise SidecarCorruptError(f"cannot resume {self.partial_path}: rows were written with a codec whose "
                                      f"parameters ({CODEC}) are missing or damaged; pass restart=True to start over")
        parameters = np.fromfile(file, dtype=CODEC_PARAMETER_DTYPE)
        if _hash_bytes(parameters, self.block_bytes) != entry["sha256"]:
            raise SidecarCorruptError(f"cannot resume {self.partial_path}: {CODEC} does not match its checksum; "
                                      f"pass restart=True to start over")
        self._codec = codec_from_manifest(entry["codec"], self.dim, parameters, source=str(file))

    # ---- internals -----------------------------------------------------------------------------------------------
    def _append(self, name: str, array: np.ndarray) -> None:
        data = _as_bytes(array)
        try:
            self._files[name].write(data)
        except OSError as error:
            _raise_if_disk_full(error, self.partial_path / name, self.partial_path)
            raise
        self._hashers[name].update(data)

    def _fail(self) -> None:
        """After a failed write or commit: file positions and buffers are unknown, so close the files now (a buffer
        flushed later could land after a resumed writer's appends). The last committed journal stays authoritative:
        a new writer resumes from it."""
        self._broken = True
        self._close_files()

    def _check_writable(self) -> None:
        if self._finalized:
            raise SidecarError(f"sidecar writer for {self.path} is already finalized")
        if self._closed:
            raise SidecarError(f"sidecar writer for {self.path} is closed; create a new writer to resume")
        if self._broken:
            raise SidecarError(f"a write to {self.partial_path} failed; close() and create a new writer to resume")

    def _check_target(self) -> None:
        """Fail before any encoding work when ``path`` could not be replaced at the end."""
        if not self.path.exists():
            return
        if not self.path.is_dir() or not ((self.path / MANIFEST).exists() or not any(self.path.iterdir())):
            raise SidecarExistsError(f"{self.path} exists and is not a sidecar; refusing to replace it")
        if (self.path / MANIFEST).exists() and not self.overwrite:
            raise SidecarExistsError(f"sidecar {self.path} already exists; pass overwrite=True to replace it")

    def _replace_target(self) -> None:
        self._check_target()
        old = None
        if self.path.exists():
            old = self.path.with_name(f"{self.path.name}.replaced-{os.getpid()}")
            os.replace(self.path, old)
        os.replace(self.partial_path, self.path)
        fsync_dir(self.path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _close_files(self) -> None:
        for stream in getattr(self, "_files", {}).values():
            try:
                stream.close()
            except OSError:
                if not self._broken:
                    raise
        self._files = {}
        self._closed = True


# ---- helpers -----------------------------------------------------------------------------------------------------
def _raise_if_disk_full(error: BaseException, file: Path, partial: Path) -> None:
    if isinstance(error, OSError) and not isinstance(error, SidecarError) and error.errno in _DISK_FULL_ERRNOS:
        raise SidecarDiskFullError(file, partial, error) from error


def _check_windows(windows: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest's window settings: ``window``, ``stride``, ``capacity`` (tokens, or None when not recorded)
    and ``max_windows`` (default 1)."""
    windows = dict(windows or {})
    unknown = sorted(set(windows) - set(_WINDOW_SETTINGS))
    if unknown:
        raise ValueError(f"unknown window settings {unknown}; expected {list(_WINDOW_SETTINGS)}")
    settings = {name: windows.get(name) for name in _WINDOW_SETTINGS}
    settings["max_windows"] = settings["max_windows"] or 1
    for name, value in settings.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"window setting {name} must be a positive integer, not {value!r}")
    return settings


def _make_codec(name: str | None, dim: int, options: Mapping[str, Any] | None):
    """The untrained codec ``name`` (``None`` for the identity ``fp16``); faiss is imported only for a real one."""
    if name is not None and name not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {name!r}")
    if not is_compressed(name):
        if options:
            raise ValueError(f"codec options {sorted(options)} need a compressed codec, not {name or 'fp16'}")
        return None
    return TokenCodec(name, dim, **dict(options or {}))


def _check_content(hashes: np.ndarray | None, index: Mapping[str, Any], num_docs: int,
                   shard: bool) -> np.ndarray | None:
    """The per-document text hashes to store (``[num_docs]`` uint64, the rows' slice for a shard), checked against
    the index identity's ``content`` digest: given exactly when the identity has one."""
    if not index.get("content"):
        if hashes is not None:
            raise ValueError("content_hashes given but the index identity has no 'content' digest")
        return None
    if hashes is None:
        raise ValueError("the index identity has a 'content' digest: pass the documents' content_hashes")
    hashes = np.ascontiguousarray(hashes, dtype=CONTENT_DTYPE)
    if hashes.shape != (num_docs,):
        raise ValueError(f"content_hashes has shape {hashes.shape}, expected ({num_docs},)")
    from ..index.content import content_digest

    if not shard and content_digest(hashes) != index["content"]:
        raise ValueError("content_hashes do not hash to the index identity's 'content' digest")
    return hashes


def _check_model(model: Mapping[str, Any]) -> dict[str, Any]:
    model = json_normalized(dict(model))
    missing = [key for key in ("model_type", "store_variant", "fingerprint") if not model.get(key)]
    if missing:
        raise ValueError(f"model info lacks {', '.join(missing)}")
    try:
        int(str(model["fingerprint"]), 16)
    except ValueError:
        raise ValueError(f"model fingerprint must be a hex string, not {model['fingerprint']!r}") from None
    return model


def _check_shard(shard: Mapping[str, Any], num_docs: int, index: Mapping[str, Any]) -> None:
    missing = [key for key in ("build_id", "index", "count", "row_start", "row_end", "num_docs") if key not in shard]
    if missing:
        raise ValueError(f"shard info lacks {', '.join(missing)}")
    if int(shard["row_end"]) - int(shard["row_start"]) != num_docs:
        raise ValueError(f"{num_docs} docids given for shard rows [{shard['row_start']}, {shard['row_end']})")
    if "num_docs" in index and int(index["num_docs"]) != int(shard["num_docs"]):
        raise ValueError(f"the shard belongs to a sidecar of {shard['num_docs']} documents but the index has "
                         f"{index['num_docs']}")


def _encode_docids(docids: Sequence[str]) -> np.ndarray:
    """``[num_docs]`` fixed-width UTF-8 bytes ``S{w}``, filled in chunks (no list of 8.8M bytes objects at once)."""
    def encoded(docid: str) -> bytes:
        if not isinstance(docid, str):
            raise TypeError(f"docids must be str, not {type(docid).__name__} ({docid!r})")
        if "\x00" in docid:  # fixed-width numpy bytes drop trailing NULs: it would read back as another docid
            raise ValueError(f"docid {docid!r} contains a NUL character, which the sidecar cannot store")
        return docid.encode("utf-8")

    width = max((len(encoded(docid)) for docid in docids), default=1)
    array = np.empty(len(docids), dtype=docid_dtype(width))
    chunk: list[bytes] = []
    start = 0
    for docid in docids:
        chunk.append(encoded(docid))
        if len(chunk) == _DOCID_CHUNK:
            array[start:start + len(chunk)] = chunk
            start += len(chunk)
            chunk = []
    array[start:start + len(chunk)] = chunk
    return array


def _as_bytes(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B")


def _hash_bytes(array: np.ndarray, block_bytes: int) -> str:
    hasher = BlockHasher(block_bytes)
    hasher.update(_as_bytes(array))
    return hasher.hexdigest()


def _read_block_log(file: Path) -> list[bytes]:
    """Digests of a block log; stops at a torn last line (a crash mid-append), the rest is re-read from data."""
    digests = []
    if file.exists():
        for line in file.read_text(encoding="ascii", errors="replace").split("\n"):
            if len(line) != 64:
                break
            try:
                digests.append(bytes.fromhex(line))
            except ValueError:
                break
    return digests


def _write_block_log(file: Path, digests: list[bytes]) -> None:
    write_text_atomic(file, "".join(digest.hex() + "\n" for digest in digests))


def _to_storage(reps: Sequence[Any], dim: int, dtype: str, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document lengths ``[B]`` and all their token vectors ``[sum(lengths), dim]`` in the storage dtype."""
    lengths = np.empty(len(reps), dtype=np.int64)
    for i, rep in enumerate(reps):
        shape = tuple(rep.shape)
        if len(shape) != 2 or shape[1] != dim:
            raise ValueError(f"document at row {first_row + i}: expected a [len, {dim}] matrix, got shape {shape}")
        lengths[i] = shape[0]
    storage = STORAGE_DTYPES[dtype]
    if dtype != "bfloat16" and all(isinstance(rep, np.ndarray) for rep in reps):
        with np.errstate(over="ignore"):  # overflow to inf is reported below, with a better message
            tokens = np.concatenate(reps, axis=0).astype(storage, copy=False)
        finite = np.isfinite(tokens)
    else:
        import torch

        target = getattr(torch, dtype)
        tensors = [torch.as_tensor(rep).detach().to("cpu", target) for rep in reps]
        converted = torch.cat(tensors, dim=0).contiguous()
        finite = torch.isfinite(converted).numpy()
        tokens = (converted.view(torch.int16).numpy().view(storage) if dtype == "bfloat16"
                  else converted.numpy().astype(storage, copy=False))
    if not finite.all():
        where = int(np.searchsorted(np.cumsum(lengths), int(np.flatnonzero(~finite.all(axis=1))[0]), side="right"))
        hint = " (float16 overflows above 65504: store bfloat16 or float32)" if dtype == "float16" else ""
        raise ValueError(f"document at row {first_row + where} has non-finite values after conversion to "
                         f"{dtype}{hint}")
    return lengths, tokens

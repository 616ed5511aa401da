"""Full integrity check of a sidecar, sharded or not: sizes, checksums (streamed), offsets and docid tables. Reads every
byte once."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from .format import (
    BLOCK_CHECKSUMS,
    CHECKSUM_ALGORITHM,
    DOCIDS,
    DOCIDS_SORTED,
    DOCIDS_SORTED_ROWS,
    MANIFEST,
    OFFSETS,
    REBUILD_ADVICE,
    WINDOW_OFFSETS,
    WINDOWS,
    Manifest,
    SidecarError,
    check_directory,
    file_checksum,
    offset_problems,
    read_manifest,
    short_hash,
    size_problems,
    window_problems,
)
from .integrity import BlockChecker
from .shards import coverage_problems, entry_problem, is_sharded, read_sharded_manifest

logger = logging.getLogger(__name__)

_CHUNK = 1 << 22  # entries per step of the structural checks, so memory stays bounded on 8.8M-document sidecars


def verify_sidecar(path: str | os.PathLike) -> list[str]:
    """Every problem found in the sidecar at ``path``, one readable line each; an empty list means it is intact.

    Checks: the manifest parses; every data file exists with the size its shape implies; every file's checksum;
    offsets start at 0, never decrease and end at ``num_tokens``; the window map (format 3) gives every row a window
    and agrees with the offsets; sorted docids are strictly increasing and map
    back to the row-order docids through ``docids_sorted_rows``.
    """
    path = Path(path)
    if is_sharded(path):
        return verify_sharded(path)  # every shard, their coverage and that they belong to the build
    try:
        check_directory(path)
        manifest = read_manifest(path)
    except SidecarError as error:
        return [str(error)]
    problems = size_problems(manifest, path)
    sized = {name for name in manifest.data_files
             if not any(problem.startswith(f"{name}:") for problem in problems)}
    intact = set()  # files whose sha256 matches the manifest
    algorithm = manifest.checksum.get("algorithm")
    if algorithm != CHECKSUM_ALGORITHM:
        problems.append(f"manifest.json: unknown checksum algorithm {algorithm!r}")
    else:
        for name in manifest.data_files:  # codec.bin too, in a compressed sidecar
            if name not in sized:
                continue
            logger.info("hashing %s", path / name)
            actual = file_checksum(path / name, manifest.block_bytes)
            recorded = manifest.files[name].sha256
            if actual == recorded:
                intact.add(name)
            else:
                problems.append(f"{name}: checksum mismatch: the manifest records {short_hash(recorded)} but the "
                                f"file hashes to {short_hash(actual)} (its content changed since the build)")
    arrays = {name: _open(path, manifest, name) for name in sized}
    # The block hashes a reader checks on first read must agree with files whose sha256 does (a file whose sha256
    # differs is reported above already).
    if BLOCK_CHECKSUMS in arrays and BLOCK_CHECKSUMS in intact:
        checker = BlockChecker(path, manifest, arrays.__getitem__)
        for name in manifest.block_files:
            if name in intact:
                problems += checker.problems(name)
    if OFFSETS in arrays:
        offsets = offset_problems(arrays[OFFSETS], manifest.num_tokens, manifest.files[OFFSETS].dtype)
        problems += offsets
        if not offsets and {WINDOWS, WINDOW_OFFSETS} <= arrays.keys():
            problems += window_problems(arrays[WINDOWS], arrays[WINDOW_OFFSETS], arrays[OFFSETS],
                                        manifest.num_windows)
    if {DOCIDS, DOCIDS_SORTED, DOCIDS_SORTED_ROWS} <= arrays.keys():
        problems += _docid_problems(arrays[DOCIDS], arrays[DOCIDS_SORTED], arrays[DOCIDS_SORTED_ROWS])
    return problems


def verify_against_index(path: str | os.PathLike, index, *, examples: int = 5, progress: bool = True) -> list[str]:
    """Every row whose docid in the sidecar at ``path`` differs from the docid of the same row in ``index`` (a
    Lucene index path, prebuilt name or open searcher), a document-count mismatch, and the documents whose text
    changed since the build (their text hashes differ from the index's): the full check of the row ↔ docid join
    that opening a sidecar only samples. Reads every document's docid from the index once, so it takes minutes at
    MS MARCO scale.
    """
    from tqdm.auto import tqdm

    from ..index import index_identity, open_searcher
    from .sharded_reader import open_sidecar

    reader = open_sidecar(path)
    searcher = open_searcher(index) if isinstance(index, (str, os.PathLike)) else index
    try:
        num_docs = int(searcher.num_docs)
        if num_docs != reader.num_docs:
            return [f"the index has {num_docs} documents, the sidecar {reader.num_docs} rows"]
        mismatched, found = 0, []
        for row in tqdm(range(num_docs), desc="compare docids", unit="doc", disable=not progress):
            indexed, stored = searcher.doc(row).docid(), reader.docid(row)
            if indexed != stored:
                mismatched += 1
                if len(found) < examples:
                    found.append(f"row {row}: the index holds '{indexed}', the sidecar '{stored}'")
        changed = [] if mismatched else _changed_texts(reader, index_identity(searcher), path, examples)
    finally:
        if searcher is not index:
            searcher.close()
        reader.close()
    if not mismatched:
        return changed
    return [f"{mismatched} of {num_docs} rows hold another document in the index than in the sidecar (the index "
            f"was re-built in another order, or the sidecar belongs to another index); first: {found[0]}",
            *found[1:]]


def _changed_texts(reader, identity, path: str | os.PathLike, examples: int) -> list[str]:
    """The documents (count and first docids) whose text in the index differs from the text the sidecar's vectors
    were encoded from, as one problem line; none when the sidecar or the index records no text hashes."""
    if not reader.index.get("content") or not identity.get("content"):
        return []
    if reader.index["content"] == identity["content"]:
        return []
    stored, current = reader.content_hashes(), np.asarray(identity.content_hashes())
    if stored.shape != current.shape:
        return [f"the sidecar records {len(stored)} document text hashes, the index {len(current)}"]
    changed = np.flatnonzero(stored != current)
    shown = reader.docids(changed[:examples])
    more = ", ..." if len(changed) > len(shown) else ""
    return [f"{len(changed)} of {len(stored)} documents have other texts in the index than the sidecar's vectors "
            f"were encoded from ({', '.join(shown)}{more}): they are stale; "
            + REBUILD_ADVICE.format(path=path).replace("--index INDEX", f"--index {identity.path or 'INDEX'}")]


def _open(path: Path, manifest: Manifest, name: str) -> np.ndarray:
    dtype, shape = manifest.expected_layout()[name]
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path / name, dtype=dtype, mode="r", shape=shape)


def _docid_problems(docids: np.ndarray, docids_sorted: np.ndarray, sorted_rows: np.ndarray) -> list[str]:
    num_docs = len(docids)
    seen = np.zeros(num_docs, dtype=bool)
    for start in range(0, num_docs, _CHUNK):
        chunk_sorted = np.asarray(docids_sorted[start:start + _CHUNK + 1])
        if (chunk_sorted[1:] <= chunk_sorted[:-1]).any():
            position = start + int(np.flatnonzero(chunk_sorted[1:] <= chunk_sorted[:-1])[0])
            return [f"{DOCIDS_SORTED}: not strictly increasing at position {position} (unsorted or duplicate docid)"]
        rows = np.asarray(sorted_rows[start:start + _CHUNK])
        if ((rows < 0) | (rows >= num_docs)).any():
            return [f"{DOCIDS_SORTED_ROWS}: row out of range [0, {num_docs}) near position {start}"]
        if (docids[rows] != chunk_sorted[:len(rows)]).any():
            position = start + int(np.flatnonzero(docids[rows] != chunk_sorted[:len(rows)])[0])
            return [f"{DOCIDS_SORTED_ROWS}: position {position} points to row {int(sorted_rows[position])}, whose "
                    f"docid differs from {DOCIDS_SORTED}"]
        seen[rows] = True
    if not seen.all():
        return [f"{DOCIDS_SORTED_ROWS}: row {int(np.flatnonzero(~seen)[0])} is never referenced"]
    return []


def verify_sharded(path: str | os.PathLike) -> list[str]:
    """Every problem of a sharded sidecar: its manifest, the row coverage, and each shard fully verified (sizes,
    checksums, offsets, docids) and checked to belong to this build. Problems in a shard are prefixed by its path."""
    path = Path(path)
    try:
        check_directory(path)
        manifest = read_sharded_manifest(path)
    except SidecarError as error:
        return [str(error)]
    entries = manifest.shards
    problems = coverage_problems([(entry.path, entry.row_start, entry.row_end) for entry in entries],
                                 manifest.num_docs)
    if sum(entry.num_tokens for entry in entries) != manifest.num_tokens:
        problems.append(f"{MANIFEST}: num_tokens={manifest.num_tokens} but the shards list "
                        f"{sum(entry.num_tokens for entry in entries)} tokens")
    for position, entry in enumerate(entries):
        shard_path = entry.resolve(path)
        shard_problems = verify_sidecar(shard_path)
        problems += [f"{shard_path}: {problem}" for problem in shard_problems]
        if (shard_path / MANIFEST).is_file():
            try:
                problem = entry_problem(manifest, path, position, read_manifest(shard_path))
            except SidecarError:
                continue  # verify_sidecar reported the unreadable manifest
            if problem:
                problems.append(problem)
    return problems

"""A hash of every document's text in an index, in row order: what binds a sidecar to the texts it encoded.

Docids and their order say which document a row holds, not what it says: an index rebuilt from edited texts keeps
both. Each document's hash is the 8-byte BLAKE2b of its UTF-8 text as :func:`~pyserini_mores.index.document_text`
returns it (the text a sidecar build encodes); the index's ``content`` digest is the sha256 of those hashes
(``[num_docs]`` little-endian uint64). They are computed once per index, reading every document's stored text, and
cached beside the index in ``<index>.sidecars/index-content.{bin,json}``, keyed by the sha256 of the index's
``segments_N`` file, which Lucene writes anew (with a random commit id) on every build or change of the index.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import write_json_atomic

logger = logging.getLogger(__name__)

CONTENT_HASH = "blake2b-64 of the utf-8 document text"
CONTENT_DTYPE = np.dtype("<u8")
CACHE_BIN = "index-content.bin"
CACHE_JSON = "index-content.json"


def text_hash(text: str) -> int:
    """The 64-bit hash of one document's text."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def hash_texts(texts: Iterable[str], count: int) -> np.ndarray:
    """``[count]`` uint64 hashes of ``texts`` (exactly ``count`` of them)."""
    hashes = np.fromiter((text_hash(text) for text in texts), dtype=CONTENT_DTYPE, count=count)
    return hashes


def content_digest(hashes: np.ndarray) -> str:
    """The index-level digest of per-document hashes (sha256 of their little-endian bytes)."""
    return hashlib.sha256(np.ascontiguousarray(hashes, dtype=CONTENT_DTYPE).tobytes()).hexdigest()


@dataclass(frozen=True)
class IndexContent:
    """An index's document text hashes: ``digest`` now, the ``[num_docs]`` array on demand (memory-mapped)."""

    digest: str
    num_docs: int
    load: Callable[[], np.ndarray]


def cache_dir(index_path: str | os.PathLike) -> Path:
    index_path = Path(index_path)
    return index_path.parent / f"{index_path.name}.sidecars"


def commit_key(index_path: str | os.PathLike) -> dict[str, str] | None:
    """The index's latest ``segments_N`` file and the sha256 of its bytes (a few hundred bytes to read), or None."""
    segments = sorted(Path(index_path).glob("segments_*"), key=lambda file: _generation(file.name))
    if not segments:
        return None
    return {"segments": segments[-1].name, "segments_sha256": hashlib.sha256(segments[-1].read_bytes()).hexdigest()}


def _generation(name: str) -> int:
    try:
        return int(name.split("_", 1)[1], 36)
    except (IndexError, ValueError):
        return -1


def cached_content(index_path: str | os.PathLike, num_docs: int) -> IndexContent | None:
    """The cached hashes of the index at ``index_path`` when they are those of its current commit, else None."""
    key = commit_key(index_path)
    folder = cache_dir(index_path)
    try:
        record = json.loads((folder / CACHE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (key is None or not isinstance(record, dict) or record.get("commit") != key
            or record.get("num_docs") != num_docs or record.get("hash") != CONTENT_HASH
            or not isinstance(record.get("digest"), str)):
        return None
    file = folder / CACHE_BIN
    if not file.is_file() or file.stat().st_size != num_docs * CONTENT_DTYPE.itemsize:
        return None
    return IndexContent(record["digest"], num_docs, functools.partial(_load_cached, file, record["digest"]))


def _load_cached(file: Path, digest: str) -> np.ndarray:
    """The cached hashes in ``file``, refused when they do not hash to ``digest`` (a module-level function, so that
    an identity holding it pickles to worker processes)."""
    hashes = np.fromfile(file, dtype=CONTENT_DTYPE)
    if content_digest(hashes) != digest:
        raise ValueError(f"{file} does not match its digest in {file.with_name(CACHE_JSON)}; delete both to "
                         "recompute them")
    return hashes


def in_memory(hashes: np.ndarray) -> IndexContent:
    """Hashes that are not cached on disk."""
    return IndexContent(content_digest(hashes), int(len(hashes)), functools.partial(np.asarray, hashes))


def store_content(index_path: str | os.PathLike, hashes: np.ndarray) -> IndexContent:
    """Cache ``hashes`` for the index's current commit (a warning, and nothing cached, when the place is read-only)."""
    digest = content_digest(hashes)
    folder = cache_dir(index_path)
    key = commit_key(index_path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{CACHE_BIN}.tmp"
        hashes.astype(CONTENT_DTYPE).tofile(temporary)
        os.replace(temporary, folder / CACHE_BIN)
        write_json_atomic(folder / CACHE_JSON, {"commit": key, "num_docs": int(len(hashes)), "hash": CONTENT_HASH,
                                                "digest": digest})
    except OSError as error:
        logger.warning("cannot cache the index's document hashes in %s (%s): they are recomputed next time",
                       folder, error)
        return in_memory(hashes)
    return IndexContent(digest, int(len(hashes)), functools.partial(_load_cached, folder / CACHE_BIN, digest))

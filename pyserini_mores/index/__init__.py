"""Lucene indexes through Pyserini: resolve a path or prebuilt name, build small indexes, read stored text, and
compute the identity a sidecar is bound to. ``python -m pyserini_mores.index`` (:mod:`.__main__`) builds one."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .._jvm import ensure_jvm, import_pyserini
from ..errors import UserFixableError
from ..formats import read_collection
from .content import IndexContent, cached_content, hash_texts, in_memory, store_content

logger = logging.getLogger(__name__)

#: Pyserini's search CLI silently switches to these BM25 parameters for its prebuilt MS MARCO indexes; so do we,
#: so that `--index msmarco-passage` gives Pyserini's numbers. Explicit --k1/--b win.
PREBUILT_BM25 = {
    "msmarco-passage": (0.82, 0.68),
    "msmarco-v1-passage": (0.82, 0.68),
    "msmarco-v1-passage-slim": (0.82, 0.68),
    "msmarco-v1-passage-full": (0.82, 0.68),
    "msmarco-v1-doc": (4.46, 0.82),
    "msmarco-doc": (4.46, 0.82),
}
DEFAULT_BM25 = (0.9, 0.4)
IDENTITY_SAMPLES = 1024


class IndexNotFoundError(FileNotFoundError):
    """Neither a Lucene index directory nor a prebuilt index that is (or can be) cached."""


@dataclass(frozen=True)
class ResolvedIndex:
    path: Path
    prebuilt_name: str | None = None

    @property
    def default_bm25(self) -> tuple[float, float]:
        return PREBUILT_BM25.get(self.prebuilt_name or "", DEFAULT_BM25)


def resolve_index(name_or_path: str | os.PathLike, download: bool = True) -> ResolvedIndex:
    """A Lucene index directory, or a Pyserini prebuilt index name (cached, or downloaded when a network is there).

    Raises:
        IndexNotFoundError: with a message saying what was tried and what to do instead.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if not any(path.glob("segments_*")):
            raise IndexNotFoundError(f"{path} is a directory but not a Lucene index (no segments_* file)")
        return ResolvedIndex(path.resolve())
    if os.sep in text or text.startswith("."):
        raise IndexNotFoundError(f"index directory {text} does not exist")
    info = _prebuilt_info(text)
    if info is None:
        raise IndexNotFoundError(
            f"'{text}' is neither an index directory nor a Pyserini prebuilt index name "
            "(e.g. msmarco-v1-passage); pass the path of a Lucene index"
        )
    cached = _cached_prebuilt_path(text, info)
    if cached is not None:
        return ResolvedIndex(cached, text)
    if not download:
        raise IndexNotFoundError(f"prebuilt index '{text}' is not in the Pyserini cache ({_cache_dir()})")
    util = import_pyserini("pyserini.util")
    try:
        return ResolvedIndex(Path(util.download_prebuilt_index(text, verbose=True)), text)
    except Exception as error:  # network errors come in many types (URLError, ValueError, OSError, ...)
        raise IndexNotFoundError(
            f"prebuilt index '{text}' is not cached in {_cache_dir()} and could not be downloaded ({error}). "
            "Offline, build an index with `python -m pyserini.index.lucene` and pass its path to --index."
        ) from error


def _prebuilt_info(name: str) -> dict | None:
    info = import_pyserini("pyserini.prebuilt_index_info")
    return info.TF_INDEX_INFO.get(name)


def _cache_dir() -> Path:
    custom = os.environ.get("PYSERINI_CACHE")
    return Path(custom) if custom else Path.home() / ".cache" / "pyserini"


def _cached_prebuilt_path(name: str, info: dict) -> Path | None:
    filename = info.get("filename") or info["urls"][0].split("/")[-1]
    stem = filename.split(".tar.gz")[0]
    candidate = _cache_dir() / "indexes" / f"{stem}.{info['md5']}"
    return candidate if candidate.is_dir() else None


def open_searcher(index: str | os.PathLike | ResolvedIndex):
    """A Pyserini ``LuceneSearcher`` over a resolved index."""
    resolved = index if isinstance(index, ResolvedIndex) else resolve_index(index)
    lucene = import_pyserini("pyserini.search.lucene")
    return lucene.LuceneSearcher(str(resolved.path))


def document_text(document) -> str:
    """The text of a Pyserini ``Document``: its stored ``contents``, else the ``contents``/``text`` of its raw JSON.

    Raises:
        MissingDocumentTextError: when the index stores neither (built without ``--storeRaw``/``--storeContents``).
    """
    contents = document.contents()
    if contents:
        return contents
    raw = document.raw()
    if raw is None:
        if contents is None:
            raise MissingDocumentTextError(
                f"the index stores no text for document {document.docid()} (built without --storeRaw or "
                "--storeContents); pass --collection with the collection file"
            )
        return ""
    try:
        record = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(record, dict):
        for key in ("contents", "text", "passage", "body"):
            if isinstance(record.get(key), str):
                title = record.get("title")
                return f"{title} {record[key]}" if isinstance(title, str) and title else record[key]
    return raw


class MissingDocumentTextError(ValueError):
    """The index stores neither contents nor raw text for a document."""


def fetch_texts(searcher, docids: list[str]) -> list[str]:
    """Texts of documents by collection docid, from the index's stored fields.

    Raises:
        KeyError: when docids are not in the index (e.g. a run from another collection), counting them all.
    """
    texts, missing = [], []
    for docid in docids:
        document = searcher.doc(docid)
        if document is None:
            missing.append(docid)
        elif not missing:
            texts.append(document_text(document))
    if missing:
        unique = list(dict.fromkeys(missing))
        raise KeyError(f"{len(unique)} of {len(set(docids))} documents are not in the index "
                       f"(e.g. {', '.join(map(str, unique[:3]))})")
    return texts


def iter_index_documents(searcher, start_row: int = 0) -> Iterator[tuple[int, str, str]]:
    """``(row, docid, text)`` for every document in Lucene internal order (the sidecar's row order)."""
    for row in range(start_row, searcher.num_docs):
        document = searcher.doc(row)
        if document is None:
            raise MissingDocumentTextError(f"Lucene document {row} cannot be read (deleted?)")
        yield row, document.docid(), document_text(document)


def index_docids(searcher) -> list[str]:
    """Every collection docid in row (Lucene internal) order."""
    return [searcher.doc(row).docid() for row in range(searcher.num_docs)]


class IndexIdentity(dict):
    """An index identity (a plain dict: ``num_docs``, ``signature``, ``content`` when the index stores text) that
    also carries where it came from: ``path`` (the index directory) and ``content_hashes`` (a callable returning the
    ``[num_docs]`` uint64 text hashes, or None), so that a sidecar built from other texts can name them."""

    path: str | None = None
    content_hashes = None


def index_identity(searcher, *, content: bool = True) -> IndexIdentity:
    """What a sidecar is bound to: the document count, a hash of the docids at evenly spaced rows, and the digest of
    every document's text hash (``content``; :mod:`.content`), when the index stores text.

    The docid signature costs at most :data:`IDENTITY_SAMPLES` stored-field reads; the content digest is read from
    its cache beside the index (computed once per index build, reading every document: see :func:`index_content`).
    Stable across machines and copies of the same index; a rebuilt index whose row order or texts changed gets
    another identity. ``content=False`` leaves the content digest out (for identities that never bind vectors to
    texts, such as a search's resume identity: no first-use pass over an uncached index's texts).
    """
    num_docs = int(searcher.num_docs)
    step = max(1, num_docs // IDENTITY_SAMPLES)
    rows = sorted(set(range(0, num_docs, step)) | ({num_docs - 1} if num_docs else set()))
    digest = hashlib.sha256(str(num_docs).encode())
    for row in rows:
        digest.update(f"{row}:{searcher.doc(row).docid()}\n".encode())
    identity = IndexIdentity(num_docs=num_docs, signature=digest.hexdigest())
    hashes = index_content(searcher) if content else None
    if hashes is not None:
        identity["content"] = hashes.digest
        identity.content_hashes = hashes.load
    identity.path = getattr(searcher, "index_dir", None)
    return identity


def index_content(searcher, *, progress: bool = True) -> IndexContent | None:
    """The text hashes of every document of ``searcher``'s index (:mod:`.content`): from the cache beside the index
    when it belongs to the index's current commit, else computed (every stored text read once) and cached. None
    when the index stores no text (its sidecars are built from ``--collection``; their content is not checked)."""
    num_docs = int(searcher.num_docs)
    index_dir = getattr(searcher, "index_dir", None)
    if index_dir is not None:
        cached = cached_content(index_dir, num_docs)
        if cached is not None:
            return cached
    if num_docs:
        try:
            document_text(searcher.doc(0))
        except MissingDocumentTextError:
            return None
    from tqdm.auto import tqdm

    logger.info("hashing the text of %d documents of %s (once per index build)", num_docs, index_dir)
    documents = tqdm(iter_index_documents(searcher), total=num_docs, unit="doc", desc="hash document texts",
                     disable=not progress or num_docs < 10_000)
    hashes = hash_texts((text for _, _, text in documents), num_docs)
    if index_dir is None:
        return in_memory(hashes)
    return store_content(index_dir, hashes)


def build_lucene_index(input_dir: str | os.PathLike, index_dir: str | os.PathLike, threads: int = 1,
                       collection: str = "JsonCollection") -> Path:
    """Build a BM25 Lucene index of a JsonCollection directory (``{"id", "contents"}`` lines) with Pyserini,
    storing positions, doc vectors and raw text (what the sidecar build and rerankers read)."""
    ensure_jvm()
    from jnius import autoclass

    index_dir = Path(index_dir)
    args = ["-collection", collection, "-input", str(input_dir), "-index", str(index_dir),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
            "-storePositions", "-storeDocvectors", "-storeRaw", "-quiet"]
    autoclass("io.anserini.index.IndexCollection").main(args)
    if not any(index_dir.glob("segments_*")):
        raise RuntimeError(f"Pyserini did not produce an index in {index_dir}")
    return index_dir


class BlankDocumentsError(UserFixableError, ValueError):
    """``strict`` indexing met documents Lucene would not index (empty or whitespace-only text)."""


@dataclass(frozen=True)
class IndexReport:
    """What :func:`index_collection` did: the index, how many documents it holds, and the docids it left out."""

    path: Path
    num_docs: int
    skipped: list[str]


def is_blank(text: str) -> bool:
    """Whether Anserini refuses ``text`` as an empty document: nothing left after Java's ``String.trim()``, which
    strips every character up to U+0020 (control characters included, not Unicode spaces such as U+00A0)."""
    return all(ord(character) <= 0x20 for character in text)


def index_collection(collection: str | os.PathLike, index_dir: str | os.PathLike, threads: int = 1, *,
                     strict: bool = False) -> IndexReport:
    """Build a Lucene index of an MS MARCO TSV / JSONL collection file or JsonCollection directory, then hash every
    indexed document's text (:func:`index_content`, cached beside the index).

    The text is rewritten as a JsonCollection beside the index and indexed into ``<index>.partial``, which is
    renamed into place only when Lucene has finished: an interrupted build never looks like an index. Documents
    whose text is empty or whitespace only are left out (Lucene's document generator refuses them) and reported.

    Raises:
        FileExistsError: ``index_dir`` already exists.
        BlankDocumentsError: ``strict`` and some documents are blank (nothing is written).
    """
    index_dir = Path(index_dir)
    if index_dir.exists():
        raise FileExistsError(f"{index_dir} already exists; remove it or choose another --index")
    if strict:
        blank = [docid for docid, text in read_collection(collection) if is_blank(text)]
        if blank:
            raise BlankDocumentsError(f"{len(blank)} document(s) of {collection} have empty or whitespace-only "
                                      f"text and would not be indexed ({_first(blank)}); nothing was written")
    staging = index_dir.with_name(index_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    jsonl_dir = staging / "_jsonl"
    jsonl_dir.mkdir(parents=True)
    count, skipped = 0, []
    with open(jsonl_dir / "docs.jsonl", "w", encoding="utf-8") as out:
        for docid, text in read_collection(collection):
            if is_blank(text):
                skipped.append(docid)
                continue
            out.write(json.dumps({"id": docid, "contents": text}, ensure_ascii=False) + "\n")
            count += 1
    built = build_lucene_index(jsonl_dir, staging / "index", threads=threads)
    os.replace(built, index_dir)
    shutil.rmtree(staging)
    searcher = open_searcher(ResolvedIndex(index_dir.resolve()))
    try:
        num_docs = int(searcher.num_docs)
        index_content(searcher)
    finally:
        searcher.close()
    if num_docs != count:
        logger.warning("%d documents were written for Lucene but the index holds %d", count, num_docs)
    logger.info("indexed %d documents into %s", num_docs, index_dir)
    return IndexReport(index_dir, num_docs, skipped)


def _first(docids: list[str], shown: int = 5) -> str:
    return ", ".join(docids[:shown]) + (", ..." if len(docids) > shown else "")

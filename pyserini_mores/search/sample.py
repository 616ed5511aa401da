"""The bundled sample behind the embedded default: a slice of debian-packages shipped with the package, indexed and
encoded into a cache directory on first use, so `python -m pyserini_mores.search` works offline with no arguments."""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .._io import write_bytes_atomic
from ..cache import cache_root
from ..formats import read_collection
from ..index import build_lucene_index, open_searcher
from ..sidecar import default_sidecar_path
from ..sidecar.build import build_sidecar
from .searcher import RerankingSearcher

logger = logging.getLogger(__name__)

#: What the no-argument run reranks with: the MaxSim dual encoder trained on debian-packages' training queries
#: (recipe maxsim-debian), shipped as a float16 delta over the pip-installed MiniLM (resources/models/debian-maxsim).
DEFAULT_RERANKER = "maxsim"
DEFAULT_MODEL = "debian-maxsim"
DEFAULT_MODEL_ARGS: dict = {}


@dataclass(frozen=True)
class EmbeddedSample:
    index: Path
    topics: Path
    qrels: Path
    cache: Path


def sample_dir() -> Path:
    return Path(str(resources.files("pyserini_mores") / "resources" / "sample"))


def prepare_sample(cache: Path | None = None) -> EmbeddedSample:
    """Unpack the sample and build its Lucene index once; later calls reuse them (keyed by the sample's hash)."""
    source = sample_dir()
    collection = source / "collection.tsv.gz"
    if not collection.is_file():
        raise FileNotFoundError(f"the embedded sample is missing from the installation ({collection})")
    digest = hashlib.sha256(collection.read_bytes()).hexdigest()[:12]
    cache = (cache or cache_root()) / f"sample-{digest}"
    cache.mkdir(parents=True, exist_ok=True)
    topics, qrels = cache / "queries.dev.tsv", cache / "qrels.dev.txt"
    for name, target in (("queries.dev.tsv.gz", topics), ("qrels.dev.txt.gz", qrels)):
        if not target.is_file():
            write_bytes_atomic(target, gzip.decompress((source / name).read_bytes()))
    index = cache / "index"
    if not index.is_dir():
        logger.info("first run: indexing the embedded sample into %s", index)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            jsonl = Path(tmp) / "jsonl"
            jsonl.mkdir()
            _tsv_to_jsonl(collection, jsonl / "collection.jsonl")
            build_lucene_index(jsonl, Path(tmp) / "index", threads=min(2, os.cpu_count() or 1))
            os.replace(Path(tmp) / "index", index)  # appears whole or not at all
    return EmbeddedSample(index=index, topics=topics, qrels=qrels, cache=cache)


def _tsv_to_jsonl(tsv_gz: Path, jsonl: Path) -> None:
    with open(jsonl, "w", encoding="utf-8") as out:
        for docid, text in read_collection(tsv_gz):
            out.write(json.dumps({"id": docid, "contents": text}) + "\n")


def ensure_sample_sidecar(sample: EmbeddedSample, reranker) -> Path:
    """Build the default reranker's sidecar for the sample index if it is not there yet, encoded in the reranker's
    own precision (``auto``: bf16 where the CPU runs it natively, ~10x faster there; fp32 where bf16 would be
    emulated, ~20x slower); the stored vectors are float16 either way.
    """
    model = reranker.model
    path = default_sidecar_path(sample.index, reranker.name, model)
    if not path.exists():
        logger.info("first run: encoding the sample's documents into %s", path)
        searcher = open_searcher(sample.index)
        try:
            build_sidecar(searcher, model, path, reranker_name=reranker.name, precision=reranker.precision,
                          source="embedded sample")
        finally:
            searcher.close()
    return path


def sample_searcher(sample: EmbeddedSample, reranker="maxsim", **searcher_kwargs) -> RerankingSearcher:
    """A :class:`RerankingSearcher` over the sample whose learned reranker (a name, with ``searcher_kwargs`` for it
    as for :class:`RerankingSearcher`, or its :class:`~pyserini_mores.rerankers.options.RerankerOptions`) reads
    its sidecar, built on first use."""
    searcher = RerankingSearcher(sample.index, reranker, sidecar=None, **searcher_kwargs)
    model = getattr(searcher.reranker, "model", None)
    if model is not None and model.store_width is not None:
        ensure_sample_sidecar(sample, searcher.reranker)
        searcher.attach_sidecar("auto", required=True)
    return searcher

"""Measure what the document content identity costs at scale: hashing every document's text once per index build,
and checking a sidecar's index identity at open.

A synthetic collection of N documents (random words from a fixed vocabulary, ~``--mean-words`` each) is indexed with
``python -m pyserini_mores.index``'s :func:`~pyserini_mores.index.index_collection`, which builds the Lucene index
and then hashes every stored text (:func:`~pyserini_mores.index.index_content`). The script times:

* ``lucene_build_s``: the Lucene build alone (``build_lucene_index`` of the same JsonCollection);
* ``hash_from_index_s``: computing the hashes from the index's stored text (every document read through Pyserini),
  the one-off cost the indexer pays after the build, and what an index built by Pyserini's own indexer pays once;
* ``hash_texts_only_s``: hashing the same texts from memory (the hashing itself, without reading the index);
* ``identity_open_ms``: ``index_identity(searcher)`` with the cache in place, as ``search`` calls it at open
  (1024 sampled docids + the cached digest), median of ``--repeats``;
* ``content_open_ms``: of which the content digest (the cache's key checked: the ``segments_N`` file hashed, the
  cache record read), median of ``--repeats``;
* ``changed_diff_ms``: naming the changed documents when the digest differs (load both ``[N]`` hash arrays and
  compare), median of ``--repeats``.

Example::

    nice -n 15 python integrations/scale/measure_content.py --num-docs 1000000 \\
        --output /work/data/scale/content-1m --json /work/data/scale/measure-content-1m.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def write_collection(path: Path, num_docs: int, mean_words: int, seed: int) -> list[str]:
    """A JsonCollection file of ``num_docs`` documents; returns their texts (for the in-memory hashing time)."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(50_000)])
    lengths = np.clip(rng.poisson(mean_words, num_docs), 1, None)
    texts = []
    with open(path, "w", encoding="utf-8") as out:
        for row, length in enumerate(lengths):
            text = " ".join(vocabulary[rng.integers(0, len(vocabulary), length)])
            texts.append(text)
            out.write(json.dumps({"id": str(row), "contents": text}) + "\n")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-docs", type=int, default=1_000_000)
    parser.add_argument("--mean-words", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, required=True, help="work directory (deleted first)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)

    from pyserini_mores.index import build_lucene_index, index_content, index_identity, open_searcher
    from pyserini_mores.index.content import CACHE_BIN, CACHE_JSON, cache_dir, hash_texts

    shutil.rmtree(args.output, ignore_errors=True)
    (args.output / "jsonl").mkdir(parents=True)
    texts = write_collection(args.output / "jsonl" / "docs.jsonl", args.num_docs, args.mean_words, args.seed)
    figures: dict[str, object] = {"num_docs": args.num_docs, "mean_words": args.mean_words, "cpus": os.cpu_count()}

    started = time.perf_counter()
    index = build_lucene_index(args.output / "jsonl", args.output / "index")
    figures["lucene_build_s"] = round(time.perf_counter() - started, 1)

    started = time.perf_counter()
    hashes = hash_texts(texts, len(texts))
    figures["hash_texts_only_s"] = round(time.perf_counter() - started, 2)
    del texts

    searcher = open_searcher(index)
    started = time.perf_counter()
    content = index_content(searcher, progress=False)
    figures["hash_from_index_s"] = round(time.perf_counter() - started, 1)
    assert content is not None and np.array_equal(content.load(), hashes)

    opens = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        identity = index_identity(searcher)
        opens.append((time.perf_counter() - started) * 1000)
    figures["identity_open_ms"] = round(statistics.median(opens), 1)
    content_opens = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        index_content(searcher, progress=False)
        content_opens.append((time.perf_counter() - started) * 1000)
    figures["content_open_ms"] = round(statistics.median(content_opens), 2)

    stored = hashes.copy()
    stored[args.num_docs // 2] ^= 1  # one changed document
    diffs = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        changed = np.flatnonzero(np.asarray(identity.content_hashes()) != stored)
        diffs.append((time.perf_counter() - started) * 1000)
    assert changed.tolist() == [args.num_docs // 2]
    figures["changed_diff_ms"] = round(statistics.median(diffs), 1)
    figures["cache_bytes"] = sum((cache_dir(index) / name).stat().st_size for name in (CACHE_BIN, CACHE_JSON))
    searcher.close()

    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(args.output)
        shutil.rmtree(cache_dir(index), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

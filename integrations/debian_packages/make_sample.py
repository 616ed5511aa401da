"""Make the embedded sample that `python -m pyserini_mores.search` runs on with no arguments.

A slice of debian-packages (../shared/data/debian-packages): N dev queries, their relevant passages, the BM25
top-`--negatives` passages of each over the FULL collection (so the sample keeps the real collection's hard
negatives instead of becoming easy), and random passages up to `--docs`. Written as gzip'd TSV files to
pyserini_mores/resources/sample/.

    python integrations/debian_packages/make_sample.py --data ../shared/data/debian-packages
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import tempfile
from pathlib import Path

from pyserini_mores.formats import read_collection, read_qrels, read_topics
from pyserini_mores.index import build_lucene_index, open_searcher

OUTPUT = Path(__file__).resolve().parents[2] / "pyserini_mores" / "resources" / "sample"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the debian-packages directory")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--negatives", type=int, default=10, help="BM25 top-k passages kept per query")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)

    data = Path(args.data)
    collection = dict(read_collection(data / "collection.tsv"))
    topics = read_topics(data / "queries.dev.tsv")
    qrels = read_qrels(data / "qrels.dev.txt")
    rng = random.Random(args.seed)
    qids = sorted(qid for qid in topics if qid in qrels)
    chosen = sorted(rng.sample(qids, args.queries), key=int)

    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / "jsonl"
        jsonl.mkdir()
        with open(jsonl / "docs.jsonl", "w") as out:
            for docid, text in collection.items():
                out.write(json.dumps({"id": docid, "contents": text}) + "\n")
        searcher = open_searcher(build_lucene_index(jsonl, Path(tmp) / "index", threads=2))
        keep: set[str] = set()
        for qid in chosen:
            keep.update(qrels[qid])
            keep.update(hit.docid for hit in searcher.search(topics[qid], k=args.negatives))
        searcher.close()
    others = sorted(set(collection) - keep, key=int)
    keep.update(rng.sample(others, max(0, args.docs - len(keep))))

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    with gzip.open(output / "collection.tsv.gz", "wt", encoding="utf-8") as out:
        for docid in sorted(keep, key=int):
            out.write(f"{docid}\t{collection[docid]}\n")
    with gzip.open(output / "queries.dev.tsv.gz", "wt", encoding="utf-8") as out:
        for qid in chosen:
            out.write(f"{qid}\t{topics[qid]}\n")
    with gzip.open(output / "qrels.dev.txt.gz", "wt", encoding="utf-8") as out:
        for qid in chosen:
            for docid, rel in qrels[qid].items():
                out.write(f"{qid} 0 {docid} {rel}\n")
    print(f"wrote {len(keep)} passages, {len(chosen)} queries to {output}")


if __name__ == "__main__":
    main()

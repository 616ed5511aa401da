"""Measure what the sidecar's read-path block checks (a hash of each 16 KiB block on its first read in a process:
xxh3_64, or crc32 in sidecars written before it) cost on the rerank path: ``ModelReranker.rerank`` of one query
against ``--candidates`` documents from a sidecar, with the checks on and with them switched off in this process
only (``BlockChecker`` methods replaced by no-ops).

For each model the benchmark's machinery (:mod:`pyserini_mores.bench.workload`) builds the model at the backbone's
dims and writes a sidecar of random rows of the exact stored shape. Each repetition then times, in a fresh reader
(every block unchecked, as in a new search process; page cache warm):

* ``first_ms``: the first rerank (query encoding, reads, block checks, scoring, sorting);
* ``steady_ms``: a second rerank of the same candidates in the same reader (blocks already checked: one bitmap
  look-up per block).

Reported: the median of each over ``--repetitions``, checks on and off, and their difference; and, over the same
``tokens.bin`` bytes in the same process, the time of hashing every block with each block hash (as a reader does:
one call per block) and their ratio (``crc32_over_xxh3_64``). The sidecar is written with the package's block hash
(``--block-hash crc32``: as written before xxh3_64). Run it on quiet cores (``--threads`` fixes torch's threads)::

    python integrations/scale/measure_integrity.py --backbone minilm --doc-len 128 --candidates 1000 \\
        --models mores:1xIB-s1 maxsim --repetitions 7 --threads 2 --json integrity-overhead.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _variant(key: str, backbone: str):
    from pyserini_mores.bench import model_hooks, workload

    if "maxsim" not in model_hooks.BENCHMARKS:  # the benchmark does not time MaxSim; its store is timed here
        model_hooks.register_benchmark("maxsim", model_hooks.BenchmarkHooks(
            variants=lambda num_layers, compression_dim: [("default", {})], flops=lambda *counts: None,
            stores_unit_vectors=True))
    known = {variant.key: variant for variant in workload.backbone_variants(backbone)}
    if key not in known and f"{key}:default" not in known:
        raise SystemExit(f"error: unknown model {key!r}; one of {', '.join(known)}")
    return known.get(key) or known[f"{key}:default"]


def measure(key: str, args: argparse.Namespace, scratch: Path) -> dict:
    import torch

    from pyserini_mores.bench import workload
    from pyserini_mores.rerankers.learned import ModelReranker
    from pyserini_mores.sidecar import integrity, open_sidecar
    from pyserini_mores.types import Query, Text

    variant = _variant(key, args.backbone)
    lengths = workload.cell_lengths(args.backbone, args.query_len, args.doc_len)
    model = workload.build_model(variant, args.backbone, lengths)
    path = scratch / key.replace(":", "-")
    expect = workload.write_sidecar(path, model, variant, args.backbone, lengths, args.candidates, args.seed)
    if args.block_hash != read_algorithm(path):
        rehash_blocks(path, args.block_hash)
    words = workload.single_piece_words(model.tokenizer)
    query = Query(workload.synthetic_texts(words, 1, lengths.query_len, args.seed + 1)[0], id="q")
    rows = np.random.default_rng(args.seed + 2).permutation(args.candidates)
    candidates = [Text(None, {"docid": f"doc{row}", "lucene_docid": int(row)}) for row in rows]
    checked = (integrity.BlockChecker.check_ranges, integrity.BlockChecker.check_file)

    def run(checks: bool) -> tuple[float, float]:
        if checks:
            integrity.BlockChecker.check_ranges, integrity.BlockChecker.check_file = checked
        else:
            integrity.BlockChecker.check_ranges = lambda self, name, starts, ends: None
            integrity.BlockChecker.check_file = lambda self, name, array=None: None
        try:
            reader = open_sidecar(path, **expect)
            reranker = ModelReranker(model, reader, batch_size=args.batch_size, precision=args.precision)
            with torch.inference_mode():
                start = time.perf_counter()
                reranker.rerank(query, candidates)
                first = time.perf_counter() - start
                start = time.perf_counter()
                reranker.rerank(query, candidates)
                steady = time.perf_counter() - start
            reader.close()
            return first * 1000, steady * 1000
        finally:
            integrity.BlockChecker.check_ranges, integrity.BlockChecker.check_file = checked

    run(True), run(False)  # warm-up: page cache, allocator, kernels
    timings = {True: [], False: []}
    for _ in range(args.repetitions):
        for checks in (True, False):  # interleaved, so drift in the machine's speed hits both alike
            timings[checks].append(run(checks))
    hashing = hash_costs(path, args.repetitions)
    shutil.rmtree(path, ignore_errors=True)
    result = {"model": key, "candidates": args.candidates, "doc_len": args.doc_len, "backbone": args.backbone,
              "store_width": model.store_width, "precision": args.precision, "block_hash": args.block_hash}
    for checks, name in ((True, "checked"), (False, "unchecked")):
        result[f"{name}_first_ms"] = round(statistics.median(t[0] for t in timings[checks]), 1)
        result[f"{name}_steady_ms"] = round(statistics.median(t[1] for t in timings[checks]), 1)
    result["first_overhead_ms"] = round(result["checked_first_ms"] - result["unchecked_first_ms"], 1)
    result["steady_overhead_ms"] = round(result["checked_steady_ms"] - result["unchecked_steady_ms"], 1)
    result.update(hashing)
    return result


def read_algorithm(path: Path) -> str:
    from pyserini_mores.sidecar.format import read_manifest

    return read_manifest(path).read_algorithm


def rehash_blocks(path: Path, algorithm: str) -> None:
    """Rewrite the block checksums of the sidecar at ``path`` with ``algorithm`` and re-seal its manifest."""
    from pyserini_mores.sidecar.format import BLOCK_CHECKSUMS, MANIFEST, Manifest, file_checksum, manifest_digest
    from pyserini_mores.sidecar.integrity import block_hashes

    data = json.loads((path / MANIFEST).read_text())
    data["checksum"]["read_algorithm"] = algorithm
    manifest = Manifest.from_dict({**data, "manifest_sha256": manifest_digest(data)})
    table = np.concatenate([block_hashes(path / name, manifest.read_block_bytes, algorithm)
                            for name in manifest.block_files])
    table.tofile(path / BLOCK_CHECKSUMS)
    data["files"][BLOCK_CHECKSUMS] = {"bytes": table.nbytes, "dtype": table.dtype.str, "shape": [len(table)],
                                      "sha256": file_checksum(path / BLOCK_CHECKSUMS, manifest.block_bytes)}
    data["manifest_sha256"] = manifest_digest(data)
    (path / MANIFEST).write_text(json.dumps(data))


def hash_costs(path: Path, repetitions: int) -> dict:
    """Median ms of hashing every 16 KiB block of ``tokens.bin`` (read into memory first) with each block hash, one
    call per block as a reader makes them, interleaved; and crc32's time over xxh3_64's."""
    from pyserini_mores.sidecar.format import READ_BLOCK_BYTES
    from pyserini_mores.sidecar.integrity import BLOCK_HASHES

    raw = np.fromfile(path / "tokens.bin", dtype=np.uint8)
    view, starts = memoryview(raw), range(0, len(raw), READ_BLOCK_BYTES)
    times: dict[str, list[float]] = {name: [] for name in BLOCK_HASHES}
    for _ in range(max(repetitions, 1)):
        for name, block_hash in BLOCK_HASHES.items():
            start = time.perf_counter()
            for offset in starts:
                block_hash(view[offset:offset + READ_BLOCK_BYTES])
            times[name].append((time.perf_counter() - start) * 1000)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"hashed_mb": round(len(raw) / 1e6, 1), **{f"{name}_ms": round(ms, 1) for name, ms in medians.items()},
            "crc32_over_xxh3_64": round(medians["crc32"] / medians["xxh3_64"], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mores:1xIB-s1", "maxsim"])
    parser.add_argument("--backbone", default="minilm")
    parser.add_argument("--doc-len", type=int, default=128)
    parser.add_argument("--query-len", type=int, default=16)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-hash", choices=["xxh3_64", "crc32"], default="xxh3_64",
                        help="the sidecar's block checksums (crc32: as sidecars written before xxh3_64 have them)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="measure-integrity-") as scratch:
        for key in args.models:
            results.append(measure(key, args, Path(scratch)))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

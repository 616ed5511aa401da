"""Time ``python -m pyserini_mores.sidecar build`` for the shipped MiniLM rerankers on the first K debian-packages
passages, and project the time to encode MS MARCO passage (8,841,823 passages) from it.

The first ``--num-docs`` passages of ``--collection`` are indexed once (``python -m pyserini_mores.index``, under
``--work``), then each reranker's sidecar is built from that index in this process, exactly as the command line does
(``sidecar build --index IDX --reranker NAME [--model M] --precision P --device D --batch-size B --overwrite``):
each reranker with no ``--model`` loads its shipped model (``mores``: debian-mores-2ib, stored as Reuse-S1;
``prettr``: debian-prettr-e128; ``maxsim``: debian-maxsim; ``tk``: debian-tk). Documents per second are the
passages over the build's own ``encode_seconds`` (reading the texts, encoding, writing the sidecar; not loading the
model or starting the JVM); the command's wall time is recorded too.

Projection: 8,841,823 passages at the measured rate, on this machine; on N Ray workers of the same speed (a sharded
build, ``--shards N --engine ray``: shards encode independently, so time divides by N); with ``--device cuda``, the
rate is one GPU's. debian-packages passages are longer than MS MARCO's (the JSON records the stored tokens per
passage; MS MARCO's average ~70 WordPieces under a 128 cap), so at the same per-token cost MS MARCO encodes faster
than projected.

Example::

    python integrations/scale/encode_throughput.py --collection ../shared/data/debian-packages/collection.tsv \\
        --num-docs 2000 --precision bf16 --device cpu --json runs/scale/encode-cpu-bf16.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
MSMARCO_PASSAGES = 8_841_823
RERANKERS = ("mores", "prettr", "maxsim", "tk")
RAY_WORKERS = (8, 16, 64)


def default_collection() -> Path:
    """The debian-packages collection beside the repository, else the sample shipped in the package."""
    debian = REPOSITORY.parent / "shared" / "data" / "debian-packages" / "collection.tsv"
    if debian.is_file():
        return debian
    from pyserini_mores.search.sample import sample_dir

    return sample_dir() / "collection.tsv.gz"


def first_passages(collection: Path, count: int) -> list[tuple[str, str]]:
    """The first ``count`` ``(docid, text)`` of ``collection`` (fewer when it holds fewer)."""
    from pyserini_mores.formats import read_collection

    passages = []
    for docid, text in read_collection(collection):
        if len(passages) == count:
            break
        passages.append((docid, text))
    return passages


def prepare_index(collection: Path, count: int, work: Path) -> tuple[Path, int]:
    """A Lucene index of the first ``count`` passages under ``work`` (reused when already built); and its size."""
    from pyserini_mores.index import index_collection, open_searcher

    # named by the collection's folder too, so one --work serves several collections
    index = work / f"index-{collection.resolve().parent.name}-first-{count}"
    if not index.is_dir():
        passages = first_passages(collection, count)
        work.mkdir(parents=True, exist_ok=True)
        tsv = work / f"{index.name}.tsv"
        tsv.write_text("".join(f"{docid}\t{' '.join(text.split())}\n" for docid, text in passages),
                       encoding="utf-8")
        index_collection(tsv, index)
    searcher = open_searcher(index)
    try:
        return index, int(searcher.num_docs)
    finally:
        searcher.close()


def time_build(index: Path, reranker: str, model: str | None, output: Path, precision: str, device: str,
               batch_size: int, max_length: int | None, max_windows: int = 1) -> dict[str, Any]:
    """Run ``sidecar build`` for ``reranker`` in this process; its wall time and the manifest's figures."""
    from pyserini_mores.sidecar.__main__ import main as sidecar_main
    from pyserini_mores.sidecar.format import read_manifest

    argv = ["build", "--index", str(index), "--reranker", reranker, "--output", str(output), "--precision",
            precision, "--device", device, "--batch-size", str(batch_size), "--overwrite"]
    argv += ["--model", model] if model else []
    argv += ["--max-length", str(max_length)] if max_length else []
    argv += ["--max-windows", str(max_windows)] if max_windows > 1 else []
    started = time.perf_counter()
    code = sidecar_main(argv)
    wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"sidecar build for {reranker} exited with {code}")
    manifest = read_manifest(output)
    encode_seconds = float(manifest.build["encode_seconds"])
    return {"reranker": reranker, "model": manifest.build.get("backbone") if model is None else model,
            "command": "python -m pyserini_mores.sidecar " + " ".join(argv),
            "num_docs": manifest.num_docs, "max_windows": max_windows,
            "windows_per_doc": round(manifest.num_windows / manifest.num_docs, 3),
            "bytes_per_doc": round(manifest.num_tokens * manifest.bytes_per_token / manifest.num_docs, 1),
            "stored_tokens_per_doc": round(manifest.num_tokens / manifest.num_docs, 2),
            "store_width": manifest.dim, "store_variant": manifest.model.get("store_variant"),
            "max_length": manifest.build.get("max_length"), "precision": manifest.build.get("precision"),
            "device": manifest.build.get("device"), "encode_seconds": round(encode_seconds, 3),
            "command_seconds": round(wall, 3), "docs_per_s": round(manifest.num_docs / encode_seconds, 2)}


def projection(docs_per_s: float, device: str, workers: tuple[int, ...]) -> dict[str, float]:
    """Hours to encode MS MARCO passage at ``docs_per_s``: here, or on one GPU; and on N such workers."""
    hours = MSMARCO_PASSAGES / docs_per_s / 3600
    first = "one GPU" if device.startswith("cuda") else "this machine"
    return {first: _significant(hours), **{f"{count} Ray workers": _significant(hours / count) for count in workers}}


def _significant(value: float, digits: int = 4) -> float:
    # Fixed decimals would turn a fast projection (0.0416 h) into 0.042, a 1% error; significant digits keep
    # every projection to the same relative precision.
    return float(f"{value:.{digits}g}")


def report_table(result: dict[str, Any]) -> str:
    rows = result["rerankers"]
    headers = ["reranker", "store", "tokens/doc", "docs/s", *rows[0]["projection_hours"]]
    lines = [headers, *([row["reranker"], f"{row['store_variant']} {row['store_width']}",
                         f"{row['stored_tokens_per_doc']:.1f}", f"{row['docs_per_s']:.1f}",
                         *(f"{hours:,.2f} h" for hours in row["projection_hours"].values())] for row in rows)]
    widths = [max(len(str(line[column])) for line in lines) for column in range(len(headers))]
    text = [f"{result['num_docs']:,} passages of {result['collection']}, precision {result['precision']}, device "
            f"{result['device']}, batch {result['batch_size']}; hours for {MSMARCO_PASSAGES:,} passages:"]
    text += ["  ".join(str(cell).rjust(width) for cell, width in zip(line, widths)) for line in lines]
    return "\n".join(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collection", type=Path, default=None,
                        help="MS MARCO TSV or JSONL (default: debian-packages beside the repository, else the "
                             "package's sample)")
    parser.add_argument("--num-docs", type=int, default=2000, help="the first K passages are encoded")
    parser.add_argument("--rerankers", nargs="+", choices=RERANKERS, default=list(RERANKERS))
    parser.add_argument("--model", default=None,
                        help="a model for every reranker listed (default: each reranker's shipped model)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--batch-size", type=int, default=64, help="sidecar build's --batch-size")
    parser.add_argument("--max-length", type=int, default=None, help="sidecar build's --max-length (tokens)")
    parser.add_argument("--max-windows", type=int, default=1,
                        help="sidecar build's --max-windows: a long document stored as up to N windows (default 1)")
    parser.add_argument("--ray-workers", type=int, nargs="+", default=list(RAY_WORKERS),
                        help="worker counts of the Ray projection")
    parser.add_argument("--work", type=Path, default=Path("runs/scale/encode"),
                        help="directory of the index and the sidecars built")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results as JSON")
    return parser


def check_arguments(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot work (one line naming the flag), or None."""
    from pyserini_mores.precision import resolve_device

    checks = [(args.num_docs >= 1, f"--num-docs must be at least 1, not {args.num_docs}"),
              (args.batch_size >= 1, f"--batch-size must be at least 1, not {args.batch_size}"),
              (args.max_windows >= 1, f"--max-windows must be at least 1, not {args.max_windows}"),
              (args.max_length is None or args.max_length >= 1,
               f"--max-length must be at least 1, not {args.max_length}"),
              (all(count >= 1 for count in args.ray_workers), "--ray-workers must all be at least 1"),
              (args.collection is None or args.collection.exists(), f"--collection {args.collection} does not exist"),
              (args.device == "cpu" or args.device.startswith("cuda"),
               f"--device must be cpu, cuda or cuda:N, not {args.device}")]
    problem = next((message for ok, message in checks if not ok), None)
    if problem is None and args.device != "cpu":
        try:
            resolve_device(args.device)
        except ValueError as error:
            return f"--device {args.device}: {error}"
    return problem


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_arguments(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    collection = args.collection or default_collection()
    index, num_docs = prepare_index(collection, args.num_docs, args.work)
    rows = []
    for reranker in args.rerankers:
        row = time_build(index, reranker, args.model, args.work / f"sidecar-{reranker}-{args.precision}",
                         args.precision, args.device, args.batch_size, args.max_length, args.max_windows)
        row["projection_hours"] = projection(row["docs_per_s"], args.device, tuple(args.ray_workers))
        rows.append(row)
    import torch

    result = {"collection": str(collection), "num_docs": num_docs, "precision": args.precision,
              "device": args.device, "batch_size": args.batch_size, "msmarco_passages": MSMARCO_PASSAGES,
              "rerankers": rows,
              "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "platform": platform.platform(), "processor": platform.processor(),
                          "cuda_device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None},
              "command": " ".join(["python", "integrations/scale/encode_throughput.py", *(argv or sys.argv[1:])])}
    print(report_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure the sidecar store at scale: build a synthetic sidecar of N documents through ``SidecarWriter``, then time
opening it, the memory opening costs, and fetching 1000 random candidates with ``get_batch`` from a cold and a warm
page cache.

Documents are random float16 token matrices (random finite bit patterns: the store never looks at values) with
lengths drawn from a log-normal of mean ``--mean-length`` (MS MARCO passages average ~70 WordPieces), clipped to
``[8, 256]``. Docids are the row numbers as strings, as MS MARCO passage ids are.

Cold page cache: this script never writes ``/proc/sys/vm/drop_caches`` (on a shared machine that evicts every
process's cache, and it needs root outside a container). It evicts only the store's pages, with
``posix_fadvise(POSIX_FADV_DONTNEED)`` on each data file after unmapping them, and checks with ``mincore(2)`` how
much of ``tokens.bin`` is still resident. On a virtual machine the host may still cache the disk image, so "cold" is
the guest's cold cache; the storage bytes each cold fetch caused (``/proc/self/io``) do not depend on that.

Each trial draws new random rows and fetches them three ways, each time from a freshly opened reader after eviction
(cold), then again (warm: pages cached and mapped): one ``get_batch`` of all rows; as ``ModelReranker`` does (sorted
by length, batches of 250: less padding); and one ``get_batch`` after ``madvise(MADV_WILLNEED)`` on every candidate's
bytes (all reads issued at once; the reader does not do this today: measured to size the gain).
``--no-random-advice`` maps ``tokens.bin`` without the reader's ``MADV_RANDOM``, to reproduce the numbers from before
it (every page fault then also reads the device's readahead window).

Example (a store of 1M documents)::

    python integrations/scale/measure_store.py --num-docs 1000000 --dim 128 \\
        --output /work/data/scale/store-1m-128 --json /work/data/scale/measure-1m-128.json

The store is deleted afterwards when larger than ``--keep-below-gb`` (5 GB) unless ``--keep`` is given.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pyserini_mores.sidecar import SidecarReader, SidecarWriter
from pyserini_mores.sidecar.format import DATA_FILES, MANIFEST, TOKENS

MODEL = {"model_type": "synthetic", "store_variant": "random-float16", "fingerprint": "5ca1e" * 8}
MIN_LENGTH, MAX_LENGTH = 8, 256
LENGTH_SIGMA = 0.5  # log-normal spread: ~1% of documents longer than 200 tokens at mean 70
DOCS_PER_ADD = 5_000
FINITE_FLOAT16_MASK = np.uint16(0xBFFF)  # clearing the top exponent bit keeps every value finite (|x| < 2)


def document_lengths(num_docs: int, mean_length: float, seed: int) -> np.ndarray:
    """``[num_docs]`` int64 token counts, log-normal with the given mean (before clipping)."""
    rng = np.random.default_rng(seed)
    mu = np.log(mean_length) - LENGTH_SIGMA ** 2 / 2
    return np.clip(np.rint(rng.lognormal(mu, LENGTH_SIGMA, num_docs)), MIN_LENGTH, MAX_LENGTH).astype(np.int64)


def build_store(path: Path, lengths: np.ndarray, dim: int, seed: int) -> dict:
    """Write the synthetic sidecar; returns build seconds and bytes."""
    num_docs = len(lengths)
    rng = np.random.default_rng(seed + 1)
    started = time.perf_counter()
    writer = SidecarWriter(path, dim=dim, dtype="float16", docids=[str(row) for row in range(num_docs)],
                           model=MODEL, index={"num_docs": num_docs, "signature": "synthetic"},
                           build={"synthetic": True, "seed": seed}, commit_every_docs=100_000, overwrite=True)
    for start in range(writer.rows_done, num_docs, DOCS_PER_ADD):
        batch_lengths = lengths[start:start + DOCS_PER_ADD]
        bits = rng.integers(0, 1 << 16, size=(int(batch_lengths.sum()), dim), dtype=np.uint16)
        block = (bits & FINITE_FLOAT16_MASK).view(np.float16)
        writer.add(np.split(block, np.cumsum(batch_lengths)[:-1]))
        if (start // DOCS_PER_ADD) % 20 == 0:
            print(f"  built {start + len(batch_lengths):,} / {num_docs:,} documents "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    writer.finalize(build={"build_seconds": round(time.perf_counter() - started, 1)})
    seconds = time.perf_counter() - started
    size = sum((path / name).stat().st_size for name in DATA_FILES)
    return {"build_seconds": round(seconds, 1), "store_bytes": size,
            "write_mb_per_s": round(size / seconds / 1e6, 1)}


# ---- page cache and memory ---------------------------------------------------------------------------------------
def evict(path: Path) -> None:
    """Drop the store's pages from the page cache (pages still mapped by a process are kept, so unmap first)."""
    for name in (*DATA_FILES, MANIFEST):
        descriptor = os.open(path / name, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def resident_fraction(file: Path) -> float:
    """Fraction of ``file``'s pages in the page cache, by ``mincore(2)`` on a fresh mapping (which touches none)."""
    size = file.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(file, "rb") as stream, mmap.mmap(stream.fileno(), size, prot=mmap.PROT_READ) as mapped:
        vector = np.zeros((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE, dtype=np.uint8)
        view = np.frombuffer(mapped, dtype=np.uint8)  # exposes the mapping's address without touching a page
        try:
            failed = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                                  vector.ctypes.data_as(ctypes.c_void_p))
        finally:
            del view  # the mapping cannot close while a view exports it
        if failed:
            raise OSError(ctypes.get_errno(), "mincore failed")
    return float((vector & 1).mean())


def device_read_bytes() -> int:
    """Bytes this process has caused to be read from storage (``/proc/self/io``): page faults included."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def rss_bytes() -> dict[str, int]:
    """This process's resident memory from ``/proc/self/status``: total, anonymous and file-backed."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            values[key] = int(rest.split()[0]) * 1024
    return values


# ---- measurements ----------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def measure(path: Path, candidates: int, trials: int, opens: int, seed: int) -> dict:
    import torch

    rng = np.random.default_rng(seed + 2)
    gc.collect()
    evict(path)
    before = rss_bytes()
    started = time.perf_counter()
    reader = SidecarReader(path)
    cold_open_ms = (time.perf_counter() - started) * 1000
    after_open = rss_bytes()
    num_docs = reader.num_docs
    open_ms = []
    for _ in range(opens):
        started = time.perf_counter()
        SidecarReader(path).close()
        open_ms.append((time.perf_counter() - started) * 1000)
    reader.close()
    del reader
    gc.collect()

    times: dict[str, list[float]] = {pattern: [] for pattern in FETCH_PATTERNS}
    read_mb: dict[str, list[float]] = {pattern: [] for pattern in FETCH_PATTERNS if pattern.endswith("cold")}
    resident_after_evict, padded_tokens, rss_after_fetch = [], [], None
    for trial in range(trials):
        rows = rng.integers(0, num_docs, size=candidates)
        for pattern in ("one batch", "length-sorted batches", "one batch after WILLNEED"):
            reader = SidecarReader(path)
            evict(path)
            if pattern == "one batch" and (trial < 3 or trial == trials - 1):  # mincore of the whole file: spot checks
                resident_after_evict.append(resident_fraction(path / TOKENS))
            for warmth in ("cold", "warm"):
                read_before, started = device_read_bytes(), time.perf_counter()
                padded = fetch(reader, rows, pattern)
                times[f"{pattern}, {warmth}"].append((time.perf_counter() - started) * 1000)
                if warmth == "cold":
                    read_mb[f"{pattern}, cold"].append((device_read_bytes() - read_before) / 1e6)
            if pattern == "one batch":
                padded_tokens.append(padded)
            if rss_after_fetch is None:
                rss_after_fetch = rss_bytes()["VmRSS"]
            reader.close()
            del reader
            gc.collect()  # unmaps the pages, so the next eviction can drop them

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50": round(percentile(values, 50), 2), "p99": round(percentile(values, 99), 2),
                "mean": round(statistics.fmean(values), 2), "max": round(max(values), 2)}

    return {
        "num_docs": num_docs, "candidates": candidates, "trials": trials,
        "open_ms_cold": round(cold_open_ms, 3), "open_ms_median": round(statistics.median(open_ms), 3),
        "rss_before_open_bytes": before["VmRSS"],
        "rss_increase_after_open_bytes": after_open["VmRSS"] - before["VmRSS"],
        "rss_increase_after_first_fetch_bytes": rss_after_fetch - before["VmRSS"],
        "tokens_resident_fraction_after_evict": resident_after_evict,
        "fetch_ms": {pattern: summary(values) for pattern, values in times.items()},
        "cold_fetch_device_read_mb_median": {pattern: round(statistics.median(values), 1)
                                             for pattern, values in read_mb.items()},
        "padded_length_median": statistics.median(padded_tokens),
        "get_batch_dtype": "float32 (the default, what rerankers ask for in fp32)",
        "torch_threads": torch.get_num_threads(),
    }


FETCH_PATTERNS = ("one batch, cold", "one batch, warm", "length-sorted batches, cold", "length-sorted batches, warm",
                  "one batch after WILLNEED, cold", "one batch after WILLNEED, warm")
RERANK_BATCH = 250  # ModelReranker's default batch_size


def fetch(reader: SidecarReader, rows: np.ndarray, pattern: str) -> int:
    """Fetch ``rows`` as one ``get_batch``, or as the reranker does (sorted by length, batches of 250), or as one
    batch after asking the kernel for every candidate's bytes at once; returns the padded length of one batch."""
    if pattern == "one batch after WILLNEED":
        prefetch(reader, rows)
        pattern = "one batch"
    if pattern == "one batch":
        docs, _ = reader.get_batch(rows)
        return int(docs.shape[1])
    order = np.argsort(reader.lengths(rows), kind="stable")
    for start in range(0, len(order), RERANK_BATCH):
        reader.get_batch(rows[order[start:start + RERANK_BATCH]])
    return 0


def prefetch(reader: SidecarReader, rows: np.ndarray) -> None:
    """``madvise(MADV_WILLNEED)`` on each candidate's byte range of ``tokens.bin``: the kernel starts every read at
    once (the device works on many in parallel) instead of one synchronous page fault after another. Not what the
    reader does today: measured here to size the gain."""
    tokens = reader.tokens
    mapped, row_bytes, page = tokens._mmap, tokens.strides[0], mmap.PAGESIZE
    offsets = reader.offsets
    for start, end in sorted(zip((offsets[rows] * row_bytes).tolist(), (offsets[rows + 1] * row_bytes).tolist())):
        if end > start:
            mapped.madvise(mmap.MADV_WILLNEED, start - start % page, end - (start - start % page))


def report_table(setup: dict, build: dict | None, results: dict) -> str:
    mb = 1024 ** 2
    rows = [
        ("documents", f"{results['num_docs']:,} (mean {setup['mean_length_actual']:.1f} tokens, dim {setup['dim']}, "
                      "float16)"),
        ("store size", f"{setup['store_bytes'] / 1024 ** 3:.2f} GiB"),
    ]
    if build:
        rows.append(("build", f"{build['build_seconds']:.0f} s ({build['write_mb_per_s']:.0f} MB/s incl. "
                              "generation and checksums)"))
    rows += [
        ("open (cold manifest)", f"{results['open_ms_cold']:.2f} ms"),
        ("open (median of repeats)", f"{results['open_ms_median']:.2f} ms"),
        ("RSS increase after open", f"{results['rss_increase_after_open_bytes'] / mb:.2f} MiB"),
        ("tokens.bin resident after evict", ", ".join(f"{value:.4f}"
                                                      for value in results["tokens_resident_fraction_after_evict"])),
        *((f"get_batch {results['candidates']} random, {pattern}",
           f"p50 {values['p50']:.1f} ms, p99 {values['p99']:.1f} ms") for pattern, values in results["fetch_ms"].items()),
        *((f"storage read per {pattern} fetch", f"{megabytes:.1f} MB (median)")
          for pattern, megabytes in results["cold_fetch_device_read_mb_median"].items()),
        ("RSS increase after first fetch", f"{results['rss_increase_after_first_fetch_bytes'] / mb:.1f} MiB"),
        ("padded length (median Lmax)", f"{results['padded_length_median']:.0f} tokens"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _read_ahead_kb(path: Path) -> int | None:
    """The readahead window of the block device holding ``path`` (what a page fault reads around itself)."""
    try:
        device = os.stat(path.parent if not path.exists() else path).st_dev
        sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
        queue = sysfs / "queue" if (sysfs / "queue").exists() else sysfs / ".." / "queue"
        return int((queue / "read_ahead_kb").read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-docs", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128, help="vector width (128 keeps 1M documents near 18 GB)")
    parser.add_argument("--mean-length", type=float, default=70.0, help="mean tokens per document")
    parser.add_argument("--output", type=Path, required=True, help="sidecar directory (reused if complete)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results as JSON")
    parser.add_argument("--candidates", type=int, default=1000, help="rows per get_batch")
    parser.add_argument("--trials", type=int, default=200, help="cold/warm fetches timed")
    parser.add_argument("--opens", type=int, default=20, help="repeated opens timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-random-advice", action="store_true",
                        help="map tokens.bin without MADV_RANDOM, as the reader did before (the kernel then reads its "
                             "readahead window around every page fault): for the before/after comparison")
    parser.add_argument("--keep", action="store_true", help="keep the store whatever its size")
    parser.add_argument("--keep-below-gb", type=float, default=5.0, help="delete a larger store afterwards")
    args = parser.parse_args(argv)

    if args.no_random_advice:
        from pyserini_mores.sidecar import reader as reader_module

        reader_module._advise_random_access = lambda array: None
    lengths = document_lengths(args.num_docs, args.mean_length, args.seed)
    expected = int(lengths.sum()) * args.dim * 2
    free = shutil.disk_usage(args.output.parent if args.output.parent.exists() else Path.cwd()).free
    print(f"{args.num_docs:,} documents, {int(lengths.sum()):,} tokens (mean {lengths.mean():.1f}), dim {args.dim}: "
          f"tokens.bin will be {expected / 1024 ** 3:.2f} GiB; {free / 1024 ** 3:.1f} GiB free")
    build = None
    if (args.output / MANIFEST).is_file():
        print(f"reusing {args.output}")
    else:
        if expected * 1.05 > free:
            print(f"error: not enough free disk for {expected / 1024 ** 3:.1f} GiB; lower --dim or --num-docs",
                  file=sys.stderr)
            return 2
        args.output.parent.mkdir(parents=True, exist_ok=True)
        build = build_store(args.output, lengths, args.dim, args.seed)
    store_bytes = sum((args.output / name).stat().st_size for name in DATA_FILES)
    setup = {"num_docs": args.num_docs, "dim": args.dim, "mean_length_requested": args.mean_length,
             "mean_length_actual": float(lengths.mean()), "store_bytes": store_bytes, "output": str(args.output),
             "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                         "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
             "cache_eviction": "posix_fadvise(POSIX_FADV_DONTNEED) per data file, checked with mincore",
             "tokens_madvise": "none" if args.no_random_advice else "MADV_RANDOM (the reader's)",
             "read_ahead_kb": _read_ahead_kb(args.output)}
    results = measure(args.output, args.candidates, args.trials, args.opens, args.seed)
    print(report_table(setup, build, results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"setup": setup, "build": build, "results": results,
                                         "command": " ".join(sys.argv)}, indent=2) + "\n")
        print(f"results written to {args.json}")
    if not args.keep and store_bytes > args.keep_below_gb * 1024 ** 3:
        shutil.rmtree(args.output)
        print(f"deleted {args.output} ({store_bytes / 1024 ** 3:.1f} GiB > {args.keep_below_gb:g} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build and measure a synthetic sidecar the size of MS MARCO passage: 8,841,823 documents of 384-d MiniLM token
vectors at 48 bytes/token (``pq`` M = 48, or ``residual`` with 1,024 centroids and 368 dims x 1 bit), written shard
by shard through the normal ``SidecarWriter`` (here one shard after another, or as Ray tasks), each shard adopting
one codec trained once, assembled, then opened and read the way the rerank path reads 1000 candidates per query, from
a cold and from a warm page cache.

Lengths: the WordPiece counts (MiniLM tokenizer, [CLS] and [SEP] included, no cap) of a real collection's passages
(``--length-source``: the debian-packages collection when it is beside the repository, else the sample shipped in the
package), each document drawing one at random. Their content tokens are scaled by one factor chosen so that the mean
after the 128-token cap equals ``--mean-length`` (70: MS MARCO passages average ~56 words, ~70 WordPieces with the
specials under a 128 cap), so the shape of the distribution (its spread, its long tail cut at the cap) is a real
collection's, and its mean MS MARCO's.

Rows: each document's codes are random (a generator seeded by the seed and the document's block of rows, so a resumed
or sharded build writes the same bytes), with valid centroid ids for ``residual``. ``--rows codes`` (default) hands
them to the writer as codes (:meth:`SidecarWriter.add_codes`): the store's own write cost. ``--rows vectors`` decodes
them with the shard's codec and adds the vectors, which the writer encodes back to the same codes: the write cost with
the codec's encoding, as a model's build pays it. Either way every stored row decodes to what was written.

Reads: the assembled store opens with ``open_sidecar``; each query draws ``--depth`` distinct random rows, sorts
them by length and reads them in batches of ``--batch-size`` with ``get_batch`` into a reused ``BatchBuffer`` as float32
(codes decoded), as ``ModelReranker`` does without a deadline. Cold: the store's pages are evicted
(``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed) before the query; warm: the same rows read again at once.

An interrupted build keeps each shard's committed rows and every finished shard: the same command resumes it
(``--restart`` discards it). Example (the full size; ~30 GB)::

    python integrations/scale/store_8m.py --output /data/scale/store-8m --shards 8 \\
        --length-source ../shared/data/debian-packages/collection.tsv --json runs/scale/store-8m.json
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from integrations.scale.measure_store import device_read_bytes, percentile, rss_bytes  # noqa: E402
from pyserini_mores.sidecar.format import MANIFEST, SidecarError  # noqa: E402

MSMARCO_PASSAGES = 8_841_823
DIM = 384  # MiniLM's width
CODE_BYTES = 48  # the compact codecs at 384 dims: pq M = 48, residual 2 + 368 x 1 bit / 8
TOKEN_CAP = 128  # the document cap the MS MARCO recipes encode with (WordPieces, specials included)
SPECIAL_TOKENS = 2  # [CLS] and [SEP]
BLOCK_DOCS = 1024  # rows of one random-generator block: the unit a resumed or sharded build regenerates
MODEL = {"model_type": "synthetic", "store_variant": "random-codes", "fingerprint": "5ca1e" * 8}
DEBIAN_COLLECTION = REPOSITORY.parent / "shared" / "data" / "debian-packages" / "collection.tsv"
RERANK_BATCH = 250  # ModelReranker's default batch_size


# ---- lengths -----------------------------------------------------------------------------------------------------
def default_length_source() -> Path:
    """The debian-packages collection beside the repository, else the sample shipped in the package."""
    if DEBIAN_COLLECTION.is_file():
        return DEBIAN_COLLECTION
    from pyserini_mores.search.sample import sample_dir

    return sample_dir() / "collection.tsv.gz"


def source_lengths(collection: Path) -> np.ndarray:
    """``[n]`` WordPiece counts (MiniLM tokenizer, specials included, uncapped) of every passage of ``collection``."""
    from transformers import AutoTokenizer

    from pyserini_mores.formats import read_collection
    from pyserini_mores.models.backbones import offline_minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(offline_minilm_path()))
    tokenizer.model_max_length = 1 << 30  # counting, not encoding: no warning about passages beyond 512
    texts = [text for _, text in read_collection(collection)]
    if not texts:
        raise ValueError(f"{collection} holds no passages")
    counts = []
    for start in range(0, len(texts), 4096):
        counts.extend(len(ids) for ids in tokenizer(texts[start:start + 4096], truncation=False)["input_ids"])
    return np.asarray(counts, dtype=np.int64)


def scale_lengths(lengths: np.ndarray, factor: float, cap: int) -> np.ndarray:
    """Content tokens scaled by ``factor`` (at least one kept), specials added back, capped at ``cap``."""
    content = np.maximum(np.rint((lengths - SPECIAL_TOKENS) * factor), 1)
    return np.minimum(content + SPECIAL_TOKENS, cap).astype(np.int64)


def length_factor(lengths: np.ndarray, mean: float, cap: int) -> float:
    """The factor whose :func:`scale_lengths` of ``lengths`` has mean ``mean`` (bisection: the mean grows with it)."""
    low, high = 1e-3, 1e3
    if not scale_lengths(lengths, low, cap).mean() <= mean <= scale_lengths(lengths, high, cap).mean():
        raise ValueError(f"no scaling of the source lengths reaches a mean of {mean} tokens under a cap of {cap}")
    for _ in range(100):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if scale_lengths(lengths, middle, cap).mean() < mean else (low, middle)
    return high


def document_lengths(source: np.ndarray, num_docs: int, mean: float, cap: int, seed: int) -> tuple[np.ndarray, float]:
    """``[num_docs]`` token counts drawn from ``source`` and scaled to mean ``mean``; and the factor."""
    factor = length_factor(source, mean, cap)
    drawn = np.random.default_rng([seed, 0]).choice(source, size=num_docs)
    return scale_lengths(drawn, factor, cap).astype(np.int32), factor


# ---- rows --------------------------------------------------------------------------------------------------------
def block_codes(seed: int, block: int, num_tokens: int, codec: str, num_centroids: int) -> np.ndarray:
    """``[num_tokens, 48]`` uint8 random codes of block ``block`` (rows ``block * BLOCK_DOCS`` onward); a residual
    code's little-endian centroid id lies below ``num_centroids``."""
    rng = np.random.default_rng([seed, 1, block])
    codes = rng.integers(0, 256, size=(num_tokens, CODE_BYTES), dtype=np.uint8)
    if codec == "residual":
        ids = rng.integers(0, num_centroids, size=num_tokens).astype("<u2").view(np.uint8).reshape(-1, 2)
        width = 1 if num_centroids <= 256 else 2
        codes[:, :width] = ids[:, :width]
    return codes


def row_codes(lengths: np.ndarray, seed: int, codec: str, num_centroids: int, start: int,
              end: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(first row, lengths, codes)`` of rows ``[start, end)``, one piece per generator block they touch."""
    row = start
    while row < end:
        block = row // BLOCK_DOCS
        block_start, block_end = block * BLOCK_DOCS, min((block + 1) * BLOCK_DOCS, len(lengths))
        block_lengths = lengths[block_start:block_end].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(block_lengths)])
        codes = block_codes(seed, block, int(offsets[-1]), codec, num_centroids)
        stop = min(end, block_end)
        yield row, block_lengths[row - block_start:stop - block_start], \
            codes[offsets[row - block_start]:offsets[stop - block_start]]
        row = stop


def training_sample(num_tokens: int, seed: int) -> np.ndarray:
    """``[num_tokens, 384]`` float32 standard normal vectors: what the store's one codec trains on (the store never
    looks at values, and the rows are random codes of the trained codec)."""
    return np.random.default_rng([seed, 2]).standard_normal((num_tokens, DIM), dtype=np.float32)


# ---- building ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreConfig:
    """One synthetic store: plain values, which is also what a Ray task receives."""

    lengths: np.ndarray = dataclasses.field(repr=False)
    codec_parameters: np.ndarray | None = dataclasses.field(default=None, repr=False)  # trained once, every shard's
    seed: int = 0
    codec: str = "pq"
    rows: str = "codes"
    num_shards: int = 1
    sample_tokens: int = 9_984  # PQ's 256 centroids x 39 points: the least faiss fits without a warning
    num_centroids: int = 1024  # residual: 2-byte ids beyond 256, so the code is 2 + 368 x 1 bit / 8 = 48 bytes
    commit_every_docs: int = 100_000
    restart: bool = False

    @property
    def num_docs(self) -> int:
        return len(self.lengths)

    @property
    def codec_options(self) -> dict[str, int]:
        options = {"sample_tokens": self.sample_tokens}
        if self.codec == "pq":
            return {**options, "pq_subquantizers": CODE_BYTES}
        return {**options, "num_centroids": self.num_centroids}

    def build_id(self) -> str:
        from pyserini_mores.sidecar.shards import sharded_build_id

        return sharded_build_id({"model": MODEL, "seed": self.seed, "codec": self.codec, "rows": self.rows,
                                 "codec_options": self.codec_options, "num_shards": self.num_shards,
                                 "lengths": hashlib.sha256(self.lengths.tobytes()).hexdigest()})


def shard_task(config: StoreConfig, shard: int, output: str, build_id: str) -> str:
    """Write shard ``shard`` of the store at ``output`` through ``SidecarWriter`` (resuming its partial build): what
    one shard of a local build, or one Ray task, runs. Returns ``output``."""
    from pyserini_mores.sidecar import SidecarWriter
    from pyserini_mores.sidecar.shards import shard_rows

    start, end = shard_rows(config.num_docs, config.num_shards, shard)
    if config.codec_parameters is None:
        raise ValueError("the store's codec is not trained: see train_codec")
    started = time.perf_counter()
    writer = SidecarWriter(
        output, dim=DIM, docids=[str(row) for row in range(start, end)], model=MODEL,
        index={"num_docs": config.num_docs, "signature": "synthetic"},
        build={"synthetic": True, "seed": config.seed, "rows": config.rows},
        shard={"build_id": build_id, "index": shard, "count": config.num_shards, "row_start": start,
               "row_end": end, "num_docs": config.num_docs},
        codec=config.codec, codec_options=config.codec_options, commit_every_docs=config.commit_every_docs,
        restart=config.restart)
    resumed_from = writer.rows_done
    try:
        if writer.codec_sample_tokens:  # else resumed: the partial build's own codec.bin encodes its rows
            writer.adopt_codec(config.codec_parameters, trained_on=config.sample_tokens)
        for _, lengths, codes in row_codes(config.lengths, config.seed, config.codec, config.num_centroids,
                                           start + writer.rows_done, end):
            if config.rows == "codes":
                writer.add_codes(lengths, codes)
            else:
                vectors = writer.codec.decode(codes)
                writer.add(np.split(vectors, np.cumsum(lengths)[:-1]) if len(lengths) else [])
        writer.finalize(build={"build_seconds": round(time.perf_counter() - started, 3),
                               "resumed_from_row": start + resumed_from})
    except BaseException:
        writer.close()  # the committed rows stay in the partial build for the next run to resume
        raise
    return output


def train_codec(config: StoreConfig, output: Path) -> tuple[np.ndarray, float]:
    """The parameters of the store's codec, trained once on :func:`training_sample` (or read back from ``output``
    when an earlier run trained it); and the seconds training took."""
    from pyserini_mores.sidecar.codecs import TokenCodec

    file = output / f"codec-{config.build_id()}.f32"  # beside the shards: a resumed build adopts the same codec
    codec = TokenCodec(config.codec, DIM, **config.codec_options)
    if file.is_file():
        parameters = np.fromfile(file, dtype=np.float32)
        if parameters.size == codec.parameters_size():
            return parameters, 0.0
    started = time.perf_counter()
    codec.train(training_sample(config.sample_tokens, config.seed))
    seconds = time.perf_counter() - started
    output.mkdir(parents=True, exist_ok=True)
    codec.parameters().tofile(file)
    return codec.parameters(), seconds


def build_store(config: StoreConfig, output: Path, engine: str, workers: int) -> dict[str, Any]:
    """Train the codec, build every shard still missing (one after another, or as ``workers`` Ray tasks at a time),
    assemble them; returns build figures for what this run wrote."""
    from pyserini_mores.sidecar.assemble import assemble_shards
    from pyserini_mores.sidecar.format import read_manifest
    from pyserini_mores.sidecar.ray_engine import build_shards_on_ray, import_ray
    from pyserini_mores.sidecar.shards import ShardPlan, shard_dirname, shard_is_complete

    build_id = config.build_id()
    paths = [output / shard_dirname(shard, config.num_shards) for shard in range(config.num_shards)]
    todo = [shard for shard, path in enumerate(paths)
            if not shard_is_complete(path, build_id, shard, config.num_shards)]
    parameters, train_seconds = train_codec(config, output)
    config = dataclasses.replace(config, codec_parameters=parameters)
    started, ray_start_seconds = time.perf_counter(), None
    if engine == "ray":
        ray = import_ray()
        from pyserini_mores._jvm import jvm_signal_handlers_kept

        started_here = not ray.is_initialized()  # else the Ray instance of the caller, with its CPUs
        if started_here:
            with jvm_signal_handlers_kept():
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [
                             str(REPOSITORY), os.environ.get("PYTHONPATH", "")]))}})
        ray_start_seconds = time.perf_counter() - started  # not the store's cost: kept out of the throughput
        started = time.perf_counter()
        try:
            build_shards_on_ray(config, ShardPlan(output, config.num_shards, build_id, paths, todo), shard_task,
                                cpus_per_task=1.0)
        finally:
            if started_here:
                with jvm_signal_handlers_kept():
                    ray.shutdown()
    else:
        for shard in todo:
            shard_task(config, shard, str(paths[shard]), build_id)
            print(f"  shard {shard + 1} of {config.num_shards} written ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    build_seconds = time.perf_counter() - started
    assemble_started = time.perf_counter()
    assemble_shards(output, paths, overwrite=True)
    assemble_seconds = time.perf_counter() - assemble_started
    manifests = [read_manifest(paths[shard]) for shard in todo]
    written_docs = sum(manifest.num_docs - (int(manifest.build.get("resumed_from_row", manifest.shard["row_start"]))
                                            - int(manifest.shard["row_start"])) for manifest in manifests)
    written_bytes = sum(_data_bytes(paths[shard]) for shard in todo)
    return {"engine": engine, "workers": workers if engine == "ray" else 1, "shards_built": todo,
            "build_seconds": round(build_seconds, 2), "assemble_seconds": round(assemble_seconds, 3),
            "docs_written": written_docs, "bytes_written": written_bytes,
            "docs_per_s": round(written_docs / build_seconds, 1) if build_seconds else None,
            "mb_per_s": round(written_bytes / build_seconds / 1e6, 2) if build_seconds else None,
            "codec_train_seconds": round(train_seconds, 2),
            "ray_start_seconds": None if ray_start_seconds is None else round(ray_start_seconds, 2)}


def _data_bytes(shard: Path) -> int:
    return sum((shard / name).stat().st_size for name in os.listdir(shard) if (shard / name).is_file())


def expected_bytes(lengths: np.ndarray, num_shards: int) -> int:
    """Bytes the finished store takes: codes, offsets, docid tables, codec parameters, manifests (a close bound)."""
    num_docs = len(lengths)
    docid_width = len(str(max(num_docs - 1, 0)))
    codes = int(lengths.sum(dtype=np.int64)) * CODE_BYTES
    # docids and sorted docids, sorted rows; offsets, windows and window offsets (one window per document)
    tables = num_docs * (2 * docid_width + 8) + 3 * (num_docs + num_shards) * 8
    # codec.bin of each shard and the shared copy (the residual's centroids are the largest), manifests, journals
    per_shard = StoreConfig.num_centroids * DIM * 4 + 64 * 1024
    return codes + tables + (num_shards + 1) * per_shard


def disk_needed(output: Path, lengths: np.ndarray, num_shards: int) -> tuple[Path, int, int]:
    """The existing directory the store goes to, its free bytes, and the bytes this run still has to write."""
    existing = output
    while not existing.exists():
        existing = existing.parent
    done = sum(file.stat().st_size for file in output.rglob("*") if file.is_file()) if output.exists() else 0
    return existing, shutil.disk_usage(existing).free, max(0, expected_bytes(lengths, num_shards) - done)


# ---- reading -----------------------------------------------------------------------------------------------------
def read_like_rerank(reader, rows: np.ndarray, batch_size: int, buffer) -> int:
    """Read ``rows`` as ``ModelReranker`` does without a deadline: sorted by length, ``batch_size`` at a time, into
    a reused buffer as float32 (codes decoded). Returns the tokens read."""
    import torch

    lengths = reader.lengths(rows)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        reader.get_batch(rows[order[start:start + batch_size]], dtype=torch.float32, buffer=buffer)
    return int(lengths.sum())


def evict_tree(path: Path) -> None:
    """Evict every file of the store (the sharded manifest and each shard's files) from the page cache."""
    from pyserini_mores._io import evict_from_page_cache

    evict_from_page_cache(file for file in path.rglob("*") if file.is_file())


def measure(path: Path, depth: int, queries: int, batch_size: int, seed: int) -> dict[str, Any]:
    """Open time, memory, and per-query read time of ``depth`` random candidates, cold and warm."""
    import torch

    from pyserini_mores.sidecar import BatchBuffer, open_sidecar

    gc.collect()
    evict_tree(path)
    before = rss_bytes()
    started = time.perf_counter()
    reader = open_sidecar(path)
    open_ms = (time.perf_counter() - started) * 1000
    after_open = rss_bytes()
    rng = np.random.default_rng([seed, 3])
    buffer = BatchBuffer()
    cold, warm, cold_read_mb, tokens = [], [], [], []
    for _ in range(queries):
        rows = rng.choice(reader.num_docs, size=depth, replace=False)
        reader.evict_from_page_cache()
        read_before, started = device_read_bytes(), time.perf_counter()
        tokens.append(read_like_rerank(reader, rows, batch_size, buffer))
        cold.append((time.perf_counter() - started) * 1000)
        cold_read_mb.append((device_read_bytes() - read_before) / 1e6)
        started = time.perf_counter()
        read_like_rerank(reader, rows, batch_size, buffer)
        warm.append((time.perf_counter() - started) * 1000)
    after_reads = rss_bytes()
    reader.close()

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
                "mean": round(statistics.fmean(values), 3), "max": round(max(values), 3)}

    return {"num_docs": reader.num_docs, "depth": depth, "queries": queries, "batch_size": batch_size,
            "open_ms": round(open_ms, 3), "rss_before_open_bytes": before["VmRSS"],
            "rss_increase_after_open_bytes": after_open["VmRSS"] - before["VmRSS"],
            "rss_increase_after_reads_bytes": after_reads["VmRSS"] - before["VmRSS"],
            "query_read_ms": {"cold": summary(cold), "warm": summary(warm)},
            "cold_query_storage_read_mb_median": round(statistics.median(cold_read_mb), 3),
            "tokens_per_query_median": statistics.median(tokens),
            "torch_threads": torch.get_num_threads()}


def store_files(path: Path) -> dict[str, Any]:
    """Bytes of each data file summed over the shards, and in all (the store's directory tree)."""
    per_file: dict[str, int] = {}
    for file in path.rglob("*"):
        if file.is_file():
            per_file[file.name] = per_file.get(file.name, 0) + file.stat().st_size
    return {"bytes_per_file": dict(sorted(per_file.items())), "total_bytes": sum(per_file.values())}


def _size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.2f} {unit}"
    return f"{size} B"


def report_table(result: dict[str, Any]) -> str:
    setup, build, files, reads = result["setup"], result["build"], result["files"], result["results"]
    rows = [("documents", f"{setup['num_docs']:,} in {setup['shards']} shards, {setup['num_tokens']:,} tokens "
                          f"(mean {setup['mean_length_actual']:.1f}), {setup['codec']} at {CODE_BYTES} B/token")]
    if build:
        rows += [("build", f"{build['build_seconds']:.1f} s for {build['docs_written']:,} documents "
                           f"({build['engine']}, {build['workers']} worker(s)): {build['docs_per_s']:,.0f} docs/s, "
                           f"{build['mb_per_s']:.1f} MB/s"),
                 ("codec training (once, before)", f"{build['codec_train_seconds']:.1f} s"),
                 ("assemble", f"{build['assemble_seconds'] * 1000:.1f} ms")]
    rows += [(f"  {name}", _size(size)) for name, size in files["bytes_per_file"].items()]
    rows += [("store on disk", f"{files['total_bytes'] / 1e9:.3f} GB"),
             ("open (cold)", f"{reads['open_ms']:.2f} ms"),
             ("RSS increase after open", f"{reads['rss_increase_after_open_bytes'] / 2 ** 20:.1f} MiB"),
             ("RSS increase after reads", f"{reads['rss_increase_after_reads_bytes'] / 2 ** 20:.1f} MiB")]
    for warmth, values in reads["query_read_ms"].items():
        rows.append((f"read {reads['depth']} candidates, {warmth}", f"p50 {values['p50']:.1f} ms, p99 "
                                                                   f"{values['p99']:.1f} ms ({reads['queries']} "
                                                                   "queries)"))
    rows.append(("storage read per cold query", f"{reads['cold_query_storage_read_mb_median']:.1f} MB (median)"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


# ---- command line ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="the store's directory (reused when complete)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results as JSON")
    parser.add_argument("--num-docs", type=int, default=MSMARCO_PASSAGES, help="documents (default: MS MARCO's)")
    parser.add_argument("--shards", type=int, default=8, help="shards, each written by its own SidecarWriter")
    parser.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="local: shards one after another; ray: Ray tasks on a local Ray instance")
    parser.add_argument("--workers", type=int, default=2, help="--engine ray: shard tasks at a time (CPUs given)")
    parser.add_argument("--codec", choices=["pq", "residual"], default="pq",
                        help="pq M = 48 or residual (1,024 centroids, 368 dims x 1 bit): 48 bytes per token")
    parser.add_argument("--rows", choices=["codes", "vectors"], default="codes",
                        help="codes: random codes written as they are; vectors: decoded and encoded by the writer")
    parser.add_argument("--mean-length", type=float, default=70.0,
                        help="mean tokens per document after the 128 cap, specials included")
    parser.add_argument("--length-source", type=Path, default=None,
                        help="collection whose WordPiece lengths are scaled (default: debian-packages beside the "
                             "repository, else the package's sample)")
    parser.add_argument("--depth", type=int, default=1000, help="candidates read per query")
    parser.add_argument("--queries", type=int, default=200, help="queries timed, each cold then warm")
    parser.add_argument("--batch-size", type=int, default=RERANK_BATCH, help="candidates per get_batch")
    parser.add_argument("--codec-sample-tokens", type=int, default=9_984,
                        help="random vectors the codec trains on (pq: >= 256, residual: >= 1,024)")
    parser.add_argument("--commit-every-docs", type=int, default=100_000,
                        help="documents between the writer's journal commits (what an interruption can lose)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--restart", action="store_true", help="discard an interrupted or finished store first")
    parser.add_argument("--keep", action="store_true", help="keep the store whatever its size")
    parser.add_argument("--keep-below-gb", type=float, default=5.0, help="delete a larger store afterwards")
    return parser


def check_arguments(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot work (one line naming the flag), or None."""
    checks = [(args.num_docs >= 1, f"--num-docs must be at least 1, not {args.num_docs}"),
              (1 <= args.shards <= args.num_docs, f"--shards must be between 1 and --num-docs, not {args.shards}"),
              (args.workers >= 1, f"--workers must be at least 1, not {args.workers}"),
              (1 <= args.depth <= args.num_docs, f"--depth must be between 1 and --num-docs, not {args.depth}"),
              (args.queries >= 1, f"--queries must be at least 1, not {args.queries}"),
              (args.codec_sample_tokens >= (256 if args.codec == "pq" else StoreConfig.num_centroids),
               f"--codec-sample-tokens must be at least {256 if args.codec == 'pq' else StoreConfig.num_centroids} "
               f"for --codec {args.codec}, not {args.codec_sample_tokens}"),
              (args.batch_size >= 1, f"--batch-size must be at least 1, not {args.batch_size}"),
              (args.commit_every_docs >= 1, f"--commit-every-docs must be at least 1, not {args.commit_every_docs}"),
              (SPECIAL_TOKENS < args.mean_length <= TOKEN_CAP,
               f"--mean-length must be above {SPECIAL_TOKENS} and at most {TOKEN_CAP}, not {args.mean_length:g}"),
              (args.length_source is None or args.length_source.exists(),
               f"--length-source {args.length_source} does not exist"),
              (not args.output.exists() or args.output.is_dir(), f"--output {args.output} is not a directory")]
    return next((message for ok, message in checks if not ok), None)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_arguments(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    source_path = args.length_source or default_length_source()
    source = source_lengths(source_path)
    lengths, factor = document_lengths(source, args.num_docs, args.mean_length, TOKEN_CAP, args.seed)
    config = StoreConfig(lengths=lengths, seed=args.seed, codec=args.codec, rows=args.rows, num_shards=args.shards,
                         sample_tokens=args.codec_sample_tokens, commit_every_docs=args.commit_every_docs,
                         restart=args.restart)
    complete = (args.output / MANIFEST).is_file() and not args.restart
    if complete:
        from pyserini_mores.sidecar.shards import is_sharded, read_sharded_manifest

        if not is_sharded(args.output) or read_sharded_manifest(args.output).build_id != config.build_id():
            print(f"error: --output {args.output} holds another store (other --num-docs, --shards, --codec, --rows, "
                  "--seed or lengths); pass --restart to replace it", file=sys.stderr)
            return 2
    else:
        if args.restart and args.output.exists():
            shutil.rmtree(args.output)
        directory, free, needed = disk_needed(args.output, lengths, args.shards)
        if needed > free:
            print(f"error: {directory} has {free:,} bytes free but the store needs {needed:,} more bytes; lower "
                  f"--num-docs or choose another --output", file=sys.stderr)
            return 2
    print(f"{args.num_docs:,} documents, {int(lengths.sum()):,} tokens (mean {lengths.mean():.2f}; lengths of "
          f"{source_path} x {factor:.3f}), {args.codec} at {CODE_BYTES} B/token: "
          f"{expected_bytes(lengths, args.shards) / 1e9:.2f} GB", flush=True)
    build = None
    try:
        if complete:
            print(f"reusing {args.output}")
        else:
            build = build_store(config, args.output, args.engine, args.workers)
    except KeyboardInterrupt:
        print(f"interrupted: {args.output} keeps every finished shard and each shard's committed rows; run the same "
              "command again to resume (--restart to discard them)", file=sys.stderr)
        return 130
    except SidecarError as error:  # e.g. a partial shard of another build: one line, like the sidecar commands
        print(f"error: {error}", file=sys.stderr)
        return 1
    files = store_files(args.output)
    setup = {"num_docs": args.num_docs, "num_tokens": int(lengths.sum()), "shards": args.shards,
             "codec": args.codec, "codec_options": config.codec_options, "bytes_per_token": CODE_BYTES, "dim": DIM,
             "rows": args.rows, "mean_length_requested": args.mean_length,
             "mean_length_actual": float(lengths.mean()), "length_cap": TOKEN_CAP,
             "length_source": str(source_path), "length_source_passages": len(source),
             "length_source_mean": float(source.mean()), "length_factor": factor, "seed": args.seed,
             "output": str(args.output),
             "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                         "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
             "cache_eviction": "posix_fadvise(POSIX_FADV_DONTNEED) on every file of the store before each cold query"}
    results = measure(args.output, args.depth, args.queries, args.batch_size, args.seed)
    result = {"setup": setup, "build": build, "files": files, "results": results,
              "command": " ".join(["python", "integrations/scale/store_8m.py", *(argv or sys.argv[1:])])}
    print(report_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}")
    if not args.keep and files["total_bytes"] > args.keep_below_gb * 1e9:
        shutil.rmtree(args.output)
        print(f"deleted {args.output} ({files['total_bytes'] / 1e9:.1f} GB > {args.keep_below_gb:g} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

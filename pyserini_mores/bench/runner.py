"""Runs the benchmark: for every (backbone, doc_len, variant, precision) it times the shipped rerank path
(:meth:`ModelReranker.rerank`: query encoding, sidecar reads, scoring, sorting) on one query and its candidates.

Protocol: one query, ``candidates`` candidates in a random row order, the same ModelReranker
batch size for every model; one warm-up, a pilot that estimates the time per candidate, one warm-up at the timed size,
then the median of ``repetitions`` timed runs. When a run would take longer than ``max_rep_seconds``, it is timed on
fewer candidates and scaled to ``candidates``: ``query encoding + (rest) × candidates / timed`` (recorded as
``extrapolated_from``).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import flops as flop_formulas
from . import machine, workload

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16")
# Precisions a run may measure: bf16 is the search CLI's bf16 (each model's own choice of path); bf16-copy and
# bf16-autocast force one path — weights cast to bf16 once, or autocast over fp32 weights — so the two can be timed
# side by side (ModelReranker's cast_weights). Their GEMM peak is bf16's.
FORCED_BF16_PATHS = {"bf16-copy": True, "bf16-autocast": False}
BENCH_PRECISIONS = PRECISIONS + tuple(FORCED_BF16_PATHS)


@dataclass
class BenchConfig:
    """Everything that decides what is measured (see ``python -m pyserini_mores.bench --help``)."""

    backbones: list[str] = field(default_factory=lambda: list(workload.PUBLIC_BACKBONES))
    doc_lens: list[int] = field(default_factory=lambda: [128, 512])
    models: list[str] | None = None  # MODEL or MODEL:VARIANT selectors; None = all
    precisions: list[str] = field(default_factory=lambda: list(PRECISIONS))
    candidates: int = 1000
    query_len: int = 16
    repetitions: int = 5
    batch_size: int = 250
    max_rep_seconds: float = 10.0  # 0 = never extrapolate
    pilot_candidates: int = 8
    cold_cache: bool = False
    codec: str = "fp16"  # sidecar codec of the precomputing models (see pyserini_mores.sidecar.codecs)
    store_dtype: str = "float16"  # vector dtype of an uncompressed sidecar (bfloat16: no conversion under bf16)
    work_dir: str | None = None
    seed: int = 0
    peak_sizes: tuple[int, ...] = machine.DEFAULT_PEAK_SIZES
    peak_repetitions: int = 5

    def __post_init__(self):
        unknown = [b for b in self.backbones if b not in workload.BACKBONES]
        if unknown:
            raise ValueError(f"unknown backbone(s) {', '.join(unknown)}; known: "
                             f"{', '.join(workload.PUBLIC_BACKBONES)}")
        bad = [p for p in self.precisions if p not in BENCH_PRECISIONS]
        if bad:
            raise ValueError(f"unknown precision(s) {', '.join(bad)}; known: {', '.join(BENCH_PRECISIONS)}")
        if self.candidates < 1 or self.repetitions < 1 or self.batch_size < 1 or self.query_len < 3:
            raise ValueError("candidates, repetitions and batch size must be >= 1, query length >= 3")
        if any(d < 3 for d in self.doc_lens):
            raise ValueError("document lengths must be >= 3 tokens")


def run_benchmark(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Measure everything ``config`` asks for; returns ``{"machine", "config", "results", "skipped"}``."""
    progress = progress or (lambda message: logger.info("%s", message))
    if config.models:
        workload.check_selectors(config.models, config.backbones)
    progress("measuring the GEMM peak (fp32, bf16)")
    peaks = {p: machine.measure_gemm_peak(p, config.peak_sizes, config.peak_repetitions) for p in PRECISIONS}
    info = machine.machine_info(peaks)
    results: list[dict] = []
    skipped: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyserini-mores-bench-", dir=config.work_dir) as scratch:
        for backbone in config.backbones:
            dims = workload.backbone_dims(backbone)
            words = workload.single_piece_words(workload.minilm_tokenizer())
            for doc_len in config.doc_lens:
                cell = _Cell(config, backbone, doc_len, words, Path(scratch))
                for variant in workload.select_variants(config.models, backbone):
                    reason = workload.feasible(variant, dims.num_hidden_layers)
                    if reason:
                        skipped.append({"model": variant.model, "variant": variant.variant, "backbone": backbone,
                                        "doc_len": doc_len, "reason": reason})
                        continue
                    for record in cell.measure(variant, peaks, progress):
                        results.append(record)
    add_speedups(results)
    info["load_average_at_end"] = list(os.getloadavg())
    info["wall_seconds"] = round(time.perf_counter() - started, 1)
    return {"machine": info, "config": asdict(config), "results": results, "skipped": skipped}


def add_speedups(results: list[dict]) -> None:
    """``speedup_vs_cross_encoder`` of every record: the cross-encoder's ms / its ms in the same (backbone, doc_len,
    precision); ``None`` when the cross-encoder was not run."""
    baseline = {(r["backbone"], r["doc_len"], r["precision"]): r["ms_per_query_median"]
                for r in results if r["model"] == "cross-encoder"}
    for record in results:
        reference = baseline.get((record["backbone"], record["doc_len"], record["precision"]))
        record["speedup_vs_cross_encoder"] = (
            round(reference / record["ms_per_query_median"], 2) if reference and record["ms_per_query_median"]
            else None)


class _Cell:
    """One (backbone, doc_len): its token counts, candidate texts, query and candidate order."""

    def __init__(self, config: BenchConfig, backbone: str, doc_len: int, words, scratch: Path):
        self.config, self.backbone, self.scratch = config, backbone, scratch
        self.words = words
        self.lengths = workload.cell_lengths(backbone, config.query_len, doc_len)
        self.doc_texts = workload.synthetic_texts(words, config.candidates, doc_len, config.seed)
        self.query_text = workload.synthetic_texts(words, 1, config.query_len, config.seed + 1)[0]
        # BM25 order has nothing to do with index order: candidates arrive as a random permutation of rows
        self.rows = np.random.default_rng(config.seed + 2).permutation(config.candidates)
        shape = flop_formulas.EncoderShape.from_dims(workload.backbone_dims(backbone))
        self.cross_encoder_flops = flop_formulas.cross_encoder_flops(
            shape, self.lengths.query_len, self.lengths.joint_doc_len - 1).total(config.candidates)

    def measure(self, variant: workload.Variant, peaks: dict, progress) -> list[dict]:
        from ..sidecar import open_sidecar
        from ..types import Text

        config, lengths = self.config, self.lengths
        model = workload.build_model(variant, self.backbone, lengths)
        count = workload.flop_count(variant, model, lengths)
        reader, sidecar_path, storage = None, None, {}
        try:
            if model.store_width is not None:
                workload.check_stored_shape(model, variant, list(self.words))
                sidecar_path = self.scratch / f"{self.backbone}-{variant.model}-{variant.variant}-d{lengths.doc_len}"
                progress(f"{self.backbone} d={lengths.doc_len} {variant.key}: writing the sidecar")
                start = time.perf_counter()
                expect = workload.write_sidecar(sidecar_path, model, variant, self.backbone, lengths,
                                                config.candidates, config.seed, dtype=config.store_dtype,
                                                codec=config.codec)
                storage["sidecar_write_seconds"] = round(time.perf_counter() - start, 2)
                reader = open_sidecar(sidecar_path, **expect)
                storage.update(bytes_per_doc=reader.bytes_per_doc,
                               sidecar_bytes_per_doc_total=workload.directory_bytes(sidecar_path) / config.candidates,
                               store_width=model.store_width, store_dtype=reader.dtype,
                               stored_tokens_per_doc=workload.stored_doc_tokens(variant, lengths))
                candidates = [Text(None, {"docid": f"doc{row}", "lucene_docid": int(row)}) for row in self.rows]
            else:
                storage.update(bytes_per_doc=0, sidecar_bytes_per_doc_total=0, store_width=None,
                               store_dtype=None, stored_tokens_per_doc=0)
                candidates = [Text(self.doc_texts[row], {"docid": f"doc{row}", "lucene_docid": int(row)})
                              for row in self.rows]
            records = []
            for precision in config.precisions:
                progress(f"{self.backbone} d={lengths.doc_len} {variant.key} {precision}: timing")
                timing = _time_reranker(model, reader, candidates, self.query_text, precision, config)
                records.append(self._record(variant, model, precision, timing, count, storage, peaks))
                progress(f"  {records[-1]['ms_per_query_median']:.1f} ms/query"
                         + (f" (extrapolated from {timing['timed']} candidates)" if timing["extrapolated"] else ""))
            return records
        finally:
            if reader is not None:
                reader.close()
            if sidecar_path is not None:
                shutil.rmtree(sidecar_path, ignore_errors=True)
            del model
            machine.release_memory()

    def _record(self, variant, model, precision, timing, count: flop_formulas.FlopCount, storage, peaks) -> dict:
        config, lengths = self.config, self.lengths
        n = config.candidates
        total_flops = count.total(n, flop_formulas.batches_for(n, config.batch_size))
        seconds = timing["ms"] / 1000.0
        achieved = total_flops / seconds / 1e9 if seconds > 0 else None
        joint = variant.model in ("cross-encoder", "prettr")
        doc_tokens = {"mores": lengths.doc_len, "tk": lengths.doc_len}.get(variant.model, lengths.joint_doc_len - 1)
        return {
            "model": variant.model,
            "variant": variant.variant,
            "backbone": self.backbone,
            "doc_len": lengths.doc_len,
            "precision": precision,
            "candidates": n,
            "candidates_timed": timing["timed"],
            "extrapolated_from": timing["timed"] if timing["extrapolated"] else None,
            "ms_per_query_median": round(timing["ms"], 3),
            "ms_per_query_min": round(timing["ms_min"], 3),
            "ms_timed_runs": [round(ms, 3) for ms in timing["runs_ms"]],
            "query_encode_ms_median": round(timing["query_ms"], 3),
            "sidecar_read_ms_median": round(timing["read_ms"], 3),
            "sidecar_read_fraction": round(timing["read_ms"] / timing["ms"], 4) if timing["ms"] else None,
            "speedup_vs_cross_encoder": None,  # filled in by add_speedups
            **storage,
            "query_tokens": lengths.query_len,
            "doc_tokens": doc_tokens,
            "doc_len_truncated_to": lengths.joint_doc_len if joint and lengths.joint_doc_len < lengths.doc_len else None,
            "flops_per_query": total_flops,
            "flops": count.to_dict(),
            "achieved_gflops": round(achieved, 2) if achieved is not None else None,
            "peak_fraction": (round(achieved / peaks[_compute_precision(precision)]["peak_gflops"], 4)
                              if achieved is not None else None),
            "flop_ratio_limit": round(self.cross_encoder_flops / total_flops, 2),
            "peak_rss_mb": round(timing["peak_rss_mb"], 1),
            "peak_rss_scope": timing["rss_scope"],
            "repetitions": config.repetitions,
            "batch_size": config.batch_size,
            "path": "sidecar" if model.store_width is not None else "text",
            "page_cache": "cold" if config.cold_cache and model.store_width is not None else "warm",
        }


def _time_reranker(model, reader, candidates: list, query_text: str, precision: str, config: BenchConfig) -> dict:
    """Time :meth:`ModelReranker.rerank` as described in the module docstring; milliseconds."""
    from ..rerankers.learned import ModelReranker
    from ..types import Query

    reranker = ModelReranker(model, reader, batch_size=config.batch_size, precision=_compute_precision(precision),
                             cast_weights=FORCED_BF16_PATHS.get(precision))
    # The bf16 weight copy is made once per reranker, before any timed run (a one-off, like loading the model).
    scorer = reranker.scoring_model
    query = Query(query_text, id="bench")
    spent = {"query": 0.0, "read": 0.0}

    def timed(name, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    # Instance attributes shadow the methods the reranker calls, so the shipped path runs unchanged.
    scorer.encode_query = timed("query", scorer.encode_query)
    if reader is not None:
        reader.get_batch = timed("read", reader.get_batch)
    sidecar_files = [p for p in Path(reader.path).iterdir() if p.is_file()] if reader is not None else []

    def run(count: int) -> tuple[float, float, float]:
        spent.update(query=0.0, read=0.0)
        if config.cold_cache and reader is not None:
            reader.close()  # unmap, so that the kernel can drop the pages
            machine.drop_page_cache(sidecar_files)
        texts = candidates[:count]
        start = time.perf_counter()
        reranker.rerank(query, texts)
        return time.perf_counter() - start, spent["query"], spent["read"]

    try:
        machine.release_memory()
        rss_reset = machine.reset_peak_rss()
        total = len(candidates)
        pilot = min(total, max(1, config.pilot_candidates))
        run(pilot)  # warm-up: first-call costs (kernel selection, page faults, lazy imports)
        pilot_seconds, pilot_query, _ = run(pilot)
        fixed = pilot_query if reader is not None else 0.0  # text models re-encode the query per batch
        per_candidate = max(pilot_seconds - fixed, 1e-9) / pilot
        timed_count = total
        if config.max_rep_seconds and fixed + per_candidate * total > config.max_rep_seconds:
            timed_count = int(min(total, max(pilot, (config.max_rep_seconds - fixed) / per_candidate)))
            if timed_count >= config.batch_size:  # whole batches, so the scaled runs have the real batch shapes
                timed_count -= timed_count % config.batch_size
        if timed_count != pilot:
            run(timed_count)  # warm-up at the timed batch shapes
        runs = [run(timed_count) for _ in range(config.repetitions)]
        peak_rss = machine.peak_rss_mb()
    finally:
        del scorer.encode_query
        if reader is not None:
            del reader.get_batch
    seconds = statistics.median(r[0] for r in runs)
    query_seconds = statistics.median(r[1] for r in runs)
    read_seconds = statistics.median(r[2] for r in runs)
    scale = total / timed_count
    fixed = query_seconds if reader is not None else 0.0

    def extrapolate(value: float) -> float:
        return fixed + (value - fixed) * scale

    return {
        "timed": timed_count,
        "extrapolated": timed_count < total,
        "ms": 1000 * extrapolate(seconds),
        "ms_min": 1000 * extrapolate(min(r[0] for r in runs)),
        "runs_ms": [1000 * r[0] for r in runs],
        "query_ms": 1000 * query_seconds,
        "read_ms": 1000 * read_seconds * scale,
        "peak_rss_mb": peak_rss,
        "rss_scope": "measurement" if rss_reset else "process",
    }


def _compute_precision(precision: str) -> str:
    """The ModelReranker precision (and GEMM peak) of a benchmark precision."""
    return "bf16" if precision in FORCED_BF16_PATHS else precision


__all__ = ["BenchConfig", "run_benchmark", "add_speedups", "PRECISIONS", "BENCH_PRECISIONS"]

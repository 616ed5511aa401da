"""Runs the benchmark: for every (backbone, doc_len, variant, precision) it times the shipped rerank path
(:meth:`ModelReranker.rerank`: query encoding, sidecar reads, scoring, sorting) on one query and its candidates, and
beside the cross-encoder, on its weights and the same pairs, the cross-encoders a user could run instead
(:mod:`.baselines`: tokenization, scoring, sorting).

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..precision import resolve_device
from ..sidecar.codecs import CODECS, TokenCodec, is_compressed
from . import baselines, machine, model_flops, workload
from . import flops as flop_formulas
from .model_hooks import benchmark_hooks

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
    baselines: list[str] = field(default_factory=lambda: list(baselines.BASELINES))  # timed with the cross-encoder
    device: str = "auto"  # auto, cpu, cuda, cuda:N (see pyserini_mores.precision.resolve_device)

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
        if self.codec not in CODECS:
            raise ValueError(f"unknown codec {self.codec}; known: {', '.join(CODECS)}")
        unknown = [b for b in self.baselines if b not in baselines.BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; known: {', '.join(baselines.BASELINES)}")


def check_codec_workload(config: BenchConfig) -> None:
    """Refuse (``ValueError``) a compressed ``config.codec`` that a sidecar of the workload cannot train: each holds
    ``candidates`` documents of the stored tokens of its cell, and k-means fits 256 centroids per sub-quantiser
    (``pq``, ``opq``) or ``num_centroids`` (``residual``, 4,096) from at least as many token vectors."""
    if not is_compressed(config.codec):
        return
    if config.models:
        workload.check_selectors(config.models, config.backbones)
    needed = TokenCodec(config.codec, 64).min_training_tokens  # independent of the width
    for backbone in config.backbones:
        dims = workload.backbone_dims(backbone)
        for doc_len in config.doc_lens:
            lengths = workload.cell_lengths(backbone, config.query_len, doc_len)
            for variant in workload.select_variants(config.models, backbone):
                if variant.model in baselines.CROSS_ENCODERS or workload.feasible(variant, dims.num_hidden_layers):
                    continue  # no sidecar
                tokens = config.candidates * workload.stored_doc_tokens(variant, lengths)
                if tokens < needed:
                    raise ValueError(
                        f"--codec {config.codec} trains on at least {needed:,} token vectors, but the {variant.key} "
                        f"sidecar at {backbone} d = {doc_len} stores {config.candidates:,} candidates x "
                        f"{workload.stored_doc_tokens(variant, lengths)} tokens = {tokens:,}; raise --candidates or "
                        "--doc-lens, or choose sq8, sq6 or sq4")


def run_benchmark(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Measure everything ``config`` asks for; returns ``{"machine", "config", "results", "skipped"}``."""
    progress = progress or (lambda message: logger.info("%s", message))
    if config.models:
        workload.check_selectors(config.models, config.backbones)
    check_codec_workload(config)
    device = resolve_device(config.device)
    progress(f"measuring the GEMM peak (fp32, bf16) on {device}")
    peaks = {p: machine.measure_gemm_peak(p, config.peak_sizes, config.peak_repetitions, device) for p in PRECISIONS}
    info = machine.machine_info(peaks, device)
    results: list[dict] = []
    skipped: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyserini-mores-bench-", dir=config.work_dir) as scratch:
        for backbone in config.backbones:
            dims = workload.backbone_dims(backbone)
            words = workload.single_piece_words(workload.minilm_tokenizer())
            for doc_len in config.doc_lens:
                cell = _Cell(config, backbone, doc_len, words, Path(scratch), device)
                for variant in workload.select_variants(config.models, backbone):
                    reason = workload.feasible(variant, dims.num_hidden_layers)
                    if reason:
                        skipped.append({"model": variant.model, "variant": variant.variant, "backbone": backbone,
                                        "doc_len": doc_len, "reason": reason})
                        continue
                    records, not_run = cell.measure(variant, peaks, progress)
                    results += records
                    skipped += not_run
    add_speedups(results)
    info["load_average_at_end"] = list(os.getloadavg())
    info["wall_seconds"] = round(time.perf_counter() - started, 1)
    return {"machine": info, "config": asdict(config), "results": results, "skipped": skipped}


def add_speedups(results: list[dict]) -> None:
    """The speed-ups of every record, each the reference's ms / the record's ms in the same (backbone, doc_len,
    precision), ``None`` without a reference there: ``speedup_vs_fastest_cross_encoder`` against the fastest of the
    cross-encoders timed there (:data:`.baselines.CROSS_ENCODERS`: the project's, Hugging Face's and
    sentence-transformers'), named in ``fastest_cross_encoder``; ``speedup_vs_cross_encoder`` against the project's."""
    fastest: dict[tuple, dict] = {}
    own: dict[tuple, dict] = {}
    for record in results:
        if record["model"] not in baselines.CROSS_ENCODERS or not record["ms_per_query_median"]:
            continue
        cell = _cell_of(record)
        if record["model"] == baselines.PROJECT_CROSS_ENCODER:
            own[cell] = record
        if cell not in fastest or record["ms_per_query_median"] < fastest[cell]["ms_per_query_median"]:
            fastest[cell] = record
    for record in results:
        cell = _cell_of(record)
        record["speedup_vs_cross_encoder"] = _speedup(own.get(cell), record)
        record["speedup_vs_fastest_cross_encoder"] = _speedup(fastest.get(cell), record)
        record["fastest_cross_encoder"] = fastest[cell]["model"] if cell in fastest else None


def _cell_of(record: dict) -> tuple:
    return record["backbone"], record["doc_len"], record["precision"]


def _speedup(reference: dict | None, record: dict) -> float | None:
    if reference is None or not record["ms_per_query_median"]:
        return None
    return round(reference["ms_per_query_median"] / record["ms_per_query_median"], 2)


class _Cell:
    """One (backbone, doc_len): its token counts, candidate texts, query and candidate order."""

    def __init__(self, config: BenchConfig, backbone: str, doc_len: int, words, scratch: Path, device):
        self.config, self.backbone, self.scratch, self.device = config, backbone, scratch, device
        self.words = words
        self.lengths = workload.cell_lengths(backbone, config.query_len, doc_len)
        self.doc_texts = workload.synthetic_texts(words, config.candidates, doc_len, config.seed)
        self.query_text = workload.synthetic_texts(words, 1, config.query_len, config.seed + 1)[0]
        # BM25 order has nothing to do with index order: candidates arrive as a random permutation of rows
        self.rows = np.random.default_rng(config.seed + 2).permutation(config.candidates)
        self.shape = flop_formulas.EncoderShape.from_dims(workload.backbone_dims(backbone))
        self.cross_encoder_flops = model_flops.cross_encoder_flops(
            self.shape, self.lengths.query_len, self.lengths.joint_doc_len - 1).total(config.candidates)

    def measure(self, variant: workload.Variant, peaks: dict, progress) -> tuple[list[dict], list[dict]]:
        """The records of ``variant`` at every precision (with the baselines' beside the cross-encoder's), and the
        baselines that could not run, as ``skipped`` entries."""
        from ..sidecar import open_sidecar
        from ..types import Text

        config, lengths = self.config, self.lengths
        model = workload.build_model(variant, self.backbone, lengths)
        count = workload.flop_count(variant, model, lengths)
        reader, sidecar_path, storage, compared = None, None, {}, None
        try:
            if baselines.applies_to(model) and config.baselines:
                compared = _Baselines(self, model, progress)
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
                storage.update(TEXT_STORAGE)
                candidates = [Text(self.doc_texts[row], {"docid": f"doc{row}", "lucene_docid": int(row)})
                              for row in self.rows]
            records, joint = [], benchmark_hooks(variant.model).joint_input
            for precision in config.precisions:
                progress(f"{self.backbone} d={lengths.doc_len} {variant.key} {precision}: timing")
                timing = _time_reranker(model, reader, candidates, self.query_text, precision, config, self.device)
                records.append(self.record(variant, precision, timing, count, storage, peaks,
                                           joint=joint, path="text" if reader is None else "sidecar"))
                self._report(records[-1], progress)
                if compared is not None:  # timed next to the cross-encoder, at the same precision
                    records += compared.measure(precision, peaks)
            return records, (compared.skipped if compared is not None else [])
        finally:
            if reader is not None:
                reader.close()
            if sidecar_path is not None:
                shutil.rmtree(sidecar_path, ignore_errors=True)
            if compared is not None:
                compared.close()
            del model
            machine.release_memory()

    @staticmethod
    def _report(record: dict, progress) -> None:
        progress(f"  {record['ms_per_query_median']:.1f} ms/query"
                 + (f" (extrapolated from {record['extrapolated_from']} candidates)"
                    if record["extrapolated_from"] else ""))

    def record(self, variant: workload.Variant, precision: str, timing: dict, count: flop_formulas.FlopCount,
               storage: dict, peaks: dict, *, joint: bool, path: str) -> dict:
        """The JSON record of one timing; ``joint``: the model reads ``[CLS] q [SEP] d [SEP]``; ``path``: ``text``
        or ``sidecar``."""
        config, lengths = self.config, self.lengths
        n = config.candidates
        total_flops = count.total(n, flop_formulas.batches_for(n, config.batch_size))
        seconds = timing["ms"] / 1000.0
        achieved = total_flops / seconds / 1e9 if seconds > 0 else None
        return {
            "model": variant.model,
            "variant": variant.variant,
            "backbone": self.backbone,
            "doc_len": lengths.doc_len,
            "precision": precision,
            "device": str(self.device),
            "candidates": n,
            "candidates_timed": timing["timed"],
            "extrapolated_from": timing["timed"] if timing["extrapolated"] else None,
            "ms_per_query_median": round(timing["ms"], 3),
            "ms_per_query_min": round(timing["ms_min"], 3),
            "ms_timed_runs": [round(ms, 3) for ms in timing["runs_ms"]],
            "query_encode_ms_median": round(timing["query_ms"], 3),
            "sidecar_read_ms_median": round(timing["read_ms"], 3),
            "sidecar_read_fraction": round(timing["read_ms"] / timing["ms"], 4) if timing["ms"] else None,
            "speedup_vs_cross_encoder": None,  # these three filled in by add_speedups
            "speedup_vs_fastest_cross_encoder": None,
            "fastest_cross_encoder": None,
            **storage,
            "query_tokens": lengths.query_len,
            "doc_tokens": lengths.joint_doc_len - 1 if joint else lengths.doc_len,
            "doc_len_truncated_to": (lengths.joint_doc_len if joint and lengths.joint_doc_len < lengths.doc_len
                                     else None),
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
            "path": path,
            "page_cache": "cold" if config.cold_cache and path == "sidecar" else "warm",
        }


#: the storage fields of a model that scores text
TEXT_STORAGE = {"bytes_per_doc": 0, "sidecar_bytes_per_doc_total": 0, "store_width": None, "store_dtype": None,
                "stored_tokens_per_doc": 0}
#: candidates whose scores the baselines must reproduce (the project's cross-encoder, fp32) before they are timed
SCORE_CHECK_CANDIDATES = 8


class _Baselines:
    """The baselines of one cell's cross-encoder: its weights saved once as a Hugging Face checkpoint, the texts
    cut to the tokens the cross-encoder reads, and each baseline timed at a precision on demand."""

    def __init__(self, cell: _Cell, model, progress):
        self.cell, self.progress = cell, progress
        config, lengths = cell.config, cell.lengths
        self.skipped = []
        self.names = []
        for name in config.baselines:
            reason = baselines.unavailable_reason(name)
            if reason:
                self.skipped.append({"model": name, "variant": "full", "backbone": cell.backbone,
                                     "doc_len": lengths.doc_len, "reason": reason})
            else:
                self.names.append(name)
        self.checkpoint = None
        if not self.names:
            return
        self.checkpoint = baselines.save_checkpoint(
            model, cell.scratch / f"{cell.backbone}-hf-cross-encoder-d{lengths.doc_len}")
        # The cross-encoder truncates the query and the document to its limits (special tokens included); the
        # synthetic words are one WordPiece each, so keeping that many words gives the baselines the same tokens.
        self.query = _first_words(cell.query_text, lengths.query_len - 2)
        self.documents = [_first_words(cell.doc_texts[row], lengths.joint_doc_len - 2) for row in cell.rows]
        self.max_length = lengths.query_len + lengths.joint_doc_len - 1
        self.encoder_batch_size = min(model.batch_size, config.batch_size)
        with torch.inference_mode():
            self.reference = model.score_texts(cell.query_text, [cell.doc_texts[row] for row in
                                                                 cell.rows[:SCORE_CHECK_CANDIDATES]]).float().cpu()
        self.count = baselines.baseline_flops(cell.shape, lengths.query_len, lengths.joint_doc_len - 1)

    def measure(self, precision: str, peaks: dict) -> list[dict]:
        """A record per baseline at ``precision``, each checked to score what the cross-encoder scores first."""
        cell, records = self.cell, []
        for name in self.names:
            self.progress(f"{cell.backbone} d={cell.lengths.doc_len} {name} {precision}: timing")
            scorer = baselines.build_scorer(name, self.checkpoint, precision=precision, device=cell.device,
                                            batch_size=self.encoder_batch_size, max_length=self.max_length)
            difference = float((scorer(self.query, self.documents[:SCORE_CHECK_CANDIDATES])
                                - self.reference).abs().max())
            timing = _time_scorer(scorer, self.query, self.documents, cell.config)
            record = cell.record(workload.Variant(name, "full"), precision, timing, self.count, TEXT_STORAGE, peaks,
                                 joint=True, path="text")
            record.update(same_weights_as=baselines.PROJECT_CROSS_ENCODER, encoder_batch_size=self.encoder_batch_size,
                          max_abs_score_difference=round(difference, 6))
            records.append(record)
            self.cell._report(record, self.progress)
            del scorer
            machine.release_memory()
        return records

    def close(self) -> None:
        if self.checkpoint is not None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)


def _first_words(text: str, count: int) -> str:
    return " ".join(text.split()[:max(count, 0)])


def _time_reranker(model, reader, candidates: list, query_text: str, precision: str, config: BenchConfig,
                   device) -> dict:
    """Time :meth:`ModelReranker.rerank` as described in the module docstring; milliseconds."""
    from ..rerankers.learned import ModelReranker
    from ..types import Query

    reranker = ModelReranker(model, reader, batch_size=config.batch_size, precision=_compute_precision(precision),
                             cast_weights=FORCED_BF16_PATHS.get(precision), device=device)
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
    if reader is not None:  # every read of stored vectors (get_batch too) goes through get_spans
        reader.get_spans = timed("read", reader.get_spans)

    def run(count: int) -> tuple[float, float, float]:
        spent.update(query=0.0, read=0.0)
        if config.cold_cache and reader is not None:
            reader.evict_from_page_cache()
        texts = candidates[:count]
        start = time.perf_counter()
        reranker.rerank(query, texts)
        return time.perf_counter() - start, spent["query"], spent["read"]

    try:
        # from a sidecar the query is encoded once per query, a fixed cost; text models re-encode it per batch
        return _time_runs(run, len(candidates), config, fixed_query_cost=reader is not None)
    finally:
        del scorer.encode_query
        if reader is not None:
            del reader.get_spans


def _time_scorer(scorer: baselines.Scorer, query: str, documents: list[str], config: BenchConfig) -> dict:
    """Time a baseline as :func:`_time_reranker` times a reranker: scoring (tokenization included) and sorting."""

    def run(count: int) -> tuple[float, float, float]:
        start = time.perf_counter()
        torch.argsort(scorer(query, documents[:count]), descending=True)
        return time.perf_counter() - start, 0.0, 0.0

    return _time_runs(run, len(documents), config, fixed_query_cost=False)


def _time_runs(run: Callable[[int], tuple[float, float, float]], total: int, config: BenchConfig, *,
               fixed_query_cost: bool) -> dict:
    """The protocol of the module docstring around ``run(count)`` → ``(seconds, query seconds, read seconds)`` of
    one query against the first ``count`` of ``total`` candidates; with ``fixed_query_cost``, query encoding is
    counted once per query when a run is scaled, not per candidate."""
    machine.release_memory()
    rss_reset = machine.reset_peak_rss()
    pilot = min(total, max(1, config.pilot_candidates))
    run(pilot)  # warm-up: first-call costs (kernel selection, page faults, lazy imports)
    pilot_seconds, pilot_query, _ = run(pilot)
    fixed = pilot_query if fixed_query_cost else 0.0
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
    seconds = statistics.median(r[0] for r in runs)
    query_seconds = statistics.median(r[1] for r in runs)
    read_seconds = statistics.median(r[2] for r in runs)
    scale = total / timed_count
    fixed = query_seconds if fixed_query_cost else 0.0

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

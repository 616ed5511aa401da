"""Presents a benchmark report: a plain-text table, the JSON file and a bar chart of speed-ups (log scale).

JSON layout (``--json``)::

    command      the argv of the run
    config       the BenchConfig (backbones, doc_lens, models, precisions, candidates, repetitions, ...)
    machine      cores, cores_available, cpu_model, cpu_flags, torch_version, torch_threads, mkldnn, python,
                 platform, load_average_at_start/_at_end, wall_seconds, peak_gflops_fp32, peak_gflops_bf16
                 (best median GFLOP/s of square matmuls on the device, measured at the start of the run) and
                 peak_gemm_* details; the capability probe: cpu_capability
                 (torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...), mkldnn_bf16_supported
                 (torch.ops.mkldnn._is_mkldnn_bf16_supported()), bf16_native and bf16_reason (the verdict of
                 --precision auto), device (where the models ran) and gpu (its name, or null)
    results[]    one record per (model, variant, backbone, doc_len, precision):
      model, variant, backbone, doc_len, precision, device
                              model is a registered model type, or beside the cross-encoder one of the baselines
                              on its weights: hf-bert-sdpa (Hugging Face BertForSequenceClassification, sdpa
                              attention) and st-crossencoder (sentence-transformers CrossEncoder); these have
                              same_weights_as, encoder_batch_size (pairs per forward pass, the cross-encoder's) and
                              max_abs_score_difference (against the project's cross-encoder in fp32, on 8 candidates)
      candidates              candidates per query the figures are for (1000 by default)
      candidates_timed        candidates actually scored per timed run
      extrapolated_from       = candidates_timed when it is below candidates (else null): the ms figures are
                              query encoding + (measured − query encoding) × candidates / candidates_timed
      ms_per_query_median     per-query latency (query encoding, sidecar reads, scoring, sorting), median of the
                              timed runs, for `candidates`; ms_per_query_min likewise
      ms_timed_runs           the raw timed runs (for candidates_timed, not scaled)
      query_encode_ms_median, sidecar_read_ms_median (scaled to `candidates`), sidecar_read_fraction
      speedup_vs_fastest_cross_encoder  ms of the fastest cross-encoder timed in the same backbone, doc_len and
                              precision (the project's, hf-bert-sdpa or st-crossencoder) / this ms; null without one;
                              fastest_cross_encoder names it. The table and the plot show this speed-up
      speedup_vs_cross_encoder  the project's cross-encoder ms / this ms, likewise
      bytes_per_doc           sidecar token bytes per document (0 for models that score text);
                              sidecar_bytes_per_doc_total includes offsets, docids and manifest
      store_width, store_dtype, stored_tokens_per_doc, sidecar_write_seconds (sidecar models)
      query_tokens, doc_tokens (document tokens the model processes), doc_len_truncated_to (joint models whose
                              q + d exceed the backbone's positions)
      flops_per_query         analytic FLOPs for `candidates` (pyserini_mores.bench.flops); flops: the breakdown
                              {query, per_batch, per_candidate, terms[]}
      achieved_gflops         flops_per_query / latency; peak_fraction = achieved / peak of that precision
      flop_ratio_limit        cross-encoder FLOPs / this model's FLOPs (the speed-up FLOPs allow)
      peak_rss_mb             peak RSS during this measurement (peak_rss_scope "measurement"; "process" when the
                              kernel does not allow resetting it), mapped sidecar pages included
      repetitions, batch_size, path ("sidecar" | "text"), page_cache ("warm" | "cold")
    skipped[]    {model, variant, backbone, doc_len, reason} for combinations that cannot be built or run (a
                 baseline whose library is not installed)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .baselines import CROSS_ENCODERS

#: Keys every result record has (the JSON contract; tests check it).
RESULT_KEYS = (
    "model", "variant", "backbone", "doc_len", "precision", "candidates", "candidates_timed", "extrapolated_from",
    "ms_per_query_median", "speedup_vs_cross_encoder", "speedup_vs_fastest_cross_encoder", "fastest_cross_encoder",
    "device", "bytes_per_doc", "achieved_gflops", "peak_fraction",
    "flop_ratio_limit", "flops_per_query", "peak_rss_mb", "repetitions", "query_encode_ms_median",
    "sidecar_read_ms_median", "sidecar_read_fraction",
)
MACHINE_KEYS = ("cores", "torch_version", "torch_threads", "cpu_model", "peak_gflops_fp32", "peak_gflops_bf16",
                "cpu_capability", "mkldnn_bf16_supported", "bf16_native", "device", "gpu")

_COLUMNS = [  # header, width, alignment
    ("backbone", 9, "<"), ("d", 4, ">"), ("prec", 4, "<"), ("model", 15, "<"), ("variant", 9, "<"),
    ("cands", 7, ">"), ("ms/query", 10, ">"), ("speed-up", 8, ">"), ("FLOP lim", 8, ">"), ("GFLOP/s", 8, ">"),
    ("%peak", 6, ">"), ("KiB/doc", 8, ">"), ("read%", 6, ">"), ("RSS MB", 7, ">"),
]


def _fmt(value, pattern: str = "{:.1f}", missing: str = "-") -> str:
    return missing if value is None else pattern.format(value)


def format_table(report: dict) -> str:
    """The results as an aligned text table, with the machine on top and footnotes for extrapolated rows."""
    info = report["machine"]
    lines = [
        f"machine: {info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']} "
        f"(threads: {info['torch_threads']}); GEMM peak fp32 {info['peak_gflops_fp32']:.0f} GFLOP/s, "
        f"bf16 {info['peak_gflops_bf16']:.0f} GFLOP/s; load average at start "
        f"{_fmt((info.get('load_average_at_start') or [None])[0], '{:.2f}')}",
        f"capability: {describe_capability(info)}",
    ]
    load = (info.get("load_average_at_start") or [0])[0]
    if info.get("cores") and load >= info["cores"]:
        lines.append(f"warning: the machine was busy (load {load:.1f} on {info['cores']} cores): timings are "
                     "perturbed; with several torch threads a descheduled thread stalls every op (--threads 1 is "
                     "steadier)")
    header = " ".join(f"{name:{align}{width}}" for name, width, align in _COLUMNS)
    lines += [header, "-" * len(header)]
    footnotes = []
    for record in report["results"]:
        candidates = str(record["candidates"])
        if record.get("extrapolated_from"):
            candidates += "*"
            footnotes.append(f"{record['backbone']} d={record['doc_len']} {record['precision']} {record['model']} "
                             f"{record['variant']}: timed on {record['extrapolated_from']} candidates")
        speedup = record.get("speedup_vs_fastest_cross_encoder")
        cells = [
            record["backbone"], str(record["doc_len"]), record["precision"], record["model"], record["variant"],
            candidates, f"{record['ms_per_query_median']:.1f}", _fmt(speedup, "{:.1f}x"),
            _fmt(record["flop_ratio_limit"], "{:.1f}x"), _fmt(record["achieved_gflops"]),
            _fmt(None if record["peak_fraction"] is None else 100 * record["peak_fraction"]),
            _fmt(record["bytes_per_doc"] / 1024 if record["bytes_per_doc"] else None),
            _fmt(None if record.get("sidecar_read_fraction") is None or record["path"] != "sidecar"
                 else 100 * record["sidecar_read_fraction"]),
            _fmt(record["peak_rss_mb"], "{:.0f}"),
        ]
        lines.append(" ".join(f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, _COLUMNS)))
    for skipped in report.get("skipped", []):
        lines.append(f"skipped {skipped['backbone']} d={skipped['doc_len']} {skipped['model']} "
                     f"{skipped['variant']}: {skipped['reason']}")
    lines += fastest_cross_encoder_lines(report["results"])
    if footnotes:
        lines.append("* timed on fewer candidates and scaled linearly to all of them "
                     "(query encoding + rest x candidates/timed):")
        lines += [f"  {note}" for note in footnotes]
    truncated = sorted({(r["backbone"], r["doc_len"], r["doc_len_truncated_to"]) for r in report["results"]
                        if r.get("doc_len_truncated_to")})
    for backbone, doc_len, kept in truncated:
        lines.append(f"note: {backbone} d={doc_len}: the joint models (cross-encoder, PreTTR) keep {kept} document "
                     f"tokens ([CLS] q [SEP] + d must fit the backbone's positions)")
    lines.append("ms/query: median per-query latency of ModelReranker.rerank (query encoding, sidecar reads, "
                 "scoring, sorting; the baselines: tokenization, scoring, sorting); speed-up: over the fastest "
                 "cross-encoder of the same backbone, d and precision; FLOP lim: the project's cross-encoder FLOPs / "
                 "model FLOPs; %peak: of the measured GEMM peak of that precision; read%: sidecar reads / latency")
    return "\n".join(lines)


def describe_capability(info: dict) -> str:
    """One line of what decides the kernels: the device, PyTorch's CPU capability, native bf16 or not."""
    device = info.get("device", "cpu")
    gpu = f" ({info['gpu']})" if info.get("gpu") else ""
    return (f"device {device}{gpu}; torch CPU capability {info.get('cpu_capability', '?')}, oneDNN bf16 "
            f"{'yes' if info.get('mkldnn_bf16_supported') else 'no'}; bf16 "
            f"{'native' if info.get('bf16_native') else 'not native'} ({info.get('bf16_reason', '?')})")


def fastest_cross_encoder_lines(results: list[dict]) -> list[str]:
    """Per (backbone, d, precision) with a cross-encoder timing: the fastest cross-encoder, the others' ms beside."""
    cells: dict[tuple, list[dict]] = {}
    for record in results:
        if record["model"] in CROSS_ENCODERS:
            cells.setdefault((record["backbone"], record["doc_len"], record["precision"]), []).append(record)
    lines = []
    for (backbone, doc_len, precision), records in cells.items():
        records = sorted(records, key=lambda r: r["ms_per_query_median"])
        others = ", ".join(f"{r['model']} {r['ms_per_query_median']:.1f} ms" for r in records[1:])
        lines.append(f"fastest cross-encoder, {backbone} d={doc_len} {precision}: {records[0]['model']} "
                     f"{records[0]['ms_per_query_median']:.1f} ms/query" + (f" ({others})" if others else ""))
    return lines


def write_json(report: dict, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def plot_speedups(report: dict, path: str | os.PathLike) -> None:
    """One panel per (backbone, doc_len): bars of speed-up over the fastest cross-encoder per variant and precision
    (log scale), with the FLOP-ratio limit (against the project's cross-encoder) as a black tick; hatched bars were
    timed on fewer candidates. Without a cross-encoder run, bars show ms per query. Needs matplotlib
    (``pip install 'pyserini-mores[plot]'``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    results = report["results"]
    cells = list(dict.fromkeys((r["backbone"], r["doc_len"]) for r in results))
    colors = {p: f"C{i}" for i, p in enumerate(dict.fromkeys(r["precision"] for r in results))}
    use_speedup = any(r.get("speedup_vs_fastest_cross_encoder") for r in results)
    columns = max(1, min(2, len(cells)))
    rows = max(1, -(-len(cells) // columns))
    figure = Figure(figsize=(7 * columns, 4.2 * rows), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)  # a canvas of its own: pyplot's global backend is never touched
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, cell in enumerate(cells):
        axis = axes[index // columns][index % columns]
        in_cell = [r for r in results if (r["backbone"], r["doc_len"]) == cell]
        labels = list(dict.fromkeys(f"{r['model']}\n{r['variant']}" for r in in_cell))
        precisions = list(dict.fromkeys(r["precision"] for r in in_cell))
        width = 0.8 / len(precisions)
        for record in in_cell:
            value = record["speedup_vs_fastest_cross_encoder"] if use_speedup else record["ms_per_query_median"]
            if not value:
                continue
            offset = precisions.index(record["precision"]) - (len(precisions) - 1) / 2
            axis.bar(labels.index(f"{record['model']}\n{record['variant']}") + offset * width, value, width=width,
                     color=colors[record["precision"]], hatch="//" if record.get("extrapolated_from") else None)
        handles = [Patch(color=color, label=precision) for precision, color in colors.items()
                   if precision in precisions]
        if any(r.get("extrapolated_from") for r in in_cell):
            handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="timed on fewer, scaled"))
        if use_speedup:
            limits = {f"{r['model']}\n{r['variant']}": r["flop_ratio_limit"] for r in in_cell}
            axis.scatter(range(len(labels)), [limits[label] for label in labels], marker="_", s=300, color="black",
                         zorder=3)
            handles.append(Line2D([], [], color="black", label="FLOP-ratio limit"))
            axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_yscale("log")
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, fontsize=7, rotation=60, ha="right")
        axis.set_title(f"{cell[0]}, d = {cell[1]}", fontsize=10)
        axis.set_ylabel("speed-up over the fastest cross-encoder" if use_speedup else "ms per query")
        axis.legend(handles=handles, fontsize=7)
    for index in range(len(cells), rows * columns):
        axes[index // columns][index % columns].axis("off")
    info = report["machine"]
    figure.suptitle(f"{info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']}, "
                    f"{info['torch_threads']} thread(s); {report['results'][0]['candidates'] if results else 0} "
                    f"candidates per query\n{describe_capability(info)}", fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


__all__ = ["RESULT_KEYS", "MACHINE_KEYS", "format_table", "describe_capability", "fastest_cross_encoder_lines",
           "write_json", "plot_speedups"]

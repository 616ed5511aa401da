"""python -m pyserini_mores.bench — every reranker side by side on this machine, in one process.

For each backbone (BERT-base dims with random weights, and the real MiniLM), document length and precision, it builds
each model at the same dims — the cross-encoder, MORES 1×IB/2×IB with Reuse-S1/S2, PreTTR at l = L−1 and L−2 with and
without compression (e = 128) and at l = L−1 with its last layer's keys and values stored, TK-2 ctx/online — writes
each precomputing model's sidecar to a temporary directory (fp16, real files, random rows of the exact stored shape),
and times ModelReranker.rerank on one query of 16 tokens against 1000 candidates (query encoding, sidecar reads,
scoring, sorting): median of the timed repetitions after warm-up. Beside the cross-encoder, on its weights, the same
pairs and token counts, precision and threads, it times the cross-encoders a user could run instead (--baselines):
Hugging Face BertForSequenceClassification with sdpa attention and sentence-transformers CrossEncoder. It reports
the speed-up over the fastest of the three cross-encoders, sidecar bytes per document, peak RSS, achieved GFLOP/s
from an analytic FLOP count (pyserini_mores.bench.flops) against the fp32/bf16 GEMM peak measured in the same run,
the FLOP-ratio limit of each speed-up, and the machine's capability (PyTorch's CPU capability, native bf16 or not,
the GPU). Runs that would exceed --max-rep-seconds are timed on fewer candidates and scaled linearly (marked * in the
table, "extrapolated_from" in the JSON).

Example:
  python -m pyserini_mores.bench --quick --json bench.json --plot bench.png
  python -m pyserini_mores.bench --backbones bert-base --doc-lens 128 --models cross-encoder mores:2xIB-s2 \\
      --precision bf16 --json bench-bert.json
  python -m pyserini_mores.bench --quick --device cuda --json bench-gpu.json

The full run with both precisions (both backbones, d = 128 and 512, --precision both: 88 measurements) takes
roughly an hour on 2 cores; each run is capped by --max-rep-seconds, so its length depends little on how slow the slowest model is.
On a machine shared with other work, --threads 1 gives much steadier timings.
"""
from __future__ import annotations

import argparse
import logging
import sys

from .._cli import device_name, run_parsed, setup_logging
from ..sidecar.codecs import CODECS
from .names import BASELINES

logger = logging.getLogger(__name__)


QUICK = {"backbones": ["minilm"], "doc_lens": [128], "repetitions": 3, "max_rep_seconds": 2.0}
FULL = {"backbones": ["bert-base", "minilm"], "doc_lens": [128, 512], "repetitions": 5, "max_rep_seconds": 10.0}


def define_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=None, metavar="MODEL[:VARIANT]",
                        help="models (cross-encoder, mores, prettr, tk) or single variants, e.g. mores:2xIB-s2 "
                             "prettr:l11-e128 tk:ctx (default: all)")
    parser.add_argument("--backbones", nargs="+", default=None, metavar="NAME",
                        help="bert-base (BERT-base dims, random weights, MiniLM WordPiece) and/or minilm "
                             "(the real MiniLM-L6) (default: both; --quick: minilm)")
    parser.add_argument("--doc-lens", nargs="+", type=int, default=None, metavar="TOKENS",
                        help="document lengths in WordPieces incl. [CLS]/[SEP] (default: 128 512; --quick: 128)")
    parser.add_argument("--query-len", type=int, default=16, help="query length in tokens (default: 16)")
    parser.add_argument("--candidates", type=int, default=1000, help="candidates per query (default: 1000)")
    parser.add_argument("--repetitions", type=int, default=None,
                        help="timed repetitions after warm-up, the median is reported (default: 5; --quick: 3)")
    parser.add_argument("--precision", nargs="+",
                        choices=["auto", "fp32", "bf16", "bf16-copy", "bf16-autocast", "both"], default=["auto"],
                        help="compute precision(s): auto (the default: bf16 where the device runs it natively, fp32 "
                             "elsewhere, as the search CLI chooses), fp32, bf16 (as --precision bf16 of the search "
                             "CLI: weights cast to bf16 once, or autocast alone for MORES), bf16-copy / bf16-autocast "
                             "(force one of those two paths, to time them side by side), both (= fp32 bf16)")
    parser.add_argument("--batch-size", type=int, default=250,
                        help="candidates per model batch, the same for every model (ModelReranker's default: 250)")
    parser.add_argument("--max-rep-seconds", type=float, default=None, metavar="S",
                        help="time a run on fewer candidates and scale linearly when all of them would take longer "
                             "than this; 0 = never (default: 10; --quick: 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", type=device_name, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help="where the models compute (and the GEMM peak is measured); auto (default): cuda when "
                             "torch.cuda.is_available(), else cpu")
    parser.add_argument("--baselines", nargs="+", choices=[*BASELINES, "none"], default=list(BASELINES),
                        metavar="NAME",
                        help="cross-encoders timed beside the project's, on its weights, whenever it is measured: "
                             f"{', '.join(BASELINES)} (Hugging Face BertForSequenceClassification with sdpa "
                             "attention, sentence-transformers CrossEncoder), or none (default: both)")
    parser.add_argument("--codec", choices=CODECS, default="fp16",
                        help="sidecar codec of the precomputing models: fp16 vectors, or a codec of `sidecar build "
                             "--codec` with its default settings, trained on the random rows and decoded at read time "
                             "(default: fp16); pq and opq train on at least 256 token vectors, residual on 4096: "
                             "--candidates x the stored tokens per document must reach that")
    parser.add_argument("--store-dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                        help="vector dtype of the uncompressed sidecars, as `sidecar build --dtype` (default: float16; "
                             "bfloat16 is read without conversion under --precision bf16)")
    parser.add_argument("--cold-cache", action="store_true",
                        help="evict the sidecar from the page cache before every timed run (default: warm)")
    parser.add_argument("--work-dir", default=None,
                        help="where the temporary sidecars are written (default: $PYSERINI_MORES_BENCH_DIR or the "
                             "system temp dir; up to ~3 GB at BERT-base dims, d = 512)")
    parser.add_argument("--peak-sizes", nargs="+", type=int, default=[1024, 2048], metavar="N",
                        help="sizes of the square matmuls that measure the GEMM peak (default: 1024 2048)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="a run of a few minutes: MiniLM, d = 128, 3 repetitions, runs over 2 s scaled")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH.png", help="bar chart of the speed-ups (log scale)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # 2-layer, 32-wide smoke-test backbone
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")


def config_from_args(args: argparse.Namespace):
    from .runner import BenchConfig
    from .workload import default_work_dir

    defaults = QUICK if args.quick else FULL
    backbones = ["tiny"] if args.tiny else (args.backbones or defaults["backbones"])
    return BenchConfig(
        backbones=backbones,
        doc_lens=args.doc_lens or defaults["doc_lens"],
        models=args.models,
        precisions=list(dict.fromkeys(p for value in args.precision
                                      for p in _precisions(value, args.device))),
        candidates=args.candidates,
        query_len=args.query_len,
        repetitions=args.repetitions or defaults["repetitions"],
        batch_size=args.batch_size,
        max_rep_seconds=defaults["max_rep_seconds"] if args.max_rep_seconds is None else args.max_rep_seconds,
        cold_cache=args.cold_cache,
        codec=args.codec,
        store_dtype=args.store_dtype,
        work_dir=args.work_dir or default_work_dir(),
        seed=args.seed,
        peak_sizes=tuple(args.peak_sizes),
        baselines=[name for name in args.baselines if name != "none"],
        device=args.device,
    )


def _precisions(value: str, device: str) -> list[str]:
    """The precisions one ``--precision`` value measures; ``auto`` is what the search CLI would choose on ``device``
    (emulated bf16 is ~20x slower than fp32: timing it by default would mostly measure the emulation)."""
    if value == "both":
        return ["fp32", "bf16"]
    if value == "auto":
        from ..precision import resolve_device, resolve_precision

        return [resolve_precision("auto", resolve_device(device))]
    return [value]


def build_parser() -> argparse.ArgumentParser:
    """The command's parser (defining it imports nothing heavy)."""
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    define_bench_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return run_parsed(parser, lambda args: run_bench(parser, args, argv), argv)


def run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    setup_logging(args.verbose)
    try:
        config = config_from_args(args)
        from .runner import check_codec_workload

        check_codec_workload(config)
    except ValueError as error:
        parser.error(str(error))
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail now, not after a long run)
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'pyserini-mores[plot]'")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from .report import format_table, plot_speedups, write_json
    from .runner import run_benchmark

    progress = (lambda message: print(message, file=sys.stderr, flush=True)) if args.verbose else None
    report = run_benchmark(config, progress=progress)
    report["command"] = ["python", "-m", "pyserini_mores.bench", *(sys.argv[1:] if argv is None else argv)]
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot_speedups(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training CLI: ``python -m pyserini_mores.train {mine-negatives,train,pretrain-compressor,export-delta,fold-blocks,
widen-ffn,average,recipes} ...``.

Examples::

    python -m pyserini_mores.train mine-negatives --index indexes/debian --topics queries.train.tsv \\
        --qrels qrels.train.txt --negatives-per-query 1 --depth 100 --output triples.train.tsv
    python -m pyserini_mores.train train --recipe cross-encoder-debian --triples triples.train.tsv --output models/ce \\
        --dev-topics queries.dev.tsv --dev-qrels qrels.dev.txt --dev-index indexes/debian
    python -m pyserini_mores.train mine-negatives --run teacher.train.trec --index indexes/debian \\
        --topics queries.train.tsv --qrels qrels.train.txt --negatives-per-query 6 --depth 30 --teacher-scores \\
        --output scored.train.tsv     # a teacher reranker's run (--hits = --rerank-depth), for --loss distill
    python -m pyserini_mores.train train --recipe mores-debian --triples scored.train.tsv --output models/mores \\
        --dev-topics queries.dev.tsv --dev-qrels qrels.dev.txt --dev-index indexes/debian
    python -m pyserini_mores.train pretrain-compressor --recipe prettr-compressor-debian --texts collection.tsv \\
        --output models/prettr-e128
    python -m pyserini_mores.train export-delta --model-type prettr --model models/prettr --output prettr-delta
    python -m pyserini_mores.train fold-blocks --model debian-mores-2ib --blocks 1 --output models/mores-1ib-start
    python -m pyserini_mores.train widen-ffn --model debian-tk --ffn-dim 400 --output models/tk-wide-start
    python -m pyserini_mores.train recipes            # list the shipped recipes
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .._cli import define_first_stage_args, parse_model_args, positive_int, run_parsed, setup_logging
from ..errors import UsageExit
from ..precision import PRECISION_CHOICES

S = argparse.SUPPRESS  # options left out of the namespace unless given, so a recipe's value is not overridden


def define_mine_args(parser: argparse.ArgumentParser) -> None:
    define_first_stage_args(parser, rerank_depth=None,
                            index_help="Lucene index: BM25 candidates (unless --run) and document text (unless "
                                       "--collection)")
    parser.add_argument("--topics", required=True, help="queries TSV (qid<TAB>text)")
    parser.add_argument("--qrels", required=True, help="TREC qrels: the positives, and documents never to use "
                                                       "as negatives")
    parser.add_argument("--run", help="first-stage run file (TREC or MS MARCO format) instead of BM25")
    parser.add_argument("--collection", help="collection file (TSV or JSONL) for document text instead of "
                                             "the index's stored text")
    parser.add_argument("--negatives-per-query", type=positive_int, default=1, metavar="N",
                        help="negatives sampled per query (each paired with every positive; default 1)")
    parser.add_argument("--depth", type=positive_int, default=100,
                        help="sample negatives from the top DEPTH (default 100)")
    parser.add_argument("--output", required=True, help="triples TSV to write (query<TAB>positive<TAB>negative)")
    parser.add_argument("--teacher-scores", action="store_true",
                        help="also write the --run's scores of each positive and negative (fields 4 and 5): the run "
                             "is a teacher reranker's (search with --hits equal to --rerank-depth, so that every "
                             "candidate has its score), for --loss distill; positives the run lacks are left out")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--relevance-level", type=int, default=1,
                        help="lowest grade that makes a positive (any grade > 0 excludes a negative)")


def define_train_args(parser: argparse.ArgumentParser) -> None:
    from ._choices import LOSSES, MODEL_TYPES, SCHEDULERS, TRAIN_MODULES

    parser.add_argument("--recipe", help="a shipped recipe name (see the 'recipes' command), a JSON file or "
                                         "inline JSON; flags given here override its values")
    model = parser.add_argument_group("model and data")
    model.add_argument("--model-type", choices=MODEL_TYPES, default=S)
    model.add_argument("--init", default=S, metavar="BACKBONE_OR_CHECKPOINT",
                       help="backbone (minilm, HF name or dir), a checkpoint of --model-type, a trained "
                       "cross-encoder or MaxSim checkpoint (mores, prettr), a trained MaxSim checkpoint "
                       "(cross-encoder: its encoder), or a GloVe .txt (tk)")
    model.add_argument("--model-arg", dest="model_args", action="append", default=S, metavar="KEY=VALUE",
                       help="model config override, repeatable (e.g. n_interaction_blocks=2)")
    model.add_argument("--triples", default=S, help="training triples TSV (query<TAB>positive<TAB>negative)")
    model.add_argument("--max-triples", type=int, default=S, help="use only the first N triples")
    model.add_argument("--negatives-per-example", type=int, default=S, metavar="K",
                       help="negatives per training group (listwise; consecutive triples sharing query and "
                            "positive are pooled; default 1)")
    model.add_argument("--batch-negatives", type=int, default=S, metavar="B",
                       help="add the positives of B other groups of the batch as negatives of each group (default 0)")
    model.add_argument("--output", required=True, help="output directory (the model in save_pretrained format, "
                                                       "checkpoints, logs)")
    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--loss", choices=LOSSES, default=S,
                     help="pointwise 2-class CE, pairwise hinge, listwise softmax CE, distill: listwise softmax CE "
                          "against a teacher's scores, or margin-mse: Margin-MSE against the teacher's score margins "
                          "(both need scored triples from mine-negatives --teacher-scores) (default: "
                          "each paper's: pointwise for MORES and the cross-encoder, listwise = pairwise softmax for "
                          "PreTTR, hinge for TK)")
    opt.add_argument("--margin", type=float, default=S, help="pairwise hinge margin (default 1, TK)")
    opt.add_argument("--distill-temperature", type=float, default=S,
                     help="--loss distill: the teacher's scores are divided by this before its softmax (default 1)")
    opt.add_argument("--hidden-teacher", default=S, metavar="CROSS_ENCODER",
                     help="also pull the query-token states of MORES's interaction blocks (PreTTR's joint layers) "
                          "towards this trained cross-encoder's at the mirrored layers (a directory or a shipped "
                          "name, e.g. debian-cross-encoder; same width and query tokenization as the model)")
    opt.add_argument("--hidden-weight", type=float, default=S, metavar="W",
                     help="--hidden-teacher: weight of the hidden-state MSE beside the ranking loss (default 1)")
    opt.add_argument("--train-modules", choices=TRAIN_MODULES, default=S,
                     help="MORES adapt-interaction / adapt-representation: train only those modules")
    opt.add_argument("--freeze-embeddings", action=argparse.BooleanOptionalAction, default=S,
                     help="keep the embedding tables frozen (the trained model then ships as a small delta); "
                          "--no-freeze-embeddings trains them, TK's (frozen by default) included")
    opt.add_argument("--freeze-layers", type=int, default=S, metavar="N",
                     help="keep the first N layers of a cross-encoder (so that models built from it still load "
                          "over it), of PreTTR or of MORES's document module frozen too")
    opt.add_argument("--doc-sidecar", default=S, metavar="SIDECAR",
                     help="train only what runs online, reading documents from this sidecar of the model instead "
                          "of encoding them (every parameter the sidecar depends on is frozen, so it stays valid "
                          "for the trained model; MORES: --model-arg reuse=s1 for an S1 sidecar); 'default': the "
                          "sidecar 'sidecar build' writes beside --doc-index for the --init model")
    opt.add_argument("--doc-index", default=S, metavar="INDEX",
                     help="the index --doc-sidecar was built from (its stored texts match the triples to rows; "
                          "default --dev-index)")
    opt.add_argument("--max-steps", type=int, default=S, help="optimiser steps (overrides --epochs)")
    opt.add_argument("--stop-at-step", type=int, default=S, metavar="STEP",
                     help="end after this step, the learning-rate schedule still that of all --max-steps (the "
                          "first part of a schedule; --resume without it continues the schedule)")
    opt.add_argument("--epochs", type=float, default=S, help="passes over the triples (default 1)")
    opt.add_argument("--batch-size", type=int, default=S,
                     help="examples per optimiser step: (query, passage) examples for pointwise, triples "
                          "otherwise (default 32)")
    opt.add_argument("--grad-accum", type=int, default=S, help="micro-batches per step (default 1)")
    opt.add_argument("--lr", type=float, default=S, help="AdamW learning rate (default 3e-5)")
    opt.add_argument("--head-lr", type=float, default=S, help="learning rate of new layers (score head, PreTTR "
                                                              "compressor, TK kernel weights; default --lr)")
    opt.add_argument("--joint-lr", type=float, default=S, help="learning rate of the layers reading query and "
                     "document together above those reading them apart (PreTTR's layers above the join, MORES's "
                     "interaction blocks; not the head; default --lr)")
    opt.add_argument("--dropout", type=float, default=S, metavar="P",
                     help="every dropout probability while training (0: off; default the model's own, BERT's 0.1)")
    opt.add_argument("--weight-decay", type=float, default=S)
    opt.add_argument("--warmup-steps", type=int, default=S)
    opt.add_argument("--scheduler", choices=SCHEDULERS, default=S, help="after warm-up (default linear decay to 0)")
    opt.add_argument("--max-grad-norm", type=float, default=S, help="gradient clipping (default 1; 0 = off)")
    opt.add_argument("--precision", choices=PRECISION_CHOICES, default=S,
                     help="auto (default): bf16 autocast only where the device runs bf16 natively (AMX or "
                          "AVX512-BF16 CPUs, CUDA with bf16), fp32 elsewhere")
    opt.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=S,
                     help="bf16 autocast on or off whatever the hardware (overrides --precision)")
    opt.add_argument("--seed", type=int, default=S)
    dev = parser.add_argument_group("dev evaluation and early stopping (MRR@10)")
    dev.add_argument("--dev-topics", default=S)
    dev.add_argument("--dev-qrels", default=S)
    dev.add_argument("--dev-index", default=S, help="index for BM25 dev candidates and their text")
    dev.add_argument("--dev-run", default=S, help="dev candidates from a run file instead of BM25")
    dev.add_argument("--dev-collection", default=S, help="dev document text from a collection file")
    dev.add_argument("--dev-depth", type=int, default=S, help="candidates reranked per dev query (default 100)")
    dev.add_argument("--dev-max-queries", type=int, default=S, help="evaluate only the first N dev queries")
    dev.add_argument("--eval-every", type=int, default=S, metavar="STEPS", help="0 turns a recipe's dev "
                                                                                "evaluation off")
    dev.add_argument("--early-stopping-patience", type=int, default=S, metavar="EVALUATIONS",
                     help="stop after this many evaluations without a better MRR@10 (0: never)")
    run = parser.add_argument_group("run")
    run.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    run.add_argument("--logging-steps", type=int, default=S)
    run.add_argument("--save-steps", type=int, default=S, help="checkpoint every N steps (default 500)")
    run.add_argument("--save-total-limit", type=int, default=S, help="checkpoints kept (default 2)")
    run.add_argument("--threads", type=int, default=S, help="BM25 threads for dev candidates")
    run.add_argument("--device", default=S, help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or log lines")


def define_compressor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", help="a shipped pretrain-compressor recipe, a JSON file or inline JSON")
    parser.add_argument("--init", default=S, metavar="PRETTR_CHECKPOINT_OR_BACKBONE")
    parser.add_argument("--texts", default=S, help="collection (TSV/JSONL) or triples file")
    parser.add_argument("--queries", default=S, help="queries TSV: pair these with random passages instead of "
                                                     "first-sentence pseudo-queries")
    parser.add_argument("--model-arg", dest="model_args", action="append", default=S, metavar="KEY=VALUE",
                        help="e.g. join_layer=5, compression_dim=128")
    parser.add_argument("--output", required=True)
    parser.add_argument("--steps", type=int, default=S, help="optimiser steps (default 1000)")
    parser.add_argument("--batch-size", type=int, default=S, help="pairs per step (default 16)")
    parser.add_argument("--lr", type=float, default=S, help="AdamW learning rate of the compressor (default 1e-3)")
    parser.add_argument("--warmup-steps", type=int, default=S)
    parser.add_argument("--heldout-pairs", type=int, default=S, help="pairs kept out to report the loss "
                                                                     "before/after (default 64)")
    parser.add_argument("--max-pairs", type=int, default=S)
    parser.add_argument("--seed", type=int, default=S)
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default=S)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=S)
    parser.add_argument("--device", default=S, help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--save-steps", type=int, default=S, help="checkpoint every N steps (default 500)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    parser.add_argument("--quiet", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.train",
                                     description="Train pyserini_mores rerankers.")
    commands = parser.add_subparsers(dest="command", required=True)
    define_mine_args(commands.add_parser(
        "mine-negatives", help="write training triples with negatives sampled from a first-stage ranking"))
    define_train_args(commands.add_parser("train", help="train a reranker on triples"))
    define_compressor_args(commands.add_parser(
        "pretrain-compressor", help="pre-train a PreTTR compressor on unlabelled (query, passage) pairs"))
    delta = commands.add_parser("export-delta", help="store a trained model as only the tensors that differ from its "
                                                     "backbone (small enough to ship; see pyserini_mores.models.delta)")
    delta.add_argument("--model-type", required=True)
    delta.add_argument("--model", required=True, help="trained checkpoint directory")
    delta.add_argument("--output", required=True)
    delta.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    delta.add_argument("--backbone", help="store the delta over this backbone (a shipped model's name, a hub name or a "
                                          "directory) instead of the one the checkpoint records, e.g. the name "
                                          "under which the cross-encoder it was trained from ships")
    fold = commands.add_parser("fold-blocks", help="start a MORES with fewer interaction blocks from a trained one: "
                                                   "its first blocks become query-module layers (their "
                                                   "cross-attention dropped); its S1 sidecar stays valid")
    fold.add_argument("--model", required=True, help="a MORES checkpoint directory or shipped model name")
    fold.add_argument("--blocks", type=int, required=True, help="interaction blocks to keep (the last ones)")
    fold.add_argument("--output", required=True)
    widen = commands.add_parser("widen-ffn", help="start a TK with wider feed-forward blocks from a trained one: "
                                                  "it scores exactly as the trained one until training moves the "
                                                  "new units")
    widen.add_argument("--model", required=True, help="a TK checkpoint directory or shipped model name")
    widen.add_argument("--ffn-dim", type=int, required=True, help="hidden units per feed-forward block (more than now)")
    widen.add_argument("--seed", type=int, default=0, help="seeds the new units' input weights")
    widen.add_argument("--output", required=True)
    average = commands.add_parser("average", help="average the weights of rankers fine-tuned from one start (a model "
                                                  "soup; see pyserini_mores.models.averaging)")
    average.add_argument("--model-type", required=True)
    average.add_argument("--model", action="append", required=True, dest="models",
                         help="a checkpoint directory or shipped model name; give two or more")
    average.add_argument("--weights", type=float, nargs="+", help="one per --model, summing to 1 (default: equal)")
    average.add_argument("--output", required=True)
    average.add_argument("--overwrite", action="store_true",
                         help="replace an existing --output (it stays whole until the new average is written)")
    recipes = commands.add_parser("recipes", help="list the shipped recipes, or show one")
    recipes.add_argument("name", nargs="?")
    return parser


def _given(args: argparse.Namespace, exclude: tuple[str, ...]) -> dict:
    # --verbose (every command's, from the shared runner) is no training setting.
    values = {key: value for key, value in vars(args).items() if key not in (*exclude, "verbose")}
    if "model_args" in values:
        values["model_args"] = parse_model_args(values["model_args"])
    return values


def run_mine(args: argparse.Namespace) -> None:
    from ..formats import read_qrels, read_ranked_run, read_topics
    from .data import collection_texts, mine_negatives, write_triples

    if args.index is None and (args.run is None or args.collection is None):
        raise UsageExit("mine-negatives needs --index, or both --run and --collection")
    if args.teacher_scores and args.run is None:
        raise UsageExit("--teacher-scores takes the scores of --run (a teacher reranker's run); give --run")
    topics, qrels = read_topics(args.topics), read_qrels(args.qrels)
    searcher, scores = None, None
    if args.run is not None:
        ranked = read_ranked_run(args.run)  # the run's own order (formats.read_ranked_run's rule)
        scores = {qid: dict(hits) for qid, hits in ranked.items()}
        rankings = {qid: [docid for docid, _ in hits] for qid, hits in ranked.items()}
    else:
        from .dev import bm25_rankings

        judged = {qid: text for qid, text in topics.items() if qid in qrels}
        rankings, searcher = bm25_rankings(args.index, judged, args.depth, args.k1, args.b, args.threads)
    if args.collection is not None:
        def fetch(docids: list[str]) -> list[str]:
            texts = collection_texts(args.collection, docids)
            return [texts[docid] for docid in docids]
    else:
        from ..index import fetch_texts, open_searcher

        searcher = searcher or open_searcher(args.index)
        fetch = lambda docids: fetch_texts(searcher, docids)  # noqa: E731
    triples, report = mine_negatives(topics, qrels, rankings, fetch, negatives_per_query=args.negatives_per_query,
                                     depth=args.depth, seed=args.seed, relevance_level=args.relevance_level,
                                     teacher_scores=scores if args.teacher_scores else None)
    count = write_triples(args.output, triples)
    unscored = (f", {report.skipped_unscored_positive} without a positive in the teacher's run"
                if args.teacher_scores else "")
    print(f"wrote {count} {'scored ' if args.teacher_scores else ''}triples for {report.queries} queries to "
          f"{args.output} (skipped: {report.skipped_no_positive} without a positive, {report.skipped_no_candidates} "
          f"without non-relevant candidates{unscored}; {report.short_of_negatives} had fewer than "
          f"{args.negatives_per_query} negatives)")


def run_train(args: argparse.Namespace) -> None:
    from ..models.registry import model_types
    from .recipes import merge_settings
    from .trainer import TrainingSettings, train

    values = merge_settings("train", args.recipe, _given(args, ("command", "recipe", "resume", "quiet")))
    missing = [name for name in ("model_type", "init", "triples") if values.get(name) is None]
    if missing:
        raise UsageExit(f"train needs {', '.join('--' + m.replace('_', '-') for m in missing)} "
                         "(or a recipe that sets them)")
    from ..rerankers.options import check_config

    if values["model_type"] in model_types():  # GloVe's max_words is an option of the init, not of the config
        check_config(values["model_type"], {key: value for key, value in values.get("model_args", {}).items()
                                            if key != "max_words"}, given_as="--model-arg")
    try:
        settings = TrainingSettings(**values)
    except (TypeError, ValueError) as error:
        raise UsageExit(f"{error}") from None
    result = train(settings, resume=args.resume, progress=not args.quiet)
    print(f"saved {settings.model_type} to {result.output} after {result.global_step}/{result.total_steps} steps "
          f"in {result.seconds:.0f} s ({result.pairs_per_second:.1f} pairs/s)"
          + (f"; resumed from step {result.resumed_from}" if result.resumed_from is not None else "")
          + (f" ({result.total_seconds:.0f} s in all its runs)"
             if result.resumed_from is not None and result.total_seconds is not None else ""))
    if result.best_step is not None:
        print(f"best dev MRR@10 {result.best_metric:.4f} at step {result.best_step}"
              + (" (stopped early)" if result.stopped_early else ""))
    print(f"load it with: load_model({settings.model_type!r}, {result.output!r})")


def run_compressor(args: argparse.Namespace) -> None:
    from ..formats import read_topics
    from .compressor import pretrain_compressor
    from .recipes import merge_settings

    values = merge_settings("pretrain-compressor", args.recipe,
                            _given(args, ("command", "recipe", "quiet", "resume")))
    missing = [name for name in ("init", "texts") if values.get(name) is None]
    if missing:
        raise UsageExit(f"pretrain-compressor needs {', '.join('--' + m for m in missing)}")
    if values.get("queries") is not None:
        values["queries"] = list(read_topics(values["queries"]).values())
    init, texts, output = values.pop("init"), values.pop("texts"), values.pop("output")
    result = pretrain_compressor(init, texts, output, resume=args.resume, progress=not args.quiet, **values)
    print(f"attention MSE on {result.heldout_pairs} held-out pairs: before {result.loss_before:.6g}, "
          f"after {result.loss_after:.6g} ({result.steps} steps, {result.seconds:.0f} s; "
          f"l={result.join_layer}, e={result.compression_dim})")
    print(f"saved to {result.output}")


def run_export_delta(args: argparse.Namespace) -> None:
    import torch

    from ..models import load_model
    from ..models.delta import save_delta

    summary = save_delta(load_model(args.model_type, args.model), args.output, dtype=getattr(torch, args.dtype),
                         backbone=args.backbone)
    print(f"stored {summary['parameters']:,} of {summary['of_parameters']:,} "
          f"parameters ({summary['tensors']} tensors, {summary['bytes'] / 1e6:.1f} MB) in {args.output}")


def save_whole(model, output: str | os.PathLike) -> None:
    """``model``'s checkpoint in ``output``, replacing what is there: written beside it and renamed into place, so
    that a killed command leaves no checkpoint that looks whole (a re-run pipeline step would take it for finished)
    and the old one stays whole until the new one is. Only an empty directory or an earlier checkpoint is replaced."""
    import shutil

    from ..models.base import CONFIG_NAME

    output = Path(output)
    if output.exists() and not (output / CONFIG_NAME).is_file() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"{output} is not a checkpoint directory, and replacing it would lose what it holds: name a "
                         "new --output (or an earlier checkpoint to replace)")
    partial, replaced = (output.with_name(output.name + suffix) for suffix in (".partial", ".replaced"))
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    if output.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        output.replace(replaced)
    partial.replace(output)
    shutil.rmtree(replaced, ignore_errors=True)


def run_fold_blocks(args: argparse.Namespace) -> None:
    from ..models import load_model

    model = load_model("mores", args.model).with_fewer_blocks(args.blocks)
    save_whole(model, args.output)
    print(f"stored a MORES of {args.blocks} interaction block(s) in {args.output}; its document module is "
          f"{args.model}'s, so an S1 sidecar of {args.model} serves it")


def run_widen_ffn(args: argparse.Namespace) -> None:
    from ..models import load_model

    model = load_model("tk", args.model)
    wider = model.with_wider_feed_forward(args.ffn_dim, seed=args.seed)
    save_whole(wider, args.output)
    print(f"stored a TK with {args.ffn_dim} feed-forward units per layer (from {model.config.ffn_dim}) in "
          f"{args.output}; it scores as the one it was made from")


def run_average(args: argparse.Namespace) -> None:
    from ..models import load_model
    from ..models.averaging import average_models

    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"{output} is a file; --output names the checkpoint directory the average is written to")
    if not args.overwrite and output.is_dir() and any(output.iterdir()):
        raise ValueError(f"{output} exists; the average is written to a new directory: remove it, name another "
                         "--output or pass --overwrite")
    soup = average_models([load_model(args.model_type, name) for name in args.models], args.weights)
    save_whole(soup, output)
    weights = args.weights or [1 / len(args.models)] * len(args.models)
    print(f"stored {' + '.join(f'{w:g} × {name}' for w, name in zip(weights, args.models))} in {args.output}")


def run_recipes(args: argparse.Namespace) -> None:
    from .recipes import read_recipe, recipe_names

    if args.name:
        print(json.dumps(read_recipe(args.name), indent=2))
        return
    for name in recipe_names():
        recipe = read_recipe(name)
        print(f"{name:32s} {recipe['command']:20s} {recipe.get('description', '')}")


def main(argv: list[str] | None = None) -> int:
    return run_parsed(build_parser(), _run, argv, usage_exit=True)


def _run(args: argparse.Namespace) -> None:
    if args.command in ("train", "pretrain-compressor"):
        setup_logging(args.verbose, quiet=args.quiet)
    else:
        setup_logging(args.verbose)
    handlers = {"mine-negatives": run_mine, "train": run_train, "pretrain-compressor": run_compressor,
                "export-delta": run_export_delta, "fold-blocks": run_fold_blocks,
                "widen-ffn": run_widen_ffn, "average": run_average, "recipes": run_recipes}
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():
        handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

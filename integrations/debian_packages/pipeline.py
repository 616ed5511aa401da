"""The whole debian-packages experiment, end to end on CPU, with the offline MiniLM backbone.

index → BM25 runs → mined negatives → the teacher, then its students → sidecars → rerank BM25 candidates of the test
(and dev) queries → time 1000-candidate reranking → one results table (MRR@10, nDCG@10, R@10, ms/query for 1000
candidates, bytes/doc, the non-inferiority test of every model against the cross-encoder).

Two families of rerankers train, each teacher before its students, then (with ``--full``) the shipped PreTTR's stages,
which learn from both the cross-encoder and MORES 2×IB:

- the cross-encoder, the teacher (recipe ``cross-encoder-debian-teacher``, the shipped ``debian-cross-encoder``'s:
  pointwise on 4 negatives per training query from its BM25 top 30), then MORES 2×IB initialised from it and trained
  against the S1 sidecar of its 4-layer document module (``mores-2ib-debian-from-ce``), then that model distilled
  from the cross-encoder's scores by Margin-MSE against the same sidecar (``mores-2ib-debian-distilled``: the
  cross-encoder reranks the BM25 top 16 of 2,000 training queries drawn at random), and, once MaxSim (below) is
  trained, distilled again from an ensemble teacher, the cross-encoder and MaxSim fused (``mores-2ib-debian-ensemble``:
  both rerank the BM25 top 16 of 6,000 training queries), and once more from a three-way teacher, that ensemble fused
  with BM25 (``mores-2ib-debian-three-way``), then trained from text on the same triples, the upper half of its
  document module training too (``mores-2ib-debian-from-text``, with a sidecar of its own); with ``--full`` only, that
  continued (``mores-2ib-debian-from-text-more``) and last trained from text on the second-stage cross-encoder's
  scores of every training query (``mores-2ib-debian-all-queries``); with the last (``mores-2ib-debian-depth-100``,
  below) these eight MORES recipes are the stages of the shipped ``debian-mores-2ib``; the cross-encoder itself
  learns from the three-way teacher too
  (``cross-encoder-debian-three-way``, its first four layers frozen: the shipped ``debian-cross-encoder``'s second
  stage);
- MaxSim (the embedded default's reranker), then the models that start from its trained encoder (MORES 1×IB, PreTTR
  l = L−2 with and without compression: their sidecars hold its token states) or learn from its scores (those and
  TK: it reranks the training queries, and negatives are mined from its run with its scores); with ``--full`` only,
  TK also learns from the second-stage cross-encoder's scores of every training query, in the stages of the shipped
  ``debian-tk`` (``tk-debian-all-queries``, then with its embeddings training ``tk-debian-all-queries-embeddings``,
  then on all 15 scored negatives of each query, ``tk-debian-all-negatives``), then two models continued from that one
  (``tk-debian-all-negatives-again``, a pass more at half the learning rate, and ``tk-debian-depth-30``, on groups of
  each query's whole BM25 top 30 scored by the cross-encoder) and averaged weight for weight into ``tk-soup``, whose
  feed-forward blocks are then widened four times (``train widen-ffn``) and trained on the depth-30 groups of the
  next 6,000 training queries (``tk-debian-depth-30-wide``: the shipped ``debian-tk``); and MORES 1×IB folded from
  the shipped 2×IB's row (``train fold-blocks``), trained against that row's sidecar on the same depth-30 groups
  (``mores-1ib-debian-depth-30``, then for more queries ``mores-1ib-debian-depth-30-more``), then on groups of each
  query's whole BM25 top 100 for 2,000 queries none of them saw (``mores-1ib-debian-depth-100``: the shipped
  ``debian-mores-1ib``), as the 2×IB's row is too, against its own sidecar (``mores-2ib-debian-depth-100``: the
  shipped ``debian-mores-2ib``);
- with ``--full`` only, the shipped ``debian-prettr-e128``'s stages: PreTTR joined at l = 4 started from the
  second-stage cross-encoder, trained against the sidecar of its layer-4 states on the seventh-stage MORES 2×IB's
  scores of the first 8,000 training queries' BM25 top 30 (``prettr-debian-from-ce``, stopped at step 2,250 of its
  schedule), then from text (``prettr-debian-from-text``), then on the cross-encoder's scores of those queries' top 16
  with every layer training (``prettr-debian-from-text-ce``), then compressed to e = 128: its compressor pre-trained
  under that model on the pairs of the same triples, and the ranker fine-tuned with it in place
  (``prettr-debian-e128-ce``).

By default every training step runs a short schedule (``Model.short_steps``) so that the whole pipeline fits about
three hours of 2 CPU cores, without the rows marked ``full_only``; ``--full`` trains every row with its recipe's own
schedule, which for the cross-encoder and the MORES 2×IB stages is the one that made the shipped models.

Every step is one of the package's commands, printed before it runs, so any of them can be copied. A journal
(``WORK/pipeline.json``, kept by ``integrations/steps.py``) records each finished step with its time and command; a
re-run skips finished steps (training and sidecar builds also resume from inside an interrupted step), so a killed
pipeline continues where it stopped, and refuses to skip one whose command has changed since (an edited recipe row
or flag, or ``--full`` after the short schedule). A model made again after its sidecar and runs (an averaged row
whose ingredient was retrained, which is averaged again too) gets them made again; a retrained teacher does not
redo the runs, triples and students made from it (delete their steps from the journal to redo them).

    python integrations/debian_packages/pipeline.py --data ../shared/data/debian-packages --work runs/debian
    python integrations/debian_packages/pipeline.py ... --models mores-2ib --full --dry-run
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:  # run as a script: the repository root makes integrations/ importable
    sys.path.append(str(REPOSITORY))

from integrations.commands import cli_parser, parse_arguments  # noqa: E402
from integrations.steps import StepRunner  # noqa: E402
from pyserini_mores._io import write_text_atomic  # noqa: E402
from pyserini_mores._model_args import format_model_arg  # noqa: E402
from pyserini_mores.train.recipes import read_recipe  # noqa: E402

PY = [sys.executable, "-m"]
ENSEMBLE_SCRIPT = Path(__file__).resolve().parent / "ensemble_teacher.py"


@dataclass(frozen=True)
class TeacherScoring:
    """How a teacher scores a student's training triples: it reranks the BM25 top ``depth`` of the training queries
    (all of them, or ``queries`` of them: drawn at random with ``seed``, or without one the file's first after its
    first ``skip``), keeping every candidate's score (``--hits`` is the same), and ``negatives`` per query are mined
    from its top ``negative_depth`` with its scores."""

    depth: int = 50
    negatives: int = 6
    negative_depth: int = 30
    queries: int | None = None
    seed: int | None = None
    skip: int = 0
    # An ensemble teacher: this other row reranks the same candidates too, and each query's two score lists are
    # fused as ``search --interpolate`` fuses them, ``alpha`` × the teacher's + (1 − alpha) × this row's, in the
    # teacher's score units (ensemble_teacher.py); negatives are mined from the fused run with the fused scores.
    ensemble_with: str | None = None
    alpha: float = 1.0
    # Then fused once more with BM25's scores of the same candidates, the same way: ``bm25_alpha`` × the teacher's
    # (or the ensemble's) + (1 − bm25_alpha) × BM25's, still in the teacher's units; None: BM25 is not part of it.
    bm25_alpha: float | None = None
    # Names the triples of a scoring that mines the same teacher run as another scoring does, with other negatives
    # (their file and step names end in it; the run itself is made once).
    mining: str | None = None

    def __post_init__(self):
        if self.skip and (self.queries is None or self.seed is not None):
            raise ValueError("skip counts lines of the training queries' file: give it with queries and no seed")

    @property
    def topics(self) -> str:
        """The name of the queries it reranks: ``train``, ``train2000`` for a random subset of 2,000,
        ``train-first8000`` for the file's first 8,000, or ``train8001-14000`` for its lines 8,001 to 14,000."""
        if self.queries is None:
            return "train"
        if self.seed is not None:
            return f"train{self.queries}"
        return f"train{self.skip + 1}-{self.skip + self.queries}" if self.skip else f"train-first{self.queries}"

    @property
    def candidates(self) -> str:
        """The name of the candidates it scores, which its runs', triples' and steps' names carry after the teacher's:
        :attr:`topics` and the depth, ``train-first8000-top16`` (the same queries are scored at other depths too)."""
        return f"{self.topics}-top{self.depth}"

    @property
    def lines(self) -> tuple[int, int] | None:
        """The training queries' file lines it reranks, ``(first, end)`` counted from 0, when they are a run of
        consecutive lines (the file's first, or those after a ``skip``); None for all of them or a random subset."""
        if self.queries is None or self.seed is not None:
            return None
        return self.skip, self.skip + self.queries


@dataclass(frozen=True)
class Model:
    """One row of the table: how it is trained, and the model arguments its sidecar and reranker need."""

    name: str
    reranker: str
    recipe: str | None  # None: an average of other rows (``average_of``), not trained
    train_args: tuple[str, ...] = ()
    rerank_args: tuple[str, ...] = ()
    # PreTTR with compression: its --init is the compressor pre-trained (recipe prettr-compressor-debian) under its
    # ``init_from`` row's model, on the collection's first-sentence pairs (``collection``) or on the query-passage
    # pairs of its own training triples (``triples``, the paper's stage 1 on the ranker's data); None: none.
    compressor_texts: str | None = None
    stores: bool = True  # False: reranks from text (no sidecar)
    init_from: str | None = None  # another row whose trained checkpoint is this one's --init (trained first)
    # True: the sidecar is built from the starting model before training, and training reads it (--doc-sidecar
    # default, so only what runs online trains); the trained model then reranks from that same sidecar.
    sidecar_first: bool = False
    teacher: str | None = None  # another row that scores this one's training triples (its recipe's loss learns them)
    teacher_scoring: TeacherScoring = TeacherScoring()  # with a teacher: the queries, depths and negatives it scores
    # Another (sidecar_first) row whose sidecar this one trains against and reranks from, instead of one of its own:
    # it starts from that row's trained model, whose document module the sidecar froze, so the stored vectors are
    # this model's too (--doc-sidecar default and the search find them by that module's fingerprint).
    sidecar_of: str | None = None
    # Without a teacher: (negatives per training query, drawn from BM25's top ...) of its unscored triples.
    bm25_negatives: tuple[int, int] = (1, 50)
    short_steps: int | None = None  # the default schedule's steps (None: the recipe's); --full: the recipe's
    # Trained only with --full (or when named in --models): a row whose teacher scores every training query, more
    # than the default schedule's three hours allow on 2 cores.
    full_only: bool = False
    seconds_per_step: float | None = None  # expected on 2 AVX2 cores in fp32, for the printed estimate
    # Not trained: the equal-weight average of these rows' trained models (``train average``, a model soup of
    # rankers continued from one start), which are made before it.
    average_of: tuple[str, ...] = ()
    # Started from this (MORES) row's trained model with its interaction blocks folded down to the recipe's
    # ``n_interaction_blocks`` (``train fold-blocks``), reading that row's sidecar (``sidecar_of`` names it too).
    fold_of: str | None = None
    # Started from this (TK) row's trained model with its feed-forward blocks widened to the recipe's ``ffn_dim``
    # (``train widen-ffn --seed WIDEN_SEED``), which scores as that model until training moves the new units.
    widen_of: str | None = None


#: The ensemble teacher of the shipped debian-mores-2ib's third stage: the cross-encoder × 0.15 + MaxSim × 0.85 (the
#: weight chosen on dev) over the BM25 top 16 of 6,000 training queries of a seeded shuffle, 8 scored negatives per
#: query from all 16.
ENSEMBLE_SCORING = TeacherScoring(depth=16, negatives=8, negative_depth=16, queries=6000, seed=29,
                                  ensemble_with="maxsim", alpha=0.15)
#: The three-way teacher of the last stages: that ensemble × 0.85 + BM25 × 0.15 (the weight chosen on dev again).
THREE_WAY_SCORING = dataclasses.replace(ENSEMBLE_SCORING, bm25_alpha=0.85)
#: The last stages' teacher scores: every training query's BM25 top 16, 8 scored negatives per query from all 16.
ALL_QUERIES_SCORING = TeacherScoring(depth=16, negatives=8, negative_depth=16)
#: The same teacher run, all 15 negatives of each query's top 16 (debian-tk's third stage)
ALL_NEGATIVES_SCORING = dataclasses.replace(ALL_QUERIES_SCORING, negatives=15, mining="15-negatives")
#: The BM25 top 30 of the first 8,000 training queries, all 29 negatives of each (one of debian-tk's last two stages,
#: and debian-mores-1ib's first)
DEPTH_30_SCORING = TeacherScoring(depth=30, negatives=29, negative_depth=30, queries=8000)
#: The same for the first 14,000 (debian-mores-1ib's second stage); its teacher run is the two runs of the first
#: 8,000 and the next 6,000 joined (Pipeline.join_runs)
DEPTH_30_MORE_SCORING = dataclasses.replace(DEPTH_30_SCORING, queries=14000)
#: The same for the 6,000 after the first 8,000 (debian-tk's last stage: queries its ingredients did not see)
DEPTH_30_NEXT_SCORING = dataclasses.replace(DEPTH_30_SCORING, queries=6000, skip=8000)
#: The BM25 top 100 of the 2,000 training queries after the first 14,000, all 99 negatives of each (the shipped
#: debian-mores-2ib's and debian-mores-1ib's last stages: groups as deep as top-100 reranking, of queries their
#: earlier stages did not see at that depth)
DEPTH_100_SCORING = TeacherScoring(depth=100, negatives=99, negative_depth=100, queries=2000, skip=14000)
#: The BM25 top 16 of the first 8,000 training queries, all 15 negatives of each (the shipped debian-prettr-e128's
#: last stages); its teacher run is cut from the one over every training query at that depth (Pipeline.cut_run)
FIRST_8000_TOP_16_SCORING = TeacherScoring(depth=16, negatives=15, negative_depth=16, queries=8000)
#: Seeds the new feed-forward units of a widened row (``widen_of``); the shipped debian-tk's start was drawn with it
WIDEN_SEED = 47

MODELS = (
    # The teacher and its students, the shipped models' recipes (docs/results.md). Expected step times on 2 AVX2
    # cores in fp32: the cross-encoder ~2 s for 16 pairs, MORES against its sidecar ~0.5 s for 32 pairs. The short
    # schedules (500, 2,000 and 500 steps) leave the rest of the three hours to the MaxSim family; --full trains them
    # up to 6,000 steps (early stopping on dev), 4,500 and 1,500 steps.
    Model("cross-encoder", "cross-encoder", "cross-encoder-debian-teacher", stores=False, bm25_negatives=(4, 30),
          short_steps=500, seconds_per_step=2.0),
    Model("mores-2ib", "mores", "mores-2ib-debian-from-ce", rerank_args=("--model-arg", "reuse=s1"),
          sidecar_first=True, init_from="cross-encoder", bm25_negatives=(4, 30), short_steps=2000,
          seconds_per_step=0.5),
    # The shipped debian-mores-2ib's second stage (its recipe's sources): MORES 2×IB continued from the row above by
    # Margin-MSE on the cross-encoder's scores of the BM25 top 16 of 2,000 training queries (a seeded random subset),
    # 8 scored negatives per query from all 16, against the same S1 sidecar (the recipe's --doc-sidecar default).
    Model("mores-2ib-distilled", "mores", "mores-2ib-debian-distilled", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib", sidecar_of="mores-2ib", teacher="cross-encoder",
          teacher_scoring=TeacherScoring(depth=16, negatives=8, negative_depth=16, queries=2000, seed=29),
          short_steps=500),
    # The MaxSim family. Step counts below the recipes' keep the default schedule within its time budget; --full
    # runs the recipes' own schedules. Not from the papers: MaxSim is the embedded default's reranker, MORES 1×IB's
    # and PreTTR's starting point, and the teacher of the rows below it (400 steps: its longer runs gain no more).
    Model("maxsim", "maxsim", "maxsim-debian", short_steps=400),
    Model("mores-1ib", "mores", "mores-debian", ("--model-arg", "n_interaction_blocks=1"),
          ("--model-arg", "reuse=s1"), sidecar_first=True, init_from="maxsim", teacher="maxsim", short_steps=800),
    Model("prettr-l4", "prettr", "prettr-debian", sidecar_first=True, init_from="maxsim", teacher="maxsim",
          short_steps=800),
    # Started from MaxSim, not from the trained PreTTR l = 4: a compressor pre-trained under that model's upper
    # layers ranks worse after the same steps.
    Model("prettr-l4-e128", "prettr", "prettr-debian", ("--model-arg", "compression_dim=128"),
          compressor_texts="collection", sidecar_first=True, init_from="maxsim", teacher="maxsim", short_steps=800),
    Model("tk", "tk", "tk-debian", teacher="maxsim"),
    # The shipped debian-mores-2ib's third stage: the distilled row above continued by Margin-MSE on the ensemble
    # teacher's scores (ENSEMBLE_SCORING) against the same S1 sidecar. It needs MaxSim, so it comes after the MaxSim
    # family.
    Model("mores-2ib-ensemble", "mores", "mores-2ib-debian-ensemble", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib-distilled", sidecar_of="mores-2ib", teacher="cross-encoder",
          teacher_scoring=ENSEMBLE_SCORING, short_steps=500),
    # Its fourth stage: continued by Margin-MSE on the three-way teacher's scores of the same candidates.
    Model("mores-2ib-three-way", "mores", "mores-2ib-debian-three-way", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib-ensemble", sidecar_of="mores-2ib", teacher="cross-encoder",
          teacher_scoring=THREE_WAY_SCORING, short_steps=250),
    # Its fifth stage (of the shipped debian-mores-2ib's eight): the same triples, trained from text with the
    # document module's layers 2-3 training too (the recipe's freeze_layers), so it builds a sidecar of its own after
    # training.
    Model("mores-2ib-from-text", "mores", "mores-2ib-debian-from-text", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib-three-way", teacher="cross-encoder", teacher_scoring=THREE_WAY_SCORING,
          short_steps=250, seconds_per_step=3.2),
    # The shipped debian-cross-encoder's second stage: the cross-encoder continued by Margin-MSE on the three-way
    # teacher's triples, its embeddings and first 4 layers frozen (the recipe's freeze_layers: MORES 2×IB's document
    # module), ~3.5 s per 40-pair step on 2 AVX2 cores in fp32.
    Model("cross-encoder-three-way", "cross-encoder", "cross-encoder-debian-three-way", stores=False,
          init_from="cross-encoder", teacher="cross-encoder", teacher_scoring=THREE_WAY_SCORING, short_steps=250,
          seconds_per_step=3.5),
    # The shipped debian-mores-2ib's sixth stage: the fifth continued from text on the same triples, 1,500 steps.
    Model("mores-2ib-from-text-more", "mores", "mores-2ib-debian-from-text-more",
          rerank_args=("--model-arg", "reuse=s1"), init_from="mores-2ib-from-text", teacher="cross-encoder",
          teacher_scoring=THREE_WAY_SCORING, full_only=True),
    # Its seventh (the start of the shipped model's last stage, below): continued from text on the second-stage
    # cross-encoder's own scores of every training query's BM25 top 16, 4.4× the three-way triples' queries.
    Model("mores-2ib-all-queries", "mores", "mores-2ib-debian-all-queries", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib-from-text-more", teacher="cross-encoder-three-way", teacher_scoring=ALL_QUERIES_SCORING,
          full_only=True),
    # The shipped debian-tk's stages, listwise-distilled from the same teacher's scores: TK with its embeddings
    # frozen (as tk-debian), then continued with them training too, then a second pass with all 15 scored negatives
    # of each query's top 16 in one group.
    Model("tk-all-queries", "tk", "tk-debian-all-queries", teacher="cross-encoder-three-way",
          teacher_scoring=ALL_QUERIES_SCORING, full_only=True),
    Model("tk-all-queries-embeddings", "tk", "tk-debian-all-queries-embeddings", init_from="tk-all-queries",
          teacher="cross-encoder-three-way", teacher_scoring=ALL_QUERIES_SCORING, full_only=True),
    Model("tk-all-negatives", "tk", "tk-debian-all-negatives", init_from="tk-all-queries-embeddings",
          teacher="cross-encoder-three-way", teacher_scoring=ALL_NEGATIVES_SCORING, full_only=True),
    Model("tk-all-negatives-again", "tk", "tk-debian-all-negatives-again", init_from="tk-all-negatives",
          teacher="cross-encoder-three-way", teacher_scoring=ALL_NEGATIVES_SCORING, full_only=True),
    Model("tk-depth-30", "tk", "tk-debian-depth-30", init_from="tk-all-negatives", teacher="cross-encoder-three-way",
          teacher_scoring=DEPTH_30_SCORING, full_only=True),
    Model("tk-soup", "tk", None, average_of=("tk-all-negatives-again", "tk-depth-30"), full_only=True),
    # The shipped debian-tk: that average with feed-forward blocks four times wider, continued on depth-30 groups of
    # the next 6,000 training queries.
    Model("tk-wide", "tk", "tk-debian-depth-30-wide", widen_of="tk-soup", teacher="cross-encoder-three-way",
          teacher_scoring=DEPTH_30_NEXT_SCORING, full_only=True),
    # The shipped debian-mores-1ib: the shipped 2×IB's row folded to one interaction block, then listwise-distilled
    # against that row's sidecar on the same cross-encoder's scores of each query's whole BM25 top 30, first for the
    # first 8,000 training queries, then for the first 14,000.
    Model("mores-1ib-depth-30", "mores", "mores-1ib-debian-depth-30", rerank_args=("--model-arg", "reuse=s1"),
          fold_of="mores-2ib-all-queries", sidecar_of="mores-2ib-all-queries", teacher="cross-encoder-three-way",
          teacher_scoring=DEPTH_30_SCORING, full_only=True),
    Model("mores-1ib-depth-30-more", "mores", "mores-1ib-debian-depth-30-more",
          rerank_args=("--model-arg", "reuse=s1"), init_from="mores-1ib-depth-30", sidecar_of="mores-2ib-all-queries",
          teacher="cross-encoder-three-way", teacher_scoring=DEPTH_30_MORE_SCORING, full_only=True),
    # The shipped debian-mores-2ib and debian-mores-1ib: mores-2ib-all-queries and mores-1ib-depth-30-more continued
    # against the same sidecar on whole BM25 top-100 groups (only what runs online trains, so the 2×IB's sidecar
    # stays both models').
    Model("mores-2ib-depth-100", "mores", "mores-2ib-debian-depth-100", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-2ib-all-queries", sidecar_of="mores-2ib-all-queries", teacher="cross-encoder-three-way",
          teacher_scoring=DEPTH_100_SCORING, full_only=True),
    Model("mores-1ib-depth-100", "mores", "mores-1ib-debian-depth-100", rerank_args=("--model-arg", "reuse=s1"),
          init_from="mores-1ib-depth-30-more", sidecar_of="mores-2ib-all-queries", teacher="cross-encoder-three-way",
          teacher_scoring=DEPTH_100_SCORING, full_only=True),
    # The shipped debian-prettr-e128's stages, joined at l = 4 of 6 and started from the second-stage cross-encoder:
    # against the sidecar of its layer-4 states on the seventh-stage MORES 2×IB's scores of the first 8,000 training
    # queries' BM25 top 30 (the recipe stops at step 2,250 of its 5,000-step schedule), then from text on the same
    # groups with layers 3-4 training too, then with every layer training on the cross-encoder's own scores of those
    # queries' top 16; then the paper's two stages of compression (e = 128): the compressor pre-trained under that
    # model on the pairs of its triples, and the whole ranker fine-tuned with it in place.
    Model("prettr-from-ce", "prettr", "prettr-debian-from-ce", sidecar_first=True, init_from="cross-encoder-three-way",
          teacher="mores-2ib-all-queries", teacher_scoring=DEPTH_30_SCORING, full_only=True),
    Model("prettr-from-text", "prettr", "prettr-debian-from-text", init_from="prettr-from-ce",
          teacher="mores-2ib-all-queries", teacher_scoring=DEPTH_30_SCORING, full_only=True),
    Model("prettr-from-text-ce", "prettr", "prettr-debian-from-text-ce", init_from="prettr-from-text",
          teacher="cross-encoder-three-way", teacher_scoring=FIRST_8000_TOP_16_SCORING, full_only=True),
    Model("prettr-e128", "prettr", "prettr-debian-e128-ce", compressor_texts="triples", init_from="prettr-from-text-ce",
          teacher="cross-encoder-three-way", teacher_scoring=FIRST_8000_TOP_16_SCORING, full_only=True),
)
MODELS_BY_NAME = {model.name: model for model in MODELS}
#: BM25 candidates kept per training query, from which unscored negatives are drawn (the deepest draw is 50)
BM25_TRAIN_HITS = 100
BASELINE = "cross-encoder"
PRECISION = "auto"  # bf16 where the CPU runs it natively (AMX), fp32 elsewhere: emulated bf16 is many times slower


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically unless it holds that text already: an unchanged file keeps its time,
    so the steps that read it are not redone."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text_atomic(path, text)


def covering_pieces(made: Iterable[tuple[int, int]], lines: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Two or more of the line spans ``made`` that follow one another from ``lines``'s first line to its end, or []
    when none do (``lines`` None: a random subset or all queries, which no pieces cover)."""
    if lines is None:
        return []
    made = [span for span in made if span != lines]

    def from_line(first: int) -> list[tuple[int, int]] | None:
        if first == lines[1]:
            return []
        for span in sorted((span for span in made if span[0] == first and span[1] <= lines[1]), reverse=True):
            rest = from_line(span[1])  # the longest span first, so that few pieces cover the lines
            if rest is not None:
                return [span, *rest]
        return None

    return from_line(lines[0]) or []


@dataclass
class Pipeline:
    data: Path
    work: Path
    models: list[Model]
    splits: list[str]
    depth: int
    speed_queries: int
    max_steps: int | None  # every row's steps (--max-steps)
    full: bool = False  # every row at its recipe's schedule (--full)
    dry_run: bool = False
    steps: StepRunner = field(init=False)
    triples: dict = field(default_factory=dict)  # triples file by its source, once made
    # The teachers' runs over consecutive lines of the training queries, once made: {(teacher, depth): {lines: run}}
    line_runs: dict = field(default_factory=dict)
    # The teachers' runs over every training query, once made: {(teacher, depth): run}
    every_query_runs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.steps = StepRunner(self.work / "pipeline.json", dry_run=self.dry_run, check=check_arguments)

    # ---- paths -------------------------------------------------------------------------------------------------
    @property
    def index(self) -> Path:
        return self.work / "index"

    def model_dir(self, name: str) -> Path:
        return self.work / "models" / name

    def run_file(self, name: str, split: str) -> Path:
        return self.work / "runs" / f"{name}.{split}.trec"

    def run(self, step: str, command: list, *, done: Path | None = None, **options) -> str | None:
        """One step through the journal; ``done``: an output the command writes last, which marks as done a step
        finished before the journal knew it."""
        return self.steps.run(step, command, outputs=[done] if done is not None else [], **options)

    # ---- the steps -------------------------------------------------------------------------------------------------
    def build_index(self) -> None:
        self.run("index", [*PY, "pyserini_mores.index", "--collection", self.data / "collection.tsv",
                           "--index", self.index, "--threads", "2"], done=self.index)

    def bm25_runs(self) -> None:
        for split in self.splits:
            self.run(f"bm25-{split}", [*PY, "pyserini_mores.search", "--index", self.index,
                                       "--topics", self.data / f"queries.{split}.tsv", "--hits", "1000",
                                       "--threads", "2", "--output", self.run_file("bm25", split)])

    def training_triples(self, model: Model) -> Path:
        """The triples ``model`` trains on: scored by its teacher, or with negatives drawn from BM25."""
        if model.teacher:
            scoring = model.teacher_scoring
            second = MODELS_BY_NAME[scoring.ensemble_with] if scoring.ensemble_with else None
            return self.scored_triples(MODELS_BY_NAME[model.teacher], scoring, second)
        return self.bm25_triples(*model.bm25_negatives)

    def bm25_triples(self, per_query: int, depth: int) -> Path:
        """Training triples with ``per_query`` negatives drawn at random from each training query's BM25 top
        ``depth`` (the commands that made the shipped cross-encoder's, docs/results.md)."""
        source = f"bm25-{per_query}x{depth}"
        if source not in self.triples:
            run = self.bm25_train_run()
            triples = self.work / f"triples.train.{source}.tsv"
            self.run(f"negatives-{source}", [
                *PY, "pyserini_mores.train", "mine-negatives", "--run", run, "--index", self.index,
                "--topics", self.data / "queries.train.tsv", "--qrels", self.data / "qrels.train.txt",
                "--negatives-per-query", str(per_query), "--depth", str(depth), "--output", triples], done=triples)
            self.triples[source] = triples
        return self.triples[source]

    def bm25_train_run(self) -> Path:
        """BM25's top :data:`BM25_TRAIN_HITS` for every training query, with its scores."""
        run = self.run_file("bm25", "train")
        self.run("bm25-train", [*PY, "pyserini_mores.search", "--index", self.index,
                                "--topics", self.data / "queries.train.tsv", "--hits", str(BM25_TRAIN_HITS),
                                "--threads", "2", "--output", run], done=run)
        return run

    def scored_triples(self, teacher: Model, scoring: TeacherScoring, second: Model | None = None) -> Path:
        """Training triples scored by ``teacher`` (with ``second``: by the ensemble of the two,
        ``scoring.ensemble_with``; with ``scoring.bm25_alpha``: by that fused once more with BM25): its run over the
        BM25 top ``scoring.depth`` of the training queries (or of a subset of them), and negatives mined from that run
        with its scores."""
        pair = teacher.name if second is None else f"{teacher.name}+{second.name}"
        name = pair if scoring.bm25_alpha is None else f"{pair}+bm25"
        source = f"{name}-{scoring.candidates}"
        if scoring.mining is not None:
            source = f"{source}-{scoring.mining}"
        if (teacher.name, scoring) not in self.triples:
            if source in self.triples:  # another scoring would overwrite the same run and triples
                raise ValueError(f"two scorings of {name}'s {scoring.candidates} would write the same run and "
                                 "triples: name the other's negatives (mining) or give it other queries")
            topics = self.training_topics(scoring)
            run = self.teacher_run(teacher, scoring, topics)
            if second is not None:
                run = self.fused_run(pair, scoring.candidates, run, self.teacher_run(second, scoring, topics),
                                     scoring.alpha)
            if scoring.bm25_alpha is not None:
                run = self.fused_run(name, scoring.candidates, run, self.bm25_train_run(), scoring.bm25_alpha)
            scored = self.work / f"triples.train.{source}.tsv"
            self.run(f"negatives-{source}", [
                *PY, "pyserini_mores.train", "mine-negatives", "--run", run, "--index", self.index,
                "--topics", topics, "--qrels", self.data / "qrels.train.txt",
                "--negatives-per-query", str(scoring.negatives), "--depth", str(scoring.negative_depth),
                "--teacher-scores", "--output", scored], done=scored)
            self.triples[source] = self.triples[teacher.name, scoring] = scored
        return self.triples[teacher.name, scoring]

    def fused_run(self, name: str, candidates: str, first: Path, second: Path, alpha: float) -> Path:
        """The run ``name`` over ``candidates`` (:attr:`TeacherScoring.candidates`): ``first`` and ``second`` fused per
        query by ensemble_teacher.py, ``alpha`` × ``first``'s scores + (1 − alpha) × ``second``'s, in ``first``'s
        units."""
        fused = self.run_file(name, candidates)
        self.run(f"ensemble-{name}-{candidates}", [
            sys.executable, ENSEMBLE_SCRIPT, "--first", first, "--second", second, "--alpha", str(alpha),
            "--output", fused], done=fused)
        return fused

    def teacher_run(self, teacher: Model, scoring: TeacherScoring, topics: Path) -> Path:
        """``teacher``'s run over the BM25 top ``scoring.depth`` of ``topics``, every candidate with its score; cut
        from its run over every training query, or joined from its runs over consecutive pieces of those queries,
        when it has reranked them all already at that depth."""
        run = self.run_file(teacher.name, scoring.candidates)
        made = self.line_runs.setdefault((teacher.name, scoring.depth), {})
        every_query = self.every_query_runs.get((teacher.name, scoring.depth))
        pieces = covering_pieces(made, scoring.lines)
        if scoring.queries is not None and every_query is not None:
            self.cut_run(f"cut-{teacher.name}-{scoring.candidates}", every_query, topics, run)
        elif pieces:
            self.join_runs(f"join-{teacher.name}-{scoring.candidates}", [made[piece] for piece in pieces], run)
        else:
            self.build_sidecar(teacher)
            self.run(f"rerank-{teacher.name}-{scoring.candidates}", [
                *PY, "pyserini_mores.search", "--index", self.index, "--topics", topics,
                *self.model_args(teacher), "--rerank-depth", str(scoring.depth), "--hits", str(scoring.depth),
                "--precision", PRECISION, "--output", run], done=run)
        if scoring.lines is not None:
            made[scoring.lines] = run
        if scoring.queries is None:
            self.every_query_runs[teacher.name, scoring.depth] = run
        return run

    def cut_run(self, step: str, source: Path, topics: Path, run: Path) -> None:
        """``run`` written as the lines of ``source`` (a teacher's run over every training query) of the queries of
        ``topics``, in their order: what reranking them again would write (each query's candidates are scored apart
        from other queries'). Not a journaled step, as :meth:`join_runs`."""
        print(f"[{step}] {topics.name}'s queries cut from {source.name}, not reranked again: {run}")
        if self.dry_run:
            return
        by_query: dict[str, list[str]] = {}
        with open(source, encoding="utf-8") as lines:
            for line in lines:
                by_query.setdefault(line.split(maxsplit=1)[0], []).append(line)
        with open(topics, encoding="utf-8") as queries:
            qids = [line.split("\t", 1)[0] for line in queries if line.strip()]
        write_if_changed(run, "".join(line for qid in qids for line in by_query.get(qid, [])))

    def join_runs(self, step: str, pieces: list[Path], run: Path) -> None:
        """``run`` written as ``pieces`` one after the other: a teacher's runs over consecutive pieces of the same
        queries at the same depth, whose scores reranking them all at once would only compute again (each query's
        candidates are scored apart from other queries'). Not a journaled step: a pure function of the pieces,
        rewritten only when its text would change, so the steps that read it are not redone."""
        print(f"[{step}] {', '.join(piece.name for piece in pieces)} joined, not reranked again: {run}")
        if not self.dry_run:
            text = "".join(piece.read_text(encoding="utf-8") for piece in pieces)
            write_if_changed(run, text)

    def training_topics(self, scoring: TeacherScoring) -> Path:
        """The training queries a teacher reranks: all of them, or ``scoring.queries`` of them (drawn at random with
        ``scoring.seed``, or the file's first), written to WORK before the steps that read them (not a journaled
        step: a pure function of the training queries, rewritten only when its text would change, so the steps after
        it are not redone)."""
        if scoring.queries is None:
            return self.data / "queries.train.tsv"
        path = self.work / f"queries.{scoring.topics}.tsv"
        chosen = (f"drawn at random (seed {scoring.seed})" if scoring.seed is not None
                  else f"after the file's first {scoring.skip:,}" if scoring.skip else "from the top of the file")
        print(f"[queries-{scoring.topics}] {scoring.queries:,} training queries {chosen}: {path}")
        if not self.dry_run:
            with open(self.data / "queries.train.tsv", encoding="utf-8") as queries:
                lines = queries.readlines()
            if scoring.seed is not None:
                random.Random(scoring.seed).shuffle(lines)
            chosen_lines = lines[scoring.skip:scoring.skip + scoring.queries]
            text = "".join(line if line.endswith("\n") else line + "\n" for line in chosen_lines)
            write_if_changed(path, text)
        return path

    def compressor_dir(self, model: Model) -> Path:
        """Where ``model``'s compressor is pre-trained: ``NAME-compressor``."""
        return self.model_dir(f"{model.name}-compressor")

    def pretrain_compressor(self, model: Model) -> None:
        """``model``'s compressor, pre-trained under its ``init_from`` row's model (recipe prettr-compressor-debian)."""
        output = self.compressor_dir(model)
        texts = self.data / "collection.tsv" if model.compressor_texts == "collection" else \
            self.training_triples(model)
        self.run(f"compressor-{model.name}", [
            *PY, "pyserini_mores.train", "pretrain-compressor", "--recipe", "prettr-compressor-debian",
            "--texts", texts, "--output", output, "--resume",
            *(["--init", self.model_dir(model.init_from)] if model.init_from else [])],
            done=output / "compressor_pretraining.json", seconds_from=_summary_seconds)

    def steps_override(self, model: Model) -> int | None:
        """The ``--max-steps`` the row's training gets: the pipeline's, its short schedule's, or none (the
        recipe's own schedule, with ``--full``)."""
        return self.max_steps or (None if self.full else model.short_steps)

    def schedule(self, model: Model) -> str:
        """The training steps, where they come from, and the time they are expected to take."""
        settings = read_recipe(model.recipe)["settings"]
        recipe_steps = settings["max_steps"]
        steps = self.steps_override(model) or recipe_steps
        origin = ("--max-steps" if self.max_steps else "the recipe's" if steps == recipe_steps
                  else f"short schedule; --full: the recipe's {recipe_steps:,}")
        text = f"up to {steps:,} training steps ({origin})"
        if settings.get("stop_at_step", steps) < steps:
            text = f"{settings['stop_at_step']:,} steps of a {steps:,}-step schedule (the recipe's stop_at_step)"
            steps = settings["stop_at_step"]
        if model.seconds_per_step:
            minutes = steps * model.seconds_per_step / 60
            text += (f", ~{model.seconds_per_step:g} s/step on 2 AVX2 cores in fp32: "
                     f"{f'~{minutes:.0f}' if minutes >= 1 else '<1'} min plus dev evaluations")
        return text

    def train(self, model: Model, triples: Path) -> None:
        output = self.model_dir(model.name)
        max_steps = self.steps_override(model)
        command = [*PY, "pyserini_mores.train", "train", "--recipe", model.recipe,
                   "--triples", triples, "--output", output,
                   "--dev-topics", self.data / "queries.dev.tsv", "--dev-qrels", self.data / "qrels.dev.txt",
                   "--dev-index", self.index, *model.train_args,
                   *(["--max-steps", str(max_steps)] if max_steps else []), "--resume"]
        if model.compressor_texts:
            command += ["--init", self.compressor_dir(model)]
        elif model.fold_of:
            command += ["--init", self.folded_start(model)]
        elif model.widen_of:
            command += ["--init", self.widened_start(model)]
        elif model.init_from:
            command += ["--init", self.model_dir(model.init_from)]
        self.run(f"train-{model.name}", command, done=self.made_marker(model),
                 seconds_from=_summary_seconds, note=self.schedule(model))

    def folded_start(self, model: Model) -> Path:
        """``model``'s starting point: its ``fold_of`` row's trained model with the recipe's interaction blocks."""
        blocks = read_recipe(model.recipe)["settings"]["model_args"]["n_interaction_blocks"]
        return self.start_made_from(model, "fold", model.fold_of, ["fold-blocks", "--blocks", str(blocks)])

    def widened_start(self, model: Model) -> Path:
        """``model``'s starting point: its ``widen_of`` row's trained model with the recipe's feed-forward width."""
        width = read_recipe(model.recipe)["settings"]["model_args"]["ffn_dim"]
        return self.start_made_from(model, "widen", model.widen_of,
                                    ["widen-ffn", "--ffn-dim", str(width), "--seed", str(WIDEN_SEED)])

    def start_made_from(self, model: Model, verb: str, source: str, command: list[str]) -> Path:
        """``model``'s starting point, written by ``train COMMAND --model SOURCE'S MODEL --output ...`` (made again
        when the source row's model has been remade since)."""
        output = self.model_dir(f"{model.name}-start")
        self.run(f"{verb}-{model.name}", [*PY, "pyserini_mores.train", command[0], "--model", self.model_dir(source),
                                          *command[1:], "--output", output],
                 done=output / "config.json", inputs=[self.made_marker(MODELS_BY_NAME[source])])
        return output

    def average(self, model: Model) -> None:
        """``model``'s checkpoint: the equal-weight average of its ``average_of`` rows' trained models, made again
        (over the old one) when one of them has been retrained since."""
        output = self.model_dir(model.name)
        parts = [part for name in model.average_of for part in ("--model", self.model_dir(name))]
        self.run(f"average-{model.name}", [*PY, "pyserini_mores.train", "average", "--model-type", model.reranker,
                                           *parts, "--output", output, "--overwrite"], done=self.made_marker(model),
                 inputs=[self.made_marker(MODELS_BY_NAME[name]) for name in model.average_of])

    def made_marker(self, model: Model) -> Path:
        """The file a row's training (or averaging) writes last: its checkpoint is whole once it exists."""
        output = self.model_dir(model.name)
        return output / ("config.json" if model.average_of else "training_summary.json")

    def model_args(self, model: Model) -> list:
        return ["--reranker", model.reranker, "--model", self.model_dir(model.name), *model.rerank_args]

    def build_sidecar(self, model: Model) -> None:
        if model.stores and not model.sidecar_first and not model.sidecar_of:
            self.run(f"sidecar-{model.name}", [*PY, "pyserini_mores.sidecar", "build", "--index", self.index,
                                               *self.model_args(model), "--precision", PRECISION],
                     inputs=[self.made_marker(model)])  # a remade model has other vectors (and another sidecar)

    def build_sidecar_of_start(self, model: Model) -> None:
        """The sidecar a ``sidecar_first`` row trains against: its starting model with the recipe's model arguments
        (what the stored vectors depend on), written where ``--doc-sidecar default`` and the search look for it."""
        settings = read_recipe(model.recipe)["settings"]
        start = (self.compressor_dir(model) if model.compressor_texts else
                 self.model_dir(model.init_from) if model.init_from else settings["init"])
        arguments = [format_model_arg(key, value) for key, value in settings.get("model_args", {}).items()]
        arguments += [value for flag, value in zip(model.train_args[::2], model.train_args[1::2])
                      if flag == "--model-arg"]
        self.run(f"sidecar-{model.name}", [*PY, "pyserini_mores.sidecar", "build", "--index", self.index,
                                           "--reranker", model.reranker, "--model", start,
                                           *(part for argument in arguments for part in ("--model-arg", argument)),
                                           "--precision", PRECISION])

    def rerank(self, model: Model, split: str) -> None:
        self.run(f"rerank-{model.name}-{split}", [
            *PY, "pyserini_mores.search", "--index", self.index, "--topics", self.data / f"queries.{split}.tsv",
            *self.model_args(model), "--rerank-depth", str(self.depth), "--hits", "1000", "--precision", PRECISION,
            "--output", self.run_file(model.name, split)], done=self.run_file(model.name, split),  # written atomically
            inputs=[self.made_marker(model)])

    def time_reranking(self, model: Model) -> None:
        """ms/query for 1000 BM25 candidates on the first test queries (the effectiveness runs use --depth)."""
        self.run(f"speed-{model.name}", [
            *PY, "pyserini_mores.search", "--index", self.index, "--topics", self.data / "queries.test.tsv",
            *self.model_args(model), "--rerank-depth", "1000", "--hits", "1000", "--precision", PRECISION,
            "--max-queries", str(self.speed_queries)], capture=True)

    def table(self) -> str:
        lines = []
        for split in self.splits:
            # Every model reranked so far, not only this invocation's --models: adding a row keeps the others.
            shown = [m for m in MODELS if m in self.models or self.run_file(m.name, split).exists()]
            runs = [self.run_file("bm25", split)] + [self.run_file(m.name, split) for m in shown]
            baseline = self.run_file(BASELINE, split) if any(m.name == BASELINE for m in shown) else None
            evaluation = self.work / f"eval.{split}.json"
            command = [*PY, "pyserini_mores.eval", *runs, "--qrels", self.data / f"qrels.{split}.txt",
                       "--metrics", "MRR@10", "nDCG@10", "R@10", "R@100", "R@1000", "--json", evaluation]
            if baseline:
                command += ["--baseline", baseline]
            self.run(f"eval-{split}", command, always=True)  # seconds; its runs may have changed since
            if not self.dry_run:
                lines += self.format_table(split, json.loads(evaluation.read_text()))
        lines.append(f"\nPipeline time (sum of its steps, this machine): {self.steps.total_seconds() / 60:.0f} min")
        text = "\n".join(lines) + "\n"
        if not self.dry_run:
            (self.work / "results.md").write_text(text)
        return text

    def format_table(self, split: str, evaluation: dict) -> list[str]:
        names = {str(self.run_file("bm25", split)): "BM25", **{
            str(self.run_file(m.name, split)): m.name for m in MODELS}}
        tests = evaluation.get("non_inferiority", {})
        queries = len(next(iter(evaluation["runs"].values()))["per_query"]["MRR@10"])
        lines = [f"\n### debian-packages {split} ({queries} queries; rerank depth {self.depth}; ms/query for 1000 "
                 f"candidates, --precision {PRECISION}, median of {self.speed_queries} queries)\n",
                 "| model | MRR@10 | nDCG@10 | R@10 | ms/query (1000 cands) | bytes/doc | vs cross-encoder (2% / 5%) |",
                 "|---|---|---|---|---|---|---|"]
        for label, run in evaluation["runs"].items():
            name = names.get(run["path"], label)
            means = run["aggregate"]
            speed, size = self.speed(name)
            verdicts = tests.get(label)
            verdict = " / ".join("NI" if t["non_inferior"] else f"no (p={t['p_value']:.2f})" for t in verdicts) \
                if verdicts else ""
            lines.append(f"| {name} | {means['MRR@10']:.3f} | {means['nDCG@10']:.3f} | {means['R@10']:.3f} | "
                         f"{speed} | {size} | {verdict} |")
        return lines

    def speed(self, name: str) -> tuple[str, str]:
        stdout = self.steps.stdout(f"speed-{name}") or ""
        timing = re.search(r"median ([\d.]+) ms", stdout)
        sidecar = re.search(r"sidecar (\S+)", stdout)
        size = "—"
        if sidecar:
            from pyserini_mores.sidecar import open_sidecar  # torch-free, but only needed for the table

            with open_sidecar(sidecar.group(1)) as store:
                size = f"{store.bytes_per_doc:,.0f}"
        return (f"{float(timing.group(1)):,.0f}" if timing else "—"), size


def check_arguments(step: str, command: list) -> None:
    """Parse ``command``'s arguments with the real command's parser (and read any recipe it names), so that a dry
    run catches a bad flag or an unknown recipe without running anything."""
    if command[1] == ENSEMBLE_SCRIPT:
        from integrations.debian_packages.ensemble_teacher import build_parser
        parser, args = build_parser(), command[2:]
    else:
        parser, args = cli_parser(command[2]), command[3:]
    try:
        parsed = parse_arguments(parser, args)
    except ValueError as error:
        raise SystemExit(f"[{step}] the command's arguments are rejected: {error}") from None
    if getattr(parsed, "recipe", None):
        try:
            read_recipe(parsed.recipe)
        except (FileNotFoundError, ValueError) as error:
            raise SystemExit(f"[{step}] {error}") from None


def prerequisites(model: Model) -> set[str]:
    """The rows ``model`` starts from (``init_from``), learns from (``teacher``, and the second of an ensemble
    teacher), reads the sidecar of (``sidecar_of``), folds (``fold_of``), widens (``widen_of``) or averages
    (``average_of``): trained before it."""
    return {name for name in (model.init_from, model.teacher, model.teacher_scoring.ensemble_with, model.sidecar_of,
                              model.fold_of, model.widen_of, *model.average_of) if name}


def with_prerequisites(models: list[Model]) -> list[Model]:
    """``models`` plus the rows they need, and the rows those need (MORES 2×IB distilled brings MORES 2×IB, which
    brings the cross-encoder), in :data:`MODELS` order so that those are trained before the models that need them."""
    names = {m.name for m in models}
    while needed := {name for m in MODELS if m.name in names for name in prerequisites(m)} - names:
        names |= needed
    added = sorted(names - {m.name for m in models})
    if added:
        needing = [m.name for m in MODELS if m.name in names and prerequisites(m) & set(added)]
        print(f"also training {', '.join(added)}: {', '.join(needing)} start from it or learn from it")
    return [m for m in MODELS if m.name in names]


def _summary_seconds(summary: Path) -> float:
    """A finished training's wall time: over all its invocations when its summary counts them."""
    values = json.loads(summary.read_text())
    return float(values.get("total_seconds") or values.get("seconds", 0.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the debian-packages directory (MS MARCO formats)")
    parser.add_argument("--work", required=True, help="working directory: index, models, sidecars, runs, table")
    parser.add_argument("--models", nargs="+", choices=[m.name for m in MODELS],
                        help="the rows to train (and those they need); default: every row, those marked "
                             "full-only only with --full")
    parser.add_argument("--splits", nargs="+", choices=["dev", "test"], default=["test"],
                        help="query sets reranked for the table (default: test; dev is used during training)")
    parser.add_argument("--depth", type=int, default=100, help="BM25 candidates reranked per query for the table")
    parser.add_argument("--speed-queries", type=int, default=5, help="queries timed at 1000 candidates")
    schedule = parser.add_mutually_exclusive_group()
    schedule.add_argument("--full", action="store_true",
                          help="train every row with its recipe's own schedule (the shipped models' for the "
                               "cross-encoder and MORES 2×IB) instead of the short one")
    schedule.add_argument("--max-steps", type=int, default=None, help="every row's training steps")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    args = parser.parse_args(argv)

    for name in ("collection.tsv", "queries.train.tsv", "qrels.train.txt", *(
            f"{kind}.{split}.{ext}" for split in {"dev", *args.splits} for kind, ext in
            (("queries", "tsv"), ("qrels", "txt")))):
        if not (Path(args.data) / name).is_file():
            raise SystemExit(f"error: {Path(args.data) / name} not found; --data must be the debian-packages folder")
    named = args.models or [m.name for m in MODELS if args.full or not m.full_only]
    models = with_prerequisites([m for m in MODELS if m.name in named])
    pipeline = Pipeline(Path(args.data).resolve(), Path(args.work).resolve(), models, args.splits, args.depth,
                        args.speed_queries, args.max_steps, args.full, args.dry_run)
    if not args.dry_run:
        (pipeline.work / "runs").mkdir(parents=True, exist_ok=True)

    pipeline.build_index()
    pipeline.bm25_runs()
    for model in models:  # MODELS order: every teacher and starting point before the rows that need it
        if model.compressor_texts:
            pipeline.pretrain_compressor(model)
        if model.sidecar_first:
            pipeline.build_sidecar_of_start(model)
        if model.sidecar_of:  # built after training, unless it is a starting point's (sidecar_first: built above)
            pipeline.build_sidecar(MODELS_BY_NAME[model.sidecar_of])
        if model.average_of:
            pipeline.average(model)
        else:
            pipeline.train(model, pipeline.training_triples(model))
    for model in models:
        pipeline.build_sidecar(model)
        for split in args.splits:
            pipeline.rerank(model, split)
        pipeline.time_reranking(model)
    print(pipeline.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The training loop: AdamW, linear warm-up and decay, gradient accumulation, bf16 autocast (CPU or CUDA), seeds,
periodic dev evaluation with early stopping on MRR@10 and best-checkpoint selection, checkpoints that a killed run
resumes from.

Why not transformers' ``Trainer`` (measured, transformers 5.x here): ``TrainingArguments`` refuses to start without
``accelerate`` (``ImportError: Using the Trainer with PyTorch requires accelerate>=1.1.0``), which is not a
dependency of this package. What it would give us is small here and kept compatible: the loss is a Trainer-style
module (:class:`.objectives.RankingObjective`, ``forward(**batch) → {"loss": ...}``), the schedules are
transformers' ``get_scheduler``, and checkpoints use Trainer's file names (``checkpoint-N/`` with ``optimizer.pt``,
``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``).

Determinism: the batch of optimizer step ``s`` is a pure function of ``(seed, s)`` (each epoch is a seeded
permutation of the groups), and checkpoints hold the weights, optimiser, schedule and torch RNG state, so a run
resumed from step ``N`` takes exactly the steps an uninterrupted run takes (bit-identical weights on CPU).

Output directory::

    OUTPUT/config.json, model.safetensors, tokenizer files   the best (dev) or final model, save_pretrained format
    OUTPUT/training_args.json                              the settings (checked on --resume)
    OUTPUT/training_summary.json                           steps, time, losses, dev results, best step
    OUTPUT/checkpoints/checkpoint-N/                       the last `save_total_limit` checkpoints
    OUTPUT/checkpoints/best/                               the best model so far (with dev evaluation)
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from .._io import copy_file_atomic
from ..precision import resolve_device, resolve_precision
from ..models import RankingModel, load_model, model_class
from ..models.base import CONFIG_NAME, WEIGHTS_NAME
from ..models.registry import ModelTable
from ._choices import LOSSES, SCHEDULERS, TEACHER_LOSSES, TRAIN_MODULES
from .data import GroupCollator, TrainingGroup, load_groups, with_batch_negatives
from .dev import DevEvaluator, gather_dev_candidates
from .hidden import HiddenStateDistillation, require_query_states
from .objectives import (UNSCORED_TRIPLES, RankingObjective, batch_to_device, count_parameters, parameter_groups,
                         select_trainable, set_dropout)
from .stored import StoredGroupCollator, StoredRankingObjective, freeze_store_parameters, open_stored_documents

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
CHECKPOINT_PREFIX = "checkpoint-"
STATE_NAME = "trainer_state.json"
ARGS_NAME = "training_args.json"
SUMMARY_NAME = "training_summary.json"
#: ``--init`` files read as GloVe vectors by a model that starts from GloVe (its ``capabilities.starts_from_glove``)
GLOVE_SUFFIXES = (".txt", ".txt.gz")
#: model type → the loss it trains with unless told otherwise (each model's own ``capabilities.default_loss``)
DEFAULT_LOSSES = ModelTable(lambda model: model.capabilities.default_loss)
#: settings that change the trajectory of a run; --resume refuses to continue with different values
RESUME_MUST_MATCH = ("model_type", "init", "triples", "loss", "model_args", "train_modules", "batch_size",
                     "grad_accum", "lr", "head_lr", "joint_lr", "dropout", "weight_decay", "warmup_steps", "scheduler",
                     "margin", "distill_temperature", "negatives_per_example", "batch_negatives", "max_triples", "seed",
                     "bf16", "precision", "max_grad_norm", "freeze_embeddings", "freeze_layers", "doc_sidecar",
                     "hidden_teacher", "hidden_weight")


@dataclass
class TrainingSettings:
    """Everything a training run needs (the ``train`` command's flags; recipes set any of them).

    Attributes:
        model_type: a :data:`pyserini_mores.models.MODEL_CLASSES` key.
        init: backbone (``minilm``, HF name or directory), a checkpoint of ``model_type`` to continue from, or for
            TK a GloVe text file (``*.txt``, ``*.txt.gz``).
        triples: ``query \\t positive \\t negative`` file.
        output: the output directory.
        loss: ``pointwise`` 2-class CE, ``pairwise`` hinge (``margin``), ``listwise`` softmax CE or ``distill``
            (softmax CE against a teacher's ``softmax(scores / distill_temperature)`` over each group; needs scored
            triples); ``None`` picks the model's paper loss (:data:`DEFAULT_LOSSES`).
        model_args: config overrides for a model built from a backbone (e.g. ``n_interaction_blocks``).
        train_modules: ``all``, or MORES's ``interaction`` / ``representation``.
        freeze_embeddings: keep every embedding table at its initial value (the model can then ship as a small
            delta over its backbone).
        freeze_layers: keep the first this many layers of a cross-encoder or of MORES's document module at their
            initial values too (see :func:`.objectives.select_trainable`); 0: none.
        batch_size: training examples per optimiser step — pointwise (query, passage, label) examples for the
            pointwise loss (a triple gives 1 + k of them), groups (query, positive, k negatives) otherwise.
        grad_accum: micro-batches per optimiser step (``batch_size`` is split into them).
        max_steps: optimiser steps; ``None`` → ``epochs`` passes over the triples.
        stop_at_step: end the run after this step, the learning-rate schedule still that of all ``max_steps`` (a
            schedule's first part, as a long run stopped there; ``--resume`` without it continues the schedule).
            ``None``: run the whole schedule.
        warmup_steps: linear warm-up steps (then ``scheduler``: linear decay to 0, constant, or cosine).
        head_lr: learning rate of new layers (score head, TK kernel weights); ``None`` = ``lr``.
        joint_lr: learning rate of the layers reading query and document together above those reading them apart
            (PreTTR's layers above the join, MORES's interaction blocks; not the head); ``None`` = ``lr``.
        precision: ``auto`` (bf16 autocast only where the device runs bf16 natively), ``fp32`` or ``bf16``;
            ``bf16`` (``True``/``False``), when set, overrides it.
        dropout: every dropout probability of the model while it trains (hidden and attention; ``0`` turns dropout
            off); ``None`` keeps the model's own (BERT's 0.1). Scores at inference never use dropout.
        negatives_per_example: ``k``; consecutive triples sharing query and positive are pooled (listwise).
        batch_negatives: ``b`` more negatives per group: the positives of other groups of the same micro-batch
            (:func:`.data.with_batch_negatives`), so a group scores ``1 + k + b`` passages.
        eval_every: dev evaluation every this many steps and after the last (needs ``dev_topics``, ``dev_qrels``
            and ``dev_index`` or ``dev_run``); the best model by ``MRR@10`` becomes the output. 0/None: off.
        early_stopping_patience: stop after this many evaluations without improvement. 0/None: never.
        device: ``cpu``, ``cuda``, ``cuda:1``…; ``None`` = CUDA when available, else CPU.
        doc_sidecar: train against this sidecar (see :mod:`.stored`): documents are read, not encoded, and every
            parameter they depend on is frozen; ``doc_index`` (default ``dev_index``) is the index it was built from.
        hidden_teacher: a trained cross-encoder (directory or shipped name) whose query-token states the model's
            (MORES's interaction blocks, PreTTR's joint layers) are pulled towards (:mod:`.hidden`); ``None``: off.
        hidden_weight: the weight of that hidden-state loss beside the ranking loss (default 1 with a teacher).
    """

    model_type: str
    init: str
    triples: str
    output: str
    loss: str | None = None
    model_args: dict = field(default_factory=dict)
    train_modules: str = "all"
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    max_steps: int | None = None
    stop_at_step: int | None = None
    epochs: float = 1.0
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 3e-5
    head_lr: float | None = None
    joint_lr: float | None = None
    dropout: float | None = None
    weight_decay: float = 0.0
    warmup_steps: int = 0
    scheduler: str = "linear"
    max_grad_norm: float | None = 1.0
    margin: float = 1.0
    distill_temperature: float = 1.0
    negatives_per_example: int = 1
    batch_negatives: int = 0
    max_triples: int | None = None
    bf16: bool | None = None
    precision: str = "auto"
    seed: int = 42
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int = 2
    dev_topics: str | None = None
    dev_qrels: str | None = None
    dev_index: str | None = None
    dev_run: str | None = None
    dev_collection: str | None = None
    dev_depth: int = 100
    dev_max_queries: int | None = None
    eval_every: int | None = None
    early_stopping_patience: int | None = None
    threads: int = 1
    device: str | None = None
    doc_sidecar: str | None = None
    doc_index: str | None = None
    hidden_teacher: str | None = None
    hidden_weight: float | None = None

    def __post_init__(self):
        # 0 switches a recipe's dev evaluation / early stopping off from the command line
        self.eval_every = self.eval_every or None
        self.early_stopping_patience = self.early_stopping_patience or None
        self.model_args = dict(self.model_args or {})
        if self.loss is None:
            self.loss = DEFAULT_LOSSES.get(self.model_type, "pointwise")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss '{self.loss}'; choose from {', '.join(LOSSES)}")
        if self.train_modules not in TRAIN_MODULES:
            raise ValueError(f"unknown train_modules '{self.train_modules}'; choose from {', '.join(TRAIN_MODULES)}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler '{self.scheduler}'; choose from {', '.join(SCHEDULERS)}")
        model_class(self.model_type)  # raises for an unknown type
        for name in ("batch_size", "grad_accum", "negatives_per_example", "logging_steps", "save_steps",
                     "save_total_limit", "dev_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), not {self.dropout}")
        if not self.distill_temperature > 0:
            raise ValueError(f"distill_temperature must be positive, not {self.distill_temperature}")
        if self.batch_negatives < 0:
            raise ValueError(f"batch_negatives must be >= 0, not {self.batch_negatives}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {self.max_steps}")
        if self.stop_at_step is not None and self.stop_at_step < 1:
            raise ValueError(f"stop_at_step must be at least 1, not {self.stop_at_step}")
        if self.max_steps is None and not self.epochs > 0:
            raise ValueError(f"epochs must be positive, not {self.epochs}")
        if self.batch_size % self.examples_per_group:
            raise ValueError(f"with the pointwise loss a triple gives {self.examples_per_group} examples; "
                             f"batch_size={self.batch_size} must be a multiple of it")
        if self.groups_per_step % self.grad_accum:
            raise ValueError(f"{self.groups_per_step} groups per step do not split into grad_accum={self.grad_accum} "
                             "equal micro-batches")
        if self.batch_negatives and self.groups_per_step // self.grad_accum <= self.batch_negatives:
            raise ValueError(f"batch_negatives={self.batch_negatives} borrows positives from other groups of a "
                             f"micro-batch, which holds {self.groups_per_step // self.grad_accum} groups; raise "
                             "batch_size or lower grad_accum")
        if self.early_stopping_patience is not None and self.eval_every is None:
            raise ValueError("early_stopping_patience needs eval_every (and dev data)")
        if self.doc_sidecar is not None and (self.doc_index or self.dev_index) is None:
            raise ValueError("doc_sidecar needs doc_index (or dev_index): the index the sidecar was built from")
        if self.hidden_weight is not None and self.hidden_teacher is None:
            raise ValueError("hidden_weight weighs the hidden-state loss of a hidden_teacher; name the teacher")
        if self.hidden_teacher is not None:
            require_query_states(self.model_type)
            self.hidden_weight = 1.0 if self.hidden_weight is None else self.hidden_weight
            if not self.hidden_weight > 0:
                raise ValueError(f"hidden_weight must be positive, not {self.hidden_weight}")

    def check_dev_data(self) -> None:
        """Raise ``ValueError`` when dev evaluation is asked for without the data it needs."""
        missing = [name for name in ("dev_topics", "dev_qrels") if getattr(self, name) is None]
        if self.dev_index is None and self.dev_run is None:
            missing.append("dev_index or dev_run")
        if missing:
            raise ValueError(f"eval_every needs {', '.join(missing)}")

    @property
    def examples_per_group(self) -> int:
        """Training examples one group counts for in ``batch_size``."""
        return 1 + self.negatives_per_example + self.batch_negatives if self.loss == "pointwise" else 1

    @property
    def groups_per_step(self) -> int:
        return self.batch_size // self.examples_per_group

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class TrainerState:
    """What a checkpoint remembers besides tensors (``trainer_state.json``)."""

    global_step: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    evaluations_without_improvement: int = 0
    stopped_early: bool = False
    log_history: list[dict] = field(default_factory=list)
    # wall seconds from the run's start to this state, summed over the invocations a resumed run took (what each
    # did after its last checkpoint is redone, and not counted); None: resumed from a checkpoint that did not count
    trained_seconds: float | None = 0.0

    @classmethod
    def load(cls, path: Path) -> "TrainerState":
        values = {"trained_seconds": None, **json.loads(path.read_text())}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


@dataclass
class TrainingResult:
    """What :func:`train` returns (also written to ``training_summary.json``)."""

    output: str
    model: RankingModel
    global_step: int
    total_steps: int
    resumed_from: int | None
    best_step: int | None
    best_metric: float | None
    stopped_early: bool
    seconds: float  # this invocation's wall time
    total_seconds: float | None  # the run's, over every invocation (:attr:`TrainerState.trained_seconds`)
    pairs_per_second: float
    log_history: list[dict]


# --------------------------------------------------------------------------------------------------- building


def training_precision(bf16: bool | None, precision: str, device) -> str:
    """``fp32`` or ``bf16``: an explicit ``bf16`` flag (``--bf16`` / ``--no-bf16``) wins over ``precision``, whose
    ``auto`` means bf16 only where ``device`` runs it natively (:func:`.precision.resolve_precision`)."""
    requested = precision if bf16 is None else ("bf16" if bf16 else "fp32")
    return resolve_precision(requested, str(device))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


def build_model(model_type: str, init: str, model_args: dict | None = None) -> RankingModel:
    """The model to train: a checkpoint, a backbone with config overrides, or (models that start from GloVe, e.g. TK)
    a GloVe text file."""
    model_args = dict(model_args or {})
    name = str(init)
    cls = model_class(model_type)
    if cls.capabilities.starts_from_glove and Path(name).is_file() and name.endswith(GLOVE_SUFFIXES):
        max_words = model_args.pop("max_words", None)
        return cls.from_glove(name, max_words=max_words, **model_args)
    return load_model(model_type, init, **model_args)


def checkpoint_dirs(output: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (``trainer_state.json`` present) of a run, oldest first."""
    root = Path(output) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        suffix = path.name[len(CHECKPOINT_PREFIX):]
        if path.name.startswith(CHECKPOINT_PREFIX) and suffix.isdigit() and (path / STATE_NAME).is_file():
            found.append((int(suffix), path))
    return [path for _, path in sorted(found)]


def last_checkpoint(output: str | os.PathLike) -> Path | None:
    dirs = checkpoint_dirs(output)
    return dirs[-1] if dirs else None


def _replace_dir(source: Path, target: Path) -> None:
    """Move a finished temporary directory into place (the old ``target`` is removed first)."""
    if target.exists():
        shutil.rmtree(target)
    os.replace(source, target)


def _fresh_tmp(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def save_checkpoint(output: Path, model: RankingModel, optimizer, scheduler, state: TrainerState,
                    keep: int) -> Path:
    """Write ``checkpoints/checkpoint-<step>`` atomically (written beside, state last, then renamed) and drop
    the oldest beyond ``keep``."""
    target = output / CHECKPOINTS_DIR / f"{CHECKPOINT_PREFIX}{state.global_step}"
    tmp = _fresh_tmp(target)
    model.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng_state.pth")
    (tmp / STATE_NAME).write_text(json.dumps(dataclasses.asdict(state), indent=2) + "\n")
    _replace_dir(tmp, target)
    for old in checkpoint_dirs(output)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _export_model(source_dir: Path, output: Path) -> None:
    """Copy a save_pretrained directory's files into ``output`` (top level), weights and config last."""
    files = sorted((p for p in source_dir.iterdir() if p.is_file()),
                   key=lambda p: p.name in (WEIGHTS_NAME, CONFIG_NAME))
    for path in files:
        if path.suffix in (".pt", ".pth") or path.name == STATE_NAME:
            continue
        copy_file_atomic(path, output / path.name)


def progress_interval() -> float:
    """Seconds between progress-bar refreshes: live on a terminal, sparse in a log file."""
    import sys

    return 0.5 if sys.stderr.isatty() else 30.0


def _make_scheduler(optimizer, name: str, warmup_steps: int, total_steps: int):
    hf_name = {"linear": "linear", "constant": "constant_with_warmup", "cosine": "cosine"}[name]
    return get_scheduler(hf_name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def start_or_resume(output: Path, resume: bool, settings: dict, settings_name: str, *, command: str,
                    comparable: Callable[[dict], dict] = lambda saved: saved) -> Path | None:
    """Create ``output`` and return the checkpoint to resume from (``None``: a fresh start, whose ``settings`` are
    written to ``output/settings_name``). Refuses to mix runs: an earlier run's checkpoints without ``resume``, or a
    resume with settings that differ from the saved ones (each key of ``comparable(saved)`` is compared; ``command``
    names what to run into another ``--output`` instead)."""
    output.mkdir(parents=True, exist_ok=True)
    checkpoint = last_checkpoint(output) if resume else None
    if checkpoint is not None:
        if (output / settings_name).is_file():
            saved = comparable(json.loads((output / settings_name).read_text()))
            current = json.loads(json.dumps(settings))  # the same JSON normalisation as the saved copy
            differing = [name for name in saved if saved[name] != current.get(name)]
            if differing:
                details = ", ".join(f"{name}: {saved[name]!r} → {current.get(name)!r}" for name in differing)
                raise ValueError(f"--resume with settings that differ from the interrupted run ({details}); "
                                 "use a new --output, or the original settings")
        return checkpoint
    if resume:
        logger.warning("--resume: no checkpoint in %s yet; starting from the beginning", output / CHECKPOINTS_DIR)
    elif checkpoint_dirs(output):
        raise ValueError(f"{output} holds checkpoints of an earlier run: continue it with --resume, or {command} "
                         "into another --output")
    (output / settings_name).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return None


def _resume_must_match(saved: dict) -> dict:
    """The saved settings a resumed training must share (:data:`RESUME_MUST_MATCH`); a setting added after the run
    was saved counts as its default, so older runs stay resumable."""
    defaults = {item.name: item.default for item in dataclasses.fields(TrainingSettings)
                if item.default is not dataclasses.MISSING}
    return {name: saved.get(name, defaults.get(name)) for name in RESUME_MUST_MATCH}


# --------------------------------------------------------------------------------------------------- the loop


class _EpochOrder:
    """The group order of each epoch: a permutation seeded by ``(seed, epoch)``, cached for the current epoch."""

    def __init__(self, num_groups: int, seed: int):
        self.num_groups, self.seed = num_groups, seed
        self._epoch, self._order = None, None

    def __call__(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.num_groups, generator=generator).tolist()
        return self._order


def train(
    settings: TrainingSettings,
    *,
    resume: bool = False,
    groups: list[TrainingGroup] | None = None,
    evaluator=None,
    on_step_end: Callable[[TrainerState, RankingModel], None] | None = None,
    progress: bool = True,
) -> TrainingResult:
    """Train ``settings.model_type`` on the triples and save the best/final model to ``settings.output``.

    Args:
        resume: continue from the last complete checkpoint in ``output/checkpoints`` (a fresh start when there
            is none); the settings must match the interrupted run's (:data:`RESUME_MUST_MATCH`).
        groups: training groups to use instead of reading ``settings.triples`` (tests, programmatic use).
        evaluator: ``model → {"MRR@10": ...}``, instead of one built from the ``dev_*`` settings.
        on_step_end: called with the state and the model after every optimiser step (after any evaluation and
            checkpoint).
        progress: show a tqdm bar (loss, learning rate).

    Returns:
        A :class:`TrainingResult`; the model in it is the one saved in ``output`` (best or final).
    """
    started = time.perf_counter()
    if settings.eval_every is not None and evaluator is None:
        settings.check_dev_data()
    output = Path(settings.output)
    checkpoint = start_or_resume(output, resume, settings.to_dict(), ARGS_NAME, command="train",
                                 comparable=_resume_must_match)
    seed_everything(settings.seed)
    groups = _training_groups(settings, groups)
    steps_per_epoch = len(groups) // settings.groups_per_step
    total_steps = settings.max_steps or max(1, math.ceil(settings.epochs * steps_per_epoch))
    end_step = min(total_steps, settings.stop_at_step or total_steps)
    model, state = _model_and_state(settings, checkpoint, total_steps)
    device = resolve_device(settings.device)
    model.to(device)
    bf16 = training_precision(settings.bf16, settings.precision, device) == "bf16"
    trainable = _trainable_parameters(model, settings)
    optimizer, scheduler = _optimizer_and_schedule(model, settings, total_steps, checkpoint)
    logger.info("%s: %d trainable parameters in %d tensors (%s); %d groups, %d steps/epoch, %d steps%s",
                settings.model_type, count_parameters(p for p in model.parameters() if p.requires_grad),
                len(trainable), settings.train_modules, len(groups), steps_per_epoch, total_steps,
                f" (stopping after step {end_step})" if end_step < total_steps else "")
    if evaluator is None and settings.eval_every is not None:
        evaluator = _build_evaluator(settings, bf16)
    collate, objective = _collator_and_objective(model, settings, groups, device)
    run = _Run(settings=settings, output=output, model=model, state=state, optimizer=optimizer, scheduler=scheduler,
               groups=groups, collate=collate, objective=objective, order=_EpochOrder(len(groups), settings.seed),
               steps_per_epoch=steps_per_epoch, total_steps=total_steps, end_step=end_step, device=device,
               bf16=bf16, started=started, seconds_before=state.trained_seconds)
    resumed_from = state.global_step if checkpoint is not None else None
    _run_steps(run, evaluator, on_step_end, progress)
    return _save_result(run, resumed_from)


# --------------------------------------------------------------------------------------------------- its steps


def _training_groups(settings: TrainingSettings, groups: list[TrainingGroup] | None) -> list[TrainingGroup]:
    """The given groups or those of ``settings.triples``, checked to fill a step and to fit the loss."""
    if groups is None:
        groups = load_groups(settings.triples, settings.negatives_per_example, settings.max_triples)
    if settings.loss in TEACHER_LOSSES and groups[0].teacher_scores is None:
        raise ValueError(f"{UNSCORED_TRIPLES}; {settings.triples} has none")
    if len(groups) < settings.groups_per_step:
        raise ValueError(f"{len(groups)} training groups are fewer than one batch of {settings.groups_per_step}")
    return groups


def _model_and_state(settings: TrainingSettings, checkpoint: Path | None,
                     total_steps: int) -> tuple[RankingModel, TrainerState]:
    if checkpoint is None:
        return build_model(settings.model_type, settings.init, settings.model_args), TrainerState()
    model = model_class(settings.model_type).from_pretrained(checkpoint)
    state = TrainerState.load(checkpoint / STATE_NAME)
    logger.info("resuming from %s (step %d of %d)", checkpoint, state.global_step, total_steps)
    return model, state


def _trainable_parameters(model: RankingModel, settings: TrainingSettings) -> list[str]:
    """Set the training dropout and freeze what does not train (``train_modules``, embeddings, what a sidecar
    stores); returns the names of the parameters that train."""
    if settings.dropout is not None:  # also after a resume: a checkpoint's config keeps the model's own dropout
        logger.info("dropout %g while training (%d dropouts set)", settings.dropout,
                    set_dropout(model, settings.dropout))
    trainable = select_trainable(model, settings.train_modules, settings.freeze_embeddings, settings.freeze_layers)
    if settings.doc_sidecar is not None:
        frozen = set(freeze_store_parameters(model))
        trainable = [name for name in trainable if name not in frozen]
        if not trainable:
            raise ValueError("no trainable parameters left: everything trainable is stored in the sidecar")
    return trainable


def _optimizer_and_schedule(model: RankingModel, settings: TrainingSettings, total_steps: int,
                            checkpoint: Path | None):
    """AdamW and the learning-rate schedule; from a checkpoint, their state and the random state it saved."""
    groups_for_optimizer = parameter_groups(model, settings.lr, settings.head_lr, settings.weight_decay,
                                           settings.joint_lr)
    optimizer = torch.optim.AdamW(groups_for_optimizer, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = _make_scheduler(optimizer, settings.scheduler, settings.warmup_steps, total_steps)
    if checkpoint is not None:
        restore_checkpoint_state(checkpoint, optimizer, scheduler)
    return optimizer, scheduler


def restore_checkpoint_state(checkpoint: Path, optimizer, scheduler) -> None:
    """Load what :func:`save_checkpoint` saved besides the model: the optimiser's and schedule's state, and the
    random state (so that dropout continues as in an uninterrupted run)."""
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=True))
    rng = torch.load(checkpoint / "rng_state.pth", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _collator_and_objective(model: RankingModel, settings: TrainingSettings, groups: list[TrainingGroup],
                            device: torch.device):
    """How groups become batches and batches a loss: from the texts, or against a sidecar's stored documents; with
    a hidden-state teacher, its inputs and loss too."""
    hidden = None
    if settings.hidden_teacher is not None:
        hidden = HiddenStateDistillation.load(settings.hidden_teacher, model, settings.hidden_weight, device)
        logger.info("hidden-state distillation from %s (weight %g): the query states of %d layers",
                    settings.hidden_teacher, hidden.weight, hidden.layers)
    if settings.doc_sidecar is None:
        objective = RankingObjective(model, settings.loss, settings.margin, settings.distill_temperature, hidden)
        return GroupCollator(model, hidden), objective
    documents = open_stored_documents(model, settings.doc_sidecar, settings.doc_index or settings.dev_index)
    documents.check_groups(groups)
    objective = StoredRankingObjective(model, settings.loss, settings.margin, settings.distill_temperature, hidden)
    return StoredGroupCollator(model, documents, hidden), objective


@dataclass
class _Run:
    """What the optimiser steps of one run share, and what they count (pairs scored, seconds in steps)."""

    settings: TrainingSettings
    output: Path
    model: RankingModel
    state: TrainerState
    optimizer: torch.optim.Optimizer
    scheduler: object
    groups: list[TrainingGroup]
    collate: Callable[[list[TrainingGroup]], dict]
    objective: RankingObjective
    order: _EpochOrder
    steps_per_epoch: int
    total_steps: int  # the learning-rate schedule's length
    end_step: int  # the step this invocation stops after (``stop_at_step``, or the schedule's end)
    device: torch.device
    bf16: bool
    started: float = 0.0  # this invocation's start (time.perf_counter)
    seconds_before: float | None = 0.0  # the run's wall seconds before it, from the checkpoint it resumed from
    pairs_done: int = 0  # scored (query, passage) pairs and time in optimiser steps only
    step_seconds: float = 0.0

    @property
    def last_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def total_seconds(self, seconds: float) -> float | None:
        """The run's wall seconds, over every invocation, once this one has taken ``seconds``."""
        return None if self.seconds_before is None else self.seconds_before + seconds


def _run_steps(run: _Run, evaluator, on_step_end, progress: bool) -> None:
    """The resumable loop: optimiser steps until ``end_step`` or early stopping, each followed by its logging,
    dev evaluation and checkpoint as due."""
    settings, state = run.settings, run.state
    running, running_count = {}, 0
    run.model.train()
    bar = tqdm(total=run.end_step, initial=state.global_step, desc=f"train {settings.model_type}", unit="step",
               disable=not progress, dynamic_ncols=True, mininterval=progress_interval())
    try:
        while state.global_step < run.end_step and not state.stopped_early:
            step_losses = _optimizer_step(run)
            for name, value in step_losses.items():
                running[name] = running.get(name, 0.0) + value
            running_count += 1
            bar.update(1)
            bar.set_postfix(loss=f"{step_losses['loss']:.4f}", lr=f"{run.last_lr:.2e}", refresh=False)

            done = state.global_step >= run.end_step
            if state.global_step % settings.logging_steps == 0 or done:
                _log_loss(run, {name: total / running_count for name, total in running.items()})
                running, running_count = {}, 0
            if evaluator is not None and settings.eval_every and (
                    state.global_step % settings.eval_every == 0 or done):
                _evaluate(run.model, evaluator, state, settings, run.output)
            if state.global_step % settings.save_steps == 0 or done or state.stopped_early:
                state.trained_seconds = run.total_seconds(run.seconds)
                save_checkpoint(run.output, run.model, run.optimizer, run.scheduler, state, settings.save_total_limit)
            if on_step_end is not None:
                on_step_end(state, run.model)
    finally:
        bar.close()


def _optimizer_step(run: _Run) -> dict[str, float]:
    """One optimiser step on the next batch of the seeded order; returns its mean loss (``"loss"``) and the mean
    of each part the objective reports (e.g. ``"hidden_loss"``)."""
    started = time.perf_counter()
    micro_batches = _micro_batches(run)
    step_losses = _forward_backward(run.objective, micro_batches, run.bf16, run.device)
    step_loss = step_losses["loss"]
    if not math.isfinite(step_loss):
        raise FloatingPointError(f"the loss became {step_loss} at step {run.state.global_step + 1}; "
                                 "lower the learning rate")
    if run.settings.max_grad_norm:
        torch.nn.utils.clip_grad_norm_([p for p in run.model.parameters() if p.requires_grad],
                                       run.settings.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.state.global_step += 1
    run.pairs_done += sum(int(batch["labels"].numel()) for batch in micro_batches)
    run.step_seconds += time.perf_counter() - started
    return step_losses


def _micro_batches(run: _Run) -> list[dict]:
    """The batch of the next step, a pure function of ``(seed, step)``, split into ``grad_accum`` collated parts."""
    per_step = run.settings.groups_per_step
    per_micro_batch = per_step // run.settings.grad_accum
    epoch, position = divmod(run.state.global_step, run.steps_per_epoch)
    indices = run.order(epoch)[position * per_step:(position + 1) * per_step]
    return [run.collate(with_batch_negatives([run.groups[i] for i in indices[start:start + per_micro_batch]],
                                             run.settings.batch_negatives))
            for start in range(0, len(indices), per_micro_batch)]


def _log_loss(run: _Run, mean_losses: dict[str, float]) -> None:
    """Record the mean losses since the last record: ``loss``, and its parts when the objective reports them."""
    state = run.state
    parts = {name: value for name, value in mean_losses.items() if name != "loss"}
    state.log_history.append({
        "step": state.global_step, "epoch": round(state.global_step / run.steps_per_epoch, 4),
        "loss": mean_losses["loss"], **parts, "lr": run.last_lr,
        "pairs_per_second": round(run.pairs_done / run.step_seconds, 2) if run.step_seconds > 0 else None})
    details = ", ".join(f"{name.removesuffix('_loss')} {value:.4f}" for name, value in parts.items())
    logger.info("step %d: loss %.4f%s, lr %.2e", state.global_step, mean_losses["loss"],
                f" ({details})" if details else "", run.last_lr)


def _save_result(run: _Run, resumed_from: int | None) -> TrainingResult:
    """Put the best (dev) or final model in ``output``, write ``training_summary.json``, return the result."""
    output, state, seconds = run.output, run.state, run.seconds
    best_dir = output / CHECKPOINTS_DIR / BEST_DIR
    if state.best_step is not None and best_dir.is_dir():
        _export_model(best_dir, output)
        final_model = model_class(run.settings.model_type).from_pretrained(output)
    else:
        run.model.save_pretrained(output)
        final_model = run.model.eval()
    result = TrainingResult(
        output=str(output), model=final_model, global_step=state.global_step, total_steps=run.total_steps,
        resumed_from=resumed_from, best_step=state.best_step, best_metric=state.best_metric,
        stopped_early=state.stopped_early, seconds=seconds, total_seconds=run.total_seconds(seconds),
        pairs_per_second=run.pairs_done / run.step_seconds if run.step_seconds > 0 else 0.0,
        log_history=state.log_history,
    )
    summary = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name != "model"}
    (output / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _forward_backward(objective: RankingObjective, micro_batches: list[dict], bf16: bool,
                      device: torch.device) -> dict[str, float]:
    """Accumulate the gradients of one optimiser step over its micro-batches; returns the step's mean of every loss
    the objective reports (``"loss"``, the one optimised, and its parts)."""
    step_losses: dict[str, float] = {}
    for batch in micro_batches:
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            losses = objective(**batch_to_device(batch, device))
        (losses["loss"] / len(micro_batches)).backward()
        for name, value in losses.items():
            step_losses[name] = step_losses.get(name, 0.0) + float(value.detach()) / len(micro_batches)
    return step_losses


def _build_evaluator(settings: TrainingSettings, bf16: bool):
    candidates = gather_dev_candidates(
        settings.dev_topics, settings.dev_qrels, index=settings.dev_index, run=settings.dev_run,
        collection=settings.dev_collection, depth=settings.dev_depth, max_queries=settings.dev_max_queries,
        threads=settings.threads,
    )
    logger.info("dev evaluation: %d queries, %d candidate pairs", len(candidates.queries), candidates.num_pairs)
    return DevEvaluator(candidates, bf16=bf16)


def _evaluate(model: RankingModel, evaluator, state: TrainerState, settings: TrainingSettings,
              output: Path) -> None:
    """Evaluate, record, keep the best model, count evaluations without improvement."""
    started = time.perf_counter()
    metrics = evaluator(model)
    metric = float(metrics["MRR@10"])
    improved = state.best_metric is None or metric > state.best_metric
    state.log_history.append({"step": state.global_step, **{f"dev_{k}": v for k, v in metrics.items()},
                              "dev_seconds": time.perf_counter() - started})
    logger.info("step %d: dev MRR@10 %.4f%s", state.global_step, metric,
                " (best so far)" if improved else f" (best {state.best_metric:.4f} at step {state.best_step})")
    if improved:
        state.best_metric, state.best_step = metric, state.global_step
        state.evaluations_without_improvement = 0
        best = output / CHECKPOINTS_DIR / BEST_DIR
        best.parent.mkdir(parents=True, exist_ok=True)
        tmp = _fresh_tmp(best)
        model.save_pretrained(tmp)
        (tmp / "best.json").write_text(json.dumps({"step": state.global_step, "MRR@10": metric}) + "\n")
        _replace_dir(tmp, best)
    else:
        state.evaluations_without_improvement += 1
        patience = settings.early_stopping_patience
        if patience is not None and state.evaluations_without_improvement >= patience:
            logger.info("early stopping at step %d: no improvement in %d evaluations", state.global_step, patience)
            state.stopped_early = True


__all__ = ["TrainingSettings", "TrainerState", "TrainingResult", "train", "build_model", "seed_everything",
           "checkpoint_dirs", "last_checkpoint", "save_checkpoint"]

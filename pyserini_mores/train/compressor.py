"""PreTTR compressor pre-training (MacAvaney et al. SIGIR 2020, §3.2, stage 1): only the compressor learns,
minimising the MSE between the attention probabilities of layers ``l+1..L`` with and without compression
(:meth:`pyserini_mores.models.prettr.PreTTRModel.attention_mse_loss`; the teacher is the same model without its
compressor), on unlabelled (query, passage) pairs (:func:`.data.compressor_pairs`).

The loss is reported on a fixed held-out set of pairs before and after training, so the gain of the pre-trained
compressor over the untrained one is measured on pairs it never saw. Checkpoints (``output/checkpoints``, as
:func:`.trainer.save_checkpoint` writes them) let an interrupted run resume to the weights of an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from .data import compressor_pairs
from .trainer import (
    STATE_NAME,
    TrainerState,
    progress_interval,
    restore_checkpoint_state,
    save_checkpoint,
    seed_everything,
    start_or_resume,
    training_precision,
)

logger = logging.getLogger(__name__)

SUMMARY_NAME = "compressor_pretraining.json"
ARGS_NAME = "compressor_args.json"  # the settings of the run in an output directory, which a resume must share


@dataclass
class CompressorResult:
    """Held-out attention MSE before and after pre-training, and what was done."""

    output: str
    loss_before: float
    loss_after: float
    steps: int
    train_pairs: int
    heldout_pairs: int
    seconds: float  # this invocation's wall time
    total_seconds: float | None  # the run's, over every invocation (None: resumed from a checkpoint without it)
    join_layer: int
    compression_dim: int


def load_prettr_for_compressor(init: str | os.PathLike, model_args: dict | None = None):
    """A PreTTR model with a compressor: from a backbone (``model_args`` must set ``compression_dim``), or from a
    PreTTR checkpoint, which may lack a compressor (or have one of another width): then a new random compressor of
    ``compression_dim`` is added and every other weight is loaded from the checkpoint.

    Raises:
        ValueError: when the result would have no compressor.
    """
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, PretrainedConfig

    from ..models import load_model
    from ..models.base import WEIGHTS_NAME, read_checkpoint_config
    from ..models.prettr import PreTTRConfig, PreTTRModel

    model_args = dict(model_args or {})
    directory = Path(init)
    if (directory / "config.json").is_file() and _is_prettr_checkpoint(directory):
        values = read_checkpoint_config(directory)
        wanted = model_args.get("compression_dim", values.get("compression_dim"))
        if wanted and values.get("compression_dim") != wanted:
            config = PreTTRConfig.from_dict({**values, **model_args})
            tokenizer = AutoTokenizer.from_pretrained(str(directory), config=PretrainedConfig(),
                                                      trust_remote_code=False)
            model = PreTTRModel(config, tokenizer)
            weights = {name: tensor for name, tensor in load_file(str(directory / WEIGHTS_NAME)).items()
                       if not name.startswith("compressor.")}
            missing, unexpected = model.load_state_dict(weights, strict=False)
            if unexpected or any(not name.startswith("compressor.") for name in missing):
                raise ValueError(f"{directory} does not fit this PreTTR config (missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]})")
            model.eval()
        else:
            model = load_model("prettr", directory, **model_args)
    else:
        model = load_model("prettr", init, **model_args)
    if model.compressor is None:
        raise ValueError("compressor pre-training needs a compressor: pass --model-arg compression_dim=E "
                         "(e.g. 128 for MiniLM, 256 for BERT-base)")
    return model


def _is_prettr_checkpoint(directory: Path) -> bool:
    values = json.loads((directory / "config.json").read_text())
    return values.get("model_type") == "prettr" and "architectures" not in values


def _pair_loss(model, chunk: Sequence[tuple[str, str]], device: torch.device) -> torch.Tensor:
    query_batch = {k: v.to(device) for k, v in model.tokenize_queries([q for q, _ in chunk]).items()}
    doc_batch = {k: v.to(device) for k, v in model.tokenize_documents([d for _, d in chunk]).items()}
    return model.attention_mse_loss(query_batch, doc_batch)


@torch.no_grad()
def heldout_attention_mse(model, pairs: Sequence[tuple[str, str]], batch_size: int = 16, bf16: bool = False) -> float:
    """Mean :meth:`attention_mse_loss` over ``pairs`` (weighted by batch size)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            total += float(_pair_loss(model, chunk, device)) * len(chunk)
            count += len(chunk)
    return total / max(count, 1)


def pretrain_compressor(
    init: str | os.PathLike,
    texts: str | os.PathLike,
    output: str | os.PathLike,
    *,
    model_args: dict | None = None,
    queries: Sequence[str] | None = None,
    steps: int = 1000,
    batch_size: int = 16,
    lr: float = 1e-3,
    warmup_steps: int = 0,
    heldout_pairs: int = 64,
    max_pairs: int | None = None,
    seed: int = 42,
    bf16: bool | None = None,
    precision: str = "auto",
    device: str | None = None,
    save_steps: int = 500,
    resume: bool = False,
    progress: bool = True,
) -> CompressorResult:
    """Pre-train the compressor of a PreTTR model and ``save_pretrained`` it (whole model) to ``output``.

    Every weight outside the compressor keeps its value (only the compressor's parameters reach the optimiser).
    Steps cycle through the training pairs in a seeded order (``steps × batch_size`` pairs in all; the paper
    converged by 2M pairs). A checkpoint is written every ``save_steps``; ``resume`` continues from the last one
    (the settings must be the interrupted run's).
    """
    started = time.perf_counter()
    if steps < 1 or batch_size < 1 or save_steps < 1:
        raise ValueError("steps, batch_size and save_steps must be at least 1")
    output = Path(output)
    settings = {"init": str(init), "texts": str(texts), "model_args": dict(model_args or {}),
                "queries": None if queries is None else hashlib.sha256(json.dumps(list(queries)).encode()).hexdigest(),
                "steps": steps, "batch_size": batch_size, "lr": lr, "warmup_steps": warmup_steps,
                "heldout_pairs": heldout_pairs, "max_pairs": max_pairs, "seed": seed}
    checkpoint = start_or_resume(output, resume, settings, ARGS_NAME, command="pre-train")
    seed_everything(seed)
    model = load_prettr_for_compressor(init, model_args) if checkpoint is None else \
        load_prettr_for_compressor(checkpoint)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device)
    bf16 = training_precision(bf16, precision, device) == "bf16"
    heldout, train_pairs = _heldout_split(texts, queries, max_pairs, seed, heldout_pairs)
    trainable = model.freeze_all_but_compressor()
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    scheduler = get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=warmup_steps)
    if checkpoint is None:
        state = TrainerState()
        # fp32: the reported number, of the compressor before any step (kept, so that a resumed run reports it too)
        state.log_history.append({"step": 0, "heldout_mse": heldout_attention_mse(model, heldout, batch_size)})
    else:
        state = TrainerState.load(checkpoint / STATE_NAME)
        restore_checkpoint_state(checkpoint, optimizer, scheduler)
        logger.info("resuming from %s (step %d of %d)", checkpoint, state.global_step, steps)
    loss_before, seconds_before = state.log_history[0]["heldout_mse"], state.trained_seconds
    logger.info("held-out attention MSE before: %.6g (%d pairs)", loss_before, len(heldout))
    _train_compressor(model, train_pairs, optimizer, scheduler, state, output, steps=steps, batch_size=batch_size,
                      seed=seed, bf16=bf16, save_steps=save_steps, started=started, progress=progress)
    loss_after = heldout_attention_mse(model, heldout, batch_size)
    logger.info("held-out attention MSE after: %.6g", loss_after)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.eval().save_pretrained(output)
    seconds = time.perf_counter() - started
    result = CompressorResult(
        output=str(output), loss_before=loss_before, loss_after=loss_after, steps=steps,
        train_pairs=len(train_pairs), heldout_pairs=len(heldout), seconds=seconds,
        total_seconds=None if seconds_before is None else seconds_before + seconds,
        join_layer=model.join_layer, compression_dim=model.config.compression_dim,
    )
    (output / SUMMARY_NAME).write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result


def _heldout_split(texts: str | os.PathLike, queries: Sequence[str] | None, max_pairs: int | None, seed: int,
                   heldout_pairs: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The held-out pairs (at most half of them) and the training pairs."""
    pairs = compressor_pairs(texts, queries=queries, max_pairs=max_pairs, seed=seed)
    heldout_pairs = min(heldout_pairs, len(pairs) // 2)
    heldout, train_pairs = pairs[:heldout_pairs], pairs[heldout_pairs:]
    if not train_pairs or not heldout:
        raise ValueError(f"{texts} gives {len(pairs)} pairs: too few to hold some out and train on the rest")
    return heldout, train_pairs


def _cycling_batches(num_items: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless batches of ``min(batch_size, num_items)`` indices, drawn from seeded permutations of the items (a new
    permutation when one runs out, so a batch may span two)."""
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while True:
        indices = []
        while len(indices) < min(batch_size, num_items):
            if not order:
                order = torch.randperm(num_items, generator=generator).tolist()
            indices.append(order.pop())
        yield indices


def _train_compressor(model, train_pairs: Sequence[tuple[str, str]], optimizer, scheduler, state: TrainerState,
                      output: Path, *, steps: int, batch_size: int, seed: int, bf16: bool, save_steps: int,
                      started: float, progress: bool) -> None:
    """Optimiser steps from ``state.global_step`` to ``steps`` on batches of ``train_pairs`` in a seeded order (a
    resumed run skips the batches of the steps done), with a checkpoint every ``save_steps`` and at the end (each
    with the run's wall time up to it: ``state.trained_seconds`` plus this invocation's since ``started``)."""
    device = next(model.parameters()).device
    seconds_before = state.trained_seconds
    batches = _cycling_batches(len(train_pairs), batch_size, seed)
    for _ in range(state.global_step):
        next(batches)
    bar = tqdm(total=steps, initial=state.global_step, desc="pretrain compressor", unit="step", disable=not progress,
               dynamic_ncols=True, mininterval=progress_interval())
    try:
        while state.global_step < steps:
            loss = _compressor_step(model, [train_pairs[i] for i in next(batches)], optimizer, scheduler, bf16, device)
            state.global_step += 1
            bar.update(1)
            bar.set_postfix(mse=f"{loss:.3g}", refresh=False)
            if state.global_step % save_steps == 0 or state.global_step == steps:
                if seconds_before is not None:
                    state.trained_seconds = seconds_before + time.perf_counter() - started
                save_checkpoint(output, model, optimizer, scheduler, state, keep=1)
    finally:
        bar.close()


def _compressor_step(model, chunk: Sequence[tuple[str, str]], optimizer, scheduler, bf16: bool,
                     device: torch.device) -> float:
    """One optimiser step on the attention MSE of ``chunk``; returns that loss."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        loss = _pair_loss(model, chunk, device)
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


__all__ = ["CompressorResult", "load_prettr_for_compressor", "heldout_attention_mse", "pretrain_compressor"]

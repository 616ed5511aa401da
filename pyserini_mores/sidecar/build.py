"""Build a sidecar: read every document of a Lucene index (or a collection file), encode it with the model in
batches, stream the representations to disk, and publish the sidecar atomically. Resumes an interrupted build.

A build can also produce one shard (a contiguous row range) of a sharded sidecar, or every shard, one after the other
here or as parallel tasks on a Ray cluster (:mod:`.ray_engine`), and then assemble them (:mod:`.assemble`). What to
build is a :class:`BuildOptions`: plain values, which is also what a Ray task receives.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..formats import read_collection
from ..index import (
    document_text,
    index_docids,
    index_identity,
    iter_index_documents,
    open_searcher,
    resolve_index,
)
from ..models import RankingModel, load_model
from ..precision import resolve_device, resolve_precision
from ..windows import WindowOptions, document_capacity, full_window_count, split_text, token_spans
from .assemble import assemble_shards
from .codecs import CODECS, RQ, TokenCodec, is_compressed
from .format import (
    MANIFEST,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    default_sidecar_path,
    partial_path,
)
from .ray_engine import build_shards_on_ray
from .shards import ShardPlan, is_sharded, shard_dirname, shard_is_complete, shard_rows, sharded_build_id
from .trained_codec import (
    TRAINED_CODEC,
    TrainedCodec,
    load_trained_codec,
    parameters_sha256,
    save_trained_codec,
    trained_codec_directory,
    trained_codec_exists,
    trained_codec_problem,
)
from .writer import SidecarWriter

logger = logging.getLogger(__name__)

# Documents are encoded in windows of this many batches, sorted by length inside a window so batches carry
# little padding, then written back in row order.
WINDOW_BATCHES = 16

ENGINES = ("local", "ray")
# The documents that train a sharded build's codec are drawn in this seeded order (the same sample on every run).
CODEC_SAMPLE_SEED = 0


@dataclass(frozen=True)
class ModelSource:
    """Where a model was loaded from (:func:`~pyserini_mores.models.load_model` records it on the model), so that
    another process, such as a Ray worker, loads the same model."""

    model_type: str
    name_or_path: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: RankingModel) -> ModelSource | None:
        """The source of ``model``, or None when it was not made by ``load_model``."""
        source = getattr(model, "source", None)
        if source is None:
            return None
        return cls(model.model_type, source, dict(getattr(model, "source_overrides", {})))

    def load(self) -> RankingModel:
        return load_model(self.model_type, self.name_or_path, **self.overrides)


@dataclass(frozen=True)
class BuildOptions:
    """One sidecar build: the index, the model, where to write and how.

    Args:
        index: a Lucene index directory or a Pyserini prebuilt index name.
        reranker: the reranker's name: in the manifest and in the default directory name.
        model: where the model loads from; needed where the model is loaded again (Ray workers).
        output: the sidecar directory (default: beside the index, :func:`.format.default_sidecar_path`); with
            ``shard``, the shard's directory (default: ``<sidecar dir>/shard-I-of-N``).
        collection: a collection file (MS MARCO TSV or JSONL) for indexes that store no text.
        batch_size: documents encoded per batch.
        dtype: storage dtype of the vectors under the ``fp16`` codec.
        codec: ``fp16``, or a compressed codec (``sq8``, ``sq6``, ``sq4``, ``pq``, ``opq``, ``rq``, ``residual``; see
            :mod:`.codecs`). Unsharded, it is trained on the first documents written; sharded, once for every shard
            on documents drawn across the collection (see ``trained_codec``).
        codec_options: the codec's settings (``pq_subquantizers``; ``nbits``, ``num_centroids``, ``residual_dims``;
            ``rq_codebooks``, ``rq_norms``; ``sample_tokens``), checked when the codec is made (the command line checks
            them first with :func:`.codecs.codec_options`).
        rq_word_stage: the ``rq`` codec's word stage (``rq_words`` set to the model's vocabulary): each code starts
            with its token's id, which the model gives while it encodes (:mod:`.rq`); refused for another codec or a
            model that gives no ids.
        trained_codec: the directory of the build's trained codec (:mod:`.trained_codec`); default: the sidecar
            directory for a whole sharded build and ``train_codec``, the shard directory's parent for one shard.
            A sharded build with a compressed codec trains it there when it is missing, then every shard adopts
            it; one shard (``shard``) only adopts it, and an unsharded build given one adopts it too.
        train_codec: only train the sharded build's codec and save it (in ``trained_codec``), build no shard.
        precision: ``fp32``, ``bf16`` autocast while encoding, or ``auto`` (bf16 where the device runs it natively).
        device: where documents are encoded: ``auto`` (CUDA when ``torch.cuda.is_available()``, else the CPU),
            ``cpu``, ``cuda`` or ``cuda:N``. Resolved by each process that encodes (a Ray task on its own node).
        overwrite: replace an existing sidecar; restart: discard an interrupted build instead of resuming it.
        shards: split the sidecar into this many shards of contiguous rows; shard: build only this one.
        engine: ``local`` (shards one after the other here) or ``ray`` (one Ray task per shard).
        address, max_retries, cpus_per_task: the Ray cluster, the retries of a failed shard task and the CPUs
            each task reserves.
        gpus_per_task: the GPUs each Ray task reserves (``None``: 1 when ``device`` is CUDA, else 0); a task that
            reserves one encodes on the GPU Ray gives it.
        windows: how a document longer than the model reads is cut into windows, each stored (see
            :mod:`pyserini_mores.windows`); the default stores one window, the text the model reads.

    Raises:
        ValueError: inconsistent sharding options (the message names the command-line flags).
    """

    index: str
    reranker: str
    model: ModelSource | None = None
    output: str | None = None
    collection: str | None = None
    batch_size: int = 64
    dtype: str = "float16"
    codec: str = "fp16"
    codec_options: Mapping[str, int] | None = None
    trained_codec: str | None = None
    train_codec: bool = False
    precision: str = "fp32"
    device: str = "auto"
    overwrite: bool = False
    restart: bool = False
    shards: int | None = None
    shard: int | None = None
    engine: str = "local"
    address: str | None = None
    max_retries: int = 3
    cpus_per_task: float = 1.0
    gpus_per_task: float | None = None
    windows: WindowOptions = field(default_factory=WindowOptions)
    rq_word_stage: bool = False

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"--codec must be one of {', '.join(CODECS)}, not {self.codec}")
        if self.rq_word_stage and self.codec != RQ:
            raise ValueError(f"--rq-word-stage applies to --codec rq, not {self.codec}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine}")
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"--shards must be at least 1, not {self.shards}")
        if self.shard is not None:
            if self.shards is None:
                raise ValueError("--shard needs --shards (the number of shards of the build)")
            if not 0 <= self.shard < self.shards:
                raise ValueError(f"--shard must be between 0 and {self.shards - 1}, not {self.shard}")
            if self.engine == "ray":
                raise ValueError("--engine ray builds every shard; drop --shard (or build it with --engine local)")
        if self.engine == "ray" and self.shards is None:
            raise ValueError("--engine ray needs --shards N (one Ray task per shard)")
        if (self.train_codec or self.trained_codec) and not is_compressed(self.codec):
            flag = "--train-codec" if self.train_codec else "--trained-codec"
            raise ValueError(f"{flag} needs a compressed --codec ({', '.join(CODECS[1:])}), not {self.codec}")
        if self.train_codec and self.shard is not None:
            raise ValueError("--train-codec trains the codec every shard adopts; drop --shard (then build the shards)")


def run_build(options: BuildOptions, model: RankingModel | None = None) -> Path:
    """Build what ``options`` describe with ``model`` (default: loaded from ``options.model``): a sidecar, one shard
    of a sharded one, or every shard (here or on Ray) and their assembly. Returns the path written."""
    device = resolve_device(options.device)  # before the model loads: a GPU that is not there fails at once
    if model is None:
        model = _load(options)
    options.windows.resolved(document_capacity(model))  # a window longer than the model reads: refused now
    model.to(device)
    # Resolved once, here: every shard (on any Ray node) encodes under, records and agrees on one precision.
    options = dataclasses.replace(options, precision=resolve_precision(options.precision, device))
    with _build_inputs(options, model) as inputs:
        if options.train_codec:
            return train_build_codec(inputs, _codec_directory(options, inputs.output),
                                     overwrite=options.overwrite).path
        if options.shards is None:
            if options.trained_codec:
                inputs.settings["trained_codec"] = adopted_codec(inputs, options.trained_codec)
            return inputs.build(inputs.output)
        if options.shard is not None:
            output = (Path(options.output) if options.output
                      else inputs.output / shard_dirname(options.shard, options.shards))
            if is_compressed(options.codec):
                inputs.settings["trained_codec"] = adopted_codec(
                    inputs, _codec_directory(options, output.parent), shard=(options.shard, options.shards))
            return inputs.build(output, shard=(options.shard, options.shards))
        return _build_every_shard(options, inputs)


def build_shard(options: BuildOptions, shard: int, output: str, expect_build_id: str | None = None) -> str:
    """Build shard ``shard`` of ``options.shards`` at ``output`` in this process (loads the model, opens the index):
    what one Ray task runs. Returns ``output``."""
    device = resolve_device(options.device)
    with _build_inputs(options, _load(options).to(device), progress=False) as inputs:
        if is_compressed(options.codec):  # the driver trained it, or found it, at options.trained_codec
            inputs.settings["trained_codec"] = adopted_codec(inputs, options.trained_codec or Path(output).parent,
                                                             shard=(shard, options.shards))
        return str(inputs.build(Path(output), shard=(shard, options.shards), expect_build_id=expect_build_id))


def _load(options: BuildOptions) -> RankingModel:
    if options.model is None:
        raise ValueError(f"the model of reranker '{options.reranker}' records no source to load it from; "
                         "pass the model itself")
    return options.model.load()


@dataclass
class _BuildInputs:
    """What every build step of one command shares: the model, the open index, the texts and the build settings."""

    model: RankingModel
    searcher: Any
    output: Path
    settings: dict[str, Any] = field(default_factory=dict)

    def build(self, output: Path, **extra: Any) -> Path:
        return build_sidecar(self.searcher, self.model, output, **{**self.settings, **extra})


@contextlib.contextmanager
def _build_inputs(options: BuildOptions, model: RankingModel, progress: bool = True) -> Iterator[_BuildInputs]:
    resolved = resolve_index(options.index)
    output = Path(options.output) if options.output else default_sidecar_path(resolved.path, options.reranker, model)
    codec_options = dict(options.codec_options or {})
    if options.rq_word_stage:  # before the index opens: a model without token ids is refused at once
        if not model.stored_vocabulary:
            raise ValueError(f"--rq-word-stage codes the token id of each stored vector, which a {model.model_type} "
                             "model does not give (tk and maxsim do)")
        codec_options["rq_words"] = model.stored_vocabulary
    searcher = open_searcher(resolved)
    try:
        texts = collection_texts(options.collection, searcher) if options.collection else None
        settings = dict(reranker_name=options.reranker, batch_size=options.batch_size, dtype=options.dtype,
                        windows=options.windows, codec=options.codec, codec_options=codec_options or None,
                        precision=options.precision, texts=texts,
                        overwrite=options.overwrite, restart=options.restart,
                        source=str(resolved.prebuilt_name or resolved.path), progress=progress, trained_codec=None)
        yield _BuildInputs(model, searcher, output, settings)
    finally:
        searcher.close()


def plan_shards(inputs: _BuildInputs, output: Path, num_shards: int) -> ShardPlan:
    """Shard directories ``output/shard-I-of-N``; finished shards of this build are left out of ``todo`` (a re-run
    redoes only what is missing), unless the build overwrites."""
    trained = inputs.settings.get("trained_codec")
    build_id = shard_build_id(inputs.model, index_identity(inputs.searcher), inputs.settings["dtype"],
                              inputs.settings["precision"], num_shards, inputs.settings["windows"],
                              codec=trained.identity() if trained is not None else None)
    paths = [output / shard_dirname(shard, num_shards) for shard in range(num_shards)]
    todo = [shard for shard, path in enumerate(paths)
            if inputs.settings["overwrite"] or not shard_is_complete(path, build_id, shard, num_shards)]
    return ShardPlan(output, num_shards, build_id, paths, todo)


def _build_every_shard(options: BuildOptions, inputs: _BuildInputs) -> Path:
    output = inputs.output
    if (output / MANIFEST).exists():
        if not options.overwrite:
            logger.info("sidecar %s exists; nothing to do", output)
            return output
        if not is_sharded(output):  # found now, not after encoding every shard
            raise SidecarExistsError(f"{output} is a single-directory sidecar; build the sharded one elsewhere")
    if is_compressed(options.codec):
        directory = _codec_directory(options, output)
        if not options.overwrite and not trained_codec_exists(directory):
            _refuse_shards_without_their_codec(output, options.shards, directory)
        inputs.settings["trained_codec"] = train_build_codec(inputs, directory, overwrite=options.overwrite)
        options = dataclasses.replace(options, trained_codec=str(directory.absolute()))  # where Ray tasks find it
    plan = plan_shards(inputs, output, options.shards)
    skipped = sorted(set(range(plan.num_shards)) - set(plan.todo))
    if skipped:
        logger.warning("%d of %d shards are already built (%s); building the other %d", len(skipped),
                       plan.num_shards, ", ".join(map(str, skipped)), len(plan.todo))
    if options.engine == "ray":
        gpus = options.gpus_per_task
        if gpus is None:
            gpus = 1.0 if resolve_device(options.device).type == "cuda" else 0.0
        if gpus > 0:  # a task sees only the GPUs Ray gives it, from cuda:0: the driver's cuda:N means nothing there
            options = dataclasses.replace(options, device="cuda")
        build_shards_on_ray(options, plan, build_shard, address=options.address, max_retries=options.max_retries,
                            cpus_per_task=options.cpus_per_task, gpus_per_task=gpus)
    else:
        for shard in plan.todo:
            inputs.build(plan.paths[shard], shard=(shard, plan.num_shards), expect_build_id=plan.build_id)
    return assemble_shards(output, plan.paths, overwrite=options.overwrite)


def shard_build_id(model: RankingModel, index: dict, dtype: str, precision: str, num_shards: int,
                   windows: WindowOptions | None = None, codec: Mapping[str, Any] | None = None) -> str:
    """The id every shard of one sharded build agrees on: a hash of what makes their data compatible, the codec
    the shards adopt included (``codec``: :meth:`.trained_codec.TrainedCodec.identity`, its name, options and
    parameter checksum)."""
    parameters = {"model_type": model.model_type, "store_variant": model.store_variant,
                  "fingerprint": model.store_fingerprint(), "index": index, "dtype": dtype,
                  "dim": model.store_width, "precision": precision, "shards": num_shards}
    if windows is not None and windows.windowed:  # a build without windows keeps the id it had before them
        parameters["windows"] = _window_settings(model, windows)
    if codec is not None:  # a float16 build keeps the id it had before sharded codecs
        parameters["codec"] = dict(codec)
    return sharded_build_id(parameters)


# ---- the codec of a sharded build ----------------------------------------------------------------------------------
def _codec_directory(options: BuildOptions, default: Path) -> Path:
    return trained_codec_directory(options.trained_codec) if options.trained_codec else Path(default)


def _requested_codec(inputs: _BuildInputs) -> TokenCodec:
    """The untrained codec the build's settings ask for (its options resolved: the defaults filled in)."""
    return TokenCodec(inputs.settings["codec"], inputs.model.store_width, **(inputs.settings["codec_options"] or {}))


def _trained_for(inputs: _BuildInputs) -> dict[str, Any]:
    """What the vectors a codec is trained on depend on: the model, the index, the precision and the windows."""
    model = inputs.model
    return {"model": {"model_type": model.model_type, "store_variant": model.store_variant,
                      "fingerprint": model.store_fingerprint()},
            "index": dict(index_identity(inputs.searcher)), "precision": inputs.settings["precision"],
            "windows": _window_settings(model, inputs.settings["windows"] or WindowOptions())}


def adopted_codec(inputs: _BuildInputs, location: str | os.PathLike,
                  shard: tuple[int, int] | None = None) -> TrainedCodec:
    """The trained codec at ``location`` that this build adopts, checked against what the build asks for.

    Raises:
        SidecarNotFoundError: there is none; for a shard, the message says which command trains it.
        SidecarMismatchError: it was trained for another codec, model, index, precision or windows.
    """
    directory = trained_codec_directory(location)
    if not trained_codec_exists(directory):
        if shard is None:
            raise SidecarNotFoundError(f"--trained-codec {location}: {directory / TRAINED_CODEC} does not exist")
        number, count = shard
        raise SidecarNotFoundError(
            f"shard {number} of {count} adopts the {inputs.settings['codec']} codec trained once for its whole build, "
            f"but {directory / TRAINED_CODEC} does not exist: train it with this command, --train-codec in place of "
            f"--shard {number} and --output {directory} (or point --trained-codec at the directory that holds it)")
    trained = load_trained_codec(directory)
    problem = trained_codec_problem(trained, _requested_codec(inputs), _trained_for(inputs))
    if problem:
        raise SidecarMismatchError(f"{problem}; train it again for this build with --train-codec --overwrite, or "
                                   "point --trained-codec at this build's")
    return trained


def train_build_codec(inputs: _BuildInputs, directory: str | os.PathLike, *, overwrite: bool = False,
                      seed: int = CODEC_SAMPLE_SEED) -> TrainedCodec:
    """The codec every shard of a sharded build adopts: the one saved in ``directory`` when it was trained for this
    build (a re-run or resumed build reuses it), else trained now on :func:`codec_sample` and saved there.

    Raises:
        SidecarMismatchError: ``directory`` holds a codec trained for another codec setting, model, index,
            precision or windows (``overwrite`` trains it again instead).
    """
    directory = Path(directory)
    codec = _requested_codec(inputs)
    trained_for = _trained_for(inputs)
    if trained_codec_exists(directory) and not overwrite:
        trained = load_trained_codec(directory)
        problem = trained_codec_problem(trained, codec, trained_for)
        if problem:
            raise SidecarMismatchError(f"{problem}; pass --overwrite to train it again (every shard is then built "
                                       "again), or build elsewhere")
        logger.info("reusing the %s codec of %s (trained on %d tokens)", trained.name, trained.path,
                    trained.trained_on)
        return trained
    sample, rows, token_ids = codec_sample(inputs.searcher, inputs.model, inputs.settings["texts"],
                                           sample_tokens=codec.sample_tokens, batch_size=inputs.settings["batch_size"],
                                           precision=inputs.settings["precision"], windows=inputs.settings["windows"],
                                           seed=seed, progress=inputs.settings["progress"],
                                           token_ids=codec.needs_token_ids)
    codec.train(sample, token_ids)
    trained = save_trained_codec(directory, codec, trained_for=trained_for,
                                 sample={"documents": len(rows), "tokens": len(sample), "seed": seed,
                                         "rows": rows.tolist()})
    logger.info("trained the %s codec on %d tokens of %d documents drawn across the collection: %s", codec.name,
                len(sample), len(rows), trained.path)
    return trained


def codec_sample(searcher, model: RankingModel, texts: list[str] | None, *, sample_tokens: int, batch_size: int,
                 precision: str, windows: WindowOptions | None = None, seed: int = CODEC_SAMPLE_SEED,
                 progress: bool = True, token_ids: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``[<= sample_tokens, dim]`` float32 stored vectors of documents drawn across the whole collection, the rows
    drawn (increasing), and with ``token_ids`` the vectors' token ids ``[<= sample_tokens]`` (else None).

    Rows are taken in a seeded random order (``seed``), a grid window of ``batch_size * WINDOW_BATCHES`` documents
    at a time (each window encoded in row order, as a build encodes), until the windows hold ``sample_tokens``
    tokens; the vectors are the windows' in that order, cut at ``sample_tokens``. Every row when the collection
    holds no more. A build's first documents would train the codec on one corner of a collection whose row order
    follows its sources or topics.
    """
    windows = windows or WindowOptions()
    capacity = document_capacity(model)
    num_docs = int(searcher.num_docs)
    order = np.random.default_rng(seed).permutation(num_docs)
    window = batch_size * WINDOW_BATCHES
    model.eval()
    pieces: list[np.ndarray] = []
    id_pieces: list[np.ndarray] = []
    drawn: list[np.ndarray] = []
    tokens = 0
    bar = tqdm(total=sample_tokens, unit="token", desc="codec sample", disable=not progress)
    with torch.inference_mode(), _autocast(model, precision):
        for start in range(0, num_docs, window):
            rows = np.sort(order[start:start + window])
            documents = [texts[row] if texts is not None else document_text(searcher.doc(int(row))) for row in rows]
            reps, _, ids = _encode_window(model, [text for document in documents
                                                  for text in split_text(document, model.tokenizer, capacity, windows)],
                                          batch_size, token_ids)
            pieces += [rep.float().numpy() for rep in reps]
            id_pieces += [piece.numpy() for piece in ids or ()]
            drawn.append(rows)
            added = sum(len(rep) for rep in reps)
            tokens += added
            bar.update(min(added, max(0, sample_tokens - bar.n)))
            if tokens >= sample_tokens:
                break
    bar.close()
    sample = (np.concatenate(pieces) if pieces else np.zeros((0, model.store_width), dtype=np.float32))
    rows = np.sort(np.concatenate(drawn)) if drawn else np.zeros(0, dtype=np.int64)
    ids = (np.concatenate(id_pieces or [np.zeros(0, dtype=np.int64)])[:sample_tokens] if token_ids else None)
    return np.ascontiguousarray(sample[:sample_tokens], dtype=np.float32), rows, ids


def _refuse_shards_without_their_codec(output: Path, num_shards: int, directory: Path) -> None:
    """A resumed sharded build whose trained codec is gone would train another one, silently unlike the shards
    already encoded: refused."""
    paths = [output / shard_dirname(shard, num_shards) for shard in range(num_shards)]
    started = [path for path in paths if path.exists() or partial_path(path).exists()]
    if started:
        raise SidecarNotFoundError(
            f"{len(started)} shards of this build exist under {output} (e.g. {started[0]}) but the codec they "
            f"adopted, {directory / TRAINED_CODEC}, is missing: pass --overwrite to train a new one and build every "
            "shard again")


def _window_settings(model: RankingModel, windows: WindowOptions) -> dict[str, int]:
    """The manifest's window settings of ``windows`` for ``model`` (window and stride resolved, in tokens)."""
    capacity = document_capacity(model)
    window, stride = windows.resolved(capacity)
    return {"window": window, "stride": stride, "max_windows": windows.max_windows, "capacity": capacity}


def collection_texts(collection: str | os.PathLike, searcher) -> list[str]:
    """Texts in the index's row order, from a collection file (for indexes built without stored text).

    Raises:
        ValueError: an indexed document is not in the collection.
    """
    docids = index_docids(searcher)
    row_of = {docid: row for row, docid in enumerate(docids)}
    texts: list[str | None] = [None] * len(docids)
    for docid, text in read_collection(collection):
        row = row_of.get(docid)
        if row is not None:
            texts[row] = text
    missing = [docids[row] for row, text in enumerate(texts) if text is None]
    if missing:
        raise ValueError(f"{len(missing)} indexed documents are not in {collection} (e.g. {missing[:3]})")
    return texts


def build_sidecar(searcher, model: RankingModel, output: str | os.PathLike, *, reranker_name: str,
                  batch_size: int = 64, dtype: str = "float16", precision: str = "auto",
                  texts: list[str] | None = None, overwrite: bool = False, restart: bool = False,
                  source: str | None = None, progress: bool = True, shard: tuple[int, int] | None = None,
                  expect_build_id: str | None = None, codec: str | None = None,
                  codec_options: dict | None = None, device: str | torch.device | None = None,
                  windows: WindowOptions | None = None, trained_codec: TrainedCodec | None = None) -> Path:
    """Encode every document of ``searcher``'s index with ``model`` into a sidecar at ``output``.

    Args:
        device: where to encode (``auto``, ``cpu``, ``cuda``, ``cuda:N``; the model is moved there); ``None``: where
            the model is. Each batch is encoded there and its vectors copied to the CPU to be written.
        shard: ``(i, n)`` encodes only the rows of shard ``i`` of ``n`` (see :func:`.shards.shard_rows`) into a
            shard directory at ``output``; :func:`.assemble.assemble_shards` joins the shards into one sidecar.
        expect_build_id: refuse to build a shard whose build id (:func:`shard_build_id`) differs, e.g. on a cluster
            node that has another checkpoint or index than the driver.
        codec, codec_options: a compressed token codec (see :class:`.writer.SidecarWriter`); ``fp16``/``None``
            stores vectors in ``dtype``.
        trained_codec: a codec trained elsewhere (:mod:`.trained_codec`) that the writer adopts instead of training
            one on the first documents: required for a shard under a compressed codec (the codec of its whole
            build, see :func:`train_build_codec`), whose build id then includes it.
        windows: how documents are cut into windows (:mod:`pyserini_mores.windows`): each window is tokenized and
            encoded as a short document, and a row's stored vectors are its windows' one after the other. Default:
            one window, what the model reads.

    Returns the sidecar path. An interrupted build leaves ``<output>.partial``; calling again resumes it. An existing
    sidecar (or the same shard of the same build) is kept unless ``overwrite``.
    """
    output = Path(output)
    windows = windows or WindowOptions()
    window_settings = _window_settings(model, windows)  # refuses a window longer than the model reads
    if device is not None:
        model.to(resolve_device(device))
    precision = resolve_precision(precision, _model_device(model))
    if trained_codec is not None and trained_codec.name != codec:
        raise ValueError(f"the trained codec {trained_codec.path} is {trained_codec.name}, not the {codec or 'fp16'} "
                         "codec of this build")
    if shard is not None and is_compressed(codec) and trained_codec is None:
        # Each shard would otherwise train a codec of its own on its own first documents.
        raise ValueError(f"a shard under the {codec} codec needs the codec trained for its whole build "
                         "(trained_codec; see train_build_codec)")
    if output.exists() and not overwrite and shard is None:
        logger.info("sidecar %s exists; nothing to do", output)
        return output
    index = index_identity(searcher)
    num_docs = int(searcher.num_docs)
    shard_info = None
    if shard is not None:
        shard_info = _shard_record(model, index, num_docs, shard, output, dtype=dtype, precision=precision,
                                   overwrite=overwrite, expect_build_id=expect_build_id, windows=windows,
                                   codec=trained_codec.identity() if trained_codec is not None else None)
        if shard_info is None:
            return output
        row_start, row_end = shard_info["row_start"], shard_info["row_end"]
    else:
        row_start, row_end = 0, num_docs
    model.eval()
    docids = _docids(searcher, row_start, row_end)
    # precision and device are part of what the sidecar promises: vectors encoded under bf16 match a from-text fp32
    # run only to bf16 accuracy (readers warn, see rerankers.learned).
    build_info = {"reranker": reranker_name, "backbone": model.config.backbone, "source": source,
                  "max_length": model.config.doc_max_length, "precision": precision,
                  "device": _model_device(model).type, "batch_size": batch_size}
    writer = SidecarWriter(
        output, dim=model.store_width, dtype=dtype, docids=docids,
        model={"model_type": model.model_type, "store_variant": model.store_variant,
               "fingerprint": model.store_fingerprint()},
        index=index, build=build_info, shard=shard_info, overwrite=overwrite, restart=restart,
        codec=codec, codec_options=codec_options,
        content_hashes=index.content_hashes()[row_start:row_end] if index.get("content") else None,
        windows=window_settings,
    )
    if trained_codec is not None:
        _adopt(writer, trained_codec)
    _encode_rows(searcher, model, writer, texts, rows=(row_start, row_end), num_docs=num_docs,
                 batch_size=batch_size, precision=precision, progress=progress, windows=windows)
    return writer.finalize()


def _adopt(writer: SidecarWriter, trained: TrainedCodec) -> None:
    """Make ``writer`` encode with ``trained``; a resumed build must already have it (its rows are its codes)."""
    if writer.codec_sample_tokens:
        writer.adopt_codec(trained.parameters, trained.trained_on)
    elif parameters_sha256(writer.codec.parameters()) != trained.sha256:
        raise SidecarMismatchError(
            f"the partial build {writer.partial_path} was started with another {trained.name} codec than "
            f"{trained.path}; pass --restart to discard it")


def _shard_record(model: RankingModel, index: dict, num_docs: int, shard: tuple[int, int], output: Path, *,
                  dtype: str, precision: str, overwrite: bool, expect_build_id: str | None,
                  windows: WindowOptions | None = None, codec: Mapping[str, Any] | None = None) -> dict | None:
    """The manifest's record of shard ``shard = (i, n)`` (its rows and build id), or None when ``output`` already
    holds that shard finished."""
    number, count = shard
    row_start, row_end = shard_rows(num_docs, count, number)
    build_id = shard_build_id(model, index, dtype, precision, count, windows, codec=codec)
    if expect_build_id is not None and build_id != expect_build_id:
        raise SidecarMismatchError(
            f"shard {number} of {count} would belong to build {build_id}, not to the planned build "
            f"{expect_build_id}: the model, index, dtype, precision, windows or trained codec seen here differ from "
            "the driver's")
    if output.exists() and not overwrite:
        if shard_is_complete(output, build_id, number, count):
            logger.info("shard %s is complete; nothing to do", output)
            return None
        raise SidecarExistsError(f"{output} exists but is not shard {number} of {count} of build {build_id}; "
                                 f"pass --overwrite to replace it")
    return {"build_id": build_id, "index": number, "count": count, "row_start": row_start, "row_end": row_end,
            "num_docs": num_docs}


def _encode_rows(searcher, model: RankingModel, writer: SidecarWriter, texts: list[str] | None, *,
                 rows: tuple[int, int], num_docs: int, batch_size: int, precision: str, progress: bool,
                 windows: WindowOptions | None = None) -> None:
    """Encode rows ``[start, end)`` not yet in ``writer`` (a resumed build has some) and add them to it, each row as
    its windows (``windows``), batched by window."""
    windows = windows or WindowOptions()
    capacity = document_capacity(model)
    row_start, row_end = rows
    start_row = row_start + writer.rows_done
    # Encode whole windows of one global grid (rows [k*window, (k+1)*window)): every document then meets the same
    # batch neighbours, hence the same padding and matrix shapes, in a shard as in an unsharded build, so sharded
    # builds are bitwise equal to it. A shard re-encodes at most its two edge windows and keeps only its rows.
    window = batch_size * WINDOW_BATCHES
    first_row = start_row - start_row % window
    last_row = min(num_docs, -(-row_end // window) * window)
    if texts is None:
        documents = itertools.islice(((row, text) for row, _, text in iter_index_documents(searcher, first_row)),
                                     last_row - first_row)
    else:
        documents = ((row, texts[row]) for row in range(first_row, last_row))
    autocast = _autocast(model, precision)
    wants_ids = writer.codec is not None and writer.codec.needs_token_ids
    # Counted before an interruption, when the build resumes.
    truncated = writer.build_info.get("truncated_documents", 0)
    stored = writer.build_info.get("windows_stored", 0)
    capped = writer.build_info.get("capped_documents", 0)
    dropped = writer.build_info.get("windows_dropped", 0)
    started = time.perf_counter()
    bar = tqdm(total=row_end - row_start, initial=writer.rows_done, unit="doc", desc=f"sidecar {writer.path.name}",
               disable=not progress, smoothing=0.05)
    with torch.inference_mode(), autocast:
        for chunk in _chunks(documents, window):
            keep = [i for i, (row, _) in enumerate(chunk) if start_row <= row < row_end]
            if not keep:
                continue
            # Every document of the grid window is cut and encoded, kept or not, so that batches are the same in a
            # shard as in an unsharded build.
            pieces = [split_text(text, model.tokenizer, capacity, windows) for _, text in chunk]
            counts = np.array([len(piece) for piece in pieces], dtype=np.int64)
            firsts = np.cumsum(counts) - counts
            reps, truncated_flags, ids = _encode_window(model, [text for piece in pieces for text in piece],
                                                        batch_size, wants_ids)
            missing = [_windows_missing(model.tokenizer, chunk[i][1], capacity, windows, int(counts[i])) for i in keep]
            truncated += int(sum(bool(truncated_flags[firsts[i] + counts[i] - 1]) or bool(gone)
                                 for i, gone in zip(keep, missing)))
            stored += int(counts[keep].sum())
            capped += sum(1 for gone in missing if gone)
            dropped += sum(missing)
            writer.update_build({"truncated_documents": truncated, "windows_stored": stored,
                                 "capped_documents": capped, "windows_dropped": dropped})
            kept = [firsts[i] + k for i in keep for k in range(counts[i])]
            writer.add([reps[j].float().numpy() for j in kept], windows=counts[keep],
                       capped=sum(1 for gone in missing if gone), token_ids=[ids[j] for j in kept] if ids else None)
            bar.update(len(keep))
    bar.close()
    writer.update_build({"encode_seconds": round(time.perf_counter() - started, 3)})


def _autocast(model: RankingModel, precision: str):
    """bf16 autocast on the model's device under ``precision="bf16"``, else nothing."""
    if precision == "bf16":
        return torch.autocast(_model_device(model).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _windows_missing(tokenizer, text: str, capacity: int, windows: WindowOptions, stored: int) -> int:
    """Windows of ``text`` that ``--max-windows`` left out (0 when it stored them all, or without windows)."""
    if not windows.windowed or stored < windows.max_windows:
        return 0
    window, stride = windows.resolved(capacity)
    return int(full_window_count(len(token_spans(tokenizer, text)), window, stride)) - stored


def _model_device(model: RankingModel) -> torch.device:
    """Where ``model`` computes (the device of its first parameter; the CPU for a model without any)."""
    parameter = next(iter(model.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _docids(searcher, row_start: int, row_end: int) -> list[str]:
    """Collection docids of rows ``[row_start, row_end)`` (a shard reads only its own)."""
    return [searcher.doc(row).docid() for row in range(row_start, row_end)]


def _encode_window(model, texts: list[str], batch_size: int, token_ids: bool = False):
    """Encode ``texts`` sorted by length (less padding) on the model's device, returned in input order on the CPU,
    plus whether each was truncated, and with ``token_ids`` the token id of each stored vector (else None)."""
    device = _model_device(model)
    lengths = [len(text) for text in texts]
    order = np.argsort(lengths, kind="stable")
    reps: list = [None] * len(texts)
    ids: list | None = [None] * len(texts) if token_ids else None
    truncated = np.zeros(len(texts), dtype=bool)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = model.tokenize_documents([texts[i] for i in chunk])
        truncated[chunk] = _truncated(model, [texts[i] for i in chunk], batch)
        encoded = model.encode_documents({key: value.to(device, non_blocking=True) for key, value in batch.items()})
        if device.type != "cpu":  # to the CPU for the writer, in one copy per batch rather than one per document
            encoded = torch.cat(encoded).cpu().split([len(rep) for rep in encoded])
        for i, rep in zip(chunk, encoded):
            reps[i] = rep
        if ids is not None:
            for i, piece in zip(chunk, model.stored_token_ids(batch)):
                ids[i] = piece
    return reps, truncated, ids


def _truncated(model, texts: list[str], batch) -> np.ndarray:
    """``[len(texts)]`` bool: documents that lost tokens to the length cap. Judged by tokenizing again with a cap no
    document reaches, because a mask that exactly fills the cap is not a cut, and models whose stored layout drops
    special tokens (PreTTR) never fill it."""
    mask = batch.get("attention_mask")
    if mask is None:
        return np.zeros(len(texts), dtype=bool)
    cap = model.config.doc_max_length
    try:
        model.config.doc_max_length = 1_000_000
        whole = model.tokenize_documents(texts)["attention_mask"].sum(1)
    finally:
        model.config.doc_max_length = cap
    return (whole > mask.sum(1)).numpy()


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk

"""Build a sidecar: read every document of a Lucene index (or a collection file), encode it with the model in
batches, stream the representations to disk, and publish the sidecar atomically. Resumes an interrupted build.

A build can also produce one shard (a contiguous row range) of a sharded sidecar, or every shard, one after the other
here or as parallel tasks on a Ray cluster (:mod:`.ray_engine`), and then assemble them (:mod:`.shards`)."""
from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

logger = logging.getLogger(__name__)

# Documents are encoded in windows of this many batches, sorted by length inside a window so batches carry
# little padding, then written back in row order.
WINDOW_BATCHES = 16


def define_build_args(parser: argparse.ArgumentParser) -> None:
    from .._cli import define_model_args

    parser.add_argument("--index", required=True, help="Lucene index directory or Pyserini prebuilt index name")
    define_model_args(parser)
    parser.add_argument("--output", default=None,
                        help="sidecar directory (default: beside the index); with --shard, the shard's directory")
    parser.add_argument("--collection", default=None,
                        help="collection file (MS MARCO TSV or JSONL) for indexes that store no text")
    parser.add_argument("--batch-size", type=int, default=64, help="documents encoded per batch")
    parser.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16")
    parser.add_argument("--codec", choices=["fp16", "sq8", "sq6", "sq4", "pq"], default="fp16",
                        help="token vector codec: fp16 stores vectors in --dtype; sq8/sq6/sq4 (faiss scalar "
                             "quantisers, 8/6/4 bits per value) and pq (faiss product quantisation, 1 byte per "
                             "sub-quantiser) are trained on the first documents and decoded at read time")
    parser.add_argument("--pq-subquantizers", type=int, default=None, metavar="M",
                        help="--codec pq: sub-quantisers per vector = bytes per token (must divide the store "
                             "width; default: width / 4)")
    parser.add_argument("--max-length", type=int, default=None, help="document length cap in tokens")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing sidecar")
    parser.add_argument("--restart", action="store_true", help="discard an interrupted build instead of resuming")
    group = parser.add_argument_group("sharded and distributed builds")
    group.add_argument("--shards", type=int, default=None,
                       help="split the sidecar into this many shards of contiguous rows (shard i holds rows "
                            "i*ceil(n/N) onward); without --shard every shard is built into OUTPUT/shard-I-of-N "
                            "and assembled")
    group.add_argument("--shard", type=int, default=None,
                       help="build only this shard (0-based) of --shards at --output (default: "
                            "<sidecar dir>/shard-I-of-N); join the shards with `assemble`")
    group.add_argument("--engine", choices=["local", "ray"], default="local",
                       help="local: shards one after the other in this process; ray: one Ray task per shard")
    group.add_argument("--address", default=None,
                       help="Ray cluster to connect to (auto, HOST:6379 or ray://HOST:10001); default: a Ray "
                            "instance already started in this process, else a new local one")
    group.add_argument("--max-retries", type=int, default=3, help="Ray: retries of a failed shard task")
    group.add_argument("--cpus-per-task", type=float, default=1.0, help="Ray: CPUs reserved by each shard task")


def run_build(args: argparse.Namespace) -> int:
    _check_shard_args(args)
    if args.engine == "ray":
        from .ray_engine import import_ray

        try:
            import_ray()  # before loading any model: say at once what to install
        except ImportError as error:
            raise SystemExit(f"error: {error}") from None
    with _build_inputs(args) as inputs:
        if args.shards is None:
            path = inputs.build(inputs.output)
        elif args.shard is not None:
            output = Path(args.output) if args.output else inputs.output / _shard_dirname(args.shard, args.shards)
            path = inputs.build(output, shard=(args.shard, args.shards))
        else:
            path = _build_every_shard(args, inputs)
    print(f"sidecar written to {path}")
    return 0


def _check_shard_args(args: argparse.Namespace) -> None:
    if args.shards is not None and args.shards < 1:
        raise SystemExit(f"error: --shards must be at least 1, not {args.shards}")
    if args.shard is not None:
        if args.shards is None:
            raise SystemExit("error: --shard needs --shards (the number of shards of the build)")
        if not 0 <= args.shard < args.shards:
            raise SystemExit(f"error: --shard must be between 0 and {args.shards - 1}, not {args.shard}")
        if args.engine == "ray":
            raise SystemExit("error: --engine ray builds every shard; drop --shard (or build it with --engine local)")
    if args.engine == "ray" and args.shards is None:
        raise SystemExit("error: --engine ray needs --shards N (one Ray task per shard)")


@dataclass
class _BuildInputs:
    """What every build step of one command shares: the model, the open index, the texts and the build options."""

    reranker: Any
    model: Any
    searcher: Any
    output: Path
    options: dict[str, Any] = field(default_factory=dict)

    def build(self, output: Path, **extra: Any) -> Path:
        return build_sidecar(self.searcher, self.model, output, **{**self.options, **extra})


@contextlib.contextmanager
def _build_inputs(args: argparse.Namespace, progress: bool = True) -> Iterator[_BuildInputs]:
    from .._cli import parse_model_args
    from ..index import open_searcher, resolve_index
    from ..rerankers import LEARNED_RERANKERS, get_reranker
    from ..search.searcher import default_sidecar_path

    if not args.reranker:
        raise SystemExit("error: --reranker is required")
    overrides = parse_model_args(args.model_arg)
    if args.max_length:
        overrides["doc_max_length"] = args.max_length
    learned = args.reranker in LEARNED_RERANKERS or args.model or overrides
    reranker = get_reranker(args.reranker, model=args.model, **overrides) if learned else get_reranker(args.reranker)
    model = getattr(reranker, "model", None)
    if model is None or model.store_width is None:
        raise SystemExit(f"error: reranker '{args.reranker}' stores no document representations; "
                         "it needs no sidecar")
    resolved = resolve_index(args.index)
    output = Path(args.output) if args.output else default_sidecar_path(resolved.path, reranker.name, model)
    searcher = open_searcher(resolved)
    try:
        texts = collection_texts(args.collection, searcher) if args.collection else None
        codec_options = {"pq_subquantizers": args.pq_subquantizers} if args.pq_subquantizers else None
        options = dict(reranker_name=reranker.name, batch_size=args.batch_size, dtype=args.dtype,
                       codec=args.codec, codec_options=codec_options, precision=args.precision, texts=texts,
                       overwrite=args.overwrite, restart=args.restart,
                       source=str(resolved.prebuilt_name or resolved.path), progress=progress)
        yield _BuildInputs(reranker, model, searcher, output, options)
    finally:
        searcher.close()


@dataclass
class ShardPlan:
    """The shards of one sharded build: their directories under ``output``, the build id and which still need work."""

    output: Path
    num_shards: int
    build_id: str
    paths: list[Path]
    todo: list[int]


def plan_shards(inputs: _BuildInputs, output: Path, num_shards: int) -> ShardPlan:
    """Shard directories ``output/shard-I-of-N``; finished shards of this build are left out of ``todo`` (a re-run
    redoes only what is missing), unless the build overwrites."""
    from ..index import index_identity
    from .shards import shard_is_complete

    build_id = shard_build_id(inputs.model, index_identity(inputs.searcher), inputs.options["dtype"],
                              inputs.options["precision"], num_shards)
    paths = [output / _shard_dirname(shard, num_shards) for shard in range(num_shards)]
    todo = [shard for shard, path in enumerate(paths)
            if inputs.options["overwrite"] or not shard_is_complete(path, build_id, shard, num_shards)]
    return ShardPlan(output, num_shards, build_id, paths, todo)


def _build_every_shard(args: argparse.Namespace, inputs: _BuildInputs) -> Path:
    from .format import MANIFEST, SidecarExistsError
    from .shards import assemble_shards, is_sharded

    output = inputs.output
    if (output / MANIFEST).exists():
        if not args.overwrite:
            logger.info("sidecar %s exists; nothing to do", output)
            return output
        if not is_sharded(output):  # found now, not after encoding every shard
            raise SidecarExistsError(f"{output} is a single-directory sidecar; build the sharded one elsewhere")
    plan = plan_shards(inputs, output, args.shards)
    skipped = sorted(set(range(plan.num_shards)) - set(plan.todo))
    if skipped:
        logger.warning("%d of %d shards are already built (%s); building the other %d", len(skipped),
                       plan.num_shards, ", ".join(map(str, skipped)), len(plan.todo))
    if args.engine == "ray":
        from .ray_engine import build_shards_on_ray

        build_shards_on_ray(args, plan, address=args.address, max_retries=args.max_retries,
                            cpus_per_task=args.cpus_per_task)
    else:
        for shard in plan.todo:
            inputs.build(plan.paths[shard], shard=(shard, plan.num_shards), expect_build_id=plan.build_id)
    return assemble_shards(output, plan.paths, overwrite=args.overwrite)


def build_shard(args: argparse.Namespace, shard: int, output: str, expect_build_id: str | None = None) -> str:
    """Build shard ``shard`` of ``args.shards`` at ``output`` in this process (loads the model, opens the index):
    what one Ray task runs. Returns ``output``."""
    with _build_inputs(args, progress=False) as inputs:
        return str(inputs.build(Path(output), shard=(shard, args.shards), expect_build_id=expect_build_id))


def shard_build_id(model, index: dict, dtype: str, precision: str, num_shards: int) -> str:
    """The id every shard of one sharded build agrees on: a hash of what makes their data compatible."""
    from .shards import sharded_build_id

    return sharded_build_id({"model_type": model.model_type, "store_variant": model.store_variant,
                             "fingerprint": model.store_fingerprint(), "index": index, "dtype": dtype,
                             "dim": model.store_width, "precision": precision, "shards": num_shards})


def _shard_dirname(shard: int, num_shards: int) -> str:
    from .shards import shard_dirname

    return shard_dirname(shard, num_shards)


def collection_texts(collection: str | os.PathLike, searcher) -> list[str]:
    """Texts in the index's row order, from a collection file (for indexes built without stored text)."""
    from ..formats import read_collection
    from ..index import index_docids

    docids = index_docids(searcher)
    row_of = {docid: row for row, docid in enumerate(docids)}
    texts: list[str | None] = [None] * len(docids)
    for docid, text in read_collection(collection):
        row = row_of.get(docid)
        if row is not None:
            texts[row] = text
    missing = [docids[row] for row, text in enumerate(texts) if text is None]
    if missing:
        raise SystemExit(f"error: {len(missing)} indexed documents are not in {collection} (e.g. {missing[:3]})")
    return texts


def build_sidecar(searcher, model, output: str | os.PathLike, *, reranker_name: str, batch_size: int = 64,
                  dtype: str = "float16", precision: str = "fp32", texts: list[str] | None = None,
                  overwrite: bool = False, restart: bool = False, source: str | None = None,
                  progress: bool = True, shard: tuple[int, int] | None = None,
                  expect_build_id: str | None = None, codec: str | None = None,
                  codec_options: dict | None = None) -> Path:
    """Encode every document of ``searcher``'s index with ``model`` into a sidecar at ``output``.

    Args:
        shard: ``(i, n)`` encodes only the rows of shard ``i`` of ``n`` (see :func:`.shards.shard_rows`) into a
            shard directory at ``output``; :func:`.shards.assemble_shards` joins the shards into one sidecar.
        expect_build_id: refuse to build a shard whose build id (:func:`shard_build_id`) differs, e.g. on a cluster
            node that has another checkpoint or index than the driver.
        codec, codec_options: a compressed token codec (see :class:`.writer.SidecarWriter`); ``fp16``/``None``
            stores vectors in ``dtype``.

    Returns the sidecar path. An interrupted build leaves ``<output>.partial``; calling again resumes it. An existing
    sidecar (or the same shard of the same build) is kept unless ``overwrite``.
    """
    import torch
    from tqdm import tqdm

    from ..index import index_identity, iter_index_documents
    from .format import SidecarExistsError, SidecarMismatchError
    from .shards import shard_is_complete, shard_rows
    from .writer import SidecarWriter

    output = Path(output)
    if shard is not None and codec not in (None, "fp16"):
        # Each shard would train a codec of its own on its own first documents.
        raise ValueError(f"a sharded build cannot use the {codec} codec yet; build it unsharded")
    if output.exists() and not overwrite and shard is None:
        logger.info("sidecar %s exists; nothing to do", output)
        return output
    index = index_identity(searcher)
    num_docs = int(searcher.num_docs)
    shard_info = None
    if shard is not None:
        number, count = shard
        row_start, row_end = shard_rows(num_docs, count, number)
        build_id = shard_build_id(model, index, dtype, precision, count)
        if expect_build_id is not None and build_id != expect_build_id:
            raise SidecarMismatchError(
                f"shard {number} of {count} would belong to build {build_id}, not to the planned build "
                f"{expect_build_id}: the model, index, dtype or precision seen here differ from the driver's")
        if output.exists() and not overwrite:
            if shard_is_complete(output, build_id, number, count):
                logger.info("shard %s is complete; nothing to do", output)
                return output
            raise SidecarExistsError(f"{output} exists but is not shard {number} of {count} of build {build_id}; "
                                     f"pass --overwrite to replace it")
        shard_info = {"build_id": build_id, "index": number, "count": count, "row_start": row_start,
                      "row_end": row_end, "num_docs": num_docs}
    else:
        row_start, row_end = 0, num_docs
    model.eval()
    docids = _docids(searcher, row_start, row_end)
    build_info = {"reranker": reranker_name, "backbone": model.config.backbone, "source": source,
                  "max_length": model.config.doc_max_length, "precision": precision, "batch_size": batch_size}
    writer = SidecarWriter(
        output, dim=model.store_width, dtype=dtype, docids=docids,
        model={"model_type": model.model_type, "store_variant": model.store_variant,
               "fingerprint": model.store_fingerprint()},
        index=index, build=build_info, shard=shard_info, overwrite=overwrite, restart=restart,
        codec=codec, codec_options=codec_options,
    )
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
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    truncated = writer.build_info.get("truncated_documents", 0)  # counted before an interruption
    started = time.perf_counter()
    bar = tqdm(total=row_end - row_start, initial=writer.rows_done, unit="doc", desc=f"sidecar {output.name}",
               disable=not progress, smoothing=0.05)
    with torch.inference_mode(), autocast:
        for chunk in _chunks(documents, window):
            keep = [i for i, (row, _) in enumerate(chunk) if start_row <= row < row_end]
            if not keep:
                continue
            reps, truncated_flags = _encode_window(model, [text for _, text in chunk], batch_size)
            truncated += int(sum(truncated_flags[i] for i in keep))
            writer.update_build({"truncated_documents": truncated})
            writer.add([reps[i].float().numpy() for i in keep])
            bar.update(len(keep))
    bar.close()
    writer.update_build({"encode_seconds": round(time.perf_counter() - started, 3)})
    return writer.finalize()


def _docids(searcher, row_start: int, row_end: int) -> list[str]:
    """Collection docids of rows ``[row_start, row_end)`` (a shard reads only its own)."""
    return [searcher.doc(row).docid() for row in range(row_start, row_end)]


def _encode_window(model, texts: list[str], batch_size: int):
    """Encode ``texts`` sorted by length (less padding), returned in input order, plus whether each was truncated."""
    lengths = [len(text) for text in texts]
    order = np.argsort(lengths, kind="stable")
    reps: list = [None] * len(texts)
    truncated = np.zeros(len(texts), dtype=bool)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = model.tokenize_documents([texts[i] for i in chunk])
        truncated[chunk] = _truncated(model, [texts[i] for i in chunk], batch)
        for i, rep in zip(chunk, model.encode_documents(batch)):
            reps[i] = rep
    return reps, truncated


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

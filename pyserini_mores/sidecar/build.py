"""Build a sidecar: read every document of a Lucene index (or a collection file), encode it with the model in
batches, stream the representations to disk, and publish the sidecar atomically. Resumes an interrupted build."""
from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

logger = logging.getLogger(__name__)

# Documents are encoded in windows of this many batches, sorted by length inside a window so batches carry
# little padding, then written back in row order.
WINDOW_BATCHES = 16


def define_build_args(parser: argparse.ArgumentParser) -> None:
    from .._cli import define_model_args

    parser.add_argument("--index", required=True, help="Lucene index directory or Pyserini prebuilt index name")
    define_model_args(parser)
    parser.add_argument("--output", default=None, help="sidecar directory (default: beside the index)")
    parser.add_argument("--collection", default=None,
                        help="collection file (MS MARCO TSV or JSONL) for indexes that store no text")
    parser.add_argument("--batch-size", type=int, default=64, help="documents encoded per batch")
    parser.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16")
    parser.add_argument("--max-length", type=int, default=None, help="document length cap in tokens")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing sidecar")
    parser.add_argument("--restart", action="store_true", help="discard an interrupted build instead of resuming")


def run_build(args: argparse.Namespace) -> int:
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
        path = build_sidecar(searcher, model, output, reranker_name=reranker.name, batch_size=args.batch_size,
                             dtype=args.dtype, precision=args.precision, texts=texts, overwrite=args.overwrite,
                             restart=args.restart, source=str(resolved.prebuilt_name or resolved.path))
    finally:
        searcher.close()
    print(f"sidecar written to {path}")
    return 0


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
                  progress: bool = True) -> Path:
    """Encode every document of ``searcher``'s index with ``model`` into a sidecar at ``output``.

    Returns the sidecar path. An interrupted build leaves ``<output>.partial``; calling again resumes it.
    """
    import torch
    from tqdm import tqdm

    from ..index import index_docids, index_identity, iter_index_documents
    from .writer import SidecarWriter

    output = Path(output)
    if output.exists() and not overwrite:
        logger.info("sidecar %s exists; nothing to do", output)
        return output
    model.eval()
    docids = index_docids(searcher)
    build_info = {"reranker": reranker_name, "backbone": model.config.backbone, "source": source,
                  "max_length": model.config.doc_max_length, "precision": precision, "batch_size": batch_size}
    writer = SidecarWriter(
        output, dim=model.store_width, dtype=dtype, docids=docids,
        model={"model_type": model.model_type, "store_variant": model.store_variant,
               "fingerprint": model.store_fingerprint()},
        index=index_identity(searcher), build=build_info, overwrite=overwrite, restart=restart,
    )
    start_row = writer.rows_done
    if texts is None:
        documents = ((row, text) for row, _, text in iter_index_documents(searcher, start_row))
    else:
        documents = ((row, texts[row]) for row in range(start_row, len(texts)))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    truncated = writer.build_info.get("truncated_documents", 0)  # counted before an interruption
    started = time.perf_counter()
    bar = tqdm(total=len(docids), initial=start_row, unit="doc", desc=f"sidecar {output.name}",
               disable=not progress, smoothing=0.05)
    with torch.inference_mode(), autocast:
        for window in _chunks(documents, batch_size * WINDOW_BATCHES):
            reps, window_truncated = _encode_window(model, [text for _, text in window], batch_size)
            truncated += window_truncated
            writer.update_build({"truncated_documents": truncated})
            writer.add([rep.float().numpy() for rep in reps])
            bar.update(len(window))
    bar.close()
    writer.update_build({"encode_seconds": round(time.perf_counter() - started, 3)})
    return writer.finalize()


def _encode_window(model, texts: list[str], batch_size: int):
    """Encode ``texts`` sorted by length (less padding), returned in input order, plus how many were truncated."""
    lengths = [len(text) for text in texts]
    order = np.argsort(lengths, kind="stable")
    reps: list = [None] * len(texts)
    truncated = 0
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = model.tokenize_documents([texts[i] for i in chunk])
        truncated += _count_truncated(model, [texts[i] for i in chunk], batch)
        for i, rep in zip(chunk, model.encode_documents(batch)):
            reps[i] = rep
    return reps, truncated


def _count_truncated(model, texts: list[str], batch) -> int:
    """Documents that reached the length cap (their tail was cut)."""
    mask = batch.get("attention_mask")
    if mask is None:
        return 0
    return int((mask.sum(1) >= model.config.doc_max_length).sum())


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk

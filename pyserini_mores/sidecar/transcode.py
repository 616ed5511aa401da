"""Re-store a finished sidecar's vectors in another codec or dtype without running the model again.

A build spends its time in the model (minutes to hours); choosing a codec is a question of bytes against
effectiveness that is cheaper to answer by transcoding one sidecar several ways and searching with each. The result is
a sidecar like any other: the source's model and index identity (so readers accept it for the same model and index),
the source's build provenance plus where it came from, written through :class:`.writer.SidecarWriter` (atomic
finalize; an interrupted transcode resumes).

Vectors are read as the source stores them (a compressed source is decoded), so transcoding a float16 sidecar gives
the codes a build with that codec would give up to the float16 rounding of its input. A codec is trained on every
token when the source holds no more than its sample (as a build trains it), else on documents drawn across the whole
source, where a build can only take its first documents.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .codecs import IDENTITY, TokenCodec
from .format import SidecarExistsError
from .sharded_reader import open_sidecar
from .writer import SidecarWriter

DEFAULT_BATCH_DOCS = 1024


def transcode_sidecar(source: str | os.PathLike, output: str | os.PathLike, *, codec: str = "fp16",
                      dtype: str = "float16", codec_options: Mapping[str, Any] | None = None,
                      overwrite: bool = False, restart: bool = False, batch_docs: int = DEFAULT_BATCH_DOCS,
                      progress: bool = True) -> Path:
    """Write ``source``'s vectors to a new sidecar at ``output`` stored with ``codec`` (or as ``dtype`` for
    ``fp16``); returns ``output``.

    Raises:
        SidecarExistsError: ``output`` is a complete sidecar and ``overwrite`` is false, or it is ``source``.
    """
    source, output = Path(source), Path(output)
    if output.resolve() == source.resolve():
        raise SidecarExistsError(f"{output} is the source sidecar: transcode into another directory")
    reader = open_sidecar(source)
    try:
        if codec != IDENTITY:  # refused before any work: a codec that the whole source cannot train
            probe = TokenCodec(codec, reader.dim, **dict(codec_options or {}))
            if reader.num_tokens < probe.min_training_tokens:
                raise ValueError(f"the {codec} codec needs at least {probe.min_training_tokens} token vectors to "
                                 f"train, {source} holds {reader.num_tokens}; {probe.too_few_tokens_hint}")
        build = {**reader.manifest.build, "transcoded_from": {"path": str(source), "dtype": reader.dtype}}
        windows, capped = _window_settings(reader)
        writer = SidecarWriter(output, dim=reader.dim, dtype=dtype, docids=reader.docids(np.arange(reader.num_docs)),
                               model=reader.model, index=reader.index, build=build, overwrite=overwrite,
                               restart=restart, codec=None if codec == "fp16" else codec,
                               codec_options=codec_options, commit_every_docs=batch_docs,
                               content_hashes=reader.content_hashes() if reader.index.get("content") else None,
                               windows=windows)
        if writer.codec_sample_tokens:
            writer.train_codec(_spread_sample(reader, writer.codec_sample_tokens))
        with tqdm(total=reader.num_docs, initial=writer.rows_done, unit="doc", desc=f"transcode {output.name}",
                  disable=not progress) as bar:
            for start in range(writer.rows_done, reader.num_docs, batch_docs):
                rows = np.arange(start, min(start + batch_docs, reader.num_docs))
                _, lengths, _ = reader.window_spans(rows)
                reps = [np.asarray(reader.get(int(row)), dtype=np.float32) for row in rows]
                pieces = np.split(np.concatenate(reps), np.cumsum(lengths)[:-1]) if len(rows) else []
                # The source's capped documents are counted once, with its first row.
                writer.add(pieces, windows=reader.window_counts(rows), capped=capped if start == 0 else 0)
                bar.update(len(rows))
        return writer.finalize()
    finally:
        reader.close()


def _window_settings(reader) -> tuple[dict[str, Any], int]:
    """The source's window settings for the writer and its count of capped documents (one window per row, not
    recorded, for a format-2 source)."""
    manifests = [shard.manifest for shard in getattr(reader, "shards", [reader])]
    if not all(manifest.has_windows for manifest in manifests):
        return {}, 0
    settings = {name: manifests[0].windows.get(name) for name in ("window", "stride", "max_windows", "capacity")}
    return settings, sum(int(manifest.windows["capped_documents"]) for manifest in manifests)


def _spread_sample(reader, sample_tokens: int, seed: int = 0) -> np.ndarray:
    """``[<= sample_tokens, dim]`` float32 training vectors: every token in row order when the store holds no more,
    else those of documents drawn at random (fixed seed) across the whole store, in row order. A build can train
    only on its first documents; a store whose rows follow some order (by source, topic or length) would train a
    codec on one corner of the space (k-means centroids most of all)."""
    lengths = reader.lengths()
    if int(lengths.sum()) <= sample_tokens:
        rows = np.arange(reader.num_docs)
    else:
        order = np.random.default_rng(seed).permutation(reader.num_docs)
        enough = int(np.searchsorted(np.cumsum(lengths[order]), sample_tokens)) + 1
        rows = np.sort(order[:enough])
    sample = np.concatenate([np.asarray(reader.get(int(row)), dtype=np.float32) for row in rows]
                            or [np.zeros((0, reader.dim), dtype=np.float32)])
    return sample[:sample_tokens]


__all__ = ["transcode_sidecar"]

"""Re-store a finished sidecar's vectors in another codec or dtype without running the model again.

A build spends its time in the model (minutes to hours); choosing a codec is a question of bytes against
effectiveness that is cheaper to answer by transcoding one sidecar several ways and searching with each. The result is
a sidecar like any other: the source's model and index identity (so readers accept it for the same model and index),
the source's build provenance plus where it came from, written through :class:`.writer.SidecarWriter` (atomic
finalize; an interrupted transcode resumes).

Vectors are read as the source stores them (a compressed source is decoded), so transcoding a float16 sidecar gives
the codes a build with that codec would give up to the float16 rounding of its input, and codecs are trained on the
first tokens in row order, as in a build.
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
        writer = SidecarWriter(output, dim=reader.dim, dtype=dtype, docids=reader.docids(np.arange(reader.num_docs)),
                               model=reader.model, index=reader.index, build=build, overwrite=overwrite,
                               restart=restart, codec=None if codec == "fp16" else codec,
                               codec_options=codec_options, commit_every_docs=batch_docs,
                               content_hashes=reader.content_hashes() if reader.index.get("content") else None)
        with tqdm(total=reader.num_docs, initial=writer.rows_done, unit="doc", desc=f"transcode {output.name}",
                  disable=not progress) as bar:
            for start in range(writer.rows_done, reader.num_docs, batch_docs):
                rows = range(start, min(start + batch_docs, reader.num_docs))
                writer.add([np.asarray(reader.get(row), dtype=np.float32) for row in rows])
                bar.update(len(rows))
        return writer.finalize()
    finally:
        reader.close()


__all__ = ["transcode_sidecar"]

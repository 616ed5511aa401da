"""Assemble shards into one sharded sidecar: validate them, then write the top-level manifest that lists them (no
data is copied). See :mod:`.shards` for the layout."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from .._io import write_json_atomic
from .format import (
    MANIFEST,
    Manifest,
    SidecarCorruptError,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    check_directory,
    read_manifest,
    size_problems,
)
from .shards import (
    ShardedManifest,
    ShardEntry,
    codec_identity,
    coverage_problems,
    identity_problems,
    is_sharded,
    rows_text,
    shard_content_id,
    shard_rows,
)

logger = logging.getLogger(__name__)

# Provenance counters of the shards that add up in the sharded manifest's ``build``; other values are kept when
# every shard agrees on them.
_SUMMED_BUILD_KEYS = ("truncated_documents", "encode_seconds", "windows_stored", "capped_documents",
                      "windows_dropped")


@dataclass
class _Shard:
    path: Path
    manifest: Manifest

    @property
    def record(self) -> dict[str, Any]:
        return self.manifest.shard

    @property
    def rows(self) -> tuple[int, int]:
        return int(self.record["row_start"]), int(self.record["row_end"])


def _read_shard(path: Path) -> _Shard:
    """A finished, intact-sized shard at ``path``, or an error saying why it cannot be assembled."""
    check_directory(path)  # missing, or an unfinished `.partial` build
    manifest = read_manifest(path)
    if not manifest.shard:
        raise SidecarMismatchError(
            f"{path} is a whole sidecar, not a shard (its {MANIFEST} records no row range); build shards with "
            f"`python -m pyserini_mores.sidecar build ... --shards N --shard I`")
    missing = [key for key in ("build_id", "index", "count", "row_start", "row_end") if key not in manifest.shard]
    if missing:
        raise SidecarCorruptError(f"{path / MANIFEST}: field 'shard' lacks {', '.join(missing)}")
    shard = _Shard(path, manifest)
    start, end = shard.rows
    if end - start != manifest.num_docs:
        raise SidecarCorruptError(f"{path / MANIFEST}: shard {rows_text(start, end)} but num_docs={manifest.num_docs}")
    problems = size_problems(manifest, path)
    if problems:
        raise SidecarCorruptError(f"shard {path} is damaged: {'; '.join(problems)}")
    return shard


# ---- assemble ----------------------------------------------------------------------------------------------------
def assemble_shards(output: str | os.PathLike, shard_paths: Sequence[str | os.PathLike], *,
                    overwrite: bool = False) -> Path:
    """Validate shards and write the sharded manifest ``<output>/manifest.json`` that references them (no copy).

    Shards inside ``output`` are recorded by relative path (the whole tree can move), others by absolute path.
    Checks (cheap: manifests and file sizes; ``verify`` hashes the data): every shard finished and complete-sized;
    one codec (name, options and parameters, by their checksum), build id, model fingerprint, index identity, dtype
    and dim; every shard of the build present exactly once;
    row ranges contiguous, non-overlapping and covering every document.

    Raises:
        SidecarNotFoundError: a shard is missing or unfinished.
        SidecarMismatchError: a shard of another build, a whole sidecar among the shards, gaps or overlaps.
        SidecarExistsError: ``output`` is already a sidecar (pass ``overwrite=True`` to replace a sharded one).
    """
    output = Path(output)
    if not shard_paths:
        raise ValueError("no shards given to assemble")
    _check_assemble_target(output, overwrite)
    shards = sorted((_read_shard(Path(path)) for path in shard_paths), key=lambda shard: shard.rows)
    first = shards[0]
    reference = {"build_id": first.record["build_id"], "fingerprint": first.manifest.model_fingerprint,
                 "index": first.manifest.index, "dtype": first.manifest.dtype, "dim": first.manifest.dim,
                 "codec": codec_identity(first.manifest)}
    for shard in shards[1:]:
        problems = identity_problems(shard.manifest, shard.path, reference, str(first.path))
        if problems:
            raise SidecarMismatchError(problems[0])
    num_shards = int(first.record["count"])
    num_docs = int(first.record.get("num_docs", first.manifest.index.get("num_docs", 0)))
    _check_shard_set(shards, num_shards, num_docs)
    problems = coverage_problems([(str(shard.path), *shard.rows) for shard in shards], num_docs)
    if problems:
        raise SidecarMismatchError(f"the shards do not tile the index: {'; '.join(problems)}")
    manifest = ShardedManifest(
        build_id=str(reference["build_id"]), num_docs=num_docs,
        num_tokens=sum(shard.manifest.num_tokens for shard in shards), dim=first.manifest.dim,
        dtype=first.manifest.dtype, model=first.manifest.model, index=first.manifest.index,
        shards=[ShardEntry(path=_recorded_path(shard.path, output), row_start=shard.rows[0], row_end=shard.rows[1],
                           num_tokens=shard.manifest.num_tokens, content=shard_content_id(shard.manifest))
                for shard in shards],
        build=_merged_build([shard.manifest.build for shard in shards]),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        library={"name": "pyserini_mores", "version": __version__})
    output.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output / MANIFEST, manifest.to_dict())
    logger.info("sharded sidecar %s: %d shards, %d documents", output, len(shards), num_docs)
    return output


def _check_assemble_target(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise SidecarExistsError(f"{output} exists and is not a directory")
    if not (output / MANIFEST).exists():
        return
    if not is_sharded(output):
        raise SidecarExistsError(f"{output} is a single-directory sidecar; assemble the shards somewhere else")
    if not overwrite:
        raise SidecarExistsError(f"sharded sidecar {output} already exists; pass --overwrite to replace its manifest")


def _check_shard_set(shards: list[_Shard], num_shards: int, num_docs: int) -> None:
    """Every shard ``0..num_shards-1`` given exactly once (named, with its rows, when one is missing)."""
    by_index: dict[int, _Shard] = {}
    for shard in shards:
        index = int(shard.record["index"])
        if index in by_index:
            raise SidecarMismatchError(f"shard {index} of {num_shards} is given twice: {by_index[index].path} and "
                                       f"{shard.path}")
        by_index[index] = shard
    missing = [index for index in range(num_shards) if index not in by_index]
    if missing:
        described = ", ".join(f"{index} ({rows_text(*shard_rows(num_docs, num_shards, index))})" for index in missing)
        raise SidecarNotFoundError(f"{len(missing)} of {num_shards} shards are missing: shard {described}; build "
                                   f"them with `--shards {num_shards} --shard I` and assemble again")


def _recorded_path(shard: Path, output: Path) -> str:
    shard, root = shard.resolve(), output.resolve()
    return str(shard.relative_to(root)) if shard.is_relative_to(root) else str(shard)


def _merged_build(builds: list[dict[str, Any]]) -> dict[str, Any]:
    merged = {key: value for key, value in builds[0].items()
              if key not in _SUMMED_BUILD_KEYS and all(build.get(key) == value for build in builds)}
    for key in _SUMMED_BUILD_KEYS:
        values = [build[key] for build in builds if isinstance(build.get(key), (int, float))]
        if values:
            merged[key] = round(sum(values), 3) if any(isinstance(v, float) for v in values) else sum(values)
    return merged

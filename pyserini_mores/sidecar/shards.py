"""Sharded sidecars: one store made of shards (contiguous row ranges, each a normal sidecar directory) that may live
on different disks, joined by a top-level manifest that lists them. Assembling copies no data.

A sharded sidecar is a directory holding one file, ``manifest.json`` (format ``pyserini-mores-sidecar-sharded``)::

    {"format": "pyserini-mores-sidecar-sharded", "format_version": 1, "build_id": "...", "num_docs": ..., ...
     "shards": [{"path": "shard-00000-of-00002", "row_start": 0, "row_end": 10, "num_tokens": ..., "content": "..."},
                {"path": "/mnt/disk2/shard-00001-of-00002", "row_start": 10, "row_end": 20, ...}]}

Each shard's own manifest records its global row range and the build it belongs to (``Manifest.shard``); the
top-level manifest records a content id of every shard manifest, so a shard rebuilt or swapped after assembling is
refused. Relative shard paths are relative to the sharded sidecar's directory. Like :mod:`.format`, reading the
manifests needs neither torch nor the JVM.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .format import (
    MANIFEST,
    Manifest,
    SidecarCorruptError,
    SidecarError,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    check_directory,
    check_expectations,
    json_normalized,
    read_manifest,
    short_hash,
    size_problems,
    write_json_atomic,
)
from .reader import BatchBuffer, ManifestMetadata, SidecarReader, _check_heads, _torch_dtype, head_major

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SHARDED_FORMAT_NAME = "pyserini-mores-sidecar-sharded"
SHARDED_FORMAT_VERSION = 1

# Provenance counters of the shards that add up in the sharded manifest's ``build``; other values are kept when
# every shard agrees on them.
_SUMMED_BUILD_KEYS = ("truncated_documents", "encode_seconds")


# ---- how rows are split ------------------------------------------------------------------------------------------
def shard_rows(num_docs: int, num_shards: int, shard: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of shard ``shard`` of ``num_shards``: ``shard * ceil(num_docs / num_shards)`` onward.

    The last shards may be empty when ``num_shards`` does not divide evenly (20 documents in 8 shards of 3).
    """
    if num_shards < 1:
        raise ValueError(f"the number of shards must be at least 1, not {num_shards}")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} does not exist: shards are numbered 0 to {num_shards - 1}")
    size = math.ceil(num_docs / num_shards)
    return min(num_docs, shard * size), min(num_docs, (shard + 1) * size)


def shard_dirname(shard: int, num_shards: int) -> str:
    """``shard-00001-of-00004``: where a sharded build puts shard 1 of 4 under its output directory."""
    return f"shard-{shard:05d}-of-{num_shards:05d}"


def sharded_build_id(parameters: Mapping[str, Any]) -> str:
    """A deterministic id of a sharded build's parameters (model fingerprint, index identity, dtype, number of
    shards...), so shards encoded on different machines without talking to each other agree on it."""
    canonical = json.dumps(json_normalized(dict(parameters)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def shard_content_id(manifest: Manifest) -> str:
    """A hash of a shard manifest's structure and checksums (not its timestamps and timings): what assembling pinned."""
    data = {key: value for key, value in manifest.to_dict().items() if key not in ("created", "build", "library")}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def shard_is_complete(path: str | os.PathLike, build_id: str, shard: int, num_shards: int) -> bool:
    """Whether ``path`` holds a finished shard ``shard`` of ``num_shards`` of build ``build_id`` with files of the
    right size (a re-run of a sharded build skips it; checksums are left to ``verify``)."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return False
    try:
        manifest = read_manifest(path)
    except SidecarError:
        return False
    record = manifest.shard
    return (record.get("build_id") == build_id and record.get("index") == shard
            and record.get("count") == num_shards and not size_problems(manifest, path))


# ---- the top-level manifest --------------------------------------------------------------------------------------
@dataclass
class ShardEntry:
    """One shard as the sharded manifest lists it: where it is, its global rows ``[row_start, row_end)``, its token
    count and the content id of its manifest at assembly time."""

    path: str
    row_start: int
    row_end: int
    num_tokens: int
    content: str

    @property
    def num_docs(self) -> int:
        return self.row_end - self.row_start

    def resolve(self, root: Path) -> Path:
        """The shard directory: ``path`` as is when absolute, else relative to the sharded sidecar ``root``."""
        path = Path(self.path)
        return path if path.is_absolute() else root / path


@dataclass
class ShardedManifest:
    """The content of a sharded sidecar's ``manifest.json``; ``model``/``index``/``dim``/``dtype`` as in a shard."""

    build_id: str
    num_docs: int
    num_tokens: int
    dim: int
    dtype: str
    model: dict[str, Any]
    index: dict[str, Any]
    shards: list[ShardEntry]
    build: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    library: dict[str, Any] = field(default_factory=dict)
    format: str = SHARDED_FORMAT_NAME
    format_version: int = SHARDED_FORMAT_VERSION

    @property
    def model_fingerprint(self) -> str:
        return str(self.model.get("fingerprint", ""))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        head = {"format": data.pop("format"), "format_version": data.pop("format_version")}
        return {**head, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = MANIFEST) -> "ShardedManifest":
        """Parse a sharded manifest dict; a missing or ill-typed field raises :class:`SidecarCorruptError`."""
        if data.get("format") != SHARDED_FORMAT_NAME:
            raise SidecarCorruptError(f"{source}: format is {data.get('format')!r}, not {SHARDED_FORMAT_NAME!r}")
        version = data.get("format_version")
        if version != SHARDED_FORMAT_VERSION:
            raise SidecarMismatchError(f"{source}: sharded sidecar format_version is {version!r}, this "
                                       f"pyserini_mores reads version {SHARDED_FORMAT_VERSION}")
        required = {"build_id": str, "num_docs": int, "num_tokens": int, "dim": int, "dtype": str, "model": dict,
                    "index": dict, "shards": list}
        for name, kind in required.items():
            if not isinstance(data.get(name), kind):
                raise SidecarCorruptError(f"{source}: field '{name}' is missing or not a {kind.__name__}")
        shards = []
        for position, entry in enumerate(data["shards"]):
            try:
                shards.append(ShardEntry(path=str(entry["path"]), row_start=int(entry["row_start"]),
                                         row_end=int(entry["row_end"]), num_tokens=int(entry["num_tokens"]),
                                         content=str(entry["content"])))
            except (TypeError, KeyError, ValueError):
                raise SidecarCorruptError(f"{source}: field 'shards[{position}]' is missing or incomplete") from None
        known = set(cls.__dataclass_fields__) - {"shards"}
        return cls(shards=shards, **{key: value for key, value in data.items() if key in known})


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a sharded sidecar (its ``manifest.json`` has the sharded format). False when unreadable:
    the single-sidecar reader then reports what is wrong."""
    try:
        data = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == SHARDED_FORMAT_NAME


def read_sharded_manifest(path: str | os.PathLike) -> ShardedManifest:
    """Read ``<path>/manifest.json`` of a sharded sidecar. Pure JSON."""
    file = Path(path) / MANIFEST
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SidecarCorruptError(f"{file} is missing: {path} is not a complete sidecar") from None
    except (OSError, ValueError) as error:
        raise SidecarCorruptError(f"{file} is unreadable: {error}") from None
    if not isinstance(data, dict):
        raise SidecarCorruptError(f"{file} does not hold a JSON object")
    return ShardedManifest.from_dict(data, source=str(file))


# ---- validation shared by assemble, the reader and verify -------------------------------------------------------
def _rows(start: int, end: int) -> str:
    return f"rows [{start}, {end})"


def coverage_problems(ranges: Sequence[tuple[str, int, int]], num_docs: int) -> list[str]:
    """Gaps and overlaps of ``(name, row_start, row_end)`` ranges that must tile ``[0, num_docs)`` exactly."""
    problems = []
    expected, previous = 0, None
    for name, start, end in sorted(ranges, key=lambda item: (item[1], item[2])):
        if end < start:
            problems.append(f"{name} has an inverted row range [{start}, {end})")
            continue
        if start > expected:
            after = f"{previous} ends at row {expected} and " if previous else ""
            problems.append(f"{_rows(expected, start)} are in no shard: {after}{name} starts at row {start}")
        elif start < expected and end > start:
            problems.append(f"{name} ({_rows(start, end)}) overlaps {previous} (which ends at row {expected})")
        if end > expected:
            expected, previous = end, name
    if expected < num_docs:
        problems.append(f"{_rows(expected, num_docs)} are in no shard (the index has {num_docs} documents)")
    elif expected > num_docs:
        problems.append(f"shards reach row {expected} but the index has {num_docs} documents")
    return problems


def _identity_problems(manifest: Manifest, file: Path, reference: Mapping[str, Any], reference_name: str) -> list[str]:
    """How a shard's manifest disagrees with the build it should belong to (``reference``: build_id, fingerprint,
    index, dtype, dim). Build id first: a shard of another build usually differs in everything else too."""
    checks = [
        ("build id", manifest.shard.get("build_id"), reference["build_id"]),
        ("model fingerprint", short_hash(manifest.model_fingerprint), short_hash(reference["fingerprint"])),
        ("index identity", manifest.index, reference["index"]),
        ("dtype", manifest.dtype, reference["dtype"]),
        ("dim", manifest.dim, reference["dim"]),
    ]
    for what, actual, expected in checks:
        if actual != expected:
            return [f"{file} is a shard of another build: its {what} is {actual} but {reference_name} has "
                    f"{expected}"]
    return []


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
        raise SidecarCorruptError(f"{path / MANIFEST}: shard {_rows(start, end)} but num_docs={manifest.num_docs}")
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
    one build id, model fingerprint, index identity, dtype and dim; every shard of the build present exactly once;
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
                 "index": first.manifest.index, "dtype": first.manifest.dtype, "dim": first.manifest.dim}
    for shard in shards[1:]:
        problems = _identity_problems(shard.manifest, shard.path, reference, str(first.path))
        if problems:
            raise SidecarMismatchError(problems[0])
    num_shards = int(first.record["count"])
    num_docs = int(first.record.get("num_docs", first.manifest.index.get("num_docs", 0)))
    _check_shard_set(shards, num_shards, num_docs)
    problems = coverage_problems([(str(shard.path), *shard.rows) for shard in shards], num_docs)
    if problems:
        raise SidecarMismatchError(f"the shards do not tile the index: {'; '.join(problems)}")
    from .. import __version__

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
        described = ", ".join(f"{index} ({_rows(*shard_rows(num_docs, num_shards, index))})" for index in missing)
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


# ---- reading -----------------------------------------------------------------------------------------------------
class _ShardReader(SidecarReader):
    """A shard opened as part of its sharded sidecar (a lone shard is refused: its rows are not Lucene docids)."""

    _part_of_sharded = True

    def __reduce__(self):
        return (_ShardReader, (str(self.path),))


def _entry_problem(manifest: ShardedManifest, root: Path, position: int, shard_manifest: Manifest) -> str | None:
    """Why the shard at ``manifest.shards[position]`` does not belong to this sharded sidecar, or None."""
    entry = manifest.shards[position]
    file = entry.resolve(root) / MANIFEST
    reference = {"build_id": manifest.build_id, "fingerprint": manifest.model_fingerprint, "index": manifest.index,
                 "dtype": manifest.dtype, "dim": manifest.dim}
    problems = _identity_problems(shard_manifest, file, reference, str(root / MANIFEST))
    if problems:
        return problems[0]
    rows = (shard_manifest.shard.get("row_start"), shard_manifest.shard.get("row_end"))
    if rows != (entry.row_start, entry.row_end):
        return (f"{file} holds rows [{rows[0]}, {rows[1]}) but {root / MANIFEST} lists it for "
                f"{_rows(entry.row_start, entry.row_end)}")
    if shard_content_id(shard_manifest) != entry.content:
        return (f"{file} changed since the shards were assembled into {root} (rebuilt or replaced); check it with "
                f"`python -m pyserini_mores.sidecar verify` and assemble again")
    return None


class ShardedSidecarReader(ManifestMetadata):
    """Read-only access to a sharded sidecar with the :class:`SidecarReader` API: rows are global (Lucene internal
    docids) and batches may span shards.

    Opening validates the top-level manifest, the row coverage and every shard (exists, finished, of this build,
    file sizes), then keeps one lazy :class:`SidecarReader` per shard.

    Raises:
        SidecarNotFoundError: the sidecar or one of its shards is missing (the message names the shard).
        SidecarMismatchError: other model, index, dtype or dim; a shard of another build or changed since assembly.
        SidecarCorruptError: unreadable manifests, gaps or overlaps, a shard's file of the wrong size.
    """

    def __init__(self, path: str | os.PathLike, *, expect_model_fingerprint: str | None = None,
                 expect_index: Mapping[str, Any] | None = None, expect_dtype: str | None = None,
                 expect_dim: int | None = None):
        self.path = Path(path)
        self._expect = {"expect_model_fingerprint": expect_model_fingerprint, "expect_index": expect_index,
                        "expect_dtype": expect_dtype, "expect_dim": expect_dim}
        check_directory(self.path)
        self.manifest = read_sharded_manifest(self.path)
        check_expectations(self.manifest, self.path, model_fingerprint=expect_model_fingerprint,
                           index=expect_index, dtype=expect_dtype, dim=expect_dim)
        entries = self.manifest.shards
        problems = coverage_problems([(entry.path, entry.row_start, entry.row_end) for entry in entries],
                                     self.manifest.num_docs)
        if problems:
            raise SidecarCorruptError(f"{self.path / MANIFEST}: {'; '.join(problems)}")
        self.shards: list[SidecarReader] = [self._open_shard(position) for position in range(len(entries))]
        self._row_starts = np.array([entry.row_start for entry in entries], dtype=np.int64)
        self._row_ends = np.array([entry.row_end for entry in entries], dtype=np.int64)

    def _open_shard(self, position: int) -> SidecarReader:
        entry = self.manifest.shards[position]
        shard_path = entry.resolve(self.path)
        where = (f"shard {position} ({_rows(entry.row_start, entry.row_end)}) of sharded sidecar {self.path}")
        try:
            check_directory(shard_path)
        except SidecarNotFoundError as error:
            raise SidecarNotFoundError(f"{where} is missing: {error}") from None
        reader = _ShardReader(shard_path)
        problem = _entry_problem(self.manifest, self.path, position, reader.manifest)
        if problem:
            raise SidecarMismatchError(f"{where}: {problem}")
        return reader

    # ---- metadata (num_docs, num_tokens, dim, dtype, model, index: ManifestMetadata) ---------------------------
    @property
    def bytes_per_doc(self) -> float:
        """Mean bytes of stored vectors per document over every shard."""
        total = sum(shard.bytes_per_doc * shard.num_docs for shard in self.shards)
        return total / max(1, self.num_docs)

    # ---- documents by row ----------------------------------------------------------------------------------------
    def lengths(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """``[len(rows)]`` int64 token counts (every row's when ``rows`` is None)."""
        if rows is None:
            return np.concatenate([shard.lengths() for shard in self.shards]).astype(np.int64)
        rows = self._check_rows(rows)
        lengths = np.empty(len(rows), dtype=np.int64)
        for shard, where, local in self._split(rows):
            lengths[where] = shard.lengths(local)
        return lengths

    def get(self, row: int) -> np.ndarray:
        """``[len, dim]`` vectors of one document (see :meth:`SidecarReader.get`)."""
        (shard, _, local), = self._split(self._check_rows([row]))
        return shard.get(int(local[0]))

    def get_batch(self, rows: Sequence[int] | np.ndarray, device: "str | torch.device" = "cpu",
                  dtype: "torch.dtype | str | None" = "float32", buffer: "BatchBuffer | None" = None,
                  heads: int | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Zero-padded ``docs [B, Lmax, dim]`` (or head-major) and ``lengths [B]`` of ``rows``, exactly as
        :meth:`SidecarReader.get_batch` gives them for an unsharded sidecar (rows may span shards). ``buffer`` is
        used when the rows come from one shard (batches spanning shards are assembled in fresh memory)."""
        import torch

        rows = self._check_rows(rows)
        _check_heads(heads, self.dim)
        split = self._split(rows)
        if len(split) == 1:  # every row in one shard, in input order: its batch is already the answer
            shard, _, local = split[0]
            return shard.get_batch(local, device, dtype, buffer, heads)
        parts = [(where, *shard.get_batch(local, dtype=None)) for shard, where, local in split]
        if not parts:  # no rows: the empty batch of the stored dtype
            docs, lengths = self.shards[0].get_batch(rows, dtype=None)
        else:
            max_len = max(part_docs.shape[1] for _, part_docs, _ in parts)
            docs = torch.zeros((len(rows), max_len, self.dim), dtype=parts[0][1].dtype)
            lengths = torch.empty(len(rows), dtype=torch.int64)
            for where, part_docs, part_lengths in parts:
                index = torch.from_numpy(where)
                docs[index, :part_docs.shape[1]] = part_docs
                lengths[index] = part_lengths
        if heads is not None:
            docs = head_major(docs, heads)
        docs = docs.to(device)
        if dtype is not None:
            docs = docs.to(_torch_dtype(dtype))
        return docs, lengths.to(device)

    # ---- docids --------------------------------------------------------------------------------------------------
    def docid(self, row: int) -> str:
        (shard, _, local), = self._split(self._check_rows([row]))
        return shard.docid(int(local[0]))

    def docids(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        rows = self._check_rows(rows)
        docids: list[str] = [""] * len(rows)
        for shard, where, local in self._split(rows):
            for position, docid in zip(where, shard.docids(local)):
                docids[position] = docid
        return docids

    def rows_for_docids(self, docids: Sequence[str]) -> np.ndarray:
        """``[len(docids)]`` int64 global rows of external docids, -1 for docids in no shard."""
        docids = list(docids)
        rows = np.full(len(docids), -1, dtype=np.int64)
        pending = np.arange(len(docids))
        for shard, start in zip(self.shards, self._row_starts):
            if not pending.size:
                break
            found = shard.rows_for_docids([docids[i] for i in pending])
            hit = found >= 0
            rows[pending[hit]] = found[hit] + start
            pending = pending[~hit]
        return rows

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> "ShardedSidecarReader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        return (_reopen_sharded, (str(self.path), self._expect))

    def __repr__(self) -> str:
        return (f"ShardedSidecarReader({str(self.path)!r}, shards={len(self.shards)}, num_docs={self.num_docs}, "
                f"num_tokens={self.num_tokens}, dim={self.dim}, dtype={self.dtype!r}, "
                f"model_type={self.model.get('model_type')!r})")

    def _check_rows(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size:
            bad = rows[(rows < 0) | (rows >= self.num_docs)]
            if bad.size:
                hint = " (-1 marks a docid that is not in the sidecar)" if bad[0] == -1 else ""
                raise IndexError(f"row {int(bad[0])} is out of range for sidecar {self.path} with "
                                 f"{self.num_docs} documents{hint}")
        return rows

    def _split(self, rows: np.ndarray) -> list[tuple[SidecarReader, np.ndarray, np.ndarray]]:
        """``(shard reader, positions in rows, shard-local rows)`` for every shard that ``rows`` touch."""
        # The first shard ending after a row holds it (empty shards end where they start, so they never match).
        owner = np.searchsorted(self._row_ends, rows, side="right")
        parts = []
        for position in np.unique(owner):
            where = np.flatnonzero(owner == position)
            parts.append((self.shards[position], where, rows[where] - self._row_starts[position]))
        return parts


def _reopen_sharded(path: str, expect: dict[str, Any]) -> ShardedSidecarReader:
    return ShardedSidecarReader(path, **expect)


# ---- verify ------------------------------------------------------------------------------------------------------
def verify_sharded(path: str | os.PathLike) -> list[str]:
    """Every problem of a sharded sidecar: its manifest, the row coverage, and each shard fully verified (sizes,
    checksums, offsets, docids) and checked to belong to this build. Problems in a shard are prefixed by its path."""
    from .verify import verify_sidecar

    path = Path(path)
    try:
        check_directory(path)
        manifest = read_sharded_manifest(path)
    except SidecarError as error:
        return [str(error)]
    entries = manifest.shards
    problems = coverage_problems([(entry.path, entry.row_start, entry.row_end) for entry in entries],
                                 manifest.num_docs)
    if sum(entry.num_tokens for entry in entries) != manifest.num_tokens:
        problems.append(f"{MANIFEST}: num_tokens={manifest.num_tokens} but the shards list "
                        f"{sum(entry.num_tokens for entry in entries)} tokens")
    for position, entry in enumerate(entries):
        shard_path = entry.resolve(path)
        shard_problems = verify_sidecar(shard_path)
        problems += [f"{shard_path}: {problem}" for problem in shard_problems]
        if (shard_path / MANIFEST).is_file():
            try:
                problem = _entry_problem(manifest, path, position, read_manifest(shard_path))
            except SidecarError:
                continue  # verify_sidecar reported the unreadable manifest
            if problem:
                problems.append(problem)
    return problems

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

This module holds what every part of a sharded store shares: how rows are split, the ids that tie shards to their
build, the top-level manifest and its validation. Assembling is in :mod:`.assemble`, reading in
:mod:`.sharded_reader`, verifying in :mod:`.verify`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .format import (
    CODEC,
    FORMAT_VERSION,
    MANIFEST,
    Manifest,
    SidecarCorruptError,
    SidecarError,
    SidecarMismatchError,
    json_normalized,
    read_manifest,
    read_manifest_object,
    short_hash,
    size_problems,
)

SHARDED_FORMAT_NAME = "pyserini-mores-sidecar-sharded"
SHARDED_FORMAT_VERSION = 1


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
    data = {key: value for key, value in manifest.to_dict().items()
            if key not in ("created", "build", "library", "manifest_sha256")}
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
    def from_dict(cls, data: Mapping[str, Any], source: str = MANIFEST) -> ShardedManifest:
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
    file, data = read_manifest_object(path)
    return ShardedManifest.from_dict(data, source=str(file))


def shards_format_version(manifest: ShardedManifest, root: Path) -> int:
    """The oldest sidecar format among the shards of the sharded sidecar at ``root``, from their manifests' JSON
    alone (a shard whose manifest cannot be read counts as the current format: opening it says what is wrong)."""
    versions = []
    for entry in manifest.shards:
        try:
            version = read_manifest_object(entry.resolve(root))[1].get("format_version")
        except SidecarError:
            continue
        if isinstance(version, int) and not isinstance(version, bool):
            versions.append(version)
    return min(versions, default=FORMAT_VERSION)


def recorded_windows(path: str | os.PathLike) -> dict[str, int | None] | None:
    """The window settings recorded by the manifest of the sidecar at ``path`` (``window``, ``stride``,
    ``max_windows``, ``capacity``: tokens, or None where not recorded), ``{"max_windows": 1, ...}`` for one stored
    without a window map (one window per row); of a sharded sidecar, its first shard's (every shard shares the build
    id that covers them). From the manifests' JSON alone, so before any model loads; None when a manifest cannot be
    read (opening the sidecar says what is wrong)."""
    try:
        if is_sharded(path):
            manifest = read_manifest(read_sharded_manifest(path).shards[0].resolve(Path(path)))
        else:
            manifest = read_manifest(path)
    except (SidecarError, IndexError):
        return None
    if not manifest.has_windows:
        return {"window": None, "stride": None, "max_windows": 1, "capacity": None}
    return {name: manifest.windows.get(name) for name in ("window", "stride", "max_windows", "capacity")}


# ---- validation shared by assemble, the reader and verify -------------------------------------------------------
def rows_text(start: int, end: int) -> str:
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
            problems.append(f"{rows_text(expected, start)} are in no shard: {after}{name} starts at row {start}")
        elif start < expected and end > start:
            problems.append(f"{name} ({rows_text(start, end)}) overlaps {previous} (which ends at row {expected})")
        if end > expected:
            expected, previous = end, name
    if expected < num_docs:
        problems.append(f"{rows_text(expected, num_docs)} are in no shard (the index has {num_docs} documents)")
    elif expected > num_docs:
        problems.append(f"shards reach row {expected} but the index has {num_docs} documents")
    return problems


def codec_identity(manifest: Manifest) -> dict[str, Any] | None:
    """A compressed shard's codec: its name, options and the checksum of its parameters (``codec.bin``); None for
    vectors stored as they are. Shards read as one piece only when theirs are equal."""
    if not manifest.compressed:
        return None
    parameters = manifest.files.get(CODEC)
    return {"name": manifest.codec.get("name"), "options": manifest.codec.get("options"),
            "parameters": parameters.sha256 if parameters is not None else None}


def _codec_text(codec: Mapping[str, Any] | None) -> str:
    if codec is None:
        return "none"
    options = ", ".join(f"{key}={value}" for key, value in (codec.get("options") or {}).items())
    return f"{codec.get('name')} ({options}) with parameters sha256 {short_hash(str(codec.get('parameters')))}"


def identity_problems(manifest: Manifest, file: Path, reference: Mapping[str, Any], reference_name: str) -> list[str]:
    """How a shard's manifest disagrees with the build it should belong to (``reference``: build_id, fingerprint,
    index, dtype, dim, and ``codec`` when given: :func:`codec_identity`). The codec first (shards built with two
    trained codecs, which a build id also tells apart, are named as such), then the build id: a shard of another
    build usually differs in everything else too."""
    if "codec" in reference and codec_identity(manifest) != reference["codec"]:
        return [f"{file} is a shard of another build: its codec is {_codec_text(codec_identity(manifest))} but "
                f"{reference_name} has {_codec_text(reference['codec'])}"]
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


def entry_problem(manifest: ShardedManifest, root: Path, position: int, shard_manifest: Manifest) -> str | None:
    """Why the shard at ``manifest.shards[position]`` does not belong to this sharded sidecar, or None."""
    entry = manifest.shards[position]
    file = entry.resolve(root) / MANIFEST
    reference = {"build_id": manifest.build_id, "fingerprint": manifest.model_fingerprint, "index": manifest.index,
                 "dtype": manifest.dtype, "dim": manifest.dim}
    problems = identity_problems(shard_manifest, file, reference, str(root / MANIFEST))
    if problems:
        return problems[0]
    rows = (shard_manifest.shard.get("row_start"), shard_manifest.shard.get("row_end"))
    if rows != (entry.row_start, entry.row_end):
        return (f"{file} holds rows [{rows[0]}, {rows[1]}) but {root / MANIFEST} lists it for "
                f"{rows_text(entry.row_start, entry.row_end)}")
    if shard_content_id(shard_manifest) != entry.content:
        return (f"{file} changed since the shards were assembled into {root} (rebuilt or replaced); check it with "
                f"`python -m pyserini_mores.sidecar verify` and assemble again")
    return None


# ---- a sharded build ---------------------------------------------------------------------------------------------
@dataclass
class ShardPlan:
    """The shards of one sharded build: their directories under ``output``, the build id and which still need work."""

    output: Path
    num_shards: int
    build_id: str
    paths: list[Path]
    todo: list[int]

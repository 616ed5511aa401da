"""The sidecar store: per-document token representations in flat memory-mapped files beside a Lucene index.

Reading needs only numpy (torch is imported when tensors are built); ``build`` (encoding a collection) lives in
:mod:`.build` and is not imported here.
"""
from __future__ import annotations

from .assemble import assemble_shards
from .format import (
    FORMAT_VERSION,
    Manifest,
    SidecarContentMismatchError,
    SidecarCorruptError,
    SidecarError,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    SidecarRowMismatchError,
    default_sidecar_path,
    read_manifest,
)
from .integrity import SidecarIntegrityError
from .reader import BatchBuffer, SidecarReader
from .sharded_reader import ShardedSidecarReader, open_sidecar
from .shards import recorded_windows
from .verify import verify_sidecar
from .writer import SidecarWriter

__all__ = [
    "BatchBuffer",
    "FORMAT_VERSION",
    "Manifest",
    "SidecarContentMismatchError",
    "SidecarCorruptError",
    "SidecarIntegrityError",
    "SidecarError",
    "SidecarExistsError",
    "SidecarMismatchError",
    "SidecarNotFoundError",
    "SidecarRowMismatchError",
    "SidecarReader",
    "SidecarWriter",
    "ShardedSidecarReader",
    "assemble_shards",
    "default_sidecar_path",
    "open_sidecar",
    "read_manifest",
    "recorded_windows",
    "verify_sidecar",
]

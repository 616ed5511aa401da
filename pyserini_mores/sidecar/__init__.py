"""The sidecar store: per-document token representations in flat memory-mapped files beside a Lucene index.

Reading needs only numpy (torch is imported when tensors are built); ``build`` (encoding a collection) lives in
:mod:`.build` and is not imported here.
"""
from __future__ import annotations

from .format import (
    FORMAT_VERSION,
    Manifest,
    SidecarCorruptError,
    SidecarError,
    SidecarExistsError,
    SidecarMismatchError,
    SidecarNotFoundError,
    read_manifest,
)
from .reader import BatchBuffer, SidecarReader, open_sidecar
from .shards import ShardedSidecarReader, assemble_shards
from .verify import verify_sidecar
from .writer import SidecarWriter

__all__ = [
    "BatchBuffer",
    "FORMAT_VERSION",
    "Manifest",
    "SidecarCorruptError",
    "SidecarError",
    "SidecarExistsError",
    "SidecarMismatchError",
    "SidecarNotFoundError",
    "SidecarReader",
    "SidecarWriter",
    "ShardedSidecarReader",
    "assemble_shards",
    "open_sidecar",
    "read_manifest",
    "verify_sidecar",
]

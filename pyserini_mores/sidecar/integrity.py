"""Block checksums of a sidecar's files: computed once by the writer, checked by a reader on a block's first read.

``checksums.bin`` holds the crc32 of every ``read_block_bytes`` block of each covered file, over its raw bytes (so
the scheme is the same for every dtype and codec). A reader keeps one bit per block: a block is hashed the first time
a read touches it in this process, and a mismatch raises :class:`SidecarIntegrityError` before its bytes reach a score.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .format import BLOCK_CHECKSUM_DTYPE, BLOCK_CHECKSUMS, Manifest, SidecarCorruptError

_READ_CHUNK = 8 * 1024 * 1024


class SidecarIntegrityError(SidecarCorruptError):
    """A block of a sidecar file does not match its checksum: its bytes changed after the build."""


def block_crcs(file: str | os.PathLike, block_bytes: int) -> np.ndarray:
    """``[ceil(size / block_bytes)]`` uint32 crc32 of consecutive blocks of ``file``, streamed."""
    size = os.path.getsize(file)
    crcs = np.empty(-(-size // block_bytes), dtype=BLOCK_CHECKSUM_DTYPE)
    chunk = max(block_bytes, _READ_CHUNK // block_bytes * block_bytes)
    block = 0
    with open(file, "rb") as stream:
        while True:
            data = stream.read(chunk)
            if not data:
                break
            view = memoryview(data)
            for start in range(0, len(view), block_bytes):
                crcs[block] = zlib.crc32(view[start:start + block_bytes])
                block += 1
    if block != len(crcs):
        raise SidecarCorruptError(f"{file} changed size while its checksums were computed")
    return crcs


class BlockChecker:
    """Verifies byte ranges of a sidecar's files against ``checksums.bin`` on first read.

    Args:
        path: the sidecar directory (for messages).
        manifest: its manifest (block size, which files, where each file's checksums start).
        array: the reader's memmap of a file by name (the bytes that are read are the bytes checked).
    """

    def __init__(self, path: Path, manifest: Manifest, array: Callable[[str], np.ndarray]):
        self.path = path
        self.block_bytes = manifest.read_block_bytes
        self._ranges = manifest.block_ranges()
        self._sizes = manifest.expected_bytes()
        self._array = array
        self._verified = {name: np.zeros(end - start, dtype=bool) for name, (start, end) in self._ranges.items()}

    def check_ranges(self, name: str, starts: np.ndarray, ends: np.ndarray) -> None:
        """Check the blocks of file ``name`` overlapping byte ranges ``[starts[i], ends[i])`` (empty ranges touch
        nothing) that no earlier call checked."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        ends = np.asarray(ends, dtype=np.int64).reshape(-1)
        keep = ends > starts
        first, last = starts[keep] // self.block_bytes, (ends[keep] - 1) // self.block_bytes
        counts = last - first + 1
        if not len(counts):
            return
        if int(counts.max()) == 1:
            blocks = first
        else:  # every block of every range: first_i, first_i + 1, ..., last_i
            steps = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            blocks = np.repeat(first, counts) + steps
        verified = self._verified[name]
        pending = blocks[~verified[blocks]]
        if len(pending):
            self._check_blocks(name, np.unique(pending))

    def check_file(self, name: str, array: np.ndarray | None = None) -> None:
        """Check every block of file ``name`` not yet checked (read from ``array``, its mapping, when given)."""
        verified = self._verified[name]
        if not verified.all():
            self._check_blocks(name, np.flatnonzero(~verified), array)

    def _check_blocks(self, name: str, blocks: np.ndarray, array: np.ndarray | None = None) -> None:
        raw = (self._array(name) if array is None else array).reshape(-1).view(np.uint8)
        first = self._ranges[name][0]
        expected = self._array(BLOCK_CHECKSUMS)
        size = self._sizes[name]
        verified = self._verified[name]
        for block in blocks.tolist():
            start = block * self.block_bytes
            end = min(start + self.block_bytes, size)
            if zlib.crc32(raw[start:end]) != int(expected[first + block]):
                raise SidecarIntegrityError(
                    f"sidecar {self.path} is damaged: {self.path / name} bytes [{start}, {end}) do not match their "
                    f"checksum in {BLOCK_CHECKSUMS}; rebuild the sidecar (`python -m pyserini_mores.sidecar verify "
                    f"{self.path}` lists every problem)")
            verified[block] = True

    def problems(self, name: str) -> list[str]:
        """Every block of ``name`` that does not match (for ``verify``), one line per file with the first few."""
        raw = self._array(name).reshape(-1).view(np.uint8)
        first = self._ranges[name][0]
        expected = self._array(BLOCK_CHECKSUMS)
        bad = [block for block in range(len(self._verified[name]))
               if zlib.crc32(raw[block * self.block_bytes:(block + 1) * self.block_bytes])
               != int(expected[first + block])]
        if not bad:
            return []
        shown = ", ".join(str(block) for block in bad[:5])
        return [f"{name}: {len(bad)} block(s) of {self.block_bytes} bytes do not match {BLOCK_CHECKSUMS} "
                f"(blocks {shown}{', ...' if len(bad) > 5 else ''})"]


class UncheckedBlocks:
    """A format 1 sidecar's stand-in for :class:`BlockChecker`: it has no ``checksums.bin``, so reads are served
    unchecked (its whole-file checksums are checked by ``verify``)."""

    def check_ranges(self, name: str, starts: np.ndarray, ends: np.ndarray) -> None:
        pass

    def check_file(self, name: str, array: np.ndarray | None = None) -> None:
        pass


def block_checker(path: Path, manifest: Manifest, array: Callable[[str], np.ndarray]) -> BlockChecker | UncheckedBlocks:
    """The read-path checker of the sidecar at ``path``: a :class:`BlockChecker` when it has block checksums."""
    return BlockChecker(path, manifest, array) if manifest.has_block_checksums else UncheckedBlocks()

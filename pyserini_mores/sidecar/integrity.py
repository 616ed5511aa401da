"""Block checksums of a sidecar's files: computed once by the writer, checked by a reader on a block's first read.

``checksums.bin`` holds a hash (``checksum.read_algorithm``: xxh3_64, or crc32 in sidecars written before) of every
``read_block_bytes`` block of each covered file, over its raw bytes (so the scheme is the same for every dtype and
codec). A reader keeps one bit per block: a block is hashed the first time a read touches it in this process, and a
mismatch raises :class:`SidecarIntegrityError` before its bytes reach a score.

What a first read pays is the hashing itself, so the loop over a read's blocks does nothing else per block: one
memoryview of the file's bytes sliced per block (slicing the memmap would build a numpy view per block, a cost of
the order of hashing the block), and the hashes compared with the stored ones, and the blocks marked, in one
vectorised step per read.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from .format import (
    BLOCK_CHECKSUMS,
    READ_CHECKSUM_ALGORITHM,
    READ_CHECKSUM_DTYPES,
    Manifest,
    SidecarCorruptError,
)

_READ_CHUNK = 8 * 1024 * 1024
#: The hash of one block (any bytes-like object) by ``checksum.read_algorithm``, as an unsigned integer.
BLOCK_HASHES: dict[str, Callable[[memoryview], int]] = {"xxh3_64": xxhash.xxh3_64_intdigest, "crc32": zlib.crc32}


class SidecarIntegrityError(SidecarCorruptError):
    """A block of a sidecar file does not match its checksum: its bytes changed after the build."""


def block_hashes(file: str | os.PathLike, block_bytes: int, algorithm: str = READ_CHECKSUM_ALGORITHM) -> np.ndarray:
    """``[ceil(size / block_bytes)]`` hashes (``algorithm``, dtype :data:`~.format.READ_CHECKSUM_DTYPES`) of
    consecutive blocks of ``file``, streamed."""
    size = os.path.getsize(file)
    block_hash = BLOCK_HASHES[algorithm]
    hashes = np.empty(-(-size // block_bytes), dtype=READ_CHECKSUM_DTYPES[algorithm])
    chunk = max(block_bytes, _READ_CHUNK // block_bytes * block_bytes)
    block = 0
    with open(file, "rb") as stream:
        while True:
            data = stream.read(chunk)
            if not data:
                break
            view = memoryview(data)
            count = -(-len(view) // block_bytes)
            if block + count > len(hashes):
                raise SidecarCorruptError(f"{file} changed size while its checksums were computed")
            hashes[block:block + count] = [block_hash(view[start:start + block_bytes])
                                           for start in range(0, len(view), block_bytes)]
            block += count
    if block != len(hashes):
        raise SidecarCorruptError(f"{file} changed size while its checksums were computed")
    return hashes


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
        self.algorithm = manifest.read_algorithm
        self._dtype = READ_CHECKSUM_DTYPES[self.algorithm]
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
        """Hash ``blocks`` (ascending block numbers) of file ``name`` and compare them with ``checksums.bin``; mark
        them checked, up to the first that does not match, which raises."""
        blocks = np.asarray(blocks, dtype=np.int64)
        actual = self._hashes(name, blocks, array)
        expected = np.asarray(self._array(BLOCK_CHECKSUMS)[self._ranges[name][0] + blocks])
        verified = self._verified[name]
        bad = np.flatnonzero(actual != expected)
        if len(bad):
            verified[blocks[:bad[0]]] = True
            start = int(blocks[bad[0]]) * self.block_bytes
            end = min(start + self.block_bytes, self._sizes[name])
            raise SidecarIntegrityError(
                f"sidecar {self.path} is damaged: {self.path / name} bytes [{start}, {end}) do not match their "
                f"checksum in {BLOCK_CHECKSUMS}; rebuild the sidecar (`python -m pyserini_mores.sidecar verify "
                f"{self.path}` lists every problem)")
        verified[blocks] = True

    def _hashes(self, name: str, blocks: np.ndarray, array: np.ndarray | None = None) -> np.ndarray:
        """``[len(blocks)]`` hashes of ``blocks`` of file ``name``, as ``checksums.bin`` stores them."""
        raw = (self._array(name) if array is None else array).reshape(-1).view(np.uint8)
        view = memoryview(raw) if raw.flags.c_contiguous else memoryview(np.ascontiguousarray(raw))
        step, block_hash = self.block_bytes, BLOCK_HASHES[self.algorithm]
        return np.fromiter((block_hash(view[start:start + step]) for start in (blocks * step).tolist()),
                           dtype=self._dtype, count=len(blocks))

    def problems(self, name: str) -> list[str]:
        """Every block of ``name`` that does not match (for ``verify``), one line per file with the first few."""
        blocks = np.arange(len(self._verified[name]), dtype=np.int64)
        expected = np.asarray(self._array(BLOCK_CHECKSUMS)[self._ranges[name][0] + blocks])
        bad = np.flatnonzero(self._hashes(name, blocks) != expected).tolist()
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

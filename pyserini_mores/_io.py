"""Atomic file writes: a file appears whole at its path or not at all, whatever kills the process meanwhile.

The content goes to ``<name>.tmp`` in the same directory (so the rename stays on one file system), is flushed and
fsynced, then ``os.replace``-d over the target and the directory entry fsynced. Readers never see a half-written
file, and a crash leaves the previous file intact; a failed write removes its temporary file.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike


@contextlib.contextmanager
def atomic_writer(path: PathLike, *, binary: bool = False, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open ``path`` for writing (text with ``\\n`` line ends, or ``binary``); it appears only when the block completes
    without error. Parent directories are created, as Pyserini's output writer does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    text = {} if binary else {"encoding": encoding, "newline": "\n"}
    try:
        with open(temporary, "wb" if binary else "w", **text) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: PathLike, text: str, *, encoding: str = "utf-8") -> None:
    with atomic_writer(path, encoding=encoding) as stream:
        stream.write(text)


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    with atomic_writer(path, binary=True) as stream:
        stream.write(data)


def write_json_atomic(path: PathLike, data: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """``data`` as indented JSON with a final newline."""
    with atomic_writer(path) as stream:
        json.dump(data, stream, indent=2, sort_keys=sort_keys)
        stream.write("\n")


def copy_file_atomic(source: PathLike, target: PathLike) -> None:
    """Copy ``source``'s bytes to ``target``."""
    with open(source, "rb") as reader, atomic_writer(target, binary=True) as stream:
        shutil.copyfileobj(reader, stream, 1 << 20)


def fsync_dir(directory: PathLike) -> None:
    """Make a rename or file creation in ``directory`` durable (best effort: not every filesystem allows it)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def evict_from_page_cache(paths) -> None:
    """Ask the kernel to drop ``paths`` from the page cache, so that the next reads come from storage: clean pages
    that no process maps (a reader first unmaps its own: :meth:`SidecarReader.evict_from_page_cache`); no root
    needed. Files that cannot be opened are skipped."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):  # not on this platform: the pages stay cached
            pass
        finally:
            os.close(fd)


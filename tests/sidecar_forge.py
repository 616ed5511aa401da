"""Test helpers: re-seal a sidecar manifest edited by a test (its ``manifest_sha256`` and ``checksums.bin``), to
simulate a writer that wrote a consistent but wrong manifest, which the checks behind the manifest checksum catch;
and turn a sidecar into the format 2 layout (no window map) or the format 1 layout that sidecars built before format
2 have."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pyserini_mores.sidecar.format import (
    BLOCK_CHECKSUMS,
    CONTENT,
    MANIFEST,
    WINDOW_FILES,
    Manifest,
    file_checksum,
    manifest_digest,
)
from pyserini_mores.sidecar.integrity import block_hashes


def reseal(path: Path) -> None:
    """Recompute ``checksums.bin`` from the files as they are and seal ``manifest.json`` as the writer would."""
    data = json.loads((path / MANIFEST).read_text())
    data["manifest_sha256"] = manifest_digest(data)
    manifest = Manifest.from_dict(data)
    hashes = [block_hashes(path / name, manifest.read_block_bytes, manifest.read_algorithm)
              for name in manifest.block_files]
    table = np.concatenate(hashes)
    table.tofile(path / BLOCK_CHECKSUMS)
    data["files"][BLOCK_CHECKSUMS] = {"bytes": table.nbytes, "sha256": file_checksum(path / BLOCK_CHECKSUMS,
                                                                                   manifest.block_bytes),
                                      "dtype": table.dtype.str, "shape": [len(table)]}
    data["manifest_sha256"] = manifest_digest(data)
    (path / MANIFEST).write_text(json.dumps(data))


def to_format_2(path: Path) -> None:
    """Turn the format 3 sidecar at ``path``, built with one window per document, into the format 2 layout it would
    have had: no ``windows.bin``, no ``window_offsets.bin``, no ``windows`` manifest field, crc32 block checksums (the
    files that stay are what format 2 wrote; ``checksums.bin`` loses the window files' blocks, which come last)."""
    data = json.loads((path / MANIFEST).read_text())
    if data["format_version"] < 3:
        return
    for name in WINDOW_FILES:
        (path / name).unlink(missing_ok=True)
        data["files"].pop(name, None)
    del data["windows"]
    data["format_version"] = 2
    data["checksum"]["read_algorithm"] = "crc32"  # the only block hash there was then
    (path / MANIFEST).write_text(json.dumps(data))
    reseal(path)


def to_format_1(path: Path) -> None:
    """Turn the format 3 sidecar at ``path`` into the format 1 layout it would have had: no ``checksums.bin``, no
    ``content_hashes.bin``, no ``manifest_sha256``, an index identity of docids only, whole-file checksums only.
    The files that stay are byte for byte what format 1 wrote (the same writer, the same sha256-blocks)."""
    to_format_2(path)
    data = json.loads((path / MANIFEST).read_text())
    for name in (BLOCK_CHECKSUMS, CONTENT):
        (path / name).unlink(missing_ok=True)
        data["files"].pop(name, None)
    del data["manifest_sha256"]
    data["index"].pop("content", None)
    data["checksum"] = {"algorithm": data["checksum"]["algorithm"], "block_bytes": data["checksum"]["block_bytes"]}
    data["format_version"] = 1
    (path / MANIFEST).write_text(json.dumps(data, indent=2))


def sharded_to_format_1(path: Path) -> None:
    """Turn every shard of the sharded sidecar at ``path`` into format 1 (:func:`to_format_1`) and its top-level
    manifest into what assembling those shards wrote: their identity of docids only, their content ids."""
    from pyserini_mores.sidecar.format import read_manifest
    from pyserini_mores.sidecar.shards import read_sharded_manifest, shard_content_id

    sharded = read_sharded_manifest(path)
    data = json.loads((path / MANIFEST).read_text())
    data["index"].pop("content", None)
    for entry, record in zip(sharded.shards, data["shards"]):
        to_format_1(entry.resolve(path))
        record["content"] = shard_content_id(read_manifest(entry.resolve(path)))
    (path / MANIFEST).write_text(json.dumps(data, indent=2))


def damage_codec_file(path: Path, damage: str) -> None:
    """Damage a compressed sidecar's ``codec.bin`` after its build: ``bytes`` changes one parameter (its checksum
    no longer matches), ``truncated`` drops the last one; other kinds were damaged while writing and are left."""
    if damage == "bytes":
        parameters = np.fromfile(path / "codec.bin", dtype="<f4")
        parameters[3] += 1.0
        parameters.tofile(path / "codec.bin")
    elif damage == "truncated":
        np.fromfile(path / "codec.bin", dtype="<f4")[:-1].tofile(path / "codec.bin")


def assert_damaged_codec_refused(path: Path, damage: str, message: str, output: Path, capsys) -> None:
    """The damaged codec of ``path`` is refused at open (``SidecarCorruptError`` matching ``message``), by
    ``transcode`` in one ``error:`` line with exit 2, and, when its bytes changed, by ``verify`` (exit 1)."""
    import re

    import pytest

    from pyserini_mores.sidecar import SidecarCorruptError, open_sidecar
    from pyserini_mores.sidecar.__main__ import main as sidecar_main

    with pytest.raises(SidecarCorruptError, match=message):
        open_sidecar(path)
    assert sidecar_main(["transcode", str(path), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(message, err)
    if damage in ("bytes", "truncated"):
        assert sidecar_main(["verify", str(path)]) == 1


def assert_codec_options_refused(path: Path, options: dict, message: str, output: Path, capsys) -> None:
    """A manifest whose codec ``options`` are edited (and re-sealed, as a writer would have written them) is refused
    when its codec is first read (``SidecarCorruptError`` with ``message`` verbatim) and by ``transcode`` in one
    ``error:`` line with exit 2."""
    import re

    import pytest

    from pyserini_mores.sidecar import SidecarCorruptError, open_sidecar
    from pyserini_mores.sidecar.__main__ import main as sidecar_main

    data = json.loads((path / MANIFEST).read_text())
    data["codec"]["options"].update(options)
    (path / MANIFEST).write_text(json.dumps(data))
    reseal(path)  # the manifest checksum alone would refuse the edit
    with pytest.raises(SidecarCorruptError, match=re.escape(message)):
        open_sidecar(path).codec  # noqa: B018 - the codec is read when first used
    assert sidecar_main(["transcode", str(path), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err

"""Test helper: re-seal a sidecar manifest edited by a test (its ``manifest_sha256`` and ``checksums.bin``), to
simulate a writer that wrote a consistent but wrong manifest, which the checks behind the manifest checksum catch."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pyserini_mores.sidecar.format import BLOCK_CHECKSUMS, MANIFEST, Manifest, file_checksum, manifest_digest
from pyserini_mores.sidecar.integrity import block_crcs


def reseal(path: Path) -> None:
    """Recompute ``checksums.bin`` from the files as they are and seal ``manifest.json`` as the writer would."""
    data = json.loads((path / MANIFEST).read_text())
    data["manifest_sha256"] = manifest_digest(data)
    manifest = Manifest.from_dict(data)
    crcs = [block_crcs(path / name, manifest.read_block_bytes) for name in manifest.block_files]
    table = np.concatenate(crcs).astype("<u4")
    table.tofile(path / BLOCK_CHECKSUMS)
    data["files"][BLOCK_CHECKSUMS] = {"bytes": table.nbytes, "sha256": file_checksum(path / BLOCK_CHECKSUMS,
                                                                                   manifest.block_bytes),
                                      "dtype": "<u4", "shape": [len(table)]}
    data["manifest_sha256"] = manifest_digest(data)
    (path / MANIFEST).write_text(json.dumps(data))

"""Work for reader processes spawned by tests: kept apart from the test modules so that a child imports only numpy
and the sidecar reader (not torch), which keeps spawning cheap."""
from __future__ import annotations

import numpy as np

from pyserini_mores.sidecar import SidecarReader


def random_reads(job: tuple[str, int, int]) -> list[tuple[list[int], list[bytes]]]:
    """``batches`` random batches of rows (repeats allowed) of the sidecar at ``path``, each with the stored bytes of
    its documents, opened and read in this process."""
    path, seed, batches = job
    rng = np.random.default_rng(seed)
    reader = SidecarReader(path)
    reads = []
    for _ in range(batches):
        rows = rng.integers(0, reader.num_docs, size=int(rng.integers(1, 60))).tolist()
        reads.append((rows, [reader.get(row).tobytes() for row in rows]))
    return reads

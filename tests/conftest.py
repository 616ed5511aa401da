"""Shared fixtures: tiny random-weight BERT configs on the real (offline) MiniLM tokenizer, tiny text collections."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

RESOURCES = Path(__file__).parent / "resources"


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from pyserini_mores.models.backbones import offline_minilm_path

    return AutoTokenizer.from_pretrained(str(offline_minilm_path()))


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

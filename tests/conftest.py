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

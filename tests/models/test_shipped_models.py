"""The trained models shipped inside the package load offline, as deltas over the bundled MiniLM."""
from __future__ import annotations

import pytest

from pyserini_mores.models import SHIPPED_MODELS_DIR, load_model, shipped_model_path, shipped_models
from pyserini_mores.search.sample import DEFAULT_MODEL, DEFAULT_RERANKER

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_embedded_default_is_a_shipped_trained_model_within_the_size_budget():
    assert DEFAULT_MODEL in shipped_models()
    total = sum(path.stat().st_size for path in SHIPPED_MODELS_DIR.rglob("*") if path.is_file())
    assert total <= 25 * 1024 * 1024, f"shipped models take {total / 2**20:.1f} MiB; the budget is 25 MiB"


def test_default_model_loads_as_a_delta_and_differs_from_the_untrained_backbone():
    trained = load_model(DEFAULT_RERANKER, DEFAULT_MODEL)
    untrained = load_model(DEFAULT_RERANKER, "minilm")
    assert trained.config.backbone == "minilm"
    assert trained.source == str(shipped_model_path(DEFAULT_MODEL))
    assert trained.store_fingerprint() != untrained.store_fingerprint()
    # the same file gives the same weights (and so finds the same sidecar) every time
    assert load_model(DEFAULT_RERANKER, DEFAULT_MODEL).store_fingerprint() == trained.store_fingerprint()
    query = "visualize ABI changes of a C/C++ library"
    relevant = "libabigail: a set of tools to compare the ABI of shared libraries and report ABI changes"
    other = "A free, open-source, cross-platform real-time strategy game of ancient warfare"
    scores = trained.score_texts(query, [relevant, other])
    assert scores[0] > scores[1]


def test_an_existing_directory_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL).mkdir()
    assert shipped_model_path(DEFAULT_MODEL) is None
    assert shipped_model_path("no-such-model") is None

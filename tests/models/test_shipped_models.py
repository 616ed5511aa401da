"""The trained models shipped inside the package load offline, as deltas over the bundled MiniLM."""
from __future__ import annotations

import pytest

from pyserini_mores.models import (
    SHIPPED_DEFAULTS,
    SHIPPED_MODELS_DIR,
    default_model,
    load_model,
    shipped_model_path,
    shipped_models,
)
from pyserini_mores.search.sample import DEFAULT_MODEL, DEFAULT_RERANKER

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: the package index refuses files over 100 MB by default: the shipped models leave 10 MB of the wheel to the code
SHIPPED_BUDGET_BYTES = 90 * 10**6
MODEL_BUDGET_BYTES = 40 * 10**6


def _size(directory) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def test_the_embedded_default_is_a_shipped_trained_model():
    assert DEFAULT_MODEL in shipped_models()
    assert default_model(DEFAULT_RERANKER) == DEFAULT_MODEL


@pytest.mark.parametrize("name", shipped_models())
def test_every_shipped_model_is_within_its_size_budget(name):
    size = _size(SHIPPED_MODELS_DIR / name)
    assert size <= MODEL_BUDGET_BYTES, f"{name} takes {size / 1e6:.1f} MB; a model's budget is 40 MB"


def test_the_shipped_models_together_fit_in_one_wheel():
    total = _size(SHIPPED_MODELS_DIR)
    assert total <= SHIPPED_BUDGET_BYTES, f"shipped models take {total / 1e6:.1f} MB; the budget is 90 MB"


def test_each_shipped_default_is_shipped_and_of_its_model_type():
    import json

    for model_type, name in SHIPPED_DEFAULTS.items():
        if name in shipped_models():
            config = json.loads((SHIPPED_MODELS_DIR / name / "config.json").read_text())
            assert config["model_type"] == model_type, name
            assert default_model(model_type) == name
        else:
            assert default_model(model_type) == "minilm"


def test_a_reranker_named_without_a_model_loads_its_shipped_checkpoint(caplog):
    from pyserini_mores import get_reranker

    reranker = get_reranker(DEFAULT_RERANKER)
    assert reranker.model.source == str(shipped_model_path(DEFAULT_MODEL))
    unshipped = next(model_type for model_type in ("tk", "prettr") if model_type not in SHIPPED_DEFAULTS)
    with caplog.at_level("WARNING", logger="pyserini_mores"):
        assert get_reranker(unshipped).model.source == "minilm"
    assert f"no trained {unshipped} ships with the package" in caplog.text


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


@pytest.mark.parametrize("name", shipped_models())
def test_every_shipped_model_loads_offline_and_ranks_the_relevant_passage_first(name):
    import json

    model_type = json.loads((SHIPPED_MODELS_DIR / name / "config.json").read_text())["model_type"]
    model = load_model(model_type, name)
    assert model.source == str(shipped_model_path(name))
    query = "visualize ABI changes of a C/C++ library"
    relevant = "libabigail: a set of tools to compare the ABI of shared libraries and report ABI changes"
    other = "A free, open-source, cross-platform real-time strategy game of ancient warfare"
    scores = model.score_texts(query, [relevant, other])
    assert scores[0] > scores[1]


def test_an_existing_directory_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL).mkdir()
    assert shipped_model_path(DEFAULT_MODEL) is None
    assert shipped_model_path("no-such-model") is None


def test_a_model_initialised_from_a_shipped_ranker_records_it_by_name():
    """So that a delta trained from it rebuilds wherever the package is installed."""
    from_name = load_model("mores", DEFAULT_MODEL, n_interaction_blocks=2)
    assert from_name.config.backbone == DEFAULT_MODEL
    from_path = load_model("mores", shipped_model_path(DEFAULT_MODEL), n_interaction_blocks=2)
    assert from_name.store_fingerprint() == from_path.store_fingerprint()

"""The trained models shipped inside the package load offline, as deltas over the bundled MiniLM (or over a shipped
ranker); models packages add theirs by name; each wheel that carries models stays under the package index's limit."""
from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from pyserini_mores.models import (
    MODELS_ENTRY_POINT_GROUP,
    MODELS_PACKAGE,
    SHIPPED_DEFAULTS,
    SHIPPED_MODELS_DIR,
    default_model,
    load_model,
    loading,
    shipped_model_dirs,
    shipped_model_path,
    shipped_models,
)
from pyserini_mores.search.sample import DEFAULT_MODEL, DEFAULT_RERANKER

from conftest import MODELS_PACKAGE_MODELS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: the package index refuses files over 100 MB by default: the shipped models leave 10 MB of each wheel to the rest
WHEEL_MODELS_BUDGET_BYTES = 90 * 10**6
MODEL_BUDGET_BYTES = 40 * 10**6


def _size(directory) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def _model_type(name: str) -> str:
    return json.loads((shipped_model_path(name) / "config.json").read_text())["model_type"]


def test_the_embedded_default_is_a_shipped_trained_model():
    assert DEFAULT_MODEL in shipped_models()
    assert default_model(DEFAULT_RERANKER) == DEFAULT_MODEL


@pytest.mark.parametrize("name", shipped_models())
def test_every_shipped_model_is_within_its_size_budget(name):
    size = _size(shipped_model_path(name))
    assert size <= MODEL_BUDGET_BYTES, f"{name} takes {size / 1e6:.1f} MB; a model's budget is 40 MB"


@pytest.mark.parametrize("directory", shipped_model_dirs(), ids=str)
def test_the_models_of_each_package_fit_in_its_wheel(directory):
    total = _size(directory)
    assert total <= WHEEL_MODELS_BUDGET_BYTES, f"{directory} takes {total / 1e6:.1f} MB; a wheel's budget is 90 MB"


def test_no_model_name_is_shipped_twice():
    names = [path.name for directory in shipped_model_dirs() for path in directory.glob("*")
             if (path / "config.json").is_file()]
    assert len(names) == len(set(names)), names


def test_each_shipped_default_is_shipped_and_of_its_model_type():
    for model_type, name in SHIPPED_DEFAULTS.items():
        if name in shipped_models():
            assert _model_type(name) == model_type, name
            assert default_model(model_type) == name
        else:
            assert default_model(model_type) == "minilm"


def test_a_reranker_named_without_a_model_loads_its_shipped_checkpoint(monkeypatch, caplog):
    from pyserini_mores import get_reranker

    reranker = get_reranker(DEFAULT_RERANKER)
    assert reranker.model.source == str(shipped_model_path(DEFAULT_MODEL))
    unshipped = "tk"  # as if none shipped for it
    monkeypatch.delitem(SHIPPED_DEFAULTS, unshipped)
    with caplog.at_level("WARNING", logger="pyserini_mores"):
        assert get_reranker(unshipped).model.source == "minilm"
    assert f"no trained {unshipped} ships with the package" in caplog.text


def test_the_models_package_of_this_repository_is_installed_with_every_model_it_ships():
    """The README's set-up installs it beside the package; its models then load by name like the package's own."""
    names = sorted(path.name for path in MODELS_PACKAGE_MODELS.glob("*") if (path / "config.json").is_file())
    [entry] = [entry for entry in entry_points(group=MODELS_ENTRY_POINT_GROUP)
               if entry.module == "pyserini_mores_models"]
    installed = Path(entry.load())
    assert installed in shipped_model_dirs()
    assert names and names == sorted(path.name for path in installed.glob("*") if (path / "config.json").is_file())
    assert all(shipped_model_path(name) == installed / name for name in names)


def test_a_shipped_default_of_a_models_package_not_installed_says_where_it_is(monkeypatch, caplog):
    from pyserini_mores import get_reranker

    (model_type, name), *_ = [(model_type, name) for model_type, name in SHIPPED_DEFAULTS.items()
                              if shipped_model_path(name).parent != SHIPPED_MODELS_DIR]
    monkeypatch.setattr(loading, "entry_points", lambda group: [])
    shipped_model_dirs.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="pyserini_mores"):
            assert get_reranker(model_type).model.source == "minilm"
    finally:
        shipped_model_dirs.cache_clear()
    assert (f"the trained {model_type} '{name}' is not installed: it ships in the {MODELS_PACKAGE} package (pip "
            f"install ./{MODELS_PACKAGE} from the repository)") in caplog.text


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
    model = load_model(_model_type(name), name)
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


@pytest.fixture
def models_package(tmp_path, monkeypatch):
    """A models package of the test's own: ``install(value)`` registers an entry point of
    :data:`MODELS_ENTRY_POINT_GROUP` (``module:attribute``) beside the installed ones; the module ``fake_models``
    (in ``tmp_path``) names ``tmp_path / 'models'``."""
    (tmp_path / "models").mkdir()
    (tmp_path / "fake_models.py").write_text(f"MODELS_DIR = {str(tmp_path / 'models')!r}\nNOT_A_DIR = '/no/such/dir'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_models", raising=False)  # another test's, naming its own tmp_path
    installed = list(loading.entry_points(group=MODELS_ENTRY_POINT_GROUP))
    added = []

    def install(value: str):
        added.append(EntryPoint(name=f"test-{len(added)}", value=value, group=MODELS_ENTRY_POINT_GROUP))
        shipped_model_dirs.cache_clear()

    monkeypatch.setattr(loading, "entry_points", lambda group: installed + added if group == MODELS_ENTRY_POINT_GROUP
                        else [])
    yield tmp_path / "models", install
    shipped_model_dirs.cache_clear()


def test_a_models_package_adds_its_models_by_name_and_loads_them_over_a_ranker_shipped_elsewhere(models_package):
    """debian-mores-2ib is a delta over debian-cross-encoder: from another package's directory it must still find
    its reference by name."""
    directory, install = models_package
    (directory / "other-mores").symlink_to(shipped_model_path("debian-mores-2ib"), target_is_directory=True)
    (directory / DEFAULT_MODEL).mkdir()
    (directory / DEFAULT_MODEL / "config.json").write_text("{}")  # a name the package itself ships: the package's wins
    install("fake_models:MODELS_DIR")
    assert shipped_model_dirs()[0] == SHIPPED_MODELS_DIR and shipped_model_dirs()[-1] == directory
    assert shipped_model_path("other-mores") == directory / "other-mores"
    assert shipped_model_path(DEFAULT_MODEL) == SHIPPED_MODELS_DIR / DEFAULT_MODEL
    assert {"other-mores", DEFAULT_MODEL} <= set(shipped_models())
    from_package = load_model("mores", "other-mores")
    assert from_package.source == str(directory / "other-mores")
    query, passages = "visualize ABI changes of a C/C++ library", ["libabigail: compare the ABI of shared libraries",
                                                                    "a real-time strategy game of ancient warfare"]
    assert from_package.score_texts(query, passages).tolist() == \
        load_model("mores", "debian-mores-2ib").score_texts(query, passages).tolist()


@pytest.mark.parametrize("value, says", [
    ("no_such_module_here:MODELS_DIR", "could not be loaded, so its models are not available: No module named"),
    ("fake_models:NOT_A_DIR", "names /no/such/dir, which is not a directory: its models are not available"),
])
def test_a_broken_models_package_is_skipped_with_a_warning_that_names_it(models_package, caplog, value, says):
    directory, install = models_package
    (directory / "other-model").mkdir()
    (directory / "other-model" / "config.json").write_text("{}")
    install(value)
    install("fake_models:MODELS_DIR")
    with caplog.at_level(logging.WARNING, logger="pyserini_mores"):
        assert shipped_model_path("other-model") == directory / "other-model"
    assert f"models package 'test-0' ({value}) " in caplog.text and says in caplog.text
    assert shipped_model_path(DEFAULT_MODEL) == SHIPPED_MODELS_DIR / DEFAULT_MODEL


def test_the_shipped_mores_1ib_reads_the_shipped_2ibs_sidecar():
    """debian-mores-1ib was folded from debian-mores-2ib and trained against its sidecar: one S1 sidecar serves both
    (docs/results.md), so their document modules must be the same to the bit."""
    one, two = load_model("mores", "debian-mores-1ib"), load_model("mores", "debian-mores-2ib")
    assert (one.config.n_interaction_blocks, two.config.n_interaction_blocks) == (1, 2)
    assert one.store_fingerprint() == two.store_fingerprint()
    assert one.fingerprint() != two.fingerprint()

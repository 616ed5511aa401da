"""The unfinished runs kept in the repository (integrations/debian_packages/checkpoints) load offline as the README
beside them says, each over its shipped backbone, so that a session on a new machine can continue one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pyserini_mores.models import load_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEPT = Path(__file__).resolve().parents[2] / "integrations" / "debian_packages" / "checkpoints"
KEPT_DIRS = sorted(path for path in KEPT.glob("*") if (path / "config.json").is_file())


def test_there_are_kept_checkpoints_and_the_readme_names_each_one():
    readme = (KEPT / "README.md").read_text()
    assert KEPT_DIRS
    for directory in KEPT_DIRS:
        assert f"`{directory.name}`" in readme, f"{directory.name} is not described in {KEPT / 'README.md'}"


@pytest.mark.parametrize("directory", KEPT_DIRS, ids=lambda path: path.name)
def test_a_kept_checkpoint_loads_over_its_backbone_and_differs_from_it(directory):
    config = json.loads((directory / "config.json").read_text())
    model_type = config["model_type"]
    kept = load_model(model_type, directory)
    start = load_model(model_type, config["backbone"], **{key: config[key] for key in ("join_layer",) if key in config})
    kept_weights, start_weights = kept.state_dict(), start.state_dict()
    assert kept_weights.keys() == start_weights.keys()
    changed = [name for name in kept_weights if not torch.equal(kept_weights[name], start_weights[name])]
    assert changed, f"{directory.name} loads as its backbone: its delta was not applied"
    with torch.no_grad():
        scores = kept.score_texts("debian package manager", ["apt installs packages.", "a text editor for the console"])
    assert scores.shape == (2,) and torch.isfinite(scores).all()

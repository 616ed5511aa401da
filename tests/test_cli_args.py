"""``--model-arg KEY=VALUE`` as users write it: JSON values, bare strings, and Python's spellings of booleans and
None (``tied=False`` must be the boolean, not the truthy string "False")."""
from __future__ import annotations

import pytest

from pyserini_mores._cli import parse_model_args
from pyserini_mores._model_args import format_model_arg


def test_values_are_json_or_bare_strings():
    assert parse_model_args(["n_interaction_blocks=2", "reuse=s1", "kernel_mus=[1.0, 0.5]", "tied=false"]) == {
        "n_interaction_blocks": 2, "reuse": "s1", "kernel_mus": [1.0, 0.5], "tied": False}


@pytest.mark.parametrize(("text", "value"), [("False", False), ("True", True), ("None", None)])
def test_python_constants_are_the_constants(text, value):
    assert parse_model_args([f"tied={text}"])["tied"] is value


def test_an_argument_without_a_value_is_refused():
    with pytest.raises(SystemExit, match="--model-arg expects KEY=VALUE, got 'tied'"):
        parse_model_args(["tied"])


def test_printed_model_args_read_back_as_the_same_values():
    values = {"reuse": "s1", "tied": False, "n_interaction_blocks": 2, "projection_dim": None, "kernel_mus": [1.0, 0.5]}
    printed = [format_model_arg(key, value) for key, value in values.items()]
    assert printed[:2] == ["reuse=s1", "tied=false"]
    assert parse_model_args(printed) == values

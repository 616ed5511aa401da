"""A model directory never runs code here: one that asks transformers to import its own Python files (``auto_map``
in ``config.json`` or ``tokenizer_config.json``) or holds only pickled weights is refused in one ``error:`` line
before any of it loads, by the API and by every command that takes a model, even with ``y`` answered to
transformers' ``[y/N]`` prompt on standard input.

The custom code is real: each of its modules writes a marker file when imported, and a control proves that
transformers does import it when trusted."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pyserini_mores.models import load_model
from pyserini_mores.models.backbones import offline_minilm_path
from pyserini_mores.models.trust import UntrustedModelError, check_model_directory

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _payload(marker: Path, name: str) -> str:
    """A module that, imported, writes ``marker`` (its own name appended) — what a hostile model would do worse."""
    return (f"with open({str(marker)!r}, 'a') as stream:\n"
            f"    stream.write({name!r} + '\\n')\n")


def _custom_config_dir(root: Path, marker: Path) -> Path:
    """A Hugging Face model directory whose config, model and tokenizer are its own code (``auto_map``)."""
    directory = root / "custom-config"
    directory.mkdir()
    minilm = offline_minilm_path()
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, directory / name)
    config = json.loads((minilm / "config.json").read_text())
    config.update(model_type="x-bert", architectures=["XModel"],
                  auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"})
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_x.py").write_text(
        _payload(marker, "configuration_x")
        + "from transformers import BertConfig\n\n\nclass XConfig(BertConfig):\n    model_type = 'x-bert'\n")
    (directory / "modeling_x.py").write_text(
        _payload(marker, "modeling_x") + "from transformers import BertModel\n\nfrom .configuration_x import XConfig\n"
        "\n\nclass XModel(BertModel):\n    config_class = XConfig\n")
    shutil.copy(minilm / "model.safetensors", directory / "model.safetensors")
    return directory


def _custom_tokenizer_dir(root: Path, checkpoint: Path, marker: Path) -> Path:
    """A copy of a pyserini_mores checkpoint whose tokenizer alone is its own code (``auto_map`` in
    ``tokenizer_config.json`` only)."""
    directory = root / "custom-tokenizer"
    shutil.copytree(checkpoint, directory)
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    tokenizer_config["tokenizer_class"] = "XTokenizer"
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (directory / "tokenization_x.py").write_text(
        _payload(marker, "tokenization_x")
        + "from transformers import BertTokenizer\n\n\nclass XTokenizer(BertTokenizer):\n    pass\n")
    return directory


def _environment(tmp_path: Path) -> dict[str, str]:
    # transformers copies a model's code into its modules cache before importing it: a fresh one per test.
    return {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf_modules"),
            "PYSERINI_MORES_CACHE": str(tmp_path / "cache"), "TOKENIZERS_PARALLELISM": "false"}


def _run(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
    # Several answers, in case a prompt is asked more than once (config, then tokenizer, then model).
    return subprocess.run(command, input="y\n" * 8, capture_output=True, text=True, timeout=600, env=environment)


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "custom-code-ran.txt"


def test_the_payloads_run_when_transformers_is_told_to_trust_them(tmp_path, tiny_maxsim_dir, marker):
    """The control: the same directories, loaded by transformers with ``trust_remote_code=True``, run their code."""
    config_dir = _custom_config_dir(tmp_path, marker)
    tokenizer_dir = _custom_tokenizer_dir(tmp_path, tiny_maxsim_dir, marker)
    script = ("import sys\nfrom transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig\n"
              "AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
              "AutoTokenizer.from_pretrained(sys.argv[2], config=PretrainedConfig(), trust_remote_code=True)\n")
    result = _run([sys.executable, "-c", script, str(config_dir), str(tokenizer_dir)], _environment(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(marker.read_text().split()) == {"configuration_x", "modeling_x", "tokenization_x"}


def test_a_directory_asking_for_its_own_code_is_refused_naming_the_file_and_key(tmp_path, tiny_maxsim_dir, marker):
    config_dir = _custom_config_dir(tmp_path, marker)
    with pytest.raises(UntrustedModelError) as refused:
        check_model_directory(config_dir)
    assert str(refused.value) == (
        f"{config_dir / 'config.json'} has an 'auto_map' key: the model asks to run its own Python code "
        "(configuration_x.py, modeling_x.py), which pyserini_mores never runs; use a model without custom code")
    tokenizer_dir = _custom_tokenizer_dir(tmp_path, tiny_maxsim_dir, marker)
    with pytest.raises(UntrustedModelError, match=r"tokenizer_config\.json has an 'auto_map' key.*tokenization_x\.py"):
        load_model("maxsim", tokenizer_dir)
    for model_type in ("maxsim", "mores", "cross-encoder"):  # a checkpoint of another type, or a backbone
        with pytest.raises(UntrustedModelError, match=r"config\.json has an 'auto_map' key"):
            load_model(model_type, config_dir)
    assert not marker.exists()
    check_model_directory(tiny_maxsim_dir)  # a checkpoint of ours passes


def test_pickled_weights_without_safetensors_are_refused(tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    minilm = offline_minilm_path()
    for name in (*TOKENIZER_FILES, "config.json"):
        shutil.copy(minilm / name, directory / name)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2)}, directory / "pytorch_model.bin")
    message = (f"{directory / 'pytorch_model.bin'} holds pickled weights, which can run code when loaded, and there is "
               "no model.safetensors: pyserini_mores loads safetensors only; convert the weights with safetensors "
               "(save_file) in an environment you trust")
    with pytest.raises(UntrustedModelError) as refused:
        load_model("maxsim", directory)
    assert str(refused.value) == message
    # Beside safetensors, a pickle is never read (the loaders ask for safetensors only).
    shutil.copy(minilm / "model.safetensors", directory / "model.safetensors")
    check_model_directory(directory)


def test_a_dense_query_encoder_asking_for_its_own_code_is_refused(tmp_path, marker):
    from pyserini_mores.search.first_stage import Dense, open_dense_searcher

    encoder = _custom_config_dir(tmp_path, marker)
    with pytest.raises(UntrustedModelError, match=r"config\.json has an 'auto_map' key"):
        open_dense_searcher(Dense(tmp_path / "no-dense-index", encoder))
    assert not marker.exists()


_API_SCRIPT = """
import sys
from pyserini_mores import get_reranker
from pyserini_mores.search import RerankingSearcher

model, index = sys.argv[1], sys.argv[2]
for name, load in (("get_reranker", lambda: get_reranker("maxsim", model=model)),
                   ("RerankingSearcher", lambda: RerankingSearcher(index, "maxsim", model=model))):
    try:
        load()
    except Exception as error:
        print(f"{name}: {type(error).__name__}: {error}")
    else:
        print(f"{name}: loaded")
"""


def _commands(model: Path, index: Path, tmp_path: Path) -> dict[str, tuple[list[str], int]]:
    """Every command that loads a model the user names, as a subprocess, with the exit status of its ``error:``
    line (2, a usage error, in every command)."""
    triples = tmp_path / "triples.tsv"
    triples.write_text("text editor\tvim is a text editor\temacs is a lisp machine\n" * 40)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 1\n")
    out = tmp_path / "out"
    module = [sys.executable, "-m"]
    return {
        "search": ([*module, "pyserini_mores.search", "--index", str(index), "--topics", str(TOPICS),
                    "--reranker", "maxsim", "--model", str(model), "--hits", "3"], 2),
        "sidecar build": ([*module, "pyserini_mores.sidecar", "build", "--index", str(index), "--reranker", "maxsim",
                           "--model", str(model), "--output", str(out / "sidecar")], 2),
        "explain": ([*module, "pyserini_mores.explain", "--index", str(index), "--query", "text editor",
                     "--reranker", "maxsim", "--model", str(model), "--output", str(out / "explain")], 2),
        "budget": ([*module, "pyserini_mores.budget", "--index", str(index), "--topics", str(TOPICS), "--qrels",
                    str(qrels), "--rerankers", f"maxsim:{model}", "--budgets", "10", "--output-dir",
                    str(out / "budget")], 2),
        "train": ([*module, "pyserini_mores.train", "train", "--model-type", "maxsim", "--init", str(model),
                   "--triples", str(triples), "--output", str(out / "train")], 2),
        "train export-delta": ([*module, "pyserini_mores.train", "export-delta", "--model-type", "maxsim",
                                "--model", str(model), "--output", str(out / "delta")], 2),
    }


def _assert_refused_everywhere(model: Path, index: Path, tmp_path: Path, marker: Path, expected: str,
                               commands: list[str] | None = None) -> None:
    environment = _environment(tmp_path)
    api = _run([sys.executable, "-c", _API_SCRIPT, str(model), str(index)], environment)
    assert api.returncode == 0, api.stderr[-3000:]
    assert api.stdout.splitlines() == [f"{name}: UntrustedModelError: {expected}"
                                       for name in ("get_reranker", "RerankingSearcher")]
    assert "[y/N]" not in api.stdout + api.stderr
    table = _commands(model, index, tmp_path)
    chosen = {name: table[name] for name in (commands or table)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(chosen, pool.map(lambda item: _run(item[0], environment), chosen.values())))
    for name, result in results.items():
        assert result.returncode == chosen[name][1], (name, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (name, result.stderr[-3000:])
        assert "[y/N]" not in result.stdout + result.stderr, name
        assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [f"error: {expected}"], \
            (name, result.stderr[-3000:])
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
def test_no_command_runs_a_models_own_code_even_when_told_yes(tmp_path, tiny_index, marker):
    model = _custom_config_dir(tmp_path, marker)
    expected = (f"{model / 'config.json'} has an 'auto_map' key: the model asks to run its own Python code "
                "(configuration_x.py, modeling_x.py), which pyserini_mores never runs; use a model without custom code")
    _assert_refused_everywhere(model, tiny_index, tmp_path, marker, expected)


@pytest.mark.slow
def test_no_command_runs_a_tokenizers_own_code_even_when_told_yes(tmp_path, tiny_index, tiny_maxsim_dir, marker):
    model = _custom_tokenizer_dir(tmp_path, tiny_maxsim_dir, marker)
    expected = (f"{model / 'tokenizer_config.json'} has an 'auto_map' key: the model asks to run its own Python code "
                "(tokenization_x.py), which pyserini_mores never runs; use a model without custom code")
    _assert_refused_everywhere(model, tiny_index, tmp_path, marker, expected, ["search", "train"])

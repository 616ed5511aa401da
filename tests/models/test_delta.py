"""Delta checkpoints: only the tensors that training changed, loaded back on top of the backbone."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import save_tiny_bert

from pyserini_mores.models import load_model
from pyserini_mores.models.delta import DELTA_WEIGHTS_NAME, save_delta
from pyserini_mores.train.objectives import select_trainable

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory, tokenizer):
    """A local HF BERT directory (random weights, 2 layers, 32 wide): a backbone like bert-base-uncased, but tiny."""
    path = tmp_path_factory.mktemp("backbone") / "tiny-bert"
    save_tiny_bert(path, tokenizer, layers=3, seed=1)
    return path


def _backbone_variant(source, tokenizer, path, change):
    """``source``'s weights after ``change(model)``, saved with the tokenizer to ``path`` (a local backbone)."""
    from transformers import BertModel

    model = BertModel.from_pretrained(source)
    with torch.no_grad():
        change(model)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _trained(model_type, backbone, **config):
    """A model as training with frozen embeddings leaves it: every other tensor moved."""
    model = load_model(model_type, str(backbone), **config)
    select_trainable(model, "all", freeze_embeddings=True)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


@pytest.mark.parametrize("model_type,config", [("prettr", {"join_layer": 2}), ("mores", {"n_interaction_blocks": 1}),
                                                ("tk", {}), ("maxsim", {})])
def test_float32_delta_loads_back_bit_identical_without_embeddings(tmp_path, tiny_backbone, model_type, config):
    model = _trained(model_type, tiny_backbone, **config)
    summary = save_delta(model, tmp_path / "delta", dtype=torch.float32)
    assert summary["tensors"] > 0 and summary["parameters"] < summary["of_parameters"]
    stored = load_file(str(tmp_path / "delta" / DELTA_WEIGHTS_NAME))
    assert not any("embeddings" in name for name in stored), "frozen embedding tables must not be stored"
    loaded = load_model(model_type, tmp_path / "delta")
    for (name, expected), actual in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(expected, actual), name
    if model.store_width:
        assert loaded.store_fingerprint() == model.store_fingerprint()


def test_float16_delta_rounds_only_the_stored_tensors(tmp_path, tiny_backbone):
    model = _trained("prettr", tiny_backbone, join_layer=2)
    save_delta(model, tmp_path / "delta")
    loaded = load_model("prettr", tmp_path / "delta")
    for name, expected in model.state_dict().items():
        actual = loaded.state_dict()[name]
        if "embeddings" in name:
            assert torch.equal(expected, actual), name
        else:
            assert torch.equal(expected.half().float(), actual), name
    # and the same file loads to the same fingerprint in every process (it is what finds the sidecar)
    assert load_model("prettr", tmp_path / "delta").store_fingerprint() == loaded.store_fingerprint()


def test_delta_accepts_config_overrides_that_do_not_change_weights(tmp_path, tiny_backbone):
    model = _trained("mores", tiny_backbone, n_interaction_blocks=1)
    save_delta(model, tmp_path / "delta")
    assert load_model("mores", tmp_path / "delta", reuse="s2").config.reuse == "s2"


def test_delta_from_another_backbone_is_refused_with_the_tensor_named(tmp_path, tiny_backbone):
    model = _trained("prettr", tiny_backbone, join_layer=2)
    save_delta(model, tmp_path / "delta")
    config_path = tmp_path / "delta" / "config.json"
    config = json.loads(config_path.read_text())
    config["backbone"] = "minilm"  # 384 wide, 6 layers: the stored 32-wide tensors cannot fit
    config.pop("encoder")
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensor '.*' .* does not fit the model rebuilt from 'minilm'"):
        load_model("prettr", tmp_path / "delta")


def test_model_without_backbone_cannot_be_saved_as_delta(tmp_path, tiny_maxsim_dir):
    model = load_model("maxsim", tiny_maxsim_dir)  # built from a config, not from a backbone
    with pytest.raises(ValueError, match="no backbone to rebuild it from"):
        save_delta(model, tmp_path / "delta")


def test_export_delta_command(tmp_path, tiny_backbone, capsys):
    from pyserini_mores.train.__main__ import main

    model = _trained("tk", tiny_backbone)
    model.save_pretrained(tmp_path / "full")
    main(["export-delta", "--model-type", "tk", "--model", str(tmp_path / "full"), "--output", str(tmp_path / "d")])
    assert "tensors" in capsys.readouterr().out
    loaded = load_model("tk", tmp_path / "d")
    assert loaded.store_fingerprint() == load_model("tk", tmp_path / "d").store_fingerprint()
    assert (tmp_path / "d" / DELTA_WEIGHTS_NAME).stat().st_size < (tmp_path / "full" / "model.safetensors").stat().st_size


def test_a_tied_mores_delta_loads_untied_with_every_trained_layer(tmp_path, tiny_backbone):
    # e.g. --init TIED_DELTA under a tied=false recipe: the shared layers are stored once, under one module's name,
    # and both modules must get them
    model = _trained("mores", tiny_backbone, n_interaction_blocks=1, tied=True)
    save_delta(model, tmp_path / "delta", dtype=torch.float32)
    untied = load_model("mores", tmp_path / "delta", tied=False)
    assert untied.config.tied is False
    assert untied.query_module.layers[0] is not untied.document_module.layers[0]
    for module in (untied.query_module, untied.document_module):
        for ours, theirs in zip(module.layers, model.document_module.layers):
            assert torch.equal(ours.ffn.output.weight, theirs.ffn.output.weight)


def test_an_untied_mores_delta_refuses_to_be_tied(tmp_path, tiny_backbone):
    model = _trained("mores", tiny_backbone, n_interaction_blocks=1, tied=False)
    save_delta(model, tmp_path / "delta", dtype=torch.float32)
    with pytest.raises(ValueError, match="has its own layers; tying them"):
        load_model("mores", tmp_path / "delta", tied=True)


def test_an_embedding_table_with_few_changed_rows_is_stored_row_sparse_and_loads_back(tmp_path, tiny_backbone):
    model = _trained("cross-encoder", tiny_backbone)
    table = model.state_dict()["encoder.embeddings.word_embeddings.weight"]
    moved = torch.tensor([3, 17, 1000])
    with torch.no_grad():
        table[moved] += 0.25  # as training moves only the rows of the tokens it saw
    save_delta(model, tmp_path / "delta", dtype=torch.float32)
    stored = load_file(str(tmp_path / "delta" / DELTA_WEIGHTS_NAME))
    assert stored["encoder.embeddings.word_embeddings.weight"].shape == (3, table.shape[1])
    assert stored["encoder.embeddings.word_embeddings.weight@rows"].tolist() == moved.tolist()
    loaded = load_model("cross-encoder", tmp_path / "delta")
    for name, expected in model.state_dict().items():
        assert torch.equal(expected, loaded.state_dict()[name]), name


def test_a_table_is_stored_row_sparse_whenever_its_changed_rows_take_fewer_bytes(tmp_path, tiny_backbone):
    model = _trained("cross-encoder", tiny_backbone)
    table = model.state_dict()["encoder.embeddings.word_embeddings.weight"]
    width = table.shape[1]  # 32 float16 values = 64 bytes a row; its int64 index adds 8
    sparse_rows, whole_rows = (len(table) * 8) // 10, (len(table) * 9) // 10 + 1  # 80% of rows: 72 < 64 × 1.25
    for moved, stored_rows in ((sparse_rows, sparse_rows), (whole_rows, len(table))):
        with torch.no_grad():
            table[:moved] += 0.25
        save_delta(model, tmp_path / f"delta-{moved}")
        stored = load_file(str(tmp_path / f"delta-{moved}" / DELTA_WEIGHTS_NAME))
        assert stored["encoder.embeddings.word_embeddings.weight"].shape == (stored_rows, width)
        assert ("encoder.embeddings.word_embeddings.weight@rows" in stored) == (stored_rows < len(table))
        expected = table.half().float()  # stored rows round to float16; the rest are the rebuild's own
        if stored_rows < len(table):
            expected[moved:] = table[moved:]
        loaded = load_model("cross-encoder", tmp_path / f"delta-{moved}")
        assert torch.equal(loaded.state_dict()["encoder.embeddings.word_embeddings.weight"], expected)


def test_tensors_kept_frozen_over_a_float16_rebuild_are_not_stored_again(tmp_path, tiny_backbone, tokenizer):
    """A model trained from a float16 delta's weights (a shipped cross-encoder), from the full-precision checkpoint
    the delta was exported from, keeps the frozen tensors at values that round to the rebuild's."""

    def round_to_float16(backbone):
        for parameter in backbone.parameters():
            parameter.copy_(parameter.half().float())

    rounded = _backbone_variant(tiny_backbone, tokenizer, tmp_path / "rounded", round_to_float16)
    model = _trained("prettr", tiny_backbone, join_layer=2)  # embeddings frozen at the unrounded values
    save_delta(model, tmp_path / "half", backbone=str(rounded))
    assert not any("embeddings" in name for name in load_file(str(tmp_path / "half" / DELTA_WEIGHTS_NAME)))
    loaded = load_model("prettr", tmp_path / "half")
    for name, expected in model.state_dict().items():
        assert torch.equal(expected.half().float(), loaded.state_dict()[name]), name
    save_delta(model, tmp_path / "full", dtype=torch.float32, backbone=str(rounded))
    assert any("embeddings" in name for name in load_file(str(tmp_path / "full" / DELTA_WEIGHTS_NAME)))


def test_a_row_sparse_table_whose_rows_do_not_fit_is_refused(tmp_path, tiny_backbone):
    model = _trained("cross-encoder", tiny_backbone)
    with torch.no_grad():
        model.state_dict()["encoder.embeddings.word_embeddings.weight"][5] += 1.0
    save_delta(model, tmp_path / "delta")
    path = tmp_path / "delta" / DELTA_WEIGHTS_NAME
    stored = load_file(str(path))
    stored["encoder.embeddings.word_embeddings.weight@rows"] = torch.tensor([10**6])
    save_file(stored, str(path))
    with pytest.raises(ValueError, match=r"tensor 'encoder.embeddings.word_embeddings.weight' .* does not fit"):
        load_model("cross-encoder", tmp_path / "delta")


def test_a_delta_is_refused_over_a_backbone_that_changed_since(tmp_path, tiny_backbone, tokenizer):
    import shutil

    backbone = tmp_path / "backbone"
    shutil.copytree(tiny_backbone, backbone)
    model = _trained("prettr", backbone, join_layer=2)
    save_delta(model, tmp_path / "delta")
    assert load_model("prettr", tmp_path / "delta").store_fingerprint() == load_model(
        "prettr", tmp_path / "delta").store_fingerprint()

    def retrain(ranker):  # the same name, other weights: e.g. a re-trained ranker
        ranker.embeddings.word_embeddings.weight[7] += 1.0

    _backbone_variant(backbone, tokenizer, backbone, retrain)
    with pytest.raises(ValueError, match=r"was saved over another '.*backbone' than the one installed"):
        load_model("prettr", tmp_path / "delta")


@pytest.fixture
def further_trained_backbone(tmp_path, tiny_backbone, tokenizer):
    """The tiny backbone with its last layer trained further and its embeddings untouched, as the cross-encoder's
    second stage leaves the first stage it continued (embeddings and lower layers frozen)."""

    def train_last_layer(backbone):
        for parameter in backbone.encoder.layer[-1].parameters():
            parameter.add_(0.01)

    return _backbone_variant(tiny_backbone, tokenizer, tmp_path / "further-trained", train_last_layer)


def test_a_delta_stored_over_another_backbone_records_it_and_loads_to_the_trained_weights(
        tmp_path, tiny_backbone, further_trained_backbone):
    model = _trained("mores", tiny_backbone, n_interaction_blocks=1)
    over_start = save_delta(model, tmp_path / "over-start", dtype=torch.float32)
    summary = save_delta(model, tmp_path / "delta", dtype=torch.float32, backbone=str(further_trained_backbone))
    config = json.loads((tmp_path / "delta" / "config.json").read_text())
    assert config["backbone"] == str(further_trained_backbone)
    assert not any("embeddings" in name for name in load_file(str(tmp_path / "delta" / DELTA_WEIGHTS_NAME)))
    # every tensor but the embeddings moved in training, so both deltas store the same ones, over either backbone
    assert (summary["tensors"], summary["parameters"]) == (over_start["tensors"], over_start["parameters"])
    loaded = load_model("mores", tmp_path / "delta")
    for (name, expected), actual in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(expected, actual), name


def test_export_delta_refuses_a_backbone_of_another_shape(tmp_path, tiny_backbone):
    from pyserini_mores.train.__main__ import main

    _trained("tk", tiny_backbone).save_pretrained(tmp_path / "full")
    with pytest.raises(SystemExit,
                       match=r"^error: backbone 'minilm' rebuilds a different model \(config fields \[.+\] differ\)$"):
        main(["export-delta", "--model-type", "tk", "--model", str(tmp_path / "full"), "--output",
              str(tmp_path / "d"), "--backbone", "minilm"])
    assert not (tmp_path / "d").exists()

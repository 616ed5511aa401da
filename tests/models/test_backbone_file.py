"""Backbone weights read straight from ``model.safetensors`` are exactly what ``transformers.AutoModel`` loads (the
package skips AutoModel for start-up time), for a plain BERT checkpoint and for a task model's."""
from __future__ import annotations

import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForSequenceClassification

from pyserini_mores.models.backbones import _bert_weights_from_file, load_backbone, offline_minilm_path


def _same_as_automodel(directory) -> None:
    expected = AutoModel.from_pretrained(directory).state_dict()
    _, state_dict, _ = load_backbone(directory)
    assert sorted(state_dict) == sorted(expected)
    for name, tensor in expected.items():
        assert state_dict[name].dtype == tensor.dtype and torch.equal(state_dict[name], tensor), name


def test_the_offline_minilm_loads_as_automodel_loads_it():
    assert _bert_weights_from_file(str(offline_minilm_path())) is not None  # the file path is the one taken
    _same_as_automodel(offline_minilm_path())


def test_a_task_models_checkpoint_loads_its_bert_as_automodel_does(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(offline_minilm_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=256, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path)  # "bert."-prefixed, with a classifier
    tokenizer.save_pretrained(tmp_path)
    _same_as_automodel(tmp_path)


def test_a_checkpoint_missing_a_bert_weight_is_left_to_automodel(tmp_path):
    """No pooler in the file: AutoModel initialises one (randomly), which the file alone cannot give."""
    from transformers import BertModel

    tokenizer = AutoTokenizer.from_pretrained(offline_minilm_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=256)
    BertModel(config, add_pooling_layer=False).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert _bert_weights_from_file(str(tmp_path)) is None
    _, state_dict, _ = load_backbone(tmp_path)
    assert "pooler.dense.weight" in state_dict
    assert sorted(state_dict) == sorted(AutoModel.from_pretrained(tmp_path).state_dict())

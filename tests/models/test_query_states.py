"""``output_query_states``: MORES and PreTTR give the query-token states of their upper layers through their own
forward (what hidden-state distillation reads), without changing a score, from text and from stored documents."""
from __future__ import annotations

import pytest
import torch
from tiny_models import spread_weights

from pyserini_mores.models import pad_documents
from pyserini_mores.models.mores import MoresConfig, MoresModel
from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERIES = ["text editor", "web server reverse proxy for debian", "python arrays"]
TEXTS = ["vim is a text editor", "nginx is a web server and reverse proxy", "numpy arrays for python"]

#: (class, config overrides, K: the layers whose query states come back)
VARIANTS = [
    (MoresModel, {}, 2),
    (MoresModel, {"n_interaction_blocks": 1, "reuse": "s1"}, 1),
    (MoresModel, {"pooling": "avg"}, 2),
    (MoresModel, {"interaction": "joint"}, 2),
    (PreTTRModel, {"join_layer": 3}, 1),
    (PreTTRModel, {"join_layer": 1, "compression_dim": 16}, 3),
]
IDS = ["mores-2ib", "mores-1ib-s1", "mores-avg", "mores-joint", "prettr-l3", "prettr-l1-e16"]


def _model(cls, tiny_dims, tokenizer, overrides):
    config_class = MoresConfig if cls is MoresModel else PreTTRConfig
    torch.manual_seed(0)
    return spread_weights(cls(config_class(encoder=tiny_dims, doc_max_length=32, **overrides), tokenizer), 1).eval()


@pytest.mark.parametrize("cls, overrides, layers", VARIANTS, ids=IDS)
@torch.no_grad()
def test_query_states_come_from_the_same_forward_and_leave_the_scores_unchanged(tiny_dims, tokenizer, cls, overrides,
                                                                               layers):
    model = _model(cls, tiny_dims, tokenizer, overrides)
    query_batch, doc_batch = model.tokenize_queries(QUERIES), model.tokenize_documents(TEXTS)
    scores, states = model(query_batch, doc_batch, output_query_states=True)
    assert model.interaction_layers == layers and len(states) == layers
    assert all(state.shape == (3, query_batch["input_ids"].shape[1], tiny_dims.hidden_size) for state in states)
    torch.testing.assert_close(scores, model(query_batch, doc_batch), rtol=0, atol=1e-5)
    logits, _ = model.forward_logits(query_batch, doc_batch, output_query_states=True)
    torch.testing.assert_close(logits, model.forward_logits(query_batch, doc_batch), rtol=0, atol=1e-5)
    assert not torch.allclose(states[-1][0], states[-1][1])  # every pair its own states


@pytest.mark.parametrize("cls, overrides, layers", VARIANTS, ids=IDS)
@torch.no_grad()
def test_stored_documents_give_the_query_states_of_the_text_forward(tiny_dims, tokenizer, cls, overrides, layers):
    model = _model(cls, tiny_dims, tokenizer, overrides)
    query_batch = model.tokenize_queries(QUERIES)
    docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(TEXTS)))
    from_text_scores, from_text = model(query_batch, model.tokenize_documents(TEXTS), output_query_states=True)
    outputs, stored = model.score_logits(model.encode_query(query_batch), docs, lengths, output_query_states=True)
    torch.testing.assert_close(outputs if outputs.dim() == 1 else outputs[:, 1] - outputs[:, 0], from_text_scores,
                               rtol=0, atol=1e-4)
    for ours, theirs in zip(stored, from_text):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_prettr_stored_keys_and_values_cannot_give_query_states(tiny_dims, tokenizer):
    model = _model(PreTTRModel, tiny_dims, tokenizer, {"reuse": "kv"})
    docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(TEXTS)))
    with pytest.raises(ValueError, match="needs reuse='states'"):
        model.score_logits(model.encode_query(model.tokenize_queries(QUERIES[:1])), docs, lengths,
                           output_query_states=True)

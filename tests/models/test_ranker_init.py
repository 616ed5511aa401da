"""A trained cross-encoder or MaxSim checkpoint as the starting point of MORES and PreTTR, and a MaxSim encoder as
that of a cross-encoder (``--init DIR``): every copied tensor is the ranker's, PreTTR at l = 0 scores exactly like the
cross-encoder, MORES's document module encodes exactly like the MaxSim encoder, and other model types still refuse
them."""
from __future__ import annotations

import pytest
import torch

from pyserini_mores.models import load_model
from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "text editor for debian"


@pytest.fixture
def cross_encoder_dir(tiny_dims, tokenizer, tmp_path):
    torch.manual_seed(3)
    query_tokens = len(tokenizer(QUERY)["input_ids"])  # the query fills its block: PreTTR l=0 is then exact
    model = CrossEncoder(CrossEncoderConfig(encoder=tiny_dims, query_max_length=query_tokens, doc_max_length=32),
                         tokenizer)
    with torch.no_grad():  # far from any fresh initialisation, so a copy cannot be confused with a new tensor
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    model.eval().save_pretrained(tmp_path / "cross-encoder")
    return tmp_path / "cross-encoder", model


@pytest.fixture
def maxsim_dir(tiny_dims, tokenizer, tmp_path):
    torch.manual_seed(4)
    model = DualEncoder(DualEncoderConfig(encoder=tiny_dims, query_max_length=8, doc_max_length=32,
                                          projection_dim=16), tokenizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    model.eval().save_pretrained(tmp_path / "maxsim")
    return tmp_path / "maxsim", model


@torch.no_grad()
def test_prettr_at_join_layer_zero_from_a_cross_encoder_scores_like_it(cross_encoder_dir, tiny_documents):
    directory, cross = cross_encoder_dir
    prettr = load_model("prettr", directory, join_layer=0, query_max_length=cross.config.query_max_length,
                        doc_max_length=cross.config.doc_max_length).eval()
    texts = [doc["contents"] for doc in tiny_documents[:5]]
    expected = cross.score_texts(QUERY, texts)
    assert expected.std() > 0.05
    state = prettr.encode_query(prettr.tokenize_queries([QUERY]))
    from pyserini_mores.models import pad_documents

    scores = prettr.score(state, *pad_documents(prettr.encode_documents(prettr.tokenize_documents(texts))))
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-4)


def test_mores_from_a_cross_encoder_copies_its_layers_and_head(cross_encoder_dir, tiny_dims):
    directory, cross = cross_encoder_dir
    model = load_model("mores", directory, n_interaction_blocks=2)
    layers = cross.encoder.layers
    for ours, theirs in zip(model.document_module.layers, layers):
        assert torch.equal(ours.attention.query.weight, theirs.attention.query.weight)
    for index, block in enumerate(model.interaction_module.blocks):
        source = layers[tiny_dims.num_hidden_layers - 2 + index]
        assert torch.equal(block.cross_attention.key.weight, source.attention.key.weight)
        assert torch.equal(block.self_attention.value.weight, source.attention.value.weight)
        assert torch.equal(block.ffn.output.weight, source.ffn.output.weight)
    assert torch.equal(model.interaction_module.head.weight, cross.head.weight)
    assert torch.equal(model.interaction_module.head.bias, cross.head.bias)
    assert torch.equal(model.query_module.embeddings.word_embeddings.weight,
                       cross.encoder.embeddings.word_embeddings.weight)
    assert model.config.backbone == str(directory)


@pytest.mark.parametrize("model_type", ["mores", "prettr"])
def test_the_cross_encoder_is_loaded_once_for_its_layers_and_its_head(cross_encoder_dir, model_type, monkeypatch):
    """A shipped cross-encoder is rebuilt from its own backbone, which takes seconds: one load serves both."""
    directory, cross = cross_encoder_dir
    loads = []
    load = CrossEncoder.from_pretrained.__func__
    monkeypatch.setattr(CrossEncoder, "from_pretrained",
                        classmethod(lambda cls, *args, **kwargs: loads.append(args) or load(cls, *args, **kwargs)))
    model = load_model(model_type, directory)
    assert len(loads) == 1
    assert torch.equal(model.ranking_head.weight, cross.head.weight)


def test_a_head_of_another_shape_is_refused(cross_encoder_dir):
    directory, _ = cross_encoder_dir
    with pytest.raises(ValueError, match=r"cross-encoder's head is \(2, 32\), this mores head is \(1, 32\)"):
        load_model("mores", directory, num_labels=1)


@pytest.mark.parametrize("model_type", ["tk", "maxsim"])
def test_models_that_cannot_start_from_a_cross_encoder_refuse_it(cross_encoder_dir, model_type):
    directory, _ = cross_encoder_dir
    with pytest.raises(ValueError, match=f"holds a 'cross-encoder' checkpoint, not a '{model_type}' one"):
        load_model(model_type, directory)


@torch.no_grad()
def test_mores_from_a_maxsim_encoder_stores_its_token_states(maxsim_dir, tiny_documents):
    directory, maxsim = maxsim_dir
    mores = load_model("mores", directory, n_interaction_blocks=2, reuse="s1", doc_max_length=32).eval()
    texts = [doc["contents"] for doc in tiny_documents[:4]]
    batch = mores.tokenize_documents(texts)
    # S1 stores the document module's last states: the MaxSim encoder's, before its projection and normalisation
    expected = maxsim.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    for stored, states, length in zip(mores.encode_documents(batch), expected, batch["attention_mask"].sum(1)):
        torch.testing.assert_close(stored, states[:length], rtol=0, atol=1e-5)
    block = mores.interaction_module.blocks[-1]
    assert torch.equal(block.cross_attention.query.weight, maxsim.encoder.layers[-1].attention.query.weight)
    assert mores.config.backbone == str(directory)


def test_mores_from_a_maxsim_encoder_gets_a_fresh_head_of_any_shape(maxsim_dir):
    directory, _ = maxsim_dir  # a dual encoder has no head to copy, so no shape to match either
    assert load_model("mores", directory, num_labels=1).interaction_module.head.weight.shape[0] == 1


def test_a_cross_encoder_from_a_maxsim_encoder_copies_it_and_gets_a_fresh_head(maxsim_dir):
    directory, maxsim = maxsim_dir
    cross = load_model("cross-encoder", directory)
    theirs = maxsim.encoder.state_dict()
    for name, tensor in cross.encoder.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    # a dual encoder has no head: the new one is drawn from the fixed seed, the same in every process
    assert torch.equal(cross.head.weight, load_model("cross-encoder", directory).head.weight)
    assert cross.config.backbone == str(directory)


def test_tk_cannot_start_from_a_maxsim_encoder(maxsim_dir):
    directory, _ = maxsim_dir
    with pytest.raises(ValueError, match="holds a 'maxsim' checkpoint, not a 'tk' one"):
        load_model("tk", directory)

"""Cross-encoder: equals ``transformers.BertModel`` on the joined pair, MORES-identical truncation, score_texts ==
forward, checkpoints; and the shared ranking losses on hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch
from tiny_models import save_tiny_bert

from pyserini_mores.models import load_model
from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig, join_pairs
from pyserini_mores.models.losses import (
    listwise_softmax_cross_entropy,
    pairwise_hinge,
    pointwise_cross_entropy,
    ranking_scores,
)

QUERY = "what is a text editor"
DOCUMENTS = [
    "Vim is a highly configurable text editor built to make creating and changing any kind of text efficient.",
    "apt installs packages.",
    "Emacs is an extensible, customizable text editor with a Lisp interpreter at its core.",
    "The Linux kernel manages hardware, memory and processes.",
    "Python is a high-level programming language.",
]
LONG_QUERY = "how do i " + "really " * 30 + "configure vim"
LONG_DOCUMENT = "vim " + "editor text " * 150


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hf_backbone(tmp_path_factory, tokenizer):
    """A tiny random ``transformers.BertModel`` saved with the MiniLM tokenizer: (directory, model)."""
    directory = tmp_path_factory.mktemp("hf_bert_ce")
    return directory, save_tiny_bert(directory, tokenizer, layers=2, seed=2, perturbation=0.1)


@pytest.fixture(scope="module")
def cross_encoder(hf_backbone) -> CrossEncoder:
    torch.manual_seed(3)
    model = CrossEncoder.from_backbone(hf_backbone[0])
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)  # spread the scores
    return model


def test_equals_hf_bert_on_the_joined_pair(hf_backbone, cross_encoder, tokenizer):
    _, hf_model = hf_backbone
    pairs = [(QUERY, DOCUMENTS[0]), (QUERY, DOCUMENTS[1]), (LONG_QUERY, LONG_DOCUMENT)]
    queries = cross_encoder.tokenize_queries([q for q, _ in pairs])
    documents = cross_encoder.tokenize_documents([d for _, d in pairs])
    with torch.no_grad():
        logits = cross_encoder.forward_logits(queries, documents)
        scores = cross_encoder(queries, documents)
    for index, (query, document) in enumerate(pairs):
        # by hand: MORES's separate truncation (16 / 128 incl. special tokens), then [CLS] q [SEP] + d [SEP]
        query_ids = tokenizer(query, max_length=16, truncation=True)["input_ids"]
        doc_ids = tokenizer(document, max_length=128, truncation=True)["input_ids"]
        input_ids = torch.tensor([query_ids + doc_ids[1:]])
        token_types = torch.tensor([[0] * len(query_ids) + [1] * (len(doc_ids) - 1)])
        if index < 2:  # untruncated: exactly BERT's standard pair encoding
            standard = tokenizer(query, document, return_tensors="pt")
            assert torch.equal(standard["input_ids"], input_ids)
            assert torch.equal(standard["token_type_ids"], token_types)
        else:
            assert input_ids.shape[1] == 16 + 127
        with torch.no_grad():
            cls = hf_model(input_ids=input_ids, token_type_ids=token_types).last_hidden_state[:, 0]
            expected = cls @ cross_encoder.head.weight.T + cross_encoder.head.bias
        torch.testing.assert_close(logits[index], expected[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(scores[index], expected[0, 1] - expected[0, 0], atol=1e-5, rtol=1e-5)


def test_join_pairs_handles_padding_on_both_sides(tokenizer):
    queries = tokenizer(["vim", "what is a text editor"], padding=True, return_tensors="pt")
    documents = tokenizer(["a long document about text editors", "short"], padding=True, return_tensors="pt")
    input_ids, mask, token_types = join_pairs(queries["input_ids"], queries["attention_mask"],
                                              documents["input_ids"], documents["attention_mask"])
    for row, (query, document) in enumerate([("vim", "a long document about text editors"),
                                             ("what is a text editor", "short")]):
        standard = tokenizer(query, document)
        length = len(standard["input_ids"])
        assert input_ids[row, :length].tolist() == standard["input_ids"]
        assert token_types[row, :length].tolist() == standard["token_type_ids"]
        assert mask[row].tolist() == [1] * length + [0] * (input_ids.shape[1] - length)
        assert input_ids[row, length:].eq(tokenizer.pad_token_id).all() and token_types[row, length:].eq(0).all()
    with pytest.raises(ValueError, match="right-padded"):
        join_pairs(queries["input_ids"], queries["attention_mask"].flip(1), documents["input_ids"],
                   documents["attention_mask"])


def test_score_texts_equals_forward(cross_encoder):
    documents = DOCUMENTS + [LONG_DOCUMENT]
    with torch.no_grad():
        trained = cross_encoder(cross_encoder.tokenize_queries([QUERY] * len(documents)),
                                cross_encoder.tokenize_documents(documents))
    assert trained.std() > 0.05
    for batch_size in (2, 64):  # sorted, packed, padded per batch; returned in input order
        torch.testing.assert_close(cross_encoder.score_texts(QUERY, documents, batch_size=batch_size), trained,
                                   atol=1e-4, rtol=0)
    assert cross_encoder.score_texts(QUERY, []).shape == (0,)


def test_no_stored_representations(cross_encoder):
    assert cross_encoder.store_width is None
    with pytest.raises(NotImplementedError):
        cross_encoder.encode_documents(cross_encoder.tokenize_documents(DOCUMENTS[:1]))


def test_save_load_round_trip(cross_encoder, tmp_path):
    cross_encoder.save_pretrained(tmp_path)
    loaded = load_model("cross-encoder", tmp_path)
    assert isinstance(loaded, CrossEncoder) and loaded.config == cross_encoder.config
    assert torch.equal(loaded.score_texts(QUERY, DOCUMENTS), cross_encoder.score_texts(QUERY, DOCUMENTS))
    assert loaded.fingerprint() == cross_encoder.fingerprint()


def test_config_checks(tiny_dims, tokenizer):
    with pytest.raises(ValueError, match="num_labels"):
        CrossEncoderConfig(encoder=tiny_dims, num_labels=3)
    with pytest.raises(ValueError, match="positions"):
        CrossEncoder(CrossEncoderConfig(encoder=tiny_dims, doc_max_length=300), tokenizer)
    model = CrossEncoder(CrossEncoderConfig(encoder=tiny_dims, num_labels=1), tokenizer).eval()
    with torch.no_grad():
        logits = model.forward_logits(model.tokenize_queries([QUERY]), model.tokenize_documents(DOCUMENTS[:1]))
    assert logits.shape == (1, 1) and model.score_texts(QUERY, DOCUMENTS[:1]).item() == pytest.approx(logits.item())


# ---- losses ------------------------------------------------------------------------------------------------------
def test_ranking_scores():
    logits = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    assert ranking_scores(logits).tolist() == [1.5, -2.0]
    assert ranking_scores(torch.tensor([[0.25], [-3.0]])).tolist() == [0.25, -3.0]
    with pytest.raises(ValueError):
        ranking_scores(torch.zeros(2, 3))


def test_pointwise_cross_entropy():
    logits = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    labels = torch.tensor([1, 0])
    # row 1: -log 0.5; row 2: -log(e¹ / (e¹ + e³)) = log(1 + e²)
    expected = (math.log(2) + math.log(1 + math.exp(2))) / 2
    assert pointwise_cross_entropy(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    # the same on logit differences (2-class CE == binary CE on l1 − l0), and on a 1-logit head
    assert pointwise_cross_entropy(ranking_scores(logits), labels).item() == pytest.approx(expected, rel=1e-6)
    assert pointwise_cross_entropy(torch.tensor([[0.0], [2.0]]), labels.float()).item() == pytest.approx(
        expected, rel=1e-6)
    assert pointwise_cross_entropy(logits.bfloat16(), labels).dtype == torch.float32


def test_pairwise_hinge():
    positive = torch.tensor([2.0, 0.5])
    negative = torch.tensor([0.5, 1.0])
    assert pairwise_hinge(positive, negative).item() == pytest.approx((0.0 + 1.5) / 2)  # max(0, 1 − 1.5), 1 + 0.5
    assert pairwise_hinge(positive, negative, margin=2.0).item() == pytest.approx((0.5 + 2.5) / 2)
    grouped = torch.tensor([[0.5, 3.0], [1.0, -1.0]])  # two negatives per positive
    assert pairwise_hinge(positive, grouped).item() == pytest.approx((0.0 + 2.0 + 1.5 + 0.0) / 4)


def test_listwise_softmax_cross_entropy():
    scores = torch.tensor([[1.0, 1.0], [2.0, 0.0]], requires_grad=True)
    # positives in column 0: -log 0.5 and -log(e² / (e² + 1)) = log(1 + e⁻²)
    expected = (math.log(2) + math.log(1 + math.exp(-2))) / 2
    assert listwise_softmax_cross_entropy(scores).item() == pytest.approx(expected, rel=1e-6)
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert listwise_softmax_cross_entropy(scores, labels).item() == pytest.approx(
        (math.log(2) + math.log(1 + math.exp(2))) / 2, rel=1e-6)
    # graded labels: target distribution ∝ labels; rows without a relevant document are skipped
    graded = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    assert listwise_softmax_cross_entropy(scores, graded).item() == pytest.approx(math.log(2), rel=1e-6)
    nothing = listwise_softmax_cross_entropy(scores, torch.zeros(2, 2))
    nothing.backward()
    assert nothing.item() == 0.0 and scores.grad is not None


def test_hidden_states_are_hf_berts_on_the_joined_pair(hf_backbone, cross_encoder, tokenizer):
    """What hidden-state distillation reads of a teacher: every row after each of the top layers, as
    ``transformers.BertModel(output_hidden_states=True)`` gives them on the same (unpadded) pair."""
    _, hf_model = hf_backbone
    pairs = [(QUERY, DOCUMENTS[0]), (LONG_QUERY, LONG_DOCUMENT)]
    queries = cross_encoder.tokenize_queries([q for q, _ in pairs])
    documents = cross_encoder.tokenize_documents([d for _, d in pairs])
    with torch.no_grad():
        states = cross_encoder.hidden_states(queries, documents, last=2)
        logits = cross_encoder.forward_logits(queries, documents)
    assert len(states) == 2
    for index, (query, document) in enumerate(pairs):
        query_ids = tokenizer(query, max_length=16, truncation=True)["input_ids"]
        doc_ids = tokenizer(document, max_length=128, truncation=True)["input_ids"]
        input_ids = torch.tensor([query_ids + doc_ids[1:]])
        token_types = torch.tensor([[0] * len(query_ids) + [1] * (len(doc_ids) - 1)])
        with torch.no_grad():
            expected = hf_model(input_ids=input_ids, token_type_ids=token_types, output_hidden_states=True)
        length = input_ids.shape[1]
        for state, hf_state in zip(states, expected.hidden_states[-2:]):
            torch.testing.assert_close(state[index, :length], hf_state[0], atol=1e-5, rtol=1e-5)
        # the [CLS] row of the last state is what the head scores
        torch.testing.assert_close(states[-1][index, 0] @ cross_encoder.head.weight.T + cross_encoder.head.bias,
                                   logits[index], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="last must be between 1 and the 2 layers, not 3"):
        cross_encoder.hidden_states(queries, documents, last=3)

"""Training against a sidecar (``train --doc-sidecar``): the loss from stored documents equals the loss of the
training forward from text, what the sidecar depends on stays frozen (so the trained model still opens the same
sidecar), and passages that are not in the index are refused before training starts."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_train import COLLECTION, QRELS, TOPICS, _tiny_model

from pyserini_mores.formats import read_collection, read_qrels, read_topics
from pyserini_mores.index import open_searcher
from pyserini_mores.models import load_model, pad_documents
from pyserini_mores.sidecar import open_sidecar
from pyserini_mores.sidecar.build import build_sidecar
from pyserini_mores.train.data import GroupCollator, TrainingGroup, load_groups, mine_negatives, write_triples
from pyserini_mores.train.hidden import HiddenStateDistillation
from pyserini_mores.train.objectives import RankingObjective
from pyserini_mores.train.stored import (
    StoredGroupCollator,
    StoredRankingObjective,
    UnmatchedTrainingTextError,
    freeze_store_parameters,
    open_stored_documents,
    per_candidate,
)
from pyserini_mores.train.trainer import TrainingSettings, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: (model type, config overrides): MORES under both reuse strategies, PreTTR split at l = 2 of 4
VARIANTS = [("mores", {"reuse": "s1"}), ("mores", {"reuse": "s2"}), ("prettr", {})]


@pytest.fixture(scope="module")
def triples(tmp_path_factory) -> Path:
    topics, qrels = read_topics(TOPICS), read_qrels(QRELS)
    texts = dict(read_collection(COLLECTION))
    found, _ = mine_negatives(topics, qrels, {qid: list(texts) for qid in topics}, lambda ids: [texts[i] for i in ids],
                              negatives_per_query=3, depth=len(texts), seed=1)
    path = tmp_path_factory.mktemp("stored-triples") / "triples.tsv"
    write_triples(path, found)
    return path


def _groups_of_every_query(triples: Path, per_query: int = 2) -> list:
    """The first ``per_query`` groups of every query: one batch then pairs each candidate with its own group's query
    only if the stored objective keeps the groups' queries apart (the file's first groups all share one query)."""
    groups, taken = [], Counter()
    for group in load_groups(triples):
        if taken[group.query] < per_query:
            groups.append(group)
            taken[group.query] += 1
    assert len(taken) == 4
    return groups


def _saved_model_and_sidecar(tmp_path: Path, tiny_index: Path, tokenizer, model_type: str, overrides: dict):
    model = _tiny_model(model_type, tokenizer, **overrides)
    with torch.no_grad():  # std 0.02 heads score everything alike; a wide head makes loss differences visible
        model.ranking_head.weight.normal_(std=1.0)
    model.save_pretrained(tmp_path / "init")
    model = load_model(model_type, tmp_path / "init")
    searcher = open_searcher(tiny_index)
    sidecar = build_sidecar(searcher, model, tmp_path / "sidecar", reranker_name=model_type, dtype="float32",
                            batch_size=4, progress=False)
    searcher.close()
    return tmp_path / "init", model, sidecar


@pytest.mark.parametrize("loss", ["pointwise", "listwise", "distill"])
@pytest.mark.parametrize("model_type, overrides", VARIANTS)
def test_loss_from_stored_documents_equals_the_training_forward_from_text(tmp_path, tiny_index, tokenizer, triples,
                                                                         model_type, overrides, loss):
    _, model, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, model_type, overrides)
    model.eval()  # dropout off: the two paths must then agree to rounding
    groups = _groups_of_every_query(triples)
    if loss == "distill":  # a made-up teacher's scores
        groups = [replace(group, teacher_scores=(1.0 + index, -float(index))) for index, group in enumerate(groups)]
    documents = open_stored_documents(model, sidecar, tiny_index)
    with torch.no_grad():
        from_text = RankingObjective(model, loss)(**GroupCollator(model)(groups))["loss"]
        stored = StoredRankingObjective(model, loss)(**StoredGroupCollator(model, documents)(groups))["loss"]
    assert from_text > 0.05
    torch.testing.assert_close(stored, from_text, rtol=0, atol=1e-5)


@pytest.mark.parametrize("loss", ["pointwise", "listwise"])
@pytest.mark.parametrize("model_type, overrides", VARIANTS)
def test_hidden_state_distillation_from_stored_documents_equals_the_one_from_text(tmp_path, tiny_index, tokenizer,
                                                                                  triples, model_type, overrides,
                                                                                  loss):
    """The teacher reads the triples' texts; the student its stored documents: the same losses as from text."""
    _, model, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, model_type, overrides)
    model.eval()
    teacher = _tiny_model("cross-encoder", tokenizer)  # 2 layers: the student's 2 blocks (PreTTR: l = 2 of 4)
    hidden = HiddenStateDistillation(teacher, model, weight=0.5)
    groups = _groups_of_every_query(triples)
    documents = open_stored_documents(model, sidecar, tiny_index)
    with torch.no_grad():
        from_text = RankingObjective(model, loss, hidden=hidden)(**GroupCollator(model, hidden)(groups))
        stored = StoredRankingObjective(model, loss, hidden=hidden)(
            **StoredGroupCollator(model, documents, hidden)(groups))
    assert from_text["hidden_loss"] > 0.01
    for name in ("loss", "ranking_loss", "hidden_loss"):
        torch.testing.assert_close(stored[name], from_text[name], rtol=0, atol=1e-5)


def test_training_against_the_sidecar_with_a_hidden_teacher(tmp_path, tiny_index, tokenizer, triples):
    init, model, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, "mores", {"reuse": "s2"})
    _tiny_model("cross-encoder", tokenizer).save_pretrained(tmp_path / "teacher")
    settings = TrainingSettings(model_type="mores", init=str(init), triples=str(triples), output=str(tmp_path / "out"),
                                batch_size=8, max_steps=3, lr=1e-2, seed=3, save_steps=1000, logging_steps=1,
                                doc_sidecar=str(sidecar), doc_index=str(tiny_index),
                                hidden_teacher=str(tmp_path / "teacher"))
    result = train(settings, progress=False)
    assert all(entry["hidden_loss"] > 0 for entry in result.log_history)
    assert result.model.store_fingerprint() == model.store_fingerprint()


#: every model that scores stored documents, and the code paths of ``score`` that differ in how they use the query
PER_CANDIDATE_VARIANTS = [
    ("mores", {"reuse": "s1"}), ("mores", {"reuse": "s2", "pooling": "avg"}),
    ("prettr", {}), ("prettr", {"join_layer": 3}), ("prettr", {"join_layer": 3, "compression_dim": 16}),
    ("tk", {}), ("maxsim", {}),
]


@pytest.mark.parametrize("model_type, overrides", PER_CANDIDATE_VARIANTS)
def test_per_candidate_query_states_score_as_each_query_alone(tokenizer, model_type, overrides):
    """What the batched stored objective relies on: ``score`` with a query state repeated per candidate
    (:func:`per_candidate`) equals scoring each group against its own query."""
    model = _tiny_model(model_type, tokenizer, **overrides).eval()
    with torch.no_grad():  # weights far from BERT's 0.02, so that scores depend clearly on the query
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(std=0.2, generator=torch.Generator().manual_seed(5))
    queries = ["text editor", "web server reverse proxy", "python scientific arrays"]
    texts = ["vim is a text editor", "nginx is a web server and reverse proxy", "numpy arrays for python",
             "sqlite is a database engine in a single file", "emacs edits text", "apache serves the web"]
    with torch.no_grad():
        docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(texts)))
        alone = torch.cat([model.score(model.encode_query(model.tokenize_queries([query])),
                                       docs[2 * index:2 * index + 2], lengths[2 * index:2 * index + 2])
                           for index, query in enumerate(queries)])
        batched = model.score(per_candidate(model.encode_query(model.tokenize_queries(queries)), 2), docs, lengths)
        first_query_only = model.score(model.encode_query(model.tokenize_queries(queries[:1])), docs, lengths)
    assert (first_query_only[2:] - alone[2:]).abs().max() > 1e-3, "the scores hardly depend on the query"
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5)


def test_per_candidate_refuses_a_state_it_cannot_repeat():
    with pytest.raises(TypeError, match="cannot repeat a query state of type Tensor per candidate"):
        per_candidate(torch.zeros(2, 3), 4)


@pytest.mark.parametrize("model_type, overrides", VARIANTS)
def test_training_against_the_sidecar_changes_only_what_runs_online(tmp_path, tiny_index, tokenizer, triples,
                                                                    model_type, overrides):
    init, model, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, model_type, overrides)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    stored_names = {name for name, _ in model.store_parameters()}
    settings = TrainingSettings(model_type=model_type, init=str(init), triples=str(triples),
                                output=str(tmp_path / "out"), batch_size=8, max_steps=5, lr=1e-2, seed=3,
                                save_steps=1000, doc_sidecar=str(sidecar), doc_index=str(tiny_index))
    trained = train(settings, progress=False).model
    after = trained.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed, "nothing trained"
    assert not changed & stored_names, f"stored-side parameters changed: {sorted(changed & stored_names)[:3]}"
    assert trained.store_fingerprint() == model.store_fingerprint()
    reloaded = load_model(model_type, tmp_path / "out")
    with open_sidecar(sidecar, expect_model_fingerprint=reloaded.store_fingerprint()) as reader:
        assert reader.num_docs == 20  # the trained model opens the sidecar it trained against


def test_passages_outside_the_index_are_refused_before_training(tmp_path, tiny_index, tokenizer):
    _, model, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, "mores", {"reuse": "s1"})
    documents = open_stored_documents(model, sidecar, tiny_index)
    known = next(iter(dict(read_collection(COLLECTION)).values()))
    groups = [TrainingGroup("q", known, ("no such passage in the index", "nor this one"))]
    with pytest.raises(UnmatchedTrainingTextError,
                       match=r"2 training passage\(s\) are not documents of the sidecar's index .*"
                             r"'no such passage in the index'.*mine the triples from this index"):
        documents.check_groups(groups)


def test_a_sidecar_of_another_model_is_refused(tmp_path, tiny_index, tokenizer):
    _, _, sidecar = _saved_model_and_sidecar(tmp_path, tiny_index, tokenizer, "mores", {"reuse": "s1"})
    other = _tiny_model("mores", tokenizer, reuse="s2")
    with pytest.raises(Exception, match="fingerprint|model"):
        open_stored_documents(other, sidecar, tiny_index)


def test_models_that_store_nothing_cannot_train_against_a_sidecar(tokenizer):
    with pytest.raises(ValueError, match="a 'cross-encoder' model stores nothing"):
        freeze_store_parameters(_tiny_model("cross-encoder", tokenizer))


def test_the_default_sidecar_is_found_beside_the_index_or_its_build_command_given(tmp_path, tiny_index, tokenizer):
    from pyserini_mores.search import default_sidecar_path
    from pyserini_mores.train.stored import DEFAULT_SIDECAR

    _tiny_model("mores", tokenizer, reuse="s1").save_pretrained(tmp_path / "init")
    model = load_model("mores", tmp_path / "init", reuse="s1")
    with pytest.raises(FileNotFoundError,
                       match=r"no sidecar of this mores model beside the index .*build it first: python -m "
                             rf"pyserini_mores\.sidecar build --index {tiny_index} --reranker mores --model "
                             rf"{tmp_path / 'init'} --model-arg reuse=s1$"):
        open_stored_documents(model, DEFAULT_SIDECAR, tiny_index)
    path = default_sidecar_path(tiny_index, "mores", model)
    searcher = open_searcher(tiny_index)
    build_sidecar(searcher, model, path, reranker_name="mores", dtype="float32", batch_size=4, progress=False)
    searcher.close()
    try:
        assert len(open_stored_documents(model, DEFAULT_SIDECAR, tiny_index)) == 20
    finally:
        import shutil

        shutil.rmtree(path)  # the tiny index is shared by the session

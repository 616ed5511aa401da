"""pygaggle's contract (``rerank`` never mutates its input; ``hits_to_texts`` carries the text; candidates are one
document each) and sentence-transformers' (``rank`` and ``predict`` on plain strings), for every reranker."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from pyserini_mores import get_reranker
from pyserini_mores.index import fetch_texts, open_searcher
from pyserini_mores.sidecar import open_sidecar
from pyserini_mores.types import CandidateError, Query, Text, hits_to_texts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "a configurable text editor"
DOCIDS = ["d04", "d05", "d01", "d02", "d03"]


@pytest.fixture(scope="module")
def documents(tiny_documents) -> list[str]:
    by_id = {record["id"]: record["contents"] for record in tiny_documents}
    return [by_id[docid] for docid in DOCIDS]


@pytest.fixture(scope="module")
def from_text(tiny_maxsim_dir):
    return get_reranker("maxsim", model=tiny_maxsim_dir)


@pytest.fixture(scope="module")
def from_sidecar(tiny_maxsim_dir, maxsim_sidecar):
    return get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=open_sidecar(maxsim_sidecar))


def _texts(documents) -> list[Text]:
    return [Text(text, {"docid": docid, "lucene_docid": -1}, score=10.0 - i)
            for i, (docid, text) in enumerate(zip(DOCIDS, documents))]


def _state(texts: list[Text]) -> list:
    return [(text.text, copy.deepcopy(text.metadata), text.score, text.title) for text in texts]


@pytest.mark.parametrize("name", ["bm25", "maxsim text", "maxsim sidecar"])
def test_rerank_returns_new_texts_and_leaves_its_input_as_it_was(name, documents, from_text, from_sidecar):
    reranker = {"bm25": get_reranker("bm25"), "maxsim text": from_text, "maxsim sidecar": from_sidecar}[name]
    texts = _texts(documents)
    before = _state(texts)
    ranked = reranker.rerank(Query(QUERY), texts)
    assert _state(texts) == before
    assert not {id(text) for text in ranked} & {id(text) for text in texts}
    assert not {id(text.metadata) for text in ranked} & {id(text.metadata) for text in texts}
    assert sorted(text.id for text in ranked) == sorted(DOCIDS)
    assert {text.id: text.metadata["first_stage_score"] for text in ranked} == {t.id: t.score for t in texts}
    if name != "bm25":
        assert [text.score for text in ranked] != [text.score for text in texts]  # rescored, on the copies


def test_rerank_until_leaves_its_input_as_it_was(documents, from_sidecar):
    import time

    texts = _texts(documents)
    before = _state(texts)
    ranked = from_sidecar.rerank_until(Query(QUERY), texts, time.monotonic() + 60)
    assert _state(texts) == before and len(ranked) == len(texts)


@pytest.mark.parametrize("texts, message", [
    ([Text("x", None)], "candidate 0 has no metadata (got NoneType): give every Text metadata={'docid': ...}"),
    ([Text("x", {"docid": "a"}), Text("y", {"lucene_docid": 2})],
     "candidate 1 has no 'docid' in its metadata (keys: lucene_docid): give every Text metadata={'docid': ...}"),
    ([Text("x", {})], "candidate 0 has no 'docid' in its metadata (keys: none)"),
    ([Text("x", {"docid": "a"}), Text("y", {"docid": "b"}), Text("z", {"docid": "a"})],
     "candidates 0 and 2 have the same docid 'a': each candidate must be a different document"),
])
@pytest.mark.parametrize("name", ["bm25", "maxsim"])
def test_candidates_without_a_docid_or_with_a_repeated_one_are_one_clear_error(texts, message, name,
                                                                               tiny_maxsim_dir):
    from pyserini_mores.errors import UserFixableError

    reranker = get_reranker("bm25") if name == "bm25" else get_reranker("maxsim", model=tiny_maxsim_dir)
    with pytest.raises(CandidateError) as raised:
        reranker.rerank(Query(QUERY), texts)
    assert str(raised.value).startswith(message) and isinstance(raised.value, UserFixableError)


def test_hits_to_texts_carries_the_text_raw_field_and_docid(tiny_index):
    searcher = open_searcher(tiny_index)
    hits = searcher.search("text editor", k=5)
    texts = hits_to_texts(hits)
    assert [text.text for text in texts] == fetch_texts(searcher, [hit.docid for hit in hits])
    assert [text.metadata["raw"] for text in texts] == [searcher.doc(hit.docid).raw() for hit in hits]
    assert [json.loads(text.metadata["raw"])["contents"] for text in texts] == [text.text for text in texts]
    assert [(text.id, text.score, text.metadata["lucene_docid"]) for text in texts] == \
        [(hit.docid, hit.score, hit.lucene_docid) for hit in hits]
    assert [text.text for text in hits_to_texts(hits, "raw")] == [text.metadata["raw"] for text in texts]
    assert [text.text for text in hits_to_texts(hits, field="contents")] == [None] * len(hits)  # raw is stored
    with pytest.raises(ValueError, match="field must be one of text, raw, contents, not 'body'"):
        hits_to_texts(hits, "body")


@pytest.mark.parametrize("name", ["bm25", "maxsim", "tk", "mores", "prettr", "cross-encoder"])
def test_rank_and_predict_agree_with_rerank_for_every_reranker(name, documents, tiny_maxsim_dir, tokenizer):
    reranker = get_reranker("bm25") if name == "bm25" else _tiny_reranker(name, tiny_maxsim_dir, tokenizer)
    texts = [Text(text, {"docid": str(i)}) for i, text in enumerate(documents)]
    expected = {int(text.id): text.score for text in reranker.rerank(Query(QUERY), texts)}
    ranked = reranker.rank(QUERY, documents, return_documents=True, batch_size=2)
    assert [result["corpus_id"] for result in ranked] == \
        sorted(range(len(documents)), key=lambda i: -expected[i])
    # batches of 2 pad the documents otherwise: float32 rounding apart, the same scores
    assert {result["corpus_id"]: result["score"] for result in ranked} == pytest.approx(expected, rel=1e-5)
    assert all(result["text"] == documents[result["corpus_id"]] for result in ranked)
    assert reranker.rank(QUERY, documents, top_k=2, batch_size=2) == [{k: v for k, v in r.items() if k != "text"}
                                                        for r in ranked[:2]]
    pairs = [(QUERY, documents[0]), ("web server", documents[1]), (QUERY, documents[2])]
    predicted = reranker.predict(pairs)
    assert isinstance(predicted, np.ndarray) and predicted.dtype == np.float32 and predicted.shape == (3,)
    assert predicted[[0, 2]].tolist() == pytest.approx([expected[0], expected[2]], rel=1e-5)
    assert predicted[1] == pytest.approx(reranker.rank("web server", [documents[1]])[0]["score"], rel=1e-5)


def test_rank_from_the_sidecar_equals_rank_from_the_text(documents, from_text, from_sidecar):
    by_text = from_text.rank(QUERY, documents)
    by_sidecar = from_sidecar.rank(QUERY, None, doc_ids=DOCIDS)
    assert [r["corpus_id"] for r in by_sidecar] == [r["corpus_id"] for r in by_text]
    assert [r["score"] for r in by_sidecar] == pytest.approx([r["score"] for r in by_text], abs=1e-5)
    # without doc_ids the sidecar's reranker encodes the strings; they are not the sidecar's documents
    assert from_sidecar.rank(QUERY, documents) == by_text
    # doc_ids name the sidecar's documents: another text given beside them does not change their scores
    assert from_sidecar.rank(QUERY, ["unrelated"] * 5, doc_ids=DOCIDS) == by_sidecar
    with pytest.raises(CandidateError, match="candidates 0 and 1 have the same docid 'd04'"):
        from_sidecar.rank(QUERY, None, doc_ids=["d04", "d04"])
    with pytest.raises(ValueError, match="reranker 'maxsim' has no sidecar to read doc_ids from"):
        from_text.rank(QUERY, None, doc_ids=DOCIDS)
    with pytest.raises(ValueError, match="3 doc_ids for 5 documents"):
        from_text.rank(QUERY, documents, doc_ids=DOCIDS[:3])
    assert from_text.rank(QUERY, []) == [] and from_text.predict([]).shape == (0,)


def _tiny_reranker(name, tiny_maxsim_dir, tokenizer):
    """A random-weight reranker of each model type, 2 layers 32 wide, on the real MiniLM tokenizer."""
    import torch
    from tiny_models import spread_tk_scores, spread_weights

    from pyserini_mores.models._layers import BertDims

    if name == "maxsim":
        return get_reranker("maxsim", model=tiny_maxsim_dir)
    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    if name == "mores":
        from pyserini_mores.models.mores import MoresConfig, MoresModel

        model = spread_weights(MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, doc_max_length=64),
                                                  tokenizer))
    elif name == "prettr":
        from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

        model = spread_weights(PreTTRModel(PreTTRConfig(encoder=dims, doc_max_length=64), tokenizer))
    elif name == "tk":
        from pyserini_mores.models.tk import TKConfig, TKModel

        model = spread_tk_scores(TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2,
                                                  num_heads=4, head_dim=8, ffn_dim=16, doc_max_length=64), tokenizer))
    else:
        from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig

        model = spread_weights(CrossEncoder(CrossEncoderConfig(encoder=dims, doc_max_length=64), tokenizer))
    return get_reranker(name, model=model.eval())

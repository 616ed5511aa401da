"""``RerankingSearcher`` is a drop-in for Pyserini's ``LuceneSearcher``: one script of what a Pyserini user calls runs
against both on a real index and gives the same results (the reranked scores and order aside)."""
from __future__ import annotations

import pytest

from pyserini_mores._jvm import import_pyserini
from pyserini_mores.index import IndexNotFoundError
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.types import CandidateError, RerankedHit

QUERIES = ["text editor", "web server reverse proxy", "package manager", "the of and"]
QIDS = ["q1", "q2", "q3", "q4"]


def describe(hits, ordered: bool = True) -> list | set:
    """Every attribute Pyserini's hits carry, as plain values (the score too, when ``ordered``)."""
    rows = [(hit.docid, hit.lucene_docid, hit.lucene_document.get("id"), hit.lucene_document.get("raw"),
             hit.lucene_document.get("contents")) for hit in hits]
    if ordered:
        return [row + (float(hit.score),) for row, hit in zip(rows, hits)]
    return set(rows)


def scores(hits) -> list[tuple[str, float]]:
    return [(hit.docid, round(float(hit.score), 5)) for hit in hits]


def pyserini_user_script(searcher, ordered: bool = True) -> dict:
    """What a Pyserini user does with a ``LuceneSearcher``, every answer as plain values. With ``ordered=False`` hits
    are compared as sets and without scores (a reranker reorders and rescores them)."""
    out: dict = {"num_docs": searcher.num_docs, "index_dir": str(searcher.index_dir),
                 "prebuilt_index_name": searcher.prebuilt_index_name}
    hits = searcher.search("text editor", k=5)
    out["search"] = describe(hits, ordered)
    out["batch_search"] = {qid: describe(found, ordered)
                           for qid, found in searcher.batch_search(QUERIES, QIDS, k=5, threads=2).items()}
    out["fields"] = describe(searcher.search("text editor", k=5, fields={"contents": 2.0}), ordered)
    out["remove_dups"] = describe(searcher.search("package manager", k=5, remove_dups=True), ordered)
    document = searcher.doc("d04")
    out["doc"] = (document.docid(), document.raw(), document.contents(), document.id())
    out["doc by lucene docid"] = searcher.doc(3).docid()
    out["doc absent"] = searcher.doc("no-such-doc")
    out["batch_doc"] = {docid: found.raw() for docid, found in searcher.batch_doc(["d01", "d02", "zz"], 2).items()}
    out["doc_by_field"] = searcher.doc_by_field("id", "d05").docid()
    out["similarity"] = searcher.get_similarity().toString()
    searcher.set_bm25(1.2, 0.75)
    out["set_bm25"] = (searcher.get_similarity().toString(), describe(searcher.search("text editor", k=5), ordered))
    out["rm3 before"] = (searcher.is_using_rm3(), searcher.get_feedback_terms("text editor"))
    searcher.set_rm3(fb_terms=5, fb_docs=3, original_query_weight=0.6)
    out["set_rm3"] = (searcher.is_using_rm3(), searcher.get_feedback_terms("text editor"),
                      describe(searcher.search("text editor", k=5), ordered))
    searcher.unset_rm3()
    out["unset_rm3"] = (searcher.is_using_rm3(), describe(searcher.search("text editor", k=5), ordered))
    searcher.set_rocchio(top_fb_terms=5, top_fb_docs=3)
    out["set_rocchio"] = (searcher.is_using_rocchio(), describe(searcher.search("text editor", k=5), ordered))
    searcher.unset_rocchio()
    out["unset_rocchio"] = searcher.is_using_rocchio()
    searcher.set_qld(500)
    out["set_qld"] = (searcher.get_similarity().toString(), describe(searcher.search("text editor", k=5), ordered))
    searcher.close()
    return out


def test_the_same_script_gives_the_same_answers_as_lucene_searcher(tiny_index):
    lucene = import_pyserini("pyserini.search.lucene").LuceneSearcher(str(tiny_index))
    expected = pyserini_user_script(lucene)
    assert expected["set_rm3"][2] != expected["search"]  # the script exercises what it claims to
    assert expected["set_qld"][1] != expected["search"]
    assert pyserini_user_script(RerankingSearcher(tiny_index, "bm25", rerank_depth=5)) == expected


def test_with_a_learned_reranker_the_same_documents_come_back(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    lucene = import_pyserini("pyserini.search.lucene").LuceneSearcher(str(tiny_index))
    expected = pyserini_user_script(lucene, ordered=False)
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=5)
    assert pyserini_user_script(searcher, ordered=False) == expected


def test_identity_reranker_hits_keep_bm25_scores_and_order(tiny_index):
    lucene = import_pyserini("pyserini.search.lucene").LuceneSearcher(str(tiny_index))
    searcher = RerankingSearcher(tiny_index, "bm25", rerank_depth=10)
    for query in QUERIES:
        assert scores(searcher.search(query, k=10)) == scores(lucene.search(query, k=10))
    searcher.set_rm3()
    lucene.set_rm3()
    assert scores(searcher.search("text editor", k=10)) == scores(lucene.search("text editor", k=10))


def test_hits_carry_raw_and_contents_and_read_documents_lazily(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=3)
    lucene = import_pyserini("pyserini.search.lucene").LuceneSearcher(str(tiny_index))
    hits = searcher.search("text editor", k=6)  # reranked head and BM25 tail alike
    for hit in hits:
        assert hit.raw == lucene.doc(hit.docid).raw() and f'"id" : "{hit.docid}"' in hit.raw
        assert hit.contents is None  # the package's indexer stores raw, not contents
    run_hits = searcher.rerank_run({"q": [("d05", 2.0), ("d04", 1.0)]}, {"q": "text editor"}, k=2)["q"]
    assert run_hits[0]._document is None  # nothing read until asked for
    assert {hit.docid: hit.lucene_document.get("id") for hit in run_hits} == {"d04": "d04", "d05": "d05"}
    assert RerankedHit("x", 1.0).lucene_document is None and RerankedHit("x", 1.0).raw is None


def test_options_a_first_stage_cannot_take_and_query_objects_are_refused(tiny_index):
    searcher = RerankingSearcher(tiny_index, "bm25")
    with pytest.raises(TypeError, match="the reranker needs the query's text: search with a string, not a int"):
        searcher.search(3)


def test_duplicate_docids_in_a_run_are_one_clear_error(tiny_index):
    searcher = RerankingSearcher(tiny_index, "bm25", rerank_depth=1)  # the second d04 is below the rerank depth
    with pytest.raises(CandidateError, match="candidates 0 and 2 have the same docid 'd04': each candidate must be a "
                                             "different document"):
        searcher.rerank_run({"q": [("d04", 3.0), ("d05", 2.0), ("d04", 1.0)]}, {"q": "text editor"})


def test_prebuilt_index_class_methods(capsys):
    lucene = import_pyserini("pyserini.search.lucene").LuceneSearcher
    lucene.list_prebuilt_indexes()
    expected = capsys.readouterr().out
    RerankingSearcher.list_prebuilt_indexes()
    assert capsys.readouterr().out == expected and "msmarco-v1-passage" in expected
    with pytest.raises(IndexNotFoundError, match="'no-such-prebuilt' is neither an index directory nor a Pyserini "
                                                 "prebuilt index name"):
        RerankingSearcher.from_prebuilt_index("no-such-prebuilt")

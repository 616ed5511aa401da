"""First stages besides BM25: another first stage's candidates from a run (joined to the index by docid, whatever the
order of the run's lines), BM25 + RM3 through Pyserini's ``set_rm3``, a dense index through Pyserini's
``FaissSearcher``, and Pyserini's ``HybridSearcher`` of the two."""
from __future__ import annotations

import inspect
import logging
import random

import pytest

from pyserini_mores.formats import read_ranked_run, write_run
from pyserini_mores.search import Dense, RerankingSearcher, Rm3, UnknownDocidsError
from pyserini_mores.search.__main__ import main as search_main
from pyserini_mores.search.first_stage import Hybrid

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Queries with many, few and no BM25 hits on the 20-document collection.
TOPICS = {"q1": "text editor", "q3": "python scientific arrays", "q5": "package manager", "q7": "the of and",
          "q8": "linux", "q12": "version control system", "q13": "install upgrade remove packages",
          "q16": "an interpreter at its core"}
DEPTH, K = 5, 10  # fewer reranked than returned: the run's own order below the head shows


def hit_pairs(results: dict) -> dict:
    return {qid: [(hit.docid, round(hit.score, 5)) for hit in hits] for qid, hits in results.items()}


@pytest.fixture(scope="module", params=["sidecar", "text"])
def searcher(request, tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    """Rows from the sidecar's sorted docids, or (without a sidecar) from Lucene."""
    options = {"sidecar": None} if request.param == "text" else {"require_sidecar": True}
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH, **options)
    yield searcher
    searcher.close()


@pytest.fixture(scope="module")
def topics_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("topics") / "topics.tsv"
    path.write_text("".join(f"{qid}\t{text}\n" for qid, text in TOPICS.items()))
    return path


@pytest.fixture(scope="module")
def other_first_stage(tiny_documents):
    """Another first stage's run, as a dense retriever's would be: 12 of the 20 documents for each topic (most
    without a BM25 term in common with it), in an order of its own, with scores from 12 down."""
    docids = [document["id"] for document in tiny_documents]
    generator = random.Random(11)
    return {qid: [(docid, float(12 - rank)) for rank, docid in enumerate(generator.sample(docids, 12))]
            for qid in TOPICS}


def write_trec(path, run: dict, shuffle: bool = False) -> None:
    lines = [f"{qid} Q0 {docid} {rank} {score} other" for qid, hits in run.items()
             for rank, (docid, score) in enumerate(hits, start=1)]
    if shuffle:
        random.Random(7).shuffle(lines)
    path.write_text("".join(line + "\n" for line in lines))


def test_ranked_run_reads_the_same_whatever_the_line_order(tmp_path, other_first_stage):
    write_trec(tmp_path / "sorted.trec", other_first_stage)
    write_trec(tmp_path / "shuffled.trec", other_first_stage, shuffle=True)
    ranked = read_ranked_run(tmp_path / "sorted.trec")
    assert ranked == read_ranked_run(tmp_path / "shuffled.trec") == other_first_stage
    msmarco = tmp_path / "shuffled.tsv"
    lines = [f"{qid}\t{docid}\t{rank}" for qid, hits in other_first_stage.items()
             for rank, (docid, _) in enumerate(hits, start=1)]
    random.Random(3).shuffle(lines)
    msmarco.write_text("\n".join(lines) + "\n")
    assert {qid: [docid for docid, _ in hits] for qid, hits in read_ranked_run(msmarco).items()} == \
        {qid: [docid for docid, _ in hits] for qid, hits in other_first_stage.items()}


def test_equal_ranks_are_ordered_as_trec_eval_orders_them(tmp_path):
    (tmp_path / "ties.trec").write_text("q1 Q0 a 1 1.0 t\nq1 Q0 c 1 2.0 t\nq1 Q0 ab 1 1.0 t\nq1 Q0 b 1 1.0 t\n")
    assert [docid for docid, _ in read_ranked_run(tmp_path / "ties.trec")["q1"]] == ["c", "b", "ab", "a"]


def test_a_shuffled_run_file_reranks_as_the_sorted_one(searcher, tmp_path, other_first_stage):
    write_trec(tmp_path / "sorted.trec", other_first_stage)
    write_trec(tmp_path / "shuffled.trec", other_first_stage, shuffle=True)
    from_sorted = searcher.rerank_run(tmp_path / "sorted.trec", TOPICS, k=K)
    assert hit_pairs(searcher.rerank_run(tmp_path / "shuffled.trec", TOPICS, k=K)) == hit_pairs(from_sorted)
    assert hit_pairs(searcher.rerank_run(other_first_stage, TOPICS, k=K)) == hit_pairs(from_sorted)
    assert list(from_sorted) == list(TOPICS)
    for qid, hits in from_sorted.items():
        run_order = [docid for docid, _ in other_first_stage.get(qid, [])][:K]
        assert sorted(hit.docid for hit in hits) == sorted(run_order), qid
        assert [hit.docid for hit in hits[DEPTH:]] == run_order[DEPTH:], "below the head: the run's order"


def test_reranking_a_run_equals_reranking_the_same_candidates_as_bm25_hits(searcher):
    qids = list(TOPICS)
    bm25 = searcher.first_stage(list(TOPICS.values()), qids, k=K)
    run = {qid: [(hit.docid, hit.score) for hit in bm25[qid]] for qid in qids if bm25.get(qid)}
    from_run = searcher.rerank_run(run, TOPICS, k=K)
    assert hit_pairs(from_run) == hit_pairs(searcher.batch_search(list(TOPICS.values()), qids, k=K))
    for qid in run:
        assert [hit.lucene_docid for hit in from_run[qid]] == \
            [hit.lucene_docid for hit in searcher.rerank_hits(TOPICS[qid], bm25[qid])[0][:K]], "joined by docid"


def test_unknown_docids_are_an_error_naming_them_or_skipped(searcher, other_first_stage):
    qid = next(iter(other_first_stage))
    hits = other_first_stage[qid]  # unknown docids at the top and in the reranked head; the run is deep enough
    with_unknown = [("not-in-index-1", 99.0), *hits[:3], ("not-in-index-2", hits[3][1]), *hits[3:]]
    run = {**other_first_stage, qid: with_unknown}
    with pytest.raises(UnknownDocidsError, match="2 of the run's docids.*not-in-index-1, not-in-index-2") as raised:
        searcher.rerank_run(run, TOPICS, k=K)
    assert raised.value.docids == ["not-in-index-1", "not-in-index-2"]
    skipped = searcher.rerank_run(run, TOPICS, k=K, skip_unknown_docids=True)
    assert hit_pairs(skipped) == hit_pairs(searcher.rerank_run(other_first_stage, TOPICS, k=K))


def test_queries_without_topics_and_topics_without_run_are_named(searcher, other_first_stage, caplog):
    missing = list(TOPICS)[:2]
    run = {qid: hits for qid, hits in other_first_stage.items() if qid not in missing}
    run["extra-query"] = other_first_stage[next(iter(run))]
    with caplog.at_level(logging.WARNING, logger="pyserini_mores.search.first_stage"):
        results = searcher.rerank_run(run, TOPICS, k=K)
    assert "1 queries of the run have no topic" in caplog.text and "extra-query" in caplog.text
    assert all(qid in caplog.text for qid in missing) and "topics have no candidates in the run" in caplog.text
    assert list(results) == list(TOPICS) and all(results[qid] == [] for qid in missing)


def test_search_command_reranks_a_run(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path, other_first_stage,
                                      topics_file, capsys):
    run_file = tmp_path / "other.trec"
    write_trec(run_file, other_first_stage, shuffle=True)
    common = ["--index", str(tiny_index), "--topics", str(topics_file), "--hits", str(K), "--reranker", "maxsim",
              "--model", str(tiny_maxsim_dir), "--rerank-depth", str(DEPTH)]
    output = tmp_path / "reranked.trec"
    assert search_main(common + ["--run", str(run_file), "--run-format", "trec", "--output", str(output)]) == 0
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH, require_sidecar=True)
    write_run(tmp_path / "library.trec", searcher.rerank_run(other_first_stage, TOPICS, k=K),
              tag="pyserini_mores-maxsim")
    searcher.close()
    assert output.read_bytes() == (tmp_path / "library.trec").read_bytes()

    with run_file.open("a") as lines:
        lines.write("q1 Q0 not-in-index 0 50.0 other\n")  # ranked first: in q1's top candidates
    capsys.readouterr()
    assert search_main(common + ["--run", str(run_file), "--output", str(tmp_path / "failed.trec")]) == 2
    assert "not-in-index" in capsys.readouterr().err
    assert search_main(common + ["--run", str(run_file), "--skip-unknown-docids",
                                 "--output", str(tmp_path / "skipped.trec")]) == 0
    assert (tmp_path / "skipped.trec").read_bytes() == output.read_bytes()


# ------------------------------------------------------------------------------------------------------------- RM3

def test_rm3_changes_the_first_stage_and_is_reranked(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    qids, queries = list(TOPICS), list(TOPICS.values())
    bm25 = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH, require_sidecar=True)
    rm3 = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH, require_sidecar=True,
                            first_stage="bm25+rm3", rm3=Rm3(fb_terms=10, fb_docs=3, original_query_weight=0.5))
    assert rm3.searcher.is_using_rm3() and not bm25.searcher.is_using_rm3()
    plain, expanded = bm25.first_stage(queries, qids, k=K), rm3.first_stage(queries, qids, k=K)
    ranking = {qid: [hit.docid for hit in plain.get(qid, [])] for qid in qids}
    assert any(ranking[qid] != [hit.docid for hit in expanded.get(qid, [])] for qid in qids), "RM3 changed nothing"
    reranked = rm3.batch_search(queries, qids, k=K)
    for qid in qids:
        assert hit_pairs({qid: reranked[qid]}) == hit_pairs({qid: rm3.rerank_hits(TOPICS[qid], expanded[qid])[0][:K]})
    bm25.close()
    rm3.close()


def test_rm3_arguments_are_checked(tiny_index):
    with pytest.raises(ValueError, match="unknown first stage 'splade'"):
        RerankingSearcher(tiny_index, "bm25", first_stage="splade")
    with pytest.raises(ValueError, match="first_stage='dense' needs dense="):
        RerankingSearcher(tiny_index, "bm25", first_stage="dense")
    with pytest.raises(ValueError, match="original_query_weight"):
        Rm3(original_query_weight=1.5)


def test_search_command_with_rm3(tiny_index, tmp_path, topics_file, capsys):
    output = tmp_path / "rm3.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(topics_file), "--hits", str(K),
                        "--first-stage", "bm25+rm3", "--fb-terms", "10", "--fb-docs", "3",
                        "--original-query-weight", "0.5", "--output", str(output)]) == 0
    assert "RM3 fb_terms=10 fb_docs=3 original_query_weight=0.5" in capsys.readouterr().out
    assert output.read_text().strip()
    assert search_main(["--index", str(tiny_index), "--topics", str(topics_file), "--rm3", "--run",
                        str(output)]) == 2
    assert "--run replaces the first stage" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------- dense

def write_dense_index(path, documents: list[dict], docids: list[str] | None = None):
    """A faiss index Pyserini's ``FaissSearcher`` reads (``index``, ``docid``) of ``documents`` encoded by the offline
    MiniLM with Pyserini's own encoder (mean pooling, L2-normalised), as ``Dense(path)`` encodes queries."""
    import faiss
    import numpy as np

    from pyserini_mores._jvm import import_pyserini
    from pyserini_mores.models.backbones import offline_minilm_path

    encoder = import_pyserini("pyserini.encode").AutoQueryEncoder(str(offline_minilm_path()), pooling="mean",
                                                                   l2_norm=True)
    vectors = np.stack([encoder.encode(document["contents"]) for document in documents]).astype("float32")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    path.mkdir(parents=True)
    faiss.write_index(index, str(path / "index"))
    (path / "docid").write_text("".join(f"{docid}\n" for docid in docids or [d["id"] for d in documents]))
    return path


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory, tiny_documents):
    return write_dense_index(tmp_path_factory.mktemp("dense") / "minilm", tiny_documents)


def test_dense_first_stage_is_faiss_ranking_joined_by_docid(tiny_index, tiny_maxsim_dir, maxsim_sidecar,
                                                             dense_index):
    qids, queries = list(TOPICS), list(TOPICS.values())
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH,
                                 require_sidecar=True, first_stage="dense", dense=Dense(dense_index))
    faiss_ranking = searcher.dense_searcher.batch_search(queries, qids, k=K, threads=1)
    candidates = searcher.first_stage(queries, qids, k=K)
    sidecar = searcher.reranker.sidecar
    for qid in qids:
        assert [hit.docid for hit in candidates[qid]] == [hit.docid for hit in faiss_ranking[qid]], qid
        assert len(candidates[qid]) == K, "dense retrieval finds candidates where BM25 finds none"
        assert [hit.lucene_docid for hit in candidates[qid]] == \
            list(sidecar.rows_for_docids([hit.docid for hit in candidates[qid]])), "joined by docid"
    reranked = searcher.batch_search(queries, qids, k=K)
    for qid, query in TOPICS.items():
        expected = searcher.rerank_hits(query, candidates[qid])[0][:K]
        assert hit_pairs({qid: reranked[qid]}) == hit_pairs({qid: expected})
        assert hit_pairs({qid: searcher.search(query, k=K)}) == hit_pairs({qid: expected})
    searcher.close()


def test_a_dense_index_of_other_documents_is_refused(tiny_index, tiny_documents, tmp_path):
    foreign = write_dense_index(tmp_path / "foreign", tiny_documents[:3], docids=["d01", "x-02", "x-03"])
    with pytest.raises(ValueError, match="2 of 3 docids checked are not in the Lucene index.*x-02, x-03"):
        RerankingSearcher(tiny_index, "bm25", first_stage="dense", dense=Dense(foreign))


def test_search_command_with_a_dense_first_stage(tiny_index, tiny_maxsim_dir, maxsim_sidecar, dense_index,
                                                 topics_file, tmp_path, capsys):
    output = tmp_path / "dense.trec"
    assert search_main(["--index", str(tiny_index), "--topics", str(topics_file), "--hits", str(K),
                        "--reranker", "maxsim", "--model", str(tiny_maxsim_dir), "--rerank-depth", str(DEPTH),
                        "--first-stage", "dense", "--dense-index", str(dense_index), "--encoder", "minilm",
                        "--output", str(output)]) == 0
    assert f"first stage: dense index {dense_index}" in capsys.readouterr().out
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH,
                                 require_sidecar=True, first_stage="dense", dense=Dense(dense_index))
    write_run(tmp_path / "library.trec", searcher.batch_search(list(TOPICS.values()), list(TOPICS), k=K),
              tag="pyserini_mores-maxsim")
    searcher.close()
    assert output.read_bytes() == (tmp_path / "library.trec").read_bytes()
    assert search_main(["--index", str(tiny_index), "--topics", str(topics_file), "--first-stage", "dense"]) == 2
    assert "--dense-index go together" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------- hybrid

def pyserini_hybrid(searcher: RerankingSearcher, hybrid: Hybrid, queries: list[str], qids: list[str], depth: int):
    """Pyserini's own ``HybridSearcher`` over the searcher's BM25 and dense searchers, each searcher's top ``depth``
    fused into the top ``depth``: {qid: [(docid, score)]}."""
    from pyserini_mores._jvm import import_pyserini

    pyserini = import_pyserini("pyserini.search.hybrid").HybridSearcher(searcher.dense_searcher, searcher.searcher)
    found = pyserini.batch_search(queries, qids, k0=depth, k=depth, alpha=hybrid.alpha,
                                  normalization=hybrid.normalization, weight_on_dense=hybrid.weight_on_dense)
    return {qid: [(hit.docid, round(float(hit.score), 5)) for hit in found[qid]] for qid in qids}


def test_hybrid_defaults_are_pyserinis():
    from pyserini_mores._jvm import import_pyserini

    defaults = inspect.signature(import_pyserini("pyserini.search.hybrid").HybridSearcher.search).parameters
    assert Hybrid() == Hybrid(**{name: defaults[name].default for name in ("alpha", "normalization",
                                                                           "weight_on_dense")})


# Normalization divides by the range of each searcher's scores: only queries with BM25 hits of two scores or more.
SPREAD_TOPICS = {qid: TOPICS[qid] for qid in ("q1", "q3", "q5", "q12", "q13")}


@pytest.mark.parametrize("hybrid, topics", [(Hybrid(), TOPICS),
                                            (Hybrid(alpha=2.0, normalization=True, weight_on_dense=True),
                                             SPREAD_TOPICS)], ids=["defaults", "normalised"])
def test_hybrid_first_stage_is_pyserinis_fusion_joined_by_docid(tiny_index, tiny_maxsim_dir, maxsim_sidecar,
                                                                 dense_index, hybrid, topics):
    qids, queries = list(topics), list(topics.values())
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH,
                                 require_sidecar=True, first_stage="hybrid", dense=Dense(dense_index), hybrid=hybrid)
    assert searcher.hybrid == hybrid
    candidates = searcher.first_stage(queries, qids, k=K)
    depth = searcher.candidate_depth(K)
    assert hit_pairs(candidates) == pyserini_hybrid(searcher, hybrid, queries, qids, depth)
    dense = searcher.dense_searcher.batch_search(queries, qids, k=depth)
    bm25 = searcher.searcher.batch_search(queries, qids, k=depth)
    sidecar = searcher.reranker.sidecar
    for qid in qids:
        docids = [hit.docid for hit in candidates[qid]]
        assert set(docids) <= {hit.docid for hit in dense[qid]} | {hit.docid for hit in bm25[qid]}, qid
        assert [hit.lucene_docid for hit in candidates[qid]] == list(sidecar.rows_for_docids(docids)), qid
    assert any([hit.docid for hit in candidates[qid]] != [hit.docid for hit in dense[qid]] for qid in qids), \
        "BM25 changed no dense ranking"
    reranked = searcher.batch_search(queries, qids, k=K)
    for qid, query in topics.items():
        expected = searcher.rerank_hits(query, candidates[qid])[0][:K]
        assert hit_pairs({qid: reranked[qid]}) == hit_pairs({qid: expected})
        assert hit_pairs({qid: searcher.search(query, k=K)}) == hit_pairs({qid: expected})
    searcher.close()


def test_hybrid_arguments_are_checked(tiny_index, dense_index):
    with pytest.raises(ValueError, match="first_stage='hybrid' needs dense="):
        RerankingSearcher(tiny_index, "bm25", first_stage="hybrid")
    with pytest.raises(ValueError, match="hybrid= is for the hybrid first stage, not 'dense'"):
        RerankingSearcher(tiny_index, "bm25", first_stage="dense", dense=Dense(dense_index), hybrid=Hybrid())
    with pytest.raises(ValueError, match="dense= is for the dense and hybrid first stages, not 'bm25'"):
        RerankingSearcher(tiny_index, "bm25", dense=Dense(dense_index))
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        Hybrid(alpha=float("nan"))
    searcher = RerankingSearcher(tiny_index, "bm25", first_stage="hybrid", dense=Dense(dense_index),
                                 hybrid=Hybrid(normalization=True))
    with pytest.raises(ValueError, match="hits of 2 queries all score the same \\(q8, q16\\)"):
        searcher.first_stage(list(TOPICS.values()), list(TOPICS), k=K)  # one BM25 hit each: a range of 0
    searcher.close()


def test_search_command_with_a_hybrid_first_stage(tiny_index, tiny_maxsim_dir, maxsim_sidecar, dense_index,
                                                  topics_file, tmp_path, capsys):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{qid} 0 {docid} 1\n" for qid, docid in [("q1", "d04"), ("q3", "d20"), ("q5", "d01")]))
    output = tmp_path / "hybrid.trec"
    common = ["--index", str(tiny_index), "--topics", str(topics_file), "--hits", str(K)]
    assert search_main(common + ["--reranker", "maxsim", "--model", str(tiny_maxsim_dir), "--rerank-depth",
                                 str(DEPTH), "--first-stage", "hybrid", "--dense-index", str(dense_index),
                                 "--hybrid-alpha", "0.5", "--hybrid-weight-on-dense", "--qrels", str(qrels),
                                 "--examples", "0", "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "first stage: hybrid of BM25 k1=" in printed
    assert f"and dense index {dense_index} (alpha=0.5 normalization=False weight_on_dense=True)" in printed
    rows = [line.split()[0] for line in printed.splitlines() if line.startswith(("hybrid ", "maxsim "))]
    assert rows == ["hybrid", "maxsim"], printed
    hybrid = Hybrid(alpha=0.5, weight_on_dense=True)
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=DEPTH,
                                 require_sidecar=True, first_stage="hybrid", dense=Dense(dense_index), hybrid=hybrid)
    write_run(tmp_path / "library.trec", searcher.batch_search(list(TOPICS.values()), list(TOPICS), k=K),
              tag="pyserini_mores-maxsim")
    searcher.close()
    assert output.read_bytes() == (tmp_path / "library.trec").read_bytes()

    assert search_main(common + ["--first-stage", "hybrid"]) == 2
    assert "--first-stage hybrid and --dense-index go together" in capsys.readouterr().err
    assert search_main(common + ["--first-stage", "dense", "--dense-index", str(dense_index),
                                 "--hybrid-alpha", "0.5"]) == 2
    assert "are for --first-stage hybrid" in capsys.readouterr().err
    assert search_main(common + ["--dense-index", str(dense_index)]) == 2
    assert "--dense-index is for --first-stage dense or hybrid" in capsys.readouterr().err

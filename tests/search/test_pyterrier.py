"""The PyTerrier transformers: a real PyTerrier pipeline (the package's BM25 first stage >> a reranker) and
``pt.Experiment`` on the embedded debian-packages sample give what ``python -m pyserini_mores.search`` gives."""
from __future__ import annotations

import pandas as pd
import pytest

pt = pytest.importorskip("pyterrier")

from pyserini_mores.eval.metrics import evaluate  # noqa: E402
from pyserini_mores.formats import read_qrels, read_ranked_run, read_topics  # noqa: E402
from pyserini_mores.pyterrier import FirstStage, MoresReranker, first_stage, reranker  # noqa: E402
from pyserini_mores.search import RerankingSearcher  # noqa: E402
from pyserini_mores.types import CandidateError  # noqa: E402

QUERIES = 20
DEPTH = 50


@pytest.mark.slow
def test_a_pyterrier_pipeline_gets_the_search_commands_mrr(tmp_path):
    from pyterrier.measures import RR

    from pyserini_mores.search.__main__ import main
    from pyserini_mores.search.sample import DEFAULT_MODEL, DEFAULT_RERANKER, prepare_sample

    run = tmp_path / "run.trec"
    assert main(["--max-queries", str(QUERIES), "--rerank-depth", str(DEPTH), "--hits", str(DEPTH),
                 "--output", str(run)]) == 0
    sample = prepare_sample()
    topics = dict(list(read_topics(sample.topics).items())[:QUERIES])
    qrels = {qid: judged for qid, judged in read_qrels(sample.qrels).items() if qid in topics}
    expected = evaluate(str(run), qrels, ["MRR@10"]).aggregate["MRR@10"]

    pipeline = first_stage(sample.index, num_results=DEPTH) >> reranker(DEFAULT_RERANKER, index=sample.index,
                                                                        model=DEFAULT_MODEL, require_sidecar=True)
    topics_frame = pd.DataFrame({"qid": list(topics), "query": list(topics.values())})
    qrels_frame = pd.DataFrame([(qid, docid, label) for qid, judged in qrels.items()
                                for docid, label in judged.items()], columns=["qid", "docno", "label"])
    result = pt.Experiment([pipeline], topics_frame, qrels_frame, eval_metrics=[RR @ 10], names=["maxsim"],
                           save_dir=str(tmp_path))
    assert 0.3 < expected < 1.0  # the trained model on the sample, not a degenerate run
    assert abs(float(result["RR@10"].iloc[0]) - expected) < 1e-9

    # the same top 10 for every query, in the same order
    ranked = pt.io.read_results(str(tmp_path / "maxsim.res.gz"))
    run_top = {qid: [docid for docid, _ in hits[:10]] for qid, hits in read_ranked_run(run).items()}
    assert {qid: list(group.sort_values("rank")["docno"][:10]) for qid, group in ranked.groupby("qid")} == run_top


def test_reranker_transformer_reads_the_sidecar_by_docno_or_scores_text(tiny_index, tiny_maxsim_dir, maxsim_sidecar,
                                                                      tiny_documents):
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=5)
    assert searcher.sidecar_path is not None
    queries = pd.DataFrame({"qid": ["q1", "q2"], "query": ["text editor", "web server reverse proxy"]})
    candidates = FirstStage(searcher, num_results=5).transform(queries)
    assert list(candidates.columns) == ["qid", "query", "docno", "score", "rank"]
    expected = {qid: [(hit.docid, hit.score) for hit in searcher.search(text, k=5)]
                for qid, text in zip(queries["qid"], queries["query"])}

    def ranking(frame):
        return {qid: list(zip(group["docno"], group["score"])) for qid, group in frame.groupby("qid", sort=False)}

    by_sidecar = MoresReranker(searcher).transform(candidates)
    assert ranking(by_sidecar) == expected
    assert list(by_sidecar["rank"]) == [rank for hits in expected.values() for rank in range(len(hits))]
    assert list(by_sidecar["query"]) == [text for qid, text in zip(queries["qid"], queries["query"])
                                         for _ in expected[qid]]

    texts = {record["id"]: record["contents"] for record in tiny_documents}
    with_text = candidates.assign(text=[texts[docno] for docno in candidates["docno"]])
    by_text = MoresReranker("maxsim", model=tiny_maxsim_dir).transform(with_text)
    assert {qid: [docid for docid, _ in hits] for qid, hits in ranking(by_text).items()} == \
        {qid: [docid for docid, _ in hits] for qid, hits in expected.items()}
    for qid, hits in ranking(by_text).items():
        assert [score for _, score in hits] == pytest.approx([score for _, score in expected[qid]], abs=1e-5)
    assert (by_text["text"] == [texts[docno] for docno in by_text["docno"]]).all()  # columns kept with their rows

    text_reranker = MoresReranker("maxsim", model=tiny_maxsim_dir)
    with pytest.raises(KeyError, match="reranker 'maxsim' scores text: give the frame a 'text' column"):
        text_reranker.transform(candidates)
    with pytest.raises(KeyError, match="needs the columns qid, query, docno"):
        text_reranker.transform(queries)
    with pytest.raises(CandidateError, match="same docid"):
        MoresReranker(searcher).transform(pd.concat([candidates[:2], candidates[:1]]))
    empty = MoresReranker(searcher).transform(candidates[:0])
    assert len(empty) == 0 and {"score", "rank"} <= set(empty.columns)


def test_a_transformer_reads_long_documents_as_its_options_say(tiny_maxsim_dir, tiny_documents):
    """The aggregation and the windows reach the reranker, and a windowed transformer scores what the reranker
    scores for the same texts."""
    from pyserini_mores import get_reranker
    from pyserini_mores.windows import WindowOptions

    windows = WindowOptions(window=8, stride=4, max_windows=4)
    transformer = MoresReranker("maxsim", model=tiny_maxsim_dir, aggregate="sump", windows=windows)
    assert (transformer.reranker.aggregate, transformer.reranker.windows) == ("sump", windows)
    frame = pd.DataFrame({"qid": "q1", "query": "text editor", "docno": [doc["id"] for doc in tiny_documents[:4]],
                          "text": [doc["contents"] for doc in tiny_documents[:4]]})
    scored = transformer.transform(frame).set_index("docno")["score"]
    expected = get_reranker("maxsim", model=tiny_maxsim_dir, aggregate="sump", windows=windows).score_documents(
        "text editor", list(frame["text"]))
    assert [scored[docno] for docno in frame["docno"]] == pytest.approx(expected.tolist(), rel=1e-6)
    plain = get_reranker("maxsim", model=tiny_maxsim_dir).score_documents("text editor", list(frame["text"]))
    assert expected.tolist() != pytest.approx(plain.tolist(), rel=1e-3)  # the later windows count

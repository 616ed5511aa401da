"""Search path end to end on a real Lucene index: registry, RerankingSearcher, sidecar build and use, the CLI."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from pyserini_mores import Query, Text, get_reranker, list_rerankers
from pyserini_mores.index import IndexNotFoundError, index_identity, open_searcher, resolve_index
from pyserini_mores.search import RerankingSearcher, SidecarMissingError
from pyserini_mores.search.__main__ import main as search_main

from conftest import RESOURCES

TOPICS = RESOURCES / "tiny_topics.tsv"
QRELS = RESOURCES / "tiny_qrels.txt"



def test_registry_lists_builtins_and_rejects_unknown_names():
    names = list_rerankers()
    for name in ("bm25", "maxsim", "mores", "prettr", "tk", "cross-encoder"):
        assert name in names
    with pytest.raises(KeyError, match=r"unknown reranker 'monot5'; known rerankers: bm25, .*maxsim"):
        get_reranker("monot5")


def test_plugin_rerankers_register_through_entry_points(tmp_path, monkeypatch):
    """A real installed distribution (a dist-info on sys.path) adds a reranker without touching our code."""
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent("""
        from pyserini_mores.rerankers import Reranker
        class Reverse(Reranker):
            name = "reverse"
            needs_text = False
            def rescore(self, query, texts):
                for i, text in enumerate(texts):
                    text.score = float(i)
                return texts
        def make(**kwargs):
            return Reverse()
    """))
    dist = tmp_path / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pyserini_mores.rerankers]\nreverse = my_plugin:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from pyserini_mores.rerankers import registry

    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    assert "reverse" in list_rerankers()
    texts = [Text("a", {"docid": "x"}), Text("b", {"docid": "y"})]
    assert [t.id for t in get_reranker("reverse").rerank("q", texts)] == ["y", "x"]


def test_rerank_returns_new_texts_with_first_stage_scores(tiny_maxsim_dir):
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir)
    texts = [Text("a text editor for the terminal", {"docid": "a"}, score=3.0),
             Text("a web server and reverse proxy", {"docid": "b"}, score=2.0)]
    reranked = reranker.rerank(Query("web server"), texts)
    assert not {id(t) for t in reranked} & {id(t) for t in texts}  # pygaggle's rerankers are non-destructive
    assert reranked[0].score >= reranked[1].score
    assert {t.id: t.metadata["first_stage_score"] for t in reranked} == {"a": 3.0, "b": 2.0}
    assert [(t.score, t.metadata) for t in texts] == [(3.0, {"docid": "a"}), (2.0, {"docid": "b"})]


def test_bm25_searcher_equals_lucene_searcher(tiny_index):
    lucene = open_searcher(tiny_index)
    searcher = RerankingSearcher(tiny_index, "bm25", rerank_depth=5)
    for query in ("text editor", "web server", "database"):
        expected = [(h.docid, pytest.approx(h.score, abs=1e-6)) for h in lucene.search(query, k=10)]
        assert [(h.docid, h.score) for h in searcher.search(query, k=10)][:5] == expected[:5]
        # beyond the rerank depth the BM25 order is kept
        assert [h.docid for h in searcher.search(query, k=10)] == [d for d, _ in expected]
    batch = searcher.batch_search(["text editor", "web server"], ["q1", "q2"], k=3, threads=2)
    assert [h.docid for h in batch["q2"]] == [h.docid for h in lucene.search("web server", k=3)]


def test_tail_below_rerank_depth_is_scored_below_the_head(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    searcher = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, rerank_depth=2)
    lucene = open_searcher(tiny_index)
    hits = searcher.search("text editor for code", k=6)
    bm25 = [h.docid for h in lucene.search("text editor for code", k=6)]
    assert sorted(h.docid for h in hits[:2]) == sorted(bm25[:2])
    assert [h.docid for h in hits[2:]] == bm25[2:]
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


def test_sidecar_scores_equal_text_scores(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    """The whole point: reading the sidecar gives the scores of encoding the documents from text."""
    with_sidecar = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, require_sidecar=True)
    from_text = RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=None)
    assert with_sidecar.sidecar_path == maxsim_sidecar and with_sidecar.reranker.sidecar is not None
    assert from_text.reranker.needs_text
    for query in ("text editor", "web server reverse proxy", "python arrays"):
        a, b = with_sidecar.search(query, k=20), from_text.search(query, k=20)
        assert [h.docid for h in a] == [h.docid for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


def test_sidecar_rows_equal_direct_encoding(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    from pyserini_mores.index import iter_index_documents
    from pyserini_mores.sidecar import open_sidecar

    reranker = get_reranker("maxsim", model=tiny_maxsim_dir)
    model = reranker.model
    searcher = open_searcher(tiny_index)
    reader = open_sidecar(maxsim_sidecar, expect_model_fingerprint=model.store_fingerprint(),
                          expect_index=index_identity(searcher))
    for row, docid, text in iter_index_documents(searcher):
        with torch.no_grad():
            direct = model.encode_documents(model.tokenize_documents([text]))[0].numpy()
        np.testing.assert_allclose(reader.get(row), direct, atol=1e-5)
        assert reader.rows_for_docids([docid])[0] == row


def test_sidecar_of_another_model_or_index_is_refused(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tokenizer,
                                                      tmp_path):
    from pyserini_mores.index import build_lucene_index
    from pyserini_mores.models import load_model

    other = load_model("maxsim", tiny_maxsim_dir)
    with torch.no_grad():
        other.encoder.layers[0].ffn.output.bias.add_(0.1)
    other.save_pretrained(tmp_path / "other-model")
    with pytest.raises(ValueError, match="another model|different model|rebuil"):
        RerankingSearcher(tiny_index, "maxsim", model=tmp_path / "other-model", sidecar=maxsim_sidecar)

    (tmp_path / "jsonl").mkdir()
    lines = (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()
    (tmp_path / "jsonl" / "d.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    other_index = build_lucene_index(tmp_path / "jsonl", tmp_path / "index")
    with pytest.raises(ValueError, match="index"):
        RerankingSearcher(other_index, "maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar)


def test_missing_sidecar_error_gives_the_build_command(tiny_index, tiny_maxsim_dir, tmp_path):
    with pytest.raises(SidecarMissingError) as error:
        RerankingSearcher(tiny_index, "maxsim", model=tiny_maxsim_dir, sidecar=tmp_path / "nowhere")
    assert "python -m pyserini_mores.sidecar build" in str(error.value)
    assert f"--model {tiny_maxsim_dir}" in str(error.value) and "--reranker maxsim" in str(error.value)


def test_index_resolution_errors(tmp_path):
    with pytest.raises(IndexNotFoundError, match="does not exist"):
        resolve_index(tmp_path / "missing")
    with pytest.raises(IndexNotFoundError, match="not a Lucene index"):
        resolve_index(tmp_path)
    with pytest.raises(IndexNotFoundError, match="neither an index directory nor a Pyserini prebuilt index"):
        resolve_index("no-such-prebuilt-index")


def test_index_identity_is_stable_and_discriminating(tiny_index):
    a, b = open_searcher(tiny_index), open_searcher(tiny_index)
    assert index_identity(a) == index_identity(b)
    assert index_identity(a)["num_docs"] == 20


def test_cli_writes_trec_and_msmarco_runs_and_metrics(tiny_index, tiny_maxsim_dir, maxsim_sidecar, tmp_path,
                                                      capsys):
    trec = tmp_path / "run.trec"
    code = search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(trec),
                        "--hits", "5", "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                        "--qrels", str(QRELS), "--rerank-depth", "10"])
    assert code == 0
    rows = [line.split() for line in trec.read_text().splitlines()]
    assert {row[0] for row in rows} == {"q1", "q2", "q3", "q4"}
    for qid in ("q1", "q2", "q3", "q4"):
        mine = [row for row in rows if row[0] == qid]
        assert 1 <= len(mine) <= 5 and [int(row[3]) for row in mine] == list(range(1, len(mine) + 1))
        assert [float(row[4]) for row in mine] == sorted((float(row[4]) for row in mine), reverse=True)
    assert rows[0][1] == "Q0" and rows[0][5] == "pyserini_mores-maxsim"
    out = capsys.readouterr().out
    assert "BM25" in out and "MRR@10" in out and "maxsim" in out
    # how long documents are read: the default aggregation over the one window the sidecar stores
    assert "Long documents: firstmaxp of 1 window of 62 tokens\n" in out
    assert "Windows scored per candidate: 1.00 (firstmaxp)\n" in out

    msmarco = tmp_path / "run.tsv"
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--output", str(msmarco),
                        "--output-format", "msmarco", "--hits", "3"]) == 0
    assert msmarco.read_text().splitlines()[0].split("\t")[0::2] == ["q1", "1"]


def test_cli_reports_malformed_topics_line_and_missing_sidecar(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    bad = tmp_path / "topics.tsv"
    bad.write_text("q1\ttext editor\nq2 no tab here\n")
    assert search_main(["--index", str(tiny_index), "--topics", str(bad), "--output", str(tmp_path / "r")]) == 2
    assert "line 2" in capsys.readouterr().err
    assert search_main(["--index", str(tiny_index), "--topics", str(TOPICS), "--reranker", "maxsim",
                        "--model", str(tiny_maxsim_dir), "--sidecar", str(tmp_path / "none")]) == 2
    assert "python -m pyserini_mores.sidecar build" in capsys.readouterr().err
    assert search_main(["--index", str(tmp_path / "nope"), "--topics", str(TOPICS)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_topics_by_pyserini_name_fail_offline_with_a_hint(monkeypatch):
    """Pyserini downloads topics by name; without a network the error says to pass a file instead."""
    from pyserini_mores.search.__main__ import load_qrels, load_topics

    with pytest.raises(FileNotFoundError, match="topics file missing/topics.tsv does not exist"):
        load_topics("missing/topics.tsv")
    try:
        topics = load_topics("msmarco-passage-dev-subset")
    except FileNotFoundError as error:  # offline (as here): the message names the remedy
        assert "offline, pass a qid<TAB>text TSV file" in str(error)
    else:  # a machine with a network really gets the topics
        assert len(topics) == 6980
    with pytest.raises(FileNotFoundError, match="qrels file nope.txt does not exist"):
        load_qrels("nope.txt")


def test_models_initialised_from_a_backbone_are_reproducible(tmp_path, tokenizer):
    """Randomly initialised parts (here PreTTR's compressor and head) come from a fixed seed, so two processes
    initialising the same backbone get the same store fingerprint and can share a sidecar."""
    from transformers import BertConfig, BertModel

    from pyserini_mores.models import load_model

    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
              ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(123)
    first = load_model("prettr", tmp_path, join_layer=1, compression_dim=8)
    torch.manual_seed(456)
    second = load_model("prettr", tmp_path, join_layer=1, compression_dim=8)
    assert first.store_fingerprint() == second.store_fingerprint()
    assert first.fingerprint() == second.fingerprint()


def test_rerank_with_explain_attaches_tk_numbers_that_reproduce_the_score(tokenizer, tmp_path, tiny_maxsim_dir):
    """TK's Figure 3 numbers come back on each result as plain data, and they add up to the score."""
    from pyserini_mores.models.tk import TKConfig, TKModel

    torch.manual_seed(0)
    model = TKModel(TKConfig(embedding_dim=32, num_heads=2, head_dim=8, ffn_dim=16, num_layers=1), tokenizer).eval()
    model.save_pretrained(tmp_path / "tk")
    reranker = get_reranker("tk", model=tmp_path / "tk")
    texts = [Text("vim is a text editor", {"docid": "a"}), Text("nginx web server", {"docid": "b"})]
    ranked = reranker.rerank(Query("text editor"), texts, explain=True)
    for text in ranked:
        numbers = text.metadata["explanation"]
        assert numbers["score"] == pytest.approx(text.score, abs=1e-4)
        assert len(numbers["log_contributions"]) == 11 and len(numbers["query_kernel_mass"][0]) == 11
        assert sum(numbers["log_contributions"]) == pytest.approx(numbers["s_log"], abs=1e-4)
    with pytest.raises(ValueError, match="cannot explain"):
        get_reranker("maxsim", model=tiny_maxsim_dir).rerank("q", [Text("x", {"docid": "x"})], explain=True)

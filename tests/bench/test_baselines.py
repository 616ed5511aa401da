"""The cross-encoders the benchmark measures speed-ups against: Hugging Face's and sentence-transformers' score exactly
what the project's cross-encoder scores on its weights and tokens, they are timed beside it in the same run, and every
speed-up is taken against the fastest of the three. A tiny random backbone, offline; no timing assertions."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from tiny_models import spread_weights

from pyserini_mores.bench import baselines, workload
from pyserini_mores.bench.__main__ import main as bench_main
from pyserini_mores.bench.report import fastest_cross_encoder_lines, format_table
from pyserini_mores.bench.runner import BenchConfig, add_speedups, run_benchmark

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY_LEN, DOC_LEN = 16, 24


def _tiny_cross_encoder():
    lengths = workload.cell_lengths("tiny", QUERY_LEN, DOC_LEN)
    model = workload.build_model(workload.Variant("cross-encoder", "full"), "tiny", lengths)
    return spread_weights(model, seed=3).eval(), lengths


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("bf16", 0.1), ("bf16-autocast", 0.1)])
def test_the_baselines_score_what_the_cross_encoder_scores(tmp_path, precision, tolerance):
    """``tolerance``: of the largest score (bf16 keeps 8 significant bits through every layer)."""
    model, lengths = _tiny_cross_encoder()
    words = workload.single_piece_words(model.tokenizer)
    query = workload.synthetic_texts(words, 1, QUERY_LEN, seed=1)[0]
    documents = workload.synthetic_texts(words, 6, DOC_LEN, seed=2)
    with torch.inference_mode():
        expected = model.score_texts(query, documents)
    checkpoint = baselines.save_checkpoint(model, tmp_path / "checkpoint")
    # the words the cross-encoder keeps, as the runner gives them to the baselines
    kept_query = " ".join(query.split()[:QUERY_LEN - 2])
    kept_documents = [" ".join(document.split()[:lengths.joint_doc_len - 2]) for document in documents]
    max_length = QUERY_LEN + lengths.joint_doc_len - 1
    from transformers import AutoTokenizer

    pair = AutoTokenizer.from_pretrained(checkpoint)(kept_query, kept_documents[0])["input_ids"]
    assert len(pair) == max_length  # [CLS] q [SEP] d [SEP]: the cross-encoder's tokens
    for name in baselines.BASELINES:
        scorer = baselines.build_scorer(name, checkpoint, precision=precision, device=torch.device("cpu"),
                                        batch_size=4, max_length=max_length)
        scores = scorer(kept_query, kept_documents)
        assert scores.dtype == torch.float32 and scores.shape == (6,)
        torch.testing.assert_close(scores, expected, atol=tolerance * float(expected.abs().max()), rtol=0)


def test_speedups_are_against_the_fastest_cross_encoder_of_each_cell():
    def record(model, ms, precision="fp32", doc_len=128):
        return {"model": model, "backbone": "minilm", "doc_len": doc_len, "precision": precision,
                "ms_per_query_median": ms}

    results = [record("cross-encoder", 100.0), record("hf-bert-sdpa", 80.0), record("st-crossencoder", 120.0),
               record("mores", 10.0),
               record("cross-encoder", 50.0, "bf16"), record("hf-bert-sdpa", 60.0, "bf16"), record("tk", 5.0, "bf16"),
               record("mores", 10.0, doc_len=512)]
    add_speedups(results)
    by_key = {(r["model"], r["precision"], r["doc_len"]): r for r in results}
    mores = by_key["mores", "fp32", 128]
    assert mores["fastest_cross_encoder"] == "hf-bert-sdpa"
    assert mores["speedup_vs_fastest_cross_encoder"] == 8.0 and mores["speedup_vs_cross_encoder"] == 10.0
    assert by_key["cross-encoder", "fp32", 128]["speedup_vs_fastest_cross_encoder"] == 0.8
    assert by_key["st-crossencoder", "fp32", 128]["speedup_vs_fastest_cross_encoder"] == pytest.approx(0.67)
    tk = by_key["tk", "bf16", 128]  # another precision is another cell: there the project's is the fastest
    assert tk["fastest_cross_encoder"] == "cross-encoder" and tk["speedup_vs_fastest_cross_encoder"] == 10.0
    alone = by_key["mores", "fp32", 512]  # no cross-encoder timed in its cell
    assert alone["fastest_cross_encoder"] is alone["speedup_vs_fastest_cross_encoder"] is None
    assert alone["speedup_vs_cross_encoder"] is None
    assert fastest_cross_encoder_lines(results)[0] == (
        "fastest cross-encoder, minilm d=128 fp32: hf-bert-sdpa 80.0 ms/query (cross-encoder 100.0 ms, "
        "st-crossencoder 120.0 ms)")


def test_the_bench_times_the_baselines_beside_the_cross_encoder(tmp_path, capsys):
    json_path = tmp_path / "bench.json"
    assert bench_main(["--tiny", "--models", "cross-encoder", "mores:1xIB-s2", "--candidates", "10",
                       "--repetitions", "1", "--doc-lens", "16", "--precision", "fp32", "--peak-sizes", "64",
                       "--device", "cpu", "--work-dir", str(tmp_path), "--json", str(json_path)]) == 0
    table = capsys.readouterr().out
    report = json.loads(json_path.read_text())
    machine = report["machine"]
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["mkldnn_bf16_supported"] == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert machine["device"] == "cpu" and machine["gpu"] is None and isinstance(machine["bf16_native"], bool)
    assert f"torch CPU capability {machine['cpu_capability']}" in table
    records = {r["model"]: r for r in report["results"]}
    assert set(records) == {"cross-encoder", "hf-bert-sdpa", "st-crossencoder", "mores"}
    cross_encoders = [records[name] for name in baselines.CROSS_ENCODERS]
    fastest = min(cross_encoders, key=lambda r: r["ms_per_query_median"])
    for record in records.values():
        assert record["device"] == "cpu" and record["ms_per_query_median"] > 0
        assert record["fastest_cross_encoder"] == fastest["model"]
        assert record["speedup_vs_fastest_cross_encoder"] == round(
            fastest["ms_per_query_median"] / record["ms_per_query_median"], 2)
        assert record["speedup_vs_cross_encoder"] == round(
            records["cross-encoder"]["ms_per_query_median"] / record["ms_per_query_median"], 2)
    for name in baselines.BASELINES:
        baseline = records[name]
        assert baseline["same_weights_as"] == "cross-encoder" and baseline["max_abs_score_difference"] < 1e-4
        assert baseline["path"] == "text" and baseline["bytes_per_doc"] == 0
        assert baseline["query_tokens"] == 16 and baseline["doc_tokens"] == records["cross-encoder"]["doc_tokens"]
        assert baseline["candidates"] == 10 and baseline["encoder_batch_size"] > 0
        # every layer over every row, a pooler and a one-logit head: more than the [CLS]-only last layer
        assert baseline["flop_ratio_limit"] < 1.0
    assert f"fastest cross-encoder, tiny d=16 fp32: {fastest['model']}" in table
    assert not list(tmp_path.glob("pyserini-mores-bench-*")), "the saved checkpoint is removed with the sidecars"


def test_without_sentence_transformers_its_baseline_is_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # `import sentence_transformers` fails
    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["cross-encoder"], precisions=["fp32"],
                         candidates=6, repetitions=1, work_dir=str(tmp_path), peak_sizes=(64,), peak_repetitions=1,
                         device="cpu")
    report = run_benchmark(config)
    assert [r["model"] for r in report["results"]] == ["cross-encoder", "hf-bert-sdpa"]
    assert report["skipped"] == [{"model": "st-crossencoder", "variant": "full", "backbone": "tiny", "doc_len": 16,
                                  "reason": "sentence-transformers is not installed "
                                            "(pip install sentence-transformers)"}]
    assert "skipped tiny d=16 st-crossencoder full: sentence-transformers is not installed" in format_table(report)


def test_no_baselines_when_asked_for_none(tmp_path, capsys):
    json_path = tmp_path / "bench.json"
    assert bench_main(["--tiny", "--models", "cross-encoder", "--candidates", "6", "--repetitions", "1",
                       "--doc-lens", "16", "--precision", "fp32", "--peak-sizes", "64", "--baselines", "none",
                       "--work-dir", str(tmp_path), "--json", str(json_path)]) == 0
    report = json.loads(json_path.read_text())
    assert [r["model"] for r in report["results"]] == ["cross-encoder"] and report["config"]["baselines"] == []
    assert report["results"][0]["fastest_cross_encoder"] == "cross-encoder"


def test_an_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="unknown baseline"):
        BenchConfig(backbones=["tiny"], baselines=["onnx"])

"""The benchmark: FLOP formulas against hand counts and against torch's FLOP counter on real runs of every model,
and a smoke test of the CLI on a tiny random backbone (JSON schema, plot). No timing assertions."""
from __future__ import annotations

import json

import pytest
import torch

from pyserini_mores.bench import flops, model_flops, workload
from pyserini_mores.bench.report import MACHINE_KEYS, RESULT_KEYS

SMALL = flops.EncoderShape(hidden=4, layers=3, heads=2, ffn=8)


def test_bert_layer_matches_a_hand_count():
    # T = 2, n = 4, f = 8: Q/K/V/O 4·(2·2·4·4) = 256, attention 2·(2·2·2·4) = 64, FFN 2·(2·2·4·8) = 256
    assert flops.bert_layer(2, SMALL) == 576


def test_cls_only_layer_matches_a_hand_count():
    # T = 5, n = 4, h = 2, f = 8: query and output projections 2·(2·4·4) = 64, key and value folds
    # 2·(2·2·2·4) = 64, logits and pool 2·(2·2·5·4) = 160, one FFN row 2·(2·4·8) = 128
    assert flops.cls_only_layer(5, SMALL) == 416


def test_cross_encoder_flops_match_a_hand_count():
    # q = 2, d = 3 → T = 5: per layer 8·5·16 + 4·25·4 + 4·5·4·8 = 640 + 400 + 640 = 1680; 2 full layers, the
    # last [CLS]-only 416; head 2·4·2 = 16
    count = model_flops.cross_encoder_flops(SMALL, query_tokens=2, doc_tokens=3)
    assert count.sum("query") == 0
    assert count.sum("candidate") == 2 * 1680 + 416 + 16
    assert count.total(1000) == 1000 * 3792


@pytest.mark.parametrize("reuse, every_row, per_candidate", [
    ("s2", False, 496), ("s1", False, 688), ("s2", True, 752), ("s1", True, 944)])
def test_mores_flops_match_a_hand_count(reuse, every_row, per_candidate):
    # K = 1, q = 2, d = 3. Query: 2 layers · 576 + block-1 query projection 2·2·4·4 = 1216.
    # Candidate: cross-attention 4·2·3·4 = 96, cross output 64, head 16, and the [CLS] row's self-attention and
    # FFN: cls_only_layer(2) = 64 + 64 + 2·(2·2·2·4) + 128 = 320 → 496; every row (the paper's count):
    # self-attention 192 + 64 + 64 = 320, FFN 256 → 752. S1 projects the document's keys and values too:
    # 2·(2·3·4·4) = 192 more.
    count = model_flops.mores_flops(SMALL, query_tokens=2, doc_tokens=3, interaction_blocks=1, reuse=reuse,
                              every_row=every_row)
    assert count.sum("query") == 1216
    assert count.sum("candidate") == per_candidate
    assert count.total(10, batches=3) == 1216 + 10 * per_candidate


def test_second_interaction_block_projects_its_own_queries():
    one = model_flops.mores_flops(SMALL, 2, 3, interaction_blocks=1, reuse="s2")
    two = model_flops.mores_flops(SMALL, 2, 3, interaction_blocks=2, reuse="s2")
    # one more full block (752 − 16 head) before the [CLS]-only last one, plus the last block's own cross-attention
    # query projection (64); one layer fewer in the query
    assert two.sum("candidate") - one.sum("candidate") == 752 - 16 + 64
    assert one.sum("query") - two.sum("query") == 576


def test_flop_ratio_of_mores_at_bert_base_is_what_the_issue_expects():
    bert = flops.EncoderShape(768, 12, 12, 3072)
    cross = model_flops.cross_encoder_flops(bert, 16, 127).total(1000)
    every_layer_row = cross + 1000 * (flops.bert_layer(16 + 127, bert) - flops.cls_only_layer(16 + 127, bert))
    paper = model_flops.mores_flops(bert, 16, 128, 2, "s2", every_row=True).total(1000)
    assert 45 < every_layer_row / paper < 55  # the issue quotes ≈ 48x (every row of every layer on both sides)
    # both sides [CLS]-only in their last layer, as shipped: the cross-encoder saves 8%, MORES 2xIB 40%
    assert 70 < cross / model_flops.mores_flops(bert, 16, 128, 2, "s2").total(1000) < 76


def _tiny_dims():
    from pyserini_mores.models._layers import BertDims

    return BertDims(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=64)


def _counted(function, *args):
    with torch.inference_mode(), flops.flop_counter() as counter:
        function(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("variant", [
    workload.Variant("cross-encoder", "full"),
    workload.Variant("mores", "1xIB-s1", (("n_interaction_blocks", 1), ("reuse", "s1"))),
    workload.Variant("mores", "2xIB-s2", (("n_interaction_blocks", 2), ("reuse", "s2"))),
    workload.Variant("mores", "2xIB-s1", (("n_interaction_blocks", 2), ("reuse", "s1"))),
    workload.Variant("prettr", "l2", (("compression_dim", None), ("join_layer", 2))),
    workload.Variant("prettr", "l2-e8", (("compression_dim", 8), ("join_layer", 2))),
    workload.Variant("prettr", "l1", (("compression_dim", None), ("join_layer", 1))),
    workload.Variant("prettr", "l1-e8", (("compression_dim", 8), ("join_layer", 1))),
    workload.Variant("prettr", "l2-kv", (("compression_dim", None), ("join_layer", 2), ("reuse", "kv"))),
    workload.Variant("prettr", "l2-avg", (("compression_dim", None), ("join_layer", 2), ("pooling", "avg"))),
    workload.Variant("prettr", "l2-e8-avg", (("compression_dim", 8), ("join_layer", 2), ("pooling", "avg"))),
    workload.Variant("prettr", "l1-e8-avg", (("compression_dim", 8), ("join_layer", 1), ("pooling", "avg"))),
    workload.Variant("prettr", "l2-kv-avg", (("compression_dim", None), ("join_layer", 2), ("reuse", "kv"),
                                             ("pooling", "avg"))),
    workload.Variant("tk", "ctx", (("mode", "ctx"),)),
    workload.Variant("tk", "online", (("mode", "online"),)),
], ids=lambda v: v.key)
def test_flop_formulas_equal_what_the_models_execute(variant, tokenizer):
    """Every matmul term of the formulas, against torch's FLOP counter on the model's own online path."""
    from pyserini_mores.models import pad_documents
    from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel

    lengths = workload.Lengths(query_len=8, doc_len=12, joint_doc_len=12, max_positions=64)
    limits = {"query_max_length": 8, "doc_max_length": 12}
    torch.manual_seed(0)
    if variant.model == "tk":
        model = TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2, num_heads=4,
                                 head_dim=8, ffn_dim=16, **limits, **variant.config), tokenizer)
    else:
        classes = {"cross-encoder": (CrossEncoder, CrossEncoderConfig), "mores": (MoresModel, MoresConfig),
                   "prettr": (PreTTRModel, PreTTRConfig)}
        model_class, config_class = classes[variant.model]
        model = model_class(config_class(encoder=_tiny_dims(), **limits, **variant.config), tokenizer)
    model.eval()
    count = workload.flop_count(variant, model, lengths)
    words = workload.single_piece_words(tokenizer)
    query = workload.synthetic_texts(words, 1, 8, seed=1)[0]
    documents = workload.synthetic_texts(words, 5, 12, seed=2)
    if model.store_width is None:
        assert _counted(model.score_texts, query, documents) == count.total(5, batches=1, kind="matmul")
        return
    with torch.inference_mode():
        state = model.encode_query(model.tokenize_queries([query]))
        doc_reps = model.encode_documents(model.tokenize_documents(documents))
    assert [rep.shape[0] for rep in doc_reps] == [workload.stored_doc_tokens(variant, lengths)] * 5
    assert _counted(model.encode_query, model.tokenize_queries([query])) == count.sum("query", "matmul")
    docs, doc_lengths = pad_documents(doc_reps)
    assert (_counted(model.score, state, docs, doc_lengths)
            == count.sum("batch", "matmul") + 5 * count.sum("candidate", "matmul"))


def test_tk_counts_its_kernels_as_elementwise_work():
    shape = model_flops.TKShape(embedding=300, layers=2, heads=16, head_dim=32, ffn=100, kernels=11)
    ctx = model_flops.tk_flops(shape, 16, 200, "ctx")
    online = model_flops.tk_flops(shape, 16, 200, "online")
    assert ctx.sum("candidate", "elementwise") == 2 * 200 * 300 + 4 * 16 * 200 * 11
    assert online.sum("candidate") - ctx.sum("candidate") == 2 * model_flops.tk_layer(200, shape)
    assert online.sum("query") == 0 and online.sum("batch") == ctx.sum("query")


def test_cli_smoke_run_writes_json_and_plot(tmp_path, capsys):
    from pyserini_mores.bench.__main__ import main

    json_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["--tiny", "--models", "cross-encoder", "mores:1xIB-s2", "mores:2xIB-s2", "--candidates", "10",
                 "--repetitions", "1", "--doc-lens", "16", "--precision", "fp32", "--peak-sizes", "64",
                 "--work-dir", str(tmp_path), "--json", str(json_path), "--plot", str(plot_path)])
    assert code == 0
    table = capsys.readouterr().out
    assert "cross-encoder" in table and "1xIB-s2" in table
    report = json.loads(json_path.read_text())
    assert set(MACHINE_KEYS) <= set(report["machine"])
    assert report["machine"]["peak_gflops_fp32"] > 0 and report["machine"]["peak_gflops_bf16"] > 0
    results = {(r["model"], r["variant"]): r for r in report["results"]}
    # the cross-encoder brings its baselines (tests/bench/test_baselines.py)
    assert set(results) == {("cross-encoder", "full"), ("mores", "1xIB-s2"), ("hf-bert-sdpa", "full"),
                            ("st-crossencoder", "full")}
    for record in results.values():
        assert set(RESULT_KEYS) <= set(record)
        assert (record["backbone"], record["doc_len"], record["precision"]) == ("tiny", 16, "fp32")
        assert record["candidates"] == 10 and record["repetitions"] == 1
        assert len(record["ms_timed_runs"]) == 1 and record["ms_per_query_median"] > 0
    cross, mores = results[("cross-encoder", "full")], results[("mores", "1xIB-s2")]
    assert cross["speedup_vs_cross_encoder"] == 1.0 and cross["flop_ratio_limit"] == 1.0
    assert cross["bytes_per_doc"] == 0 and cross["path"] == "text"
    # MORES reads a real fp16 sidecar: 16 tokens × 2·K·n = 64 values × 2 bytes per document
    assert mores["bytes_per_doc"] == 16 * 64 * 2 and mores["path"] == "sidecar"
    assert mores["flop_ratio_limit"] == pytest.approx(cross["flops_per_query"] / mores["flops_per_query"], rel=1e-3)
    # the 2-layer tiny backbone cannot hold 2 interaction blocks: recorded, not silently dropped
    assert [skipped["variant"] for skipped in report["skipped"]] == ["2xIB-s2"]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("pyserini-mores-bench-*")), "temporary sidecars are removed"


def test_slow_runs_are_timed_on_fewer_candidates_and_marked(tmp_path):
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark

    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["mores:1xIB-s2"], precisions=["fp32"],
                         candidates=10, repetitions=1, max_rep_seconds=1e-9, pilot_candidates=4,
                         work_dir=str(tmp_path), peak_sizes=(64,), peak_repetitions=1)
    (record,) = run_benchmark(config)["results"]
    assert record["candidates"] == 10
    assert record["candidates_timed"] == record["extrapolated_from"] == 4
    assert record["speedup_vs_cross_encoder"] is None  # no cross-encoder in this run


def test_a_bfloat16_sidecar_is_timed_when_asked_for(tmp_path):
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark

    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["mores:1xIB-s2"], precisions=["bf16"],
                         candidates=10, repetitions=1, store_dtype="bfloat16", work_dir=str(tmp_path),
                         peak_sizes=(64,), peak_repetitions=1)
    (record,) = run_benchmark(config)["results"]
    assert record["store_dtype"] == "bfloat16" and record["bytes_per_doc"] == 16 * 64 * 2
    assert record["ms_per_query_median"] > 0


def test_unknown_models_are_refused_before_anything_runs(capsys):
    from pyserini_mores.bench.__main__ import main

    assert main(["--tiny", "--models", "mores:9xIB", "--precision", "fp32"]) == 2
    assert "mores has:" in capsys.readouterr().err


def test_prettr_pooled_at_the_last_join_is_timed_from_states_and_from_keys_and_values(tmp_path):
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark

    config = BenchConfig(backbones=["tiny"], doc_lens=[16],
                         models=["prettr:l1", "prettr:l1-kv", "prettr:l1-avg", "prettr:l1-kv-avg"],
                         precisions=["fp32"], candidates=10, repetitions=1, work_dir=str(tmp_path),
                         peak_sizes=(64,), peak_repetitions=1)
    records = {record["variant"]: record for record in run_benchmark(config)["results"]}
    assert set(records) == {"l1", "l1-kv", "l1-avg", "l1-kv-avg"}
    # pooled, the last layer runs for every query-block row, not [CLS] alone: the variants really are pooled
    assert records["l1-avg"]["flops_per_query"] > records["l1"]["flops_per_query"]
    assert records["l1-kv-avg"]["flops_per_query"] > records["l1-kv"]["flops_per_query"]
    # the 15 stored tokens (``d [SEP]``, the document's [CLS] dropped) of the tiny backbone's n = 32 in float16: the
    # states, or the last layer's keys and values
    assert records["l1-avg"]["bytes_per_doc"] == 15 * 32 * 2
    assert records["l1-kv-avg"]["bytes_per_doc"] == 15 * 2 * 32 * 2
    assert all(record["path"] == "sidecar" and record["ms_per_query_median"] > 0 for record in records.values())


def test_the_bench_takes_every_sidecar_codec_and_refuses_a_workload_too_small_to_train_it(tmp_path, capsys):
    from pyserini_mores.bench.__main__ import build_parser, main
    from pyserini_mores.bench.runner import BenchConfig, run_benchmark
    from pyserini_mores.sidecar.codecs import CODECS

    (codec_flag,) = [action for action in build_parser()._actions if action.dest == "codec"]
    assert tuple(codec_flag.choices) == CODECS
    # MORES 1xIB S2 stores 16 tokens per document at d = 16: 10 candidates hold 160 token vectors
    base = ["--tiny", "--models", "mores:1xIB-s2", "--doc-lens", "16", "--precision", "fp32", "--peak-sizes", "64",
            "--work-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as refused:  # a usage error, before anything is measured
        main([*base, "--candidates", "10", "--codec", "opq"])
    assert refused.value.code == 2
    assert ("--codec opq trains on at least 256 token vectors, but the mores:1xIB-s2 sidecar at tiny d = 16 stores 10 "
            "candidates x 16 tokens = 160; raise --candidates or --doc-lens, or choose sq8, sq6 or sq4"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main([*base, "--candidates", "20", "--codec", "residual"])
    assert "--codec residual trains on at least 4,096 token vectors" in capsys.readouterr().err
    config = BenchConfig(backbones=["tiny"], doc_lens=[16], models=["mores:1xIB-s2"], precisions=["fp32"],
                         candidates=20, repetitions=1, work_dir=str(tmp_path), peak_sizes=(64,), peak_repetitions=1,
                         codec="opq")
    (record,) = run_benchmark(config)["results"]
    # 64 values per token (2 x 32, MORES S2 of the tiny backbone) in 16 one-byte sub-quantiser codes (width / 4)
    assert record["store_dtype"] == "opq" and record["bytes_per_doc"] == 16 * 16
    assert record["ms_per_query_median"] > 0

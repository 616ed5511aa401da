"""Adding a model is one class plus one registry line: a toy model defined here, registered with
:func:`register_model`, goes through a sidecar build, search with its reranker (the sidecar's scores equal the
text's) and a training step; with the benchmark's own line (:func:`register_benchmark`: its variants and FLOP
formula) also the benchmark's workload and FLOP count — with no other change to the package."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from pyserini_mores.bench import flops as bench_flops
from pyserini_mores.bench import model_hooks, workload
from pyserini_mores.bench.flops import FlopCount, Term, linear
from pyserini_mores.index import open_searcher
from pyserini_mores.models import RankingModel, load_model, model_class, pad_documents, register_model, registry
from pyserini_mores.models._layers import BertDims, key_padding_mask
from pyserini_mores.models.base import ModelCapabilities, RankingConfig
from pyserini_mores.rerankers import get_reranker, list_rerankers
from pyserini_mores.search import RerankingSearcher, default_sidecar_path
from pyserini_mores.sidecar.build import build_sidecar
from pyserini_mores.train.trainer import TrainingSettings, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERIES = ("text editor", "package manager for debian", "web server")


@dataclass
class ToyConfig(RankingConfig):
    projection_dim: int = 8


class ToyModel(RankingModel):
    """Bag of embeddings: the sidecar stores each document token's projected embedding; the score is the dot product
    of the query's mean projected embedding with the document's mean stored row."""

    model_type = "toy"
    config_class = ToyConfig
    capabilities = ModelCapabilities(default_loss="pairwise", new_parameters=("projection.",))

    def __init__(self, config: ToyConfig, tokenizer):
        super().__init__(config, tokenizer)
        self.embeddings = nn.Embedding(config.encoder.vocab_size, config.encoder.hidden_size)
        self.projection = nn.Linear(config.encoder.hidden_size, config.projection_dim)

    @property
    def store_width(self) -> int:
        return self.config.projection_dim

    def store_config(self) -> dict:
        return {**super().store_config(), "projection_dim": self.config.projection_dim}

    def _vectors(self, batch: dict) -> torch.Tensor:
        return self.projection(self.embeddings(batch["input_ids"]))

    def encode_documents(self, doc_batch: dict) -> list[torch.Tensor]:
        vectors = self._vectors(doc_batch)
        return [vectors[i, :length] for i, length in enumerate(doc_batch["attention_mask"].sum(1).tolist())]

    def encode_query(self, query_batch: dict) -> torch.Tensor:
        mask = query_batch["attention_mask"].unsqueeze(-1).float()
        return (self._vectors(query_batch) * mask).sum(1) / mask.sum(1)  # [B, W]

    def score(self, query_state: torch.Tensor, docs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = key_padding_mask(lengths, docs.shape[1])[:, 0, 0, :, None].float()
        means = (docs.float() * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B, W]
        return torch.bmm(means.unsqueeze(1), query_state.expand_as(means).unsqueeze(2)).view(-1)

    def forward(self, query_batch: dict, doc_batch: dict) -> torch.Tensor:
        docs, lengths = pad_documents(self.encode_documents(doc_batch))
        return self.score(self.encode_query(query_batch), docs, lengths)


def toy_flops(model: ToyModel, query_tokens: int, doc_tokens: int) -> FlopCount:
    hidden, width = model.config.encoder.hidden_size, model.config.projection_dim
    return FlopCount((Term("query_projection", linear(query_tokens, hidden, width), "query"),
                      Term("doc_mean", doc_tokens * width, kind="elementwise"),
                      Term("dot", linear(1, width, 1))))


def toy_variants(num_layers: int, compression_dim: int) -> list[tuple[str, dict]]:
    return [(f"w{width}", {"projection_dim": width}) for width in (8, 16)]


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(registry, "MODEL_CLASSES", dict(registry.MODEL_CLASSES))  # forgotten after the test
    monkeypatch.setattr(model_hooks, "BENCHMARKS", dict(model_hooks.BENCHMARKS))
    register_model("toy", ToyModel)  # the one line that adds the model
    # the benchmark's own line for it (optional: a model without one is not benchmarked)
    model_hooks.register_benchmark("toy", model_hooks.BenchmarkHooks(toy_variants, toy_flops))


@pytest.fixture
def toy_dir(tmp_path, tokenizer):
    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    ToyModel(ToyConfig(encoder=dims, doc_max_length=64), tokenizer).eval().save_pretrained(tmp_path / "toy")
    return tmp_path / "toy"


def test_a_registered_model_is_loaded_and_offered_as_a_reranker(toy, toy_dir):
    assert model_class("toy") is ToyModel and "toy" in list_rerankers()
    assert isinstance(load_model("toy", toy_dir), ToyModel)
    assert TrainingSettings(model_type="toy", init="x", triples="t", output="o").loss == "pairwise"


def test_sidecar_build_then_search_scores_as_from_text(toy, toy_dir, tiny_index):
    model = get_reranker("toy", model=toy_dir).model
    sidecar = default_sidecar_path(tiny_index, "toy", model)
    searcher = open_searcher(tiny_index)
    try:
        build_sidecar(searcher, model, sidecar, reranker_name="toy", dtype="float32", batch_size=4, progress=False)
    finally:
        searcher.close()
    with_sidecar = RerankingSearcher(tiny_index, "toy", model=toy_dir, require_sidecar=True)
    from_text = RerankingSearcher(tiny_index, "toy", model=toy_dir, sidecar=None)
    assert with_sidecar.reranker.sidecar is not None and from_text.reranker.needs_text
    for query in QUERIES:
        stored, text = with_sidecar.search(query, k=10), from_text.search(query, k=10)
        assert [hit.docid for hit in stored] == [hit.docid for hit in text]
        np.testing.assert_allclose([hit.score for hit in stored], [hit.score for hit in text], rtol=0, atol=1e-6)
        assert len({hit.score for hit in stored}) > 1


def test_one_training_step(toy, toy_dir, tmp_path, tiny_documents):
    texts = {document["id"]: document["contents"] for document in tiny_documents}
    triples = tmp_path / "triples.tsv"
    triples.write_text("".join(f"{query}\t{texts[positive]}\t{texts[negative]}\n" for query, positive, negative in
                               [("text editor", "d04", "d01"), ("package manager", "d01", "d02")]))
    before = load_model("toy", toy_dir).state_dict()
    result = train(TrainingSettings(model_type="toy", init=str(toy_dir), triples=str(triples),
                                    output=str(tmp_path / "out"), max_steps=1, batch_size=2, lr=1e-2, head_lr=1e-1),
                   progress=False)
    assert result.global_step == 1 and isinstance(result.model, ToyModel)
    after = result.model.state_dict()
    assert all(not torch.equal(before[name], after[name]) for name in ("projection.weight", "projection.bias"))


def test_benchmark_workload_and_flops(toy, tokenizer):
    variants = [variant for variant in workload.backbone_variants("tiny") if variant.model == "toy"]
    assert [variant.key for variant in variants] == ["toy:w8", "toy:w16"]
    assert workload.select_variants(["toy:w16"], "tiny") == variants[1:]
    lengths = workload.Lengths(query_len=8, doc_len=12, joint_doc_len=12, max_positions=64)
    words = workload.single_piece_words(tokenizer)
    for variant in variants:
        model = workload.build_model(variant, "tiny", lengths)
        assert workload.feasible(variant, 2) is None and model.store_width == variant.config["projection_dim"]
        workload.check_stored_shape(model, variant, list(words))
        count = workload.flop_count(variant, model, lengths)
        query = model.tokenize_queries(workload.synthetic_texts(words, 1, 6, seed=1))
        docs, doc_lengths = pad_documents(model.encode_documents(
            model.tokenize_documents(workload.synthetic_texts(words, 5, 10, seed=2))))
        assert docs.shape[1] == workload.stored_doc_tokens(variant, lengths)
        with torch.inference_mode(), bench_flops.flop_counter() as counter:
            model.score(model.encode_query(query), docs, doc_lengths)
        assert counter.get_total_flops() == count.total(5, kind="matmul")


def test_capabilities_are_declared_once_and_read_only():
    with pytest.raises(TypeError, match=r"^Stray sets default_loss, new_parameters as class attributes; declare them "
                                        r"as capabilities = ModelCapabilities\(\.\.\.\)$"):
        class Stray(RankingModel):  # the flags of old would be silently ignored
            model_type = "stray"
            default_loss = "pairwise"
            new_parameters = ("head.",)
    assert ToyModel.capabilities == ModelCapabilities(default_loss="pairwise", new_parameters=("projection.",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ToyModel.capabilities.default_loss = "listwise"
    mores = model_class("mores").capabilities
    with pytest.raises(TypeError):
        mores.trainable_module_groups["everything"] = ("",)
    assert dict(mores.trainable_module_groups) == {"interaction": ("interaction_module.",),
                                                   "representation": ("document_module.", "query_module.")}

"""Reranking from an opq sidecar with the codec's rotation folded into the model's side: the codes are decoded
without rotating back (``y = x Rᵀ``) and MaxSim and TK rotate the query's terms, MORES Reuse-S1 its key and value
weights. Each must score exactly what the same model scores on the fully decoded vectors; models that need the
vectors themselves (PreTTR, MORES Reuse-S2) and other codecs read them decoded as before; and a sharded sidecar folds
only when its shards share one rotation."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import spread_tk_scores, spread_weights

from pyserini_mores.models._layers import BertDims
from pyserini_mores.rerankers.learned import ModelReranker
from pyserini_mores.sidecar import SidecarWriter, open_sidecar
from pyserini_mores.sidecar.assemble import assemble_shards
from pyserini_mores.types import Query, Text

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
QUERY = "a text editor for the terminal"
DIMS = BertDims(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=256)
OPQ = {"pq_subquantizers": 8}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """40 passages, ~800 WordPieces: enough token vectors to train 256 centroids per sub-quantiser."""
    lines = (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()
    documents = [json.loads(line)["contents"] for line in lines]
    words = " ".join(documents).split()
    return [" ".join(words[(7 * i) % len(words):][:20]) or "empty" for i in range(40)]


def _model(kind: str, tokenizer):
    torch.manual_seed(0)
    if kind == "maxsim":
        from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig

        return spread_weights(DualEncoder(DualEncoderConfig(encoder=DIMS, doc_max_length=32), tokenizer)).eval()
    if kind == "tk":
        from pyserini_mores.models.tk import TKConfig, TKModel

        model = TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=1, num_heads=4, head_dim=8,
                                 ffn_dim=16, doc_max_length=32), tokenizer).eval()
        return spread_tk_scores(model)
    from pyserini_mores.models.mores import MoresConfig, MoresModel

    reuse = "s2" if kind == "mores-s2" else "s1"
    model = MoresModel(MoresConfig(encoder=DIMS, n_interaction_blocks=2, reuse=reuse, doc_max_length=32), tokenizer)
    return spread_weights(model).eval()


def _write(path: Path, model, reps: list[torch.Tensor], docids: list[str], codec: str | None = "opq",
           options: dict | None = None, token_ids: list[torch.Tensor] | None = None) -> Path:
    writer = SidecarWriter(path, dim=model.store_width, docids=docids,
                           model={"model_type": model.model_type, "store_variant": model.store_variant,
                                  "fingerprint": model.store_fingerprint()},
                           index={"num_docs": len(docids), "signature": "test:frame"},
                           **({"codec": codec, "codec_options": options or OPQ} if codec else {"dtype": "float32"}))
    writer.add([rep.float() for rep in reps], token_ids=token_ids)
    writer.finalize()
    return path


def _sidecar(tmp_path: Path, model, texts: list[str], codec: str | None = "opq", options: dict | None = None):
    with torch.no_grad():
        reps = model.encode_documents(model.tokenize_documents(texts))
    path = _write(tmp_path / f"{model.model_type}-{model.store_variant}-{codec}", model, reps,
                  [f"d{i}" for i in range(len(texts))], codec, options)
    return open_sidecar(path, expect_model_fingerprint=model.store_fingerprint())


def _candidates(texts: list[str]) -> list[Text]:
    return [Text(text, {"docid": f"d{i}", "lucene_docid": i}, score=float(-i)) for i, text in enumerate(texts)]


def _reference_scores(model, sidecar, count: int) -> np.ndarray:
    """The model's scores of the fully decoded rows (``x``, rotated back by the codec), in the reranker's order."""
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        docs, lengths = sidecar.get_batch(np.arange(count))
        return model.score(state, docs, lengths).float().numpy()


def _scores(reranker: ModelReranker, texts: list[str]) -> np.ndarray:
    ranked = reranker.rerank(Query(QUERY), _candidates(texts))
    return np.array([text.score for text in sorted(ranked, key=lambda text: int(text.id[1:]))])


def test_rotated_rows_decode_to_the_stored_vectors_times_the_rotation(tmp_path, tokenizer, texts):
    model = _model("maxsim", tokenizer)
    sidecar = _sidecar(tmp_path, model, texts)
    rotation = sidecar.store_rotation
    assert rotation.shape == (32, 32)
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(32), atol=1e-5)
    rows = np.array([3, 0, 17, 39, 3])
    decoded, lengths = sidecar.get_batch(rows)
    rotated, rotated_lengths = sidecar.get_batch(rows, rotated=True)
    assert torch.equal(lengths, rotated_lengths)
    assert not torch.allclose(rotated, decoded, atol=1e-3)  # another frame, not the same vectors
    np.testing.assert_allclose((rotated @ torch.from_numpy(rotation)).numpy(), decoded.numpy(), atol=1e-5)
    for row, length in zip(rows, lengths.tolist()):  # padding stays zero in either frame
        assert not rotated[rows.tolist().index(row), length:].any()


@pytest.mark.parametrize("kind", ["maxsim", "tk", "mores"])
def test_folding_the_rotation_into_the_model_scores_as_the_decoded_vectors(kind, tmp_path, tokenizer, texts,
                                                                           monkeypatch):
    model = _model(kind, tokenizer)
    sidecar = _sidecar(tmp_path, model, texts)
    want = _reference_scores(model, sidecar, len(texts))
    reads = []
    read = type(sidecar).get_spans

    def spy(self, *args, **kwargs):
        reads.append(kwargs.get("rotated", False))
        return read(self, *args, **kwargs)

    monkeypatch.setattr(type(sidecar), "get_spans", spy)
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert reranker.folds_codec_rotation
    got = _scores(reranker, texts)
    assert reads and all(reads)  # every batch read in the rotated frame: no rotation back
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    frame = reranker._store_frame(reranker.scoring_model)
    assert reranker._store_frame(reranker.scoring_model) is frame  # made once per model and sidecar
    # the fold is what makes them equal: the rotated codes against the query as it is score otherwise
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        docs, lengths = read(sidecar, *sidecar.window_spans(np.arange(len(texts)))[:2], rotated=True)
        unfolded = model.score(state, docs, lengths).float().numpy()
    assert np.abs(unfolded - want).max() > 1e-2


@pytest.mark.parametrize("kind", ["mores-s2", "maxsim-pq"])
def test_models_and_codecs_without_a_fold_read_the_decoded_vectors(kind, tmp_path, tokenizer, texts, monkeypatch):
    model = _model(kind.split("-")[0] if kind == "maxsim-pq" else kind, tokenizer)
    codec = "pq" if kind == "maxsim-pq" else "opq"
    sidecar = _sidecar(tmp_path, model, texts, codec=codec)
    assert (sidecar.store_rotation is None) == (codec == "pq")
    reads = []
    read = type(sidecar).get_spans
    monkeypatch.setattr(type(sidecar), "get_spans",
                        lambda self, *a, **k: reads.append(k.get("rotated", False)) or read(self, *a, **k))
    reranker = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="fp32")
    assert not reranker.folds_codec_rotation
    got = _scores(reranker, texts)
    assert reads and not any(reads)
    np.testing.assert_allclose(got, _reference_scores(model, sidecar, len(texts)), rtol=1e-4, atol=1e-4)


def test_a_frame_is_refused_where_there_is_no_rotation(tmp_path, tokenizer, texts):
    model = _model("maxsim", tokenizer)
    for codec in ("pq", None):
        sidecar = _sidecar(tmp_path, model, texts, codec=codec)
        assert sidecar.store_rotation is None
        with pytest.raises(ValueError, match=r"sidecar .* has no rotated frame \(only an opq codec has one\)"):
            sidecar.get_batch([0, 1], rotated=True)
    from pyserini_mores.sidecar.codecs import TokenCodec

    with pytest.raises(ValueError, match="the sq8 codec has no rotated frame"):
        TokenCodec("sq8", 4).decode(np.zeros((1, 4), dtype=np.uint8), rotated=True)


def _sharded(tmp_path: Path, model, texts: list[str], codec_parameters: np.ndarray, codec: str = "opq",
             options: dict | None = None) -> Path:
    """Two shards of ``texts`` (opq by default), both adopting the codec of ``codec_parameters`` (as a sharded
    build's shards adopt the one codec trained for them)."""
    with torch.no_grad():
        reps = [rep.float() for rep in model.encode_documents(model.tokenize_documents(texts))]
    docids = [f"d{i}" for i in range(len(texts))]
    paths = []
    for number, (start, end) in enumerate(((0, len(texts) // 2), (len(texts) // 2, len(texts)))):
        writer = SidecarWriter(tmp_path / f"shard-{number}", dim=model.store_width, docids=docids[start:end],
                               model={"model_type": model.model_type, "store_variant": model.store_variant,
                                      "fingerprint": model.store_fingerprint()},
                               index={"num_docs": len(texts), "signature": "test:frame"}, codec=codec,
                               codec_options=options or OPQ,
                               shard={"build_id": "frame", "index": number, "count": 2, "row_start": start,
                                      "row_end": end, "num_docs": len(texts)})
        writer.adopt_codec(codec_parameters)
        writer.add(reps[start:end])
        paths.append(writer.finalize())
    assemble_shards(tmp_path / "sharded", paths)
    return tmp_path / "sharded"


def test_a_sharded_sidecar_folds_the_rotation_its_shards_share(tmp_path, tokenizer, texts):
    model = _model("mores", tokenizer)
    whole = _sidecar(tmp_path, model, texts)
    path = _sharded(tmp_path, model, texts, whole.codec.parameters())
    sharded = open_sidecar(path, expect_model_fingerprint=model.store_fingerprint())
    np.testing.assert_array_equal(sharded.store_rotation, whole.store_rotation)
    rows = [0, 25, 3, 39, 20, 19]  # across the shard boundary
    rotated, lengths = sharded.get_batch(rows, rotated=True)
    want, want_lengths = whole.get_batch(rows, rotated=True)
    assert torch.equal(rotated, want) and torch.equal(lengths, want_lengths)
    reranker = ModelReranker(model, sharded, batch_size=7, device="cpu", precision="fp32")
    assert reranker.folds_codec_rotation
    np.testing.assert_allclose(_scores(reranker, texts), _reference_scores(model, sharded, len(texts)),
                               rtol=1e-4, atol=1e-4)


def test_shards_of_two_rotations_are_read_rotated_back(tmp_path, tokenizer, texts):
    """``assemble`` refuses shards of two codecs; a store whose shards' rotations differ anyway (assembled by an older
    version) must still never score one shard's codes in another's frame."""
    model = _model("mores", tokenizer)
    whole = _sidecar(tmp_path, model, texts)
    sharded = open_sidecar(_sharded(tmp_path, model, texts, whole.codec.parameters()),
                           expect_model_fingerprint=model.store_fingerprint())
    other = np.linalg.qr(np.random.default_rng(1).standard_normal((32, 32)))[0].astype(np.float32)
    sharded.shards[1].codec._opq.rotation = other  # as if that shard had trained its own codec
    assert sharded.store_rotation is None
    with pytest.raises(ValueError, match="has no rotated frame its shards share"):
        sharded.get_batch([0, 25], rotated=True)
    reranker = ModelReranker(model, sharded, batch_size=7, device="cpu", precision="fp32")
    assert not reranker.folds_codec_rotation
    np.testing.assert_allclose(_scores(reranker, texts), _reference_scores(model, sharded, len(texts)),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["maxsim", "mores"])
def test_under_bf16_the_fold_meets_the_bf16_scoring_copy(kind, tmp_path, tokenizer, texts, monkeypatch):
    """Under bf16 the reranker scores with a bf16 copy of the model: the frame is made from that copy's weights,
    and scores agree with the same copy reading the vectors rotated back, to bf16 accuracy."""
    model = _model(kind, tokenizer)
    sidecar = _sidecar(tmp_path, model, texts)
    folded = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="bf16")
    assert folded.folds_codec_rotation
    got = _scores(folded, texts)
    plain = ModelReranker(model, sidecar, batch_size=7, device="cpu", precision="bf16")
    monkeypatch.setattr(type(plain.scoring_model), "store_frame", lambda self, rotation: None)
    assert not plain.folds_codec_rotation
    want = _scores(plain, texts)
    spread = want.max() - want.min()
    assert spread > 0.1
    np.testing.assert_allclose(got, want, atol=0.03 * spread)

"""Every join between candidates, index and sidecar is checked: a candidate is scored with the vectors of its own
document or refused; a reranker brought along with its sidecar is held to the searcher's index; offsets are
validated when a sidecar opens; the build precision is part of what a sidecar promises; the bf16 weight copy follows
the model's config."""
from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sidecar_forge import reseal

from pyserini_mores import Query, Text, get_reranker
from pyserini_mores.rerankers.learned import ModelReranker
from pyserini_mores.search import RerankingSearcher
from pyserini_mores.sidecar import (
    SidecarCorruptError,
    SidecarMismatchError,
    SidecarReader,
    SidecarRowMismatchError,
    SidecarWriter,
    assemble_shards,
    open_sidecar,
    read_manifest,
)
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.shards import shard_rows

from conftest import RESOURCES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "a text editor for the terminal"


def _candidates(reader) -> list[Text]:
    """Every document of ``reader`` as a candidate with its true row and docid."""
    return [Text(None, {"docid": docid, "lucene_docid": row})
            for row, docid in enumerate(reader.docids(range(reader.num_docs)))]


def _scores(reranker, texts: list[Text]) -> dict[str, float]:
    return {text.id: text.score for text in reranker.rescore(Query(QUERY), texts)}


# ---- a candidate's row holds its own document ------------------------------------------------------------------
def test_shuffled_lucene_docids_are_refused_naming_the_docid_and_the_row(tiny_maxsim_dir, maxsim_sidecar):
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="fp32")
    texts = _candidates(reranker.sidecar)
    rows = [text.metadata["lucene_docid"] for text in texts]
    random.Random(0).shuffle(rows)
    for text, row in zip(texts, rows):
        text.metadata["lucene_docid"] = row
    wrong = [(i, text) for i, text in enumerate(texts) if text.metadata["lucene_docid"] != i]
    first_position, first = wrong[0]
    with pytest.raises(SidecarRowMismatchError) as caught:
        reranker.rescore(Query(QUERY), texts)
    error = caught.value
    row = first.metadata["lucene_docid"]
    stored = reranker.sidecar.docid(row)
    message = str(error)
    assert isinstance(error, ValueError)
    assert f"candidate {first.id!r} has row (lucene_docid) {row}" in message
    assert f"row {row} of sidecar {maxsim_sidecar} holds {stored!r}" in message
    assert f"{len(wrong)} of {len(texts)} candidates disagree" in message
    assert str(reranker.sidecar.index["signature"]) in message and "remap_by_docid=True" in message
    assert (error.docid, error.row, error.stored_docid, error.mismatches) == (first.id, row, stored, len(wrong))
    # explanations read rows through the same check
    one = [Text(None, {"docid": texts[first_position].id, "lucene_docid": row})]
    with pytest.raises(SidecarRowMismatchError):
        reranker._sidecar_rows(one)


def test_remap_by_docid_scores_shuffled_hits_like_correct_ones(tiny_maxsim_dir, maxsim_sidecar, caplog):
    correct = _scores(get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="fp32"),
                      _candidates(open_sidecar(maxsim_sidecar)))
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="fp32",
                            remap_by_docid=True)
    texts = _candidates(reranker.sidecar)
    for text, row in zip(texts, np.roll(np.arange(len(texts)), 3)):
        text.metadata["lucene_docid"] = int(row)
    with caplog.at_level(logging.WARNING, logger="pyserini_mores.rerankers.learned"):
        remapped = _scores(reranker, texts)
    assert remapped == correct
    assert "remap_by_docid=True" in caplog.text


def test_a_candidate_without_a_docid_cannot_be_checked(tiny_maxsim_dir, maxsim_sidecar):
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="fp32")
    with pytest.raises(ValueError, match="the candidate at row 2 has no docid"):
        reranker.rescore(Query(QUERY), [Text(None, {"lucene_docid": 2})])


def test_a_reranker_with_the_sidecar_of_another_index_is_refused_by_the_searcher(tiny_index, tiny_maxsim_dir,
                                                                                  maxsim_sidecar, tmp_path):
    """The same documents indexed in another order: every row means another document."""
    from pyserini_mores.index import build_lucene_index

    (tmp_path / "jsonl").mkdir()
    lines = (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()
    (tmp_path / "jsonl" / "docs.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    reordered = build_lucene_index(tmp_path / "jsonl", tmp_path / "index")
    reranker = get_reranker("maxsim", model=tiny_maxsim_dir, sidecar=maxsim_sidecar, precision="fp32")
    with pytest.raises(SidecarMismatchError, match="was built for another index"):
        RerankingSearcher(reordered, reranker, rerank_depth=5)
    searcher = RerankingSearcher(tiny_index, reranker, rerank_depth=5)  # its own index: accepted
    try:
        assert searcher.sidecar_path == maxsim_sidecar
        assert searcher.search("text editor", k=3)
    finally:
        searcher.close()


def test_an_open_sidecar_handed_to_the_factory_is_checked_against_the_model(tiny_maxsim_dir, maxsim_sidecar,
                                                                            tmp_path):
    from pyserini_mores.models import load_model

    other = load_model("maxsim", tiny_maxsim_dir)
    with torch.no_grad():
        other.encoder.layers[0].ffn.output.bias.add_(0.1)
    with pytest.raises(SidecarMismatchError, match="another model"):
        get_reranker("maxsim", model=other, sidecar=open_sidecar(maxsim_sidecar), precision="fp32")


# ---- offsets validated on open -------------------------------------------------------------------------------------
DIM = 4
DOCIDS = [f"d{i}" for i in range(9)]
LENGTHS = [3, 0, 2, 5, 1, 4, 0, 2, 0]  # empty documents, one of them last
MODEL = {"model_type": "maxsim", "store_variant": "tokens", "fingerprint": "ab" * 32}
INDEX = {"num_docs": len(DOCIDS), "signature": "test:trust"}


def _vectors() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((length, DIM)).astype(np.float32) for length in LENGTHS]


def _write(path: Path, build: dict | None = None) -> Path:
    writer = SidecarWriter(path, dim=DIM, dtype="float32", docids=DOCIDS, model=MODEL, index=INDEX, build=build)
    writer.add(_vectors())
    return writer.finalize()


def _write_sharded(root: Path, count: int = 3) -> tuple[Path, list[Path]]:
    paths = []
    for number in range(count):
        start, end = shard_rows(len(DOCIDS), count, number)
        writer = SidecarWriter(root / f"shard-{number}", dim=DIM, dtype="float32", docids=DOCIDS[start:end],
                               model=MODEL, index=INDEX,
                               shard={"build_id": "trust", "index": number, "count": count, "row_start": start,
                                      "row_end": end, "num_docs": len(DOCIDS)})
        writer.add(_vectors()[start:end])
        paths.append(writer.finalize())
    return assemble_shards(root, paths), paths


CORRUPTIONS = {  # offsets → (damaged offsets, what the error says)
    "decreasing": (lambda o: np.concatenate([o[:1], [o[2] + 1], o[2:]]), r"offsets decrease at row 1 \(4 -> 3\)"),
    "first not 0": (lambda o: np.concatenate([[1], o[1:]]), r"first offset is 1, not 0"),
    "last not num_tokens": (lambda o: np.concatenate([o[:-1], [o[-1] - 1]]),
                            r"last offset is 16 but the manifest has num_tokens=17"),
}


def _damage(offsets_file: Path, how: str) -> None:
    offsets = np.fromfile(offsets_file, dtype="<i8")
    damaged = np.asarray(CORRUPTIONS[how][0](offsets), dtype="<i8")
    assert damaged.shape == offsets.shape  # the right size: only the values are wrong
    damaged.tofile(offsets_file)


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_damaged_offsets_of_the_right_size_are_refused_at_open(tmp_path, how):
    path = _write(tmp_path / "sidecar")
    assert np.array_equal(SidecarReader(path).lengths(), LENGTHS)
    _damage(path / "offsets.bin", how)
    with pytest.raises(SidecarCorruptError, match=CORRUPTIONS[how][1]) as caught:
        SidecarReader(path)
    assert f"({path / 'offsets.bin'})" in str(caught.value) and "offsets.bin: " in str(caught.value)


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_damaged_offsets_in_one_shard_are_refused_at_open(tmp_path, how):
    sharded, shards = _write_sharded(tmp_path / "sharded")
    assert np.array_equal(open_sidecar(sharded).lengths(), LENGTHS)
    _damage(shards[1] / "offsets.bin", how)
    with pytest.raises(SidecarCorruptError, match="offsets.bin") as caught:
        open_sidecar(sharded)
    assert str(shards[1] / "offsets.bin") in str(caught.value)


def test_the_row_check_spans_shards(tmp_path):
    sharded, _ = _write_sharded(tmp_path / "sharded")
    reader, whole = open_sidecar(sharded), SidecarReader(_write(tmp_path / "whole"))
    rows = np.array([8, 0, 4, 3, 7, 1])
    docids = [DOCIDS[row] for row in rows]
    docids[2], docids[4] = "d5", "nope"
    for candidate in (reader, whole):
        assert candidate.docid_mismatches(rows, docids).tolist() == [2, 4]
        assert candidate.docid_mismatches([], []).tolist() == []


# ---- build precision and device ------------------------------------------------------------------------------------
def test_the_build_records_precision_and_device_and_info_shows_them(maxsim_sidecar, tmp_path, capsys):
    manifest = read_manifest(maxsim_sidecar)
    assert manifest.build_precision in ("fp32", "bf16") and manifest.build_device == "cpu"
    assert sidecar_main(["info", str(maxsim_sidecar)]) == 0
    assert f"encoded     precision {manifest.build_precision}, device cpu" in capsys.readouterr().out
    old = tmp_path / "old"
    shutil.copytree(maxsim_sidecar, old)
    data = json.loads((old / "manifest.json").read_text())
    del data["build"]["precision"], data["build"]["device"]  # a build from before they were recorded
    (old / "manifest.json").write_text(json.dumps(data))
    reseal(old)
    assert read_manifest(old).build_precision is None and read_manifest(old).build_device is None
    assert sidecar_main(["info", str(old)]) == 0
    assert "encoded     precision unknown, device unknown (not recorded by the build)" in capsys.readouterr().out


def test_an_fp32_reranker_warns_once_on_a_bf16_built_sidecar(tmp_path, tiny_maxsim_dir, caplog):
    from pyserini_mores.models import load_model

    model = load_model("maxsim", tiny_maxsim_dir)
    bf16_built = tmp_path / "bf16"
    fp32_built = tmp_path / "fp32"
    unknown = tmp_path / "unknown"
    for path, build in ((bf16_built, {"precision": "bf16", "device": "cpu"}),
                        (fp32_built, {"precision": "fp32", "device": "cpu"}), (unknown, None)):
        writer = SidecarWriter(path, dim=model.store_width, dtype="float32", docids=["a", "b"],
                               model={**MODEL, "fingerprint": model.store_fingerprint()},
                               index={"num_docs": 2, "signature": "x"}, build=build)
        writer.add([np.ones((2, model.store_width), np.float32), np.ones((1, model.store_width), np.float32)])
        writer.finalize()
    logger = "pyserini_mores.rerankers.learned"
    with caplog.at_level(logging.WARNING, logger=logger):
        ModelReranker(model, open_sidecar(bf16_built), precision="fp32")
        ModelReranker(model, open_sidecar(bf16_built), precision="fp32")  # once per sidecar
    warnings = [record.getMessage() for record in caplog.records if record.name == logger]
    assert len(warnings) == 1
    assert "scores in fp32" in warnings[0] and "encoded under bf16" in warnings[0]
    assert "only to bf16 accuracy" in warnings[0] and "--precision fp32 --overwrite" in warnings[0]
    assert str(bf16_built) in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logger):
        ModelReranker(model, open_sidecar(fp32_built), precision="fp32")
        ModelReranker(model, open_sidecar(unknown), precision="fp32")
        ModelReranker(model, open_sidecar(bf16_built), precision="bf16")
        attached = ModelReranker(model, None, precision="fp32")
    assert not [record for record in caplog.records if record.name == logger]
    other = tmp_path / "bf16-again"
    shutil.copytree(bf16_built, other)
    with caplog.at_level(logging.WARNING, logger=logger):
        attached.sidecar = open_sidecar(other)  # what the searcher does: attaching checks too
    assert any("encoded under bf16" in record.getMessage() for record in caplog.records)


# ---- the bf16 weight copy follows the config -----------------------------------------------------------------------
def test_the_bf16_copy_follows_a_change_of_reuse(tmp_path, tiny_dims, tokenizer, tiny_documents):
    from pyserini_mores.models.mores import MoresConfig, MoresModel

    torch.manual_seed(0)
    model = MoresModel(MoresConfig(encoder=tiny_dims, n_interaction_blocks=2, reuse="s2", doc_max_length=64),
                       tokenizer).eval()
    texts = [doc["contents"] for doc in tiny_documents[:6]]
    docids = [f"d{i}" for i in range(len(texts))]

    def sidecar(name: str):
        with torch.no_grad():
            reps = model.encode_documents(model.tokenize_documents(texts))
        writer = SidecarWriter(tmp_path / name, dim=model.store_width, dtype="float32", docids=docids,
                               model={"model_type": model.model_type, "store_variant": model.store_variant,
                                      "fingerprint": model.store_fingerprint()},
                               index={"num_docs": len(texts), "signature": "x"})
        writer.add([rep.float() for rep in reps])
        return open_sidecar(writer.finalize(), expect_model_fingerprint=model.store_fingerprint())

    def candidates():
        return [Text(None, {"docid": docid, "lucene_docid": row}) for row, docid in enumerate(docids)]

    reranker = ModelReranker(model, sidecar("s2"), precision="bf16", cast_weights=True)
    reranker.rescore(Query(QUERY), candidates())  # the copy is made, with reuse s2
    model.set_reuse("s1")
    reranker.sidecar = sidecar("s1")
    after = [text.score for text in reranker.rescore(Query(QUERY), candidates())]
    fresh = ModelReranker(model, reranker.sidecar, precision="bf16", cast_weights=True)
    np.testing.assert_array_equal(after, [text.score for text in fresh.rescore(Query(QUERY), candidates())])
    assert reranker.scoring_model.config.reuse == "s1"


def test_verify_against_the_index_finds_every_row_of_a_reordered_index(tiny_index, maxsim_sidecar, tmp_path, capsys):
    """`sidecar verify --index`: the full row ↔ docid check, which opening a sidecar only samples."""
    from pyserini_mores.index import build_lucene_index
    from pyserini_mores.sidecar.__main__ import main as sidecar_main
    from pyserini_mores.sidecar.verify import verify_against_index

    assert verify_against_index(maxsim_sidecar, tiny_index, progress=False) == []
    (tmp_path / "jsonl").mkdir()
    lines = (RESOURCES / "tiny_collection.jsonl").read_text().splitlines()
    (tmp_path / "jsonl" / "docs.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    reordered = build_lucene_index(tmp_path / "jsonl", tmp_path / "index")
    problems = verify_against_index(maxsim_sidecar, reordered, progress=False)
    moved = sum(1 for first, last in zip(lines, reversed(lines)) if first != last)
    assert problems[0].startswith(f"{moved} of {len(lines)} rows hold another document"), problems
    assert "row 0: the index holds" in problems[0]
    assert sidecar_main(["verify", str(maxsim_sidecar), "--index", str(reordered)]) == 1
    assert "rows hold another document" in capsys.readouterr().out
    assert sidecar_main(["verify", str(maxsim_sidecar), "--index", str(tiny_index)]) == 0

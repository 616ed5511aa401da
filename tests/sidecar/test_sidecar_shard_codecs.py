"""Sharded builds under a compressed codec: one codec trained before the shards on documents drawn across the
collection and adopted by every shard (all shards here, one ``--shard I`` at a time after ``--train-codec``), the
store read as one piece, an interrupted build resumed with its saved codec, and the refusals (a shard without its
build's codec, a codec trained for another build, shards of two codecs)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sidecar_forge import reseal

from pyserini_mores.sidecar import SidecarMismatchError, assemble_shards, open_sidecar, verify_sidecar
from pyserini_mores.sidecar import build as build_module
from pyserini_mores.sidecar.__main__ import main as sidecar_main
from pyserini_mores.sidecar.trained_codec import load_trained_codec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# As in test_sidecar_shards.py: one batch size and one torch thread, so that every build encodes the same bits.
SAME_AS_FIXTURE = ("--dtype", "float32", "--batch-size", "3")
OPQ = ("--codec", "opq", "--pq-subquantizers", "4")


def _build(tiny_index, tiny_maxsim_dir, *extra) -> int:
    return sidecar_main(["build", "--index", str(tiny_index), "--reranker", "maxsim", "--model", str(tiny_maxsim_dir),
                         *SAME_AS_FIXTURE, *extra])


def _codes(path: Path) -> bytes:
    """The codes of every row in row order: a whole sidecar's ``tokens.bin``, or its shards' one after the other."""
    reader = open_sidecar(path)
    return b"".join((shard.path / "tokens.bin").read_bytes() for shard in getattr(reader, "shards", [reader]))


@pytest.fixture(scope="module")
def sharded_opq(tiny_index, tiny_maxsim_dir, tmp_path_factory, one_torch_thread) -> Path:
    """Every shard of 3 built here under the opq codec (M = 4), then assembled."""
    output = tmp_path_factory.mktemp("sharded_opq") / "sidecar"
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--output", str(output)) == 0
    return output


@pytest.mark.parametrize("codec", ["opq", "pq"])
def test_every_shard_adopts_one_codec_and_reads_like_an_unsharded_build_of_it(codec, sharded_opq, tiny_index,
                                                                            tiny_maxsim_dir, tmp_path):
    settings = ("--codec", codec, "--pq-subquantizers", "4")
    sharded = sharded_opq
    if codec != "opq":
        sharded = tmp_path / "sharded"
        assert _build(tiny_index, tiny_maxsim_dir, *settings, "--shards", "3", "--output", str(sharded)) == 0
    trained = load_trained_codec(sharded)
    record = json.loads((sharded / "trained-codec.json").read_text())
    assert record["codec"]["name"] == codec and record["codec"]["options"] == {"sample_tokens": 65536,
                                                                               "pq_subquantizers": 4}
    # The tiny collection holds fewer tokens than the sample: every document trains the codec.
    assert record["sample"]["rows"] == list(range(20)) and record["sample"]["tokens"] == trained.trained_on
    whole = tmp_path / "whole"
    assert _build(tiny_index, tiny_maxsim_dir, *settings, "--trained-codec", str(sharded), "--output", str(whole)) == 0
    reader, one = open_sidecar(sharded), open_sidecar(whole)
    assert len(reader.shards) == 3 and reader.dtype == one.dtype == codec
    assert all(np.array_equal(shard.codec.parameters(), trained.parameters) for shard in reader.shards)
    assert np.array_equal(one.codec.parameters(), trained.parameters)
    assert [shard.manifest.codec["trained_on_tokens"] for shard in reader.shards] == [trained.trained_on] * 3
    assert len({shard.manifest.shard["build_id"] for shard in reader.shards}) == 1
    assert _codes(sharded) == _codes(whole)
    for row in range(20):
        assert np.array_equal(reader.get(row), one.get(row))
    if codec == "pq":  # decoded a batch at a time by table lookups alone: a batch across shards reads the same
        rows = [19, 0, 7, 6, 13, 14, 7, 3]
        docs, lengths = reader.get_batch(rows)
        expected_docs, expected_lengths = one.get_batch(rows)
        assert torch.equal(docs, expected_docs) and torch.equal(lengths, expected_lengths)
    assert verify_sidecar(sharded) == []


def test_info_on_a_sharded_sidecar_names_the_codec_its_shards_share(sharded_opq, tmp_path, capsys):
    capsys.readouterr()
    assert sidecar_main(["info", str(sharded_opq)]) == 0
    vectors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("vectors")]
    assert vectors == ["vectors     dim 32, codec opq, pq_subquantizers=4 (trained on 384 tokens), 4 bytes/token, "
                       "one codec in every shard"]
    # a shard whose manifest records other codec parameters (assembled by an older version, which did not check)
    copy = tmp_path / "copy"
    shutil.copytree(sharded_opq, copy)
    shard = sorted(path for path in copy.iterdir() if (path / "codec.bin").exists())[1]
    manifest = json.loads((shard / "manifest.json").read_text())
    manifest["files"]["codec.bin"]["sha256"] = "0" * 64
    (shard / "manifest.json").write_text(json.dumps(manifest))
    reseal(shard)
    sidecar_main(["info", str(copy)])
    out = capsys.readouterr().out
    assert "vectors     dim 32, codec opq, pq_subquantizers=4 (trained on 384 tokens), 4 bytes/token, 2 different " \
           "codecs across the shards" in out


def test_the_codec_sample_is_drawn_across_the_collection(tiny_index, tiny_maxsim_dir, maxsim_sidecar):
    from pyserini_mores.index import open_searcher
    from pyserini_mores.models import load_model

    model = load_model("maxsim", str(tiny_maxsim_dir))
    searcher = open_searcher(tiny_index)
    try:
        # Windows of 16 documents (1 per batch) in a seeded order; the first window holds more than 40 tokens.
        sample, rows, _ = build_module.codec_sample(searcher, model, None, sample_tokens=40, batch_size=1,
                                                 precision="fp32", progress=False)
        again, same_rows, _ = build_module.codec_sample(searcher, model, None, sample_tokens=40, batch_size=1,
                                                     precision="fp32", progress=False)
        _, other_rows, _ = build_module.codec_sample(searcher, model, None, sample_tokens=40, batch_size=1,
                                                  precision="fp32", seed=1, progress=False)
    finally:
        searcher.close()
    assert sample.shape == (40, model.store_width) and sample.dtype == np.float32
    assert len(rows) == 16 and rows.tolist() != list(range(16)) and rows.tolist() == sorted(set(rows.tolist()))
    assert np.array_equal(sample, again) and np.array_equal(rows, same_rows)
    assert not np.array_equal(rows, other_rows)
    # The sample is the drawn documents' stored vectors in row order (other batch neighbours: equal to rounding).
    stored = open_sidecar(maxsim_sidecar)
    expected = np.concatenate([stored.get(int(row)) for row in rows])[:40]
    np.testing.assert_allclose(sample, expected, rtol=0, atol=1e-5)


def test_one_shard_at_a_time_adopts_the_codec_that_train_codec_saved(sharded_opq, tiny_index, tiny_maxsim_dir,
                                                                     tmp_path, capsys):
    output = tmp_path / "opq"
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--shard", "1",
                  "--output", str(output / "shard-1")) == 2
    assert capsys.readouterr().err == (
        f"error: shard 1 of 3 adopts the opq codec trained once for its whole build, but "
        f"{output / 'trained-codec.json'} does not exist: train it with this command, --train-codec in place of "
        f"--shard 1 and --output {output} (or point --trained-codec at the directory that holds it)\n")
    assert not (output / "shard-1").exists() and not (output / "shard-1.partial").exists()

    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--train-codec", "--output", str(output)) == 0
    trained = load_trained_codec(output)
    assert capsys.readouterr().out.startswith(
        f"trained codec written to {output / 'trained-codec.json'}: opq (pq_subquantizers=4), parameters sha256 "
        f"{trained.sha256[:12]}, trained on {trained.trained_on:,} tokens of 20 documents drawn across the collection")
    assert sorted(path.name for path in output.iterdir()) == ["trained-codec.bin", "trained-codec.json"]
    shards = [output / f"shard-{number}" for number in range(3)]
    for number, path in enumerate(shards):
        assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--shard", str(number),
                      "--output", str(path)) == 0
    assert sidecar_main(["assemble", "--output", str(output), *map(str, shards)]) == 0
    reader = open_sidecar(output)
    assert all(np.array_equal(shard.codec.parameters(), trained.parameters) for shard in reader.shards)
    assert verify_sidecar(output) == []
    # A shard adopts a codec from elsewhere with --trained-codec: that of the whole build, its shard 1 byte for byte.
    elsewhere = tmp_path / "elsewhere" / "shard-1"
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--shard", "1", "--trained-codec",
                  str(sharded_opq / "trained-codec.json"), "--output", str(elsewhere)) == 0
    built_whole = sharded_opq / "shard-00001-of-00003"
    for name in ("tokens.bin", "codec.bin", "offsets.bin"):
        assert (elsewhere / name).read_bytes() == (built_whole / name).read_bytes()


def test_an_interrupted_sharded_build_resumes_with_the_codec_it_saved(sharded_opq, tiny_index, tiny_maxsim_dir,
                                                                      tmp_path, monkeypatch, capsys):
    real_encode = build_module._encode_window
    calls = {"n": 0}

    def killed_in_shard_1(*args):  # call 1 encodes the codec sample, 2 shard 0 and 3 shard 1 (windows of 48)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real_encode(*args)

    monkeypatch.setattr(build_module, "_encode_window", killed_in_shard_1)
    output = tmp_path / "opq"
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--output", str(output))
    saved = (output / "trained-codec.json").read_bytes(), (output / "trained-codec.bin").read_bytes()
    assert (output / "shard-00000-of-00003" / "manifest.json").exists()
    monkeypatch.setattr(build_module, "_encode_window", real_encode)

    # Without its codec, the shards already encoded would meet another one: refused.
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("trained-codec.json", "trained-codec.bin"):
        (output / name).rename(aside / name)
    capsys.readouterr()
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--output", str(output)) == 2
    assert capsys.readouterr().err == (
        f"error: 2 shards of this build exist under {output} (e.g. {output / 'shard-00000-of-00003'}) but the codec "
        f"they adopted, {output / 'trained-codec.json'}, is missing: pass --overwrite to train a new one and build "
        "every shard again\n")
    for name in ("trained-codec.json", "trained-codec.bin"):
        (aside / name).rename(output / name)

    # Asked for other codec settings, the saved codec is not replaced silently either.
    assert _build(tiny_index, tiny_maxsim_dir, "--codec", "opq", "--pq-subquantizers", "8", "--shards", "3",
                  "--output", str(output)) == 2
    assert capsys.readouterr().err == (
        f"error: {output / 'trained-codec.json'} is a codec trained for another build: its codec options is "
        "{'sample_tokens': 65536, 'pq_subquantizers': 4}, this build's is {'sample_tokens': 65536, "
        "'pq_subquantizers': 8}; pass --overwrite to train it again (every shard is then built again), or build "
        "elsewhere\n")

    monkeypatch.setattr(build_module, "codec_sample", lambda *args, **kwargs: pytest.fail("trained again"))
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--output", str(output)) == 0
    assert ((output / "trained-codec.json").read_bytes(), (output / "trained-codec.bin").read_bytes()) == saved
    reader = open_sidecar(output)
    trained = load_trained_codec(output)
    assert all(np.array_equal(shard.codec.parameters(), trained.parameters) for shard in reader.shards)
    assert verify_sidecar(output) == []
    # Trained on the same sample as the uninterrupted build: the same codec, the same codes.
    assert np.array_equal(trained.parameters, load_trained_codec(sharded_opq).parameters)
    assert _codes(output) == _codes(sharded_opq)


def test_shards_of_two_codecs_are_not_assembled(sharded_opq, tiny_index, tiny_maxsim_dir, tmp_path):
    other = tmp_path / "m8"
    assert _build(tiny_index, tiny_maxsim_dir, "--codec", "opq", "--pq-subquantizers", "8", "--shards", "3",
                  "--output", str(other)) == 0
    first = sharded_opq / "shard-00000-of-00003"
    foreign = other / "shard-00001-of-00003"
    with pytest.raises(SidecarMismatchError) as error:
        assemble_shards(tmp_path / "mixed", [first, foreign, sharded_opq / "shard-00002-of-00003"])
    message = str(error.value)
    assert message.startswith(f"{foreign} is a shard of another build: its codec is opq (sample_tokens=65536, "
                              "pq_subquantizers=8) with parameters sha256 ")
    assert f"but {first} has opq (sample_tokens=65536, pq_subquantizers=4) with parameters sha256 " in message


def test_codec_flags_are_checked(tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    with pytest.raises(SystemExit, match="--train-codec needs a compressed --codec"):
        _build(tiny_index, tiny_maxsim_dir, "--train-codec", "--output", str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="--trained-codec needs a compressed --codec"):
        _build(tiny_index, tiny_maxsim_dir, "--trained-codec", str(tmp_path), "--output", str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="--train-codec trains the codec every shard adopts; drop --shard"):
        _build(tiny_index, tiny_maxsim_dir, *OPQ, "--train-codec", "--shards", "2", "--shard", "0",
               "--output", str(tmp_path / "x"))
    capsys.readouterr()
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--trained-codec", str(tmp_path / "none"),
                  "--output", str(tmp_path / "x")) == 2
    assert capsys.readouterr().err == (f"error: --trained-codec {tmp_path / 'none'}: "
                                       f"{tmp_path / 'none' / 'trained-codec.json'} does not exist\n")
    assert not (tmp_path / "x").exists()


def test_a_damaged_trained_codec_is_refused(sharded_opq, tiny_index, tiny_maxsim_dir, tmp_path, capsys):
    copy = tmp_path / "codec"
    copy.mkdir()
    for name in ("trained-codec.json", "trained-codec.bin"):
        shutil.copy(sharded_opq / name, copy / name)
    data = bytearray((copy / "trained-codec.bin").read_bytes())
    data[7] ^= 0x10
    (copy / "trained-codec.bin").write_bytes(bytes(data))
    assert _build(tiny_index, tiny_maxsim_dir, *OPQ, "--shards", "3", "--shard", "0", "--trained-codec", str(copy),
                  "--output", str(tmp_path / "shard-0")) == 2
    assert capsys.readouterr().err == (f"error: {copy / 'trained-codec.bin'} does not match its sha256 in "
                                       f"{copy / 'trained-codec.json'}; train the codec again (--train-codec "
                                       "--overwrite)\n")

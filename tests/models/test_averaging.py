"""Weight averaging (model soups): every tensor is the weighted mean, refusals name what does not match, and the
``train average`` command writes a model that loads to the same weights."""
from __future__ import annotations

import pytest
import torch
from tiny_models import save_tiny_bert

from pyserini_mores.models import load_model
from pyserini_mores.models.averaging import average_models

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "what is a text editor"
DOCUMENTS = ["Vim is a highly configurable text editor.", "apt installs packages.", "The Linux kernel."]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("backbone") / "tiny-bert"
    save_tiny_bert(path, tokenizer, layers=2, seed=3)
    return path


def _fine_tuned(backbone, seed, **config):
    """A cross-encoder as fine-tuning from ``backbone`` leaves it: every parameter moved, differently per seed."""
    model = load_model("cross-encoder", str(backbone), **config)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def test_every_tensor_is_the_weighted_mean(backbone):
    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    soup = average_models([first, second], [0.25, 0.75])
    for name, tensor in soup.state_dict().items():
        a, b = first.state_dict()[name], second.state_dict()[name]
        if tensor.is_floating_point():
            assert not torch.equal(a, b), f"{name}: the two models must differ for the test to mean anything"
            torch.testing.assert_close(tensor, 0.25 * a + 0.75 * b, rtol=0, atol=1e-6, msg=name)
        else:
            assert torch.equal(tensor, a), name


def test_equal_weights_by_default_and_a_model_averaged_with_itself_is_itself(backbone):
    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    halves = average_models([first, second], [0.5, 0.5])
    assert all(torch.equal(tensor, halves.state_dict()[name])
               for name, tensor in average_models([first, second]).state_dict().items())
    itself = average_models([first, first, first])
    assert itself.fingerprint() == first.fingerprint()
    assert torch.equal(itself.score_texts(QUERY, DOCUMENTS), first.score_texts(QUERY, DOCUMENTS))


def test_a_tensor_the_models_share_is_kept_bit_for_bit(backbone):
    """A part trained frozen (MORES's document module against its sidecar) must keep its store fingerprint: a
    weighted sum of equal copies turns -0.0 into 0.0 (the shipped MORES's word embeddings hold some)."""
    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    name = "encoder.embeddings.word_embeddings.weight"
    shared = first.state_dict()[name].clone()
    shared[:, 0] = -0.0
    for model in (first, second):
        model.load_state_dict({name: shared}, strict=False)
    for soup in (average_models([first, second]), average_models([first, second, first])):
        kept = soup.state_dict()[name]
        assert torch.equal(kept.view(torch.int32), shared.view(torch.int32))
        assert not torch.equal(soup.state_dict()["head.weight"], first.state_dict()["head.weight"])  # the others mixed


def test_the_models_are_left_as_they_were(backbone):
    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    before = first.fingerprint(), second.fingerprint()
    average_models([first, second])
    assert (first.fingerprint(), second.fingerprint()) == before


@pytest.mark.parametrize("weights, message", [
    ([1.0], r"1 weights for 2 models: give one weight per model"),
    ([0.6, 0.6], r"the weights must be positive and sum to 1, not \[0.6, 0.6\]"),
    ([1.5, -0.5], r"the weights must be positive and sum to 1, not \[1.5, -0.5\]"),
])
def test_bad_weights_are_refused(backbone, weights, message):
    with pytest.raises(ValueError, match=message):
        average_models([_fine_tuned(backbone, 1), _fine_tuned(backbone, 2)], weights)


def test_other_architectures_are_refused_by_name(backbone):
    first = _fine_tuned(backbone, 1)
    with pytest.raises(ValueError, match="averaging needs at least two models, not 1"):
        average_models([first])
    with pytest.raises(ValueError, match="model 2's config differs from model 1's in query_max_length"):
        average_models([first, _fine_tuned(backbone, 2, query_max_length=8)])
    maxsim = load_model("maxsim", str(backbone))
    with pytest.raises(ValueError, match="model 2 is a 'maxsim' model, model 1 a 'cross-encoder' one"):
        average_models([first, maxsim])


def test_average_command_writes_the_soup(backbone, tmp_path, capsys):
    from pyserini_mores.train.__main__ import main

    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    first.save_pretrained(tmp_path / "a")
    second.save_pretrained(tmp_path / "b")
    assert main(["average", "--model-type", "cross-encoder", "--model", str(tmp_path / "a"), "--model",
                 str(tmp_path / "b"), "--weights", "0.3", "0.7", "--output", str(tmp_path / "soup")]) == 0
    assert f"stored 0.3 × {tmp_path / 'a'} + 0.7 × {tmp_path / 'b'} in {tmp_path / 'soup'}" in capsys.readouterr().out
    loaded = load_model("cross-encoder", tmp_path / "soup")
    assert loaded.fingerprint() == average_models([first, second], [0.3, 0.7]).fingerprint()
    assert not (tmp_path / "soup.partial").exists()  # written there, then renamed into place
    before = (tmp_path / "soup" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit, match=r"soup exists; the average is written to a new directory: remove it, name "
                                         r"another --output or pass --overwrite"):
        main(["average", "--model-type", "cross-encoder", "--model", str(tmp_path / "a"), "--model",
              str(tmp_path / "b"), "--output", str(tmp_path / "soup")])
    assert (tmp_path / "soup" / "model.safetensors").read_bytes() == before  # nothing lost
    (tmp_path / "file").write_text("not a checkpoint")
    with pytest.raises(SystemExit, match=r"file is a file; --output names the checkpoint directory the average is "
                                         r"written to"):
        main(["average", "--model-type", "cross-encoder", "--model", str(tmp_path / "a"), "--model",
              str(tmp_path / "b"), "--output", str(tmp_path / "file"), "--overwrite"])
    assert (tmp_path / "file").read_text() == "not a checkpoint"


def test_average_command_overwrites_only_when_asked(backbone, tmp_path):
    """--overwrite (the reproduction pipeline re-averaging a retrained ingredient) replaces the whole directory."""
    from pyserini_mores.train.__main__ import main

    first, second = _fine_tuned(backbone, 1), _fine_tuned(backbone, 2)
    first.save_pretrained(tmp_path / "a")
    second.save_pretrained(tmp_path / "b")
    first.save_pretrained(tmp_path / "soup")
    (tmp_path / "soup" / "stale.txt").write_text("left by the old checkpoint")
    assert main(["average", "--model-type", "cross-encoder", "--model", str(tmp_path / "a"), "--model",
                 str(tmp_path / "b"), "--output", str(tmp_path / "soup"), "--overwrite"]) == 0
    assert load_model("cross-encoder", tmp_path / "soup").fingerprint() == average_models([first, second]).fingerprint()
    assert not (tmp_path / "soup" / "stale.txt").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b", "soup"]  # no .partial or .replaced left

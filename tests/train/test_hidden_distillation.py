"""Hidden-state distillation (``train --hidden-teacher``): the student's query-token states after each interaction
block are pulled towards a frozen cross-encoder's at the mirrored layer — a real loss beside the ranking loss that
trains, zero when the student computes the teacher's states, refused when the states cannot align, and never a
gradient for the teacher."""
from __future__ import annotations

import pytest
import torch
from test_train import _dims, _tiny_model
from tiny_models import spread_weights

from pyserini_mores.models import load_model
from pyserini_mores.models._layers import BertDims
from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
from pyserini_mores.train.__main__ import build_parser
from pyserini_mores.train.data import GroupCollator, TrainingGroup
from pyserini_mores.train.hidden import HiddenStateDistillation
from pyserini_mores.train.objectives import RankingObjective
from pyserini_mores.train.trainer import TrainingSettings, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUPS = [
    TrainingGroup("text editor for the terminal", "vim is a text editor", ("nginx serves the web",)),
    TrainingGroup("web server reverse proxy", "nginx is a web server and reverse proxy", ("numpy arrays",)),
    TrainingGroup("python arrays", "numpy gives python fast arrays", ("emacs edits text",)),
    TrainingGroup("embedded database", "sqlite is a database in one file", ("apache serves the web",)),
]


def _teacher(tokenizer, dims: BertDims | None = None, seed: int = 7, **overrides) -> CrossEncoder:
    torch.manual_seed(0)
    model = CrossEncoder(CrossEncoderConfig(encoder=dims or _dims(), doc_max_length=48, **overrides), tokenizer)
    return spread_weights(model, seed).eval()


def _losses(student, hidden, loss: str = "pointwise") -> dict:
    return RankingObjective(student, loss, hidden=hidden)(**GroupCollator(student, hidden)(GROUPS))


@pytest.mark.parametrize("model_type", ["mores", "prettr"])
def test_the_hidden_loss_is_added_to_the_ranking_loss(tokenizer, model_type):
    student = spread_weights(_tiny_model(model_type, tokenizer), 2).eval()  # dropout off: comparable losses
    hidden = HiddenStateDistillation(_teacher(tokenizer), student, weight=0.5)
    with torch.no_grad():
        losses = _losses(student, hidden)
        plain = RankingObjective(student, "pointwise")(**GroupCollator(student)(GROUPS))["loss"]
    assert losses["hidden_loss"] > 0.01
    torch.testing.assert_close(losses["ranking_loss"], plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(losses["loss"], plain + 0.5 * losses["hidden_loss"], rtol=0, atol=1e-5)


def test_the_hidden_loss_is_zero_when_the_student_computes_the_teachers_states(tokenizer, tmp_path):
    """PreTTR split at layer 0 from a cross-encoder whose queries fill its block (every query cut to [CLS] a b [SEP])
    is that cross-encoder, layer by layer: its query states after layers 1..L are the teacher's."""
    teacher = _teacher(tokenizer, query_max_length=4)
    teacher.save_pretrained(tmp_path / "teacher")
    student = load_model("prettr", tmp_path / "teacher", join_layer=0, query_max_length=4, doc_max_length=48).eval()
    hidden = HiddenStateDistillation(teacher, student)
    with torch.no_grad():
        assert hidden.layers == 4 and _losses(student, hidden, "listwise")["hidden_loss"] < 1e-10
        student.encoder.layers[2].ffn.output.weight.mul_(1.5)  # from layer 3 on, the states differ
        assert _losses(student, hidden, "listwise")["hidden_loss"] > 1e-4


def test_training_with_a_hidden_teacher_lowers_the_hidden_loss_and_logs_both_losses(tokenizer, tmp_path):
    _teacher(tokenizer).save_pretrained(tmp_path / "teacher")
    spread_weights(_tiny_model("mores", tokenizer), 2).save_pretrained(tmp_path / "init")
    settings = TrainingSettings(model_type="mores", init=str(tmp_path / "init"), triples="unused",
                                output=str(tmp_path / "out"), loss="listwise", batch_size=4, max_steps=8, lr=3e-3,
                                seed=3, save_steps=1000, logging_steps=1, dropout=0.0,
                                hidden_teacher=str(tmp_path / "teacher"), hidden_weight=2.0)
    result = train(settings, groups=GROUPS, progress=False)
    logged = [entry for entry in result.log_history if "hidden_loss" in entry]
    assert len(logged) == 8 and all("ranking_loss" in entry for entry in logged)
    first, last = logged[0], logged[-1]
    assert first["loss"] == pytest.approx(first["ranking_loss"] + 2.0 * first["hidden_loss"], rel=1e-5)
    assert last["hidden_loss"] < 0.7 * first["hidden_loss"], [entry["hidden_loss"] for entry in logged]
    assert load_model("mores", tmp_path / "out").config.n_interaction_blocks == 2  # the student, not the teacher


def test_the_teacher_gets_no_gradient(tokenizer):
    student = spread_weights(_tiny_model("mores", tokenizer), 2).train()
    teacher = _teacher(tokenizer)
    hidden = HiddenStateDistillation(teacher, student)
    _losses(student, hidden)["loss"].backward()
    assert all(parameter.grad is None and not parameter.requires_grad for parameter in teacher.parameters())
    assert not teacher.training
    blocks = student.interaction_module.blocks
    assert blocks[0].ffn.output.weight.grad is not None and blocks[0].ffn.output.weight.grad.abs().sum() > 0


def test_states_that_cannot_align_are_refused(tokenizer):
    student = _tiny_model("mores", tokenizer)
    wider = BertDims(hidden_size=48, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=256)
    with pytest.raises(ValueError, match="the student's states are 32 wide, the teacher's 48"):
        HiddenStateDistillation(_teacher(tokenizer, wider), student)
    with pytest.raises(ValueError, match="mirror the teacher's last 2, but the teacher has 1"):
        HiddenStateDistillation(_teacher(tokenizer, _dims(1)), student)
    with pytest.raises(ValueError, match="the teacher cuts queries at 8 tokens, the student at 16"):
        HiddenStateDistillation(_teacher(tokenizer, query_max_length=8), student)
    with pytest.raises(ValueError, match="must be a cross-encoder, not a 'mores'"):
        HiddenStateDistillation(_tiny_model("mores", tokenizer), student)
    with pytest.raises(ValueError, match="a 'tk' model has no query states"):
        HiddenStateDistillation(_teacher(tokenizer), _tiny_model("tk", tokenizer))
    hidden = HiddenStateDistillation(_teacher(tokenizer), student)
    batch = GroupCollator(student, hidden)(GROUPS)
    batch["teacher_query_batch"] = hidden.teacher.tokenize_queries(["another query"] * len(batch["labels"]))
    with pytest.raises(ValueError, match="the teacher's query tokens differ from the student's"):
        RankingObjective(student, "pointwise", hidden=hidden)(**batch)
    with pytest.raises(ValueError, match="needs the teacher's inputs in the batch"):
        RankingObjective(student, "pointwise", hidden=hidden)(**GroupCollator(student)(GROUPS))


def test_the_settings_and_the_command_line(tmp_path):
    args = build_parser().parse_args(["train", "--hidden-teacher", "debian-cross-encoder", "--hidden-weight", "0.5",
                                      "--output", "o"])
    assert (args.hidden_teacher, args.hidden_weight) == ("debian-cross-encoder", 0.5)
    values = dict(init="x", triples="t", output=str(tmp_path))
    assert TrainingSettings(model_type="prettr", hidden_teacher="t", **values).hidden_weight == 1.0
    with pytest.raises(ValueError, match="a 'tk' model has no query states"):
        TrainingSettings(model_type="tk", hidden_teacher="t", **values)
    with pytest.raises(ValueError, match="name the teacher"):
        TrainingSettings(model_type="mores", hidden_weight=0.5, **values)
    with pytest.raises(ValueError, match="hidden_weight must be positive"):
        TrainingSettings(model_type="mores", hidden_teacher="t", hidden_weight=0.0, **values)


def test_a_run_with_a_hidden_teacher_resumes_only_with_it(tokenizer, tmp_path):
    spread_weights(_tiny_model("mores", tokenizer), 2).save_pretrained(tmp_path / "init")
    _teacher(tokenizer).save_pretrained(tmp_path / "teacher")
    values = dict(model_type="mores", init=str(tmp_path / "init"), triples="unused", output=str(tmp_path / "out"),
                  loss="listwise", batch_size=4, max_steps=2, lr=1e-3, seed=3, save_steps=1)
    train(TrainingSettings(**values, hidden_teacher=str(tmp_path / "teacher")), groups=GROUPS, progress=False)
    with pytest.raises(ValueError, match="hidden_teacher"):
        train(TrainingSettings(**{**values, "max_steps": 3}), resume=True, groups=GROUPS, progress=False)

"""Distillation losses against their definitions on hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch

from pyserini_mores.models.losses import hidden_state_mse, margin_mse
from pyserini_mores.train.objectives import loss_of_outputs

INF = float("inf")


def test_margin_mse_is_the_mean_squared_margin_error():
    student = torch.tensor([[3.0, 1.0, 2.0], [0.0, 1.0, -1.0]])
    teacher = torch.tensor([[5.0, 2.0, 5.0], [1.0, 1.0, 0.0]])
    # margins: student (2, 1), (-1, 1); teacher (3, 0), (0, 1); errors -1, 1, -1, 0
    assert margin_mse(student, teacher).item() == pytest.approx((1 + 1 + 1 + 0) / 4)


def test_margin_mse_ignores_the_score_scale_but_not_the_margins():
    student = torch.tensor([[13.0, 10.0]])
    assert margin_mse(student, torch.tensor([[3.0, 0.0]])).item() == 0.0  # same margin, other scale
    assert margin_mse(student, torch.tensor([[0.0, 3.0]])).item() == pytest.approx(36.0)


def test_margin_mse_leaves_out_pairs_the_teacher_did_not_score():
    """Batch negatives (another query's positive) carry -inf as teacher score: no margin to learn from them."""
    student = torch.tensor([[2.0, 1.0, 7.0]])
    teacher = torch.tensor([[4.0, 1.0, -INF]])
    assert margin_mse(student, teacher).item() == pytest.approx((1.0 - 3.0) ** 2)
    nothing = margin_mse(student, torch.tensor([[-INF, -INF, -INF]]))
    assert nothing.item() == 0.0 and nothing.requires_grad is False


def test_margin_mse_gradient_is_the_definitions():
    student = torch.tensor([[3.0, 1.0]], requires_grad=True)
    margin_mse(student, torch.tensor([[5.0, 2.0]])).backward()
    # d/ds⁺ (s⁺ − s⁻ − 3)² = 2·(2 − 3) = −2; d/ds⁻ = +2
    assert student.grad.tolist() == [[-2.0, 2.0]]


def test_the_objective_routes_margin_mse_and_refuses_unscored_groups():
    scores = torch.tensor([3.0, 1.0, 2.0, 0.0, 1.0, -1.0])
    teacher = torch.tensor([[5.0, 2.0, 5.0], [1.0, 1.0, 0.0]])
    labels = torch.tensor([1, 0, 0, 1, 0, 0])
    assert loss_of_outputs(scores, labels, 3, "margin-mse", teacher_scores=teacher).item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="needs scored triples"):
        loss_of_outputs(scores, labels, 3, "margin-mse")


def test_hidden_state_distillation_is_zero_when_the_student_is_the_teacher():
    states = torch.randn(2, 5, 8)
    assert hidden_state_mse(states, states.clone()).item() == 0.0
    assert hidden_state_mse(states, states + 1.0).item() == pytest.approx(1.0)


def test_hidden_state_distillation_counts_only_real_tokens():
    student, teacher = torch.zeros(1, 3, 2), torch.tensor([[[1.0, 1.0], [2.0, 2.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert hidden_state_mse(student, teacher, mask).item() == pytest.approx((1.0 + 4.0) / 2)
    with pytest.raises(ValueError, match="same shape"):
        hidden_state_mse(student, teacher[:, :2])


def test_hidden_state_distillation_does_not_train_the_teacher():
    student = torch.zeros(1, 2, 2, requires_grad=True)
    teacher = torch.ones(1, 2, 2, requires_grad=True)
    hidden_state_mse(student, teacher).backward()
    assert teacher.grad is None and torch.allclose(student.grad, torch.full((1, 2, 2), -2.0 / 4))
    assert not math.isnan(student.grad.sum().item())

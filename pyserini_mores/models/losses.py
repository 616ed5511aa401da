"""Ranking losses shared by every model family, and the one rule that turns a 2-class head into a ranking score.

Conventions (all functions return a scalar mean over the batch, computed in fp32 even under autocast):

* **pointwise** — MORES's default (Dai & Callan 2019, the MORES code): 2-class softmax cross-entropy on
  ``logits [B, 2]`` with ``labels [B]`` in {0, 1}. For two classes this equals binary cross-entropy on the logit
  difference ``s = logits[:, 1] - logits[:, 0]``, so :func:`pointwise_cross_entropy` also accepts ranking scores
  ``[B]`` (or a 1-logit head ``[B, 1]``) and gives the same value.
* **pairwise** — hinge ``max(0, margin - s⁺ + s⁻)`` (EARL's "pairwise hinge", TK's loss).
* **listwise** — softmax cross-entropy over a group of candidates of one query (``[Q, G]``); with G = 2 and the
  positive first this is PreTTR's pairwise softmax loss ``-log softmax([s⁺, s⁻])[0]``.
* **distill** — the same softmax cross-entropy against a teacher's softmax over the group instead of the labels
  (listwise knowledge distillation).
* **margin-mse** — Margin-MSE (Hofstätter et al. 2020, "Improving Efficient Neural Ranking Models with
  Cross-Architecture Knowledge Distillation"): the squared error between the student's and the teacher's margins
  ``s⁺ − s⁻``, so a student of another architecture learns the teacher's differences, not its score scale.
* :func:`hidden_state_mse` — dense per-token supervision where a student's states mirror a teacher's layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def ranking_scores(logits: torch.Tensor) -> torch.Tensor:
    """Ranking score ``[B]`` of head outputs ``logits [B, 2]`` (→ ``logits[:, 1] - logits[:, 0]``) or ``[B, 1]``.

    The logit difference is the log-odds of relevance, strictly monotone in ``P(rel) = softmax(logits)[:, 1]``, so
    it ranks exactly as the paper's ``P(rel)`` does while keeping resolution where softmax saturates (and it is
    what :func:`pointwise_cross_entropy` trains when given scores).
    """
    if logits.shape[-1] == 2:
        return logits[..., 1] - logits[..., 0]
    if logits.shape[-1] == 1:
        return logits[..., 0]
    raise ValueError(f"expected logits with 1 or 2 columns, got shape {tuple(logits.shape)}")


def pointwise_cross_entropy(logits_or_scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Pointwise relevance loss: 2-class CE on ``logits [B, 2]``, or binary CE on scores ``[B]`` / ``[B, 1]``.

    Args:
        logits_or_scores: ``[B, 2]`` head logits (class 1 = relevant), or ``[B]``/``[B, 1]`` ranking scores.
        labels: ``[B]`` binary relevance (ints or floats in {0, 1}).

    Example:
        >>> pointwise_cross_entropy(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))  # -log 0.5
        tensor(0.6931)
    """
    values = logits_or_scores.float()
    if values.dim() == 2 and values.shape[-1] == 2:
        return F.cross_entropy(values, labels.long())
    if values.dim() == 2 and values.shape[-1] == 1:
        values = values[:, 0]
    if values.dim() != 1:
        raise ValueError(f"expected [B, 2] logits or [B] scores, got shape {tuple(logits_or_scores.shape)}")
    return F.binary_cross_entropy_with_logits(values, labels.float())


def pairwise_hinge(positive_scores: torch.Tensor, negative_scores: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Mean of ``max(0, margin - s⁺ + s⁻)``.

    Args:
        positive_scores: ``[B]`` scores of relevant documents.
        negative_scores: ``[B]`` (one negative per positive) or ``[B, N]`` (N negatives per positive; every
            (positive, negative) pair counts once).
        margin: the hinge margin (1.0 in TK; EARL does not state one).
    """
    positive = positive_scores.float()
    negative = negative_scores.float()
    if negative.dim() == positive.dim() + 1:
        positive = positive.unsqueeze(-1)
    return torch.clamp(margin - positive + negative, min=0).mean()


def listwise_softmax_cross_entropy(grouped_scores: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax cross-entropy over the candidates of each query.

    Args:
        grouped_scores: ``[Q, G]`` scores, one row per query.
        labels: ``[Q, G]`` non-negative relevance; the target distribution of a row is ``labels / labels.sum()``.
            ``None`` means the relevant document is in column 0 of every row (the usual ``(pos, neg, neg, …)``
            grouping). Rows without any relevant document are skipped.

    Example:
        >>> listwise_softmax_cross_entropy(torch.tensor([[1.0, 1.0]]))  # -log 0.5
        tensor(0.6931)
    """
    log_probs = grouped_scores.float().log_softmax(-1)
    if labels is None:
        return -log_probs[:, 0].mean()
    labels = labels.to(log_probs.dtype)
    totals = labels.sum(-1)
    keep = totals > 0
    if not bool(keep.any()):
        return (grouped_scores.float() * 0).sum()  # no relevant document: zero loss, graph kept
    target = labels[keep] / totals[keep, None]
    return -(target * log_probs[keep]).sum(-1).mean()


def listwise_distillation(grouped_scores: torch.Tensor, teacher_scores: torch.Tensor,
                          temperature: float = 1.0) -> torch.Tensor:
    """Cross-entropy of the student's softmax over each group against the teacher's ``softmax(teacher / T)``: the
    KL divergence from teacher to student plus the teacher's entropy, a constant, so the gradient is the KL's.

    Args:
        grouped_scores: ``[Q, G]`` student scores.
        teacher_scores: ``[Q, G]`` teacher scores; ``-inf`` gives a candidate no target probability.
        temperature: divides the teacher's scores (above 1 flattens its distribution, below 1 sharpens it).

    Example:
        >>> listwise_distillation(torch.tensor([[0.0, 0.0]]), torch.tensor([[5.0, float('-inf')]]))  # -log 0.5
        tensor(0.6931)
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, not {temperature}")
    target = (teacher_scores.float() / temperature).softmax(-1)
    return listwise_softmax_cross_entropy(grouped_scores, target)


def margin_mse(grouped_scores: torch.Tensor, teacher_scores: torch.Tensor) -> torch.Tensor:
    """Mean over (positive, negative) pairs of ``((s⁺ − s⁻) − (t⁺ − t⁻))²`` (Margin-MSE, Hofstätter et al. 2020).

    Args:
        grouped_scores: ``[Q, G]`` student scores, the positive in column 0.
        teacher_scores: ``[Q, G]`` teacher scores of the same candidates; a non-finite teacher score (``-inf``: a
            batch negative the teacher never scored) leaves its pair out.

    Example:
        >>> margin_mse(torch.tensor([[3.0, 1.0]]), torch.tensor([[5.0, 2.0]]))  # ((3 - 1) - (5 - 2))² = 1
        tensor(1.)
    """
    student = grouped_scores.float()
    teacher = teacher_scores.float().to(student.device)
    student_margins = student[:, :1] - student[:, 1:]
    teacher_margins = teacher[:, :1] - teacher[:, 1:]
    scored = torch.isfinite(teacher_margins)
    if not bool(scored.any()):
        return (student * 0).sum()  # nothing the teacher scored: zero loss, graph kept
    return (student_margins[scored] - teacher_margins[scored]).pow(2).mean()


def hidden_state_mse(student_states: torch.Tensor, teacher_states: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error between aligned token states, averaged over the real tokens.

    Args:
        student_states: ``[B, L, n]``, e.g. MORES's query-token states after interaction block k.
        teacher_states: ``[B, L, n]``, the teacher's states of the same tokens at the mirrored layer (a
            cross-encoder's query tokens at layer L − K + k); no gradient flows into the teacher.
        mask: ``[B, L]``, 1 for real tokens; ``None``: every token counts.
    """
    if student_states.shape != teacher_states.shape:
        raise ValueError(f"student states {tuple(student_states.shape)} and teacher states "
                         f"{tuple(teacher_states.shape)} must have the same shape")
    squared = (student_states.float() - teacher_states.detach().float()).pow(2).mean(-1)
    if mask is None:
        return squared.mean()
    weights = mask.to(squared.dtype)
    return (squared * weights).sum() / weights.sum().clamp(min=1)


__all__ = ["ranking_scores", "pointwise_cross_entropy", "pairwise_hinge", "listwise_softmax_cross_entropy",
           "listwise_distillation", "margin_mse", "hidden_state_mse"]

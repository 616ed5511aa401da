"""Attention written out while training (:func:`attention_context`): the same values and gradients as PyTorch's
fused kernel, taken exactly when it is meant to be, and every model scores the same with gradients as without."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyserini_mores.models._layers import WRITTEN_OUT_MAX_QUERIES, Attention, attention_context

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCUMENTS = [
    "Vim is a highly configurable text editor built to make creating and changing any kind of text efficient.",
    "apt installs packages.",
    "The Linux kernel manages hardware, memory and processes.",
]


def _heads(query_rows: int, dtype=torch.float64, key_rows: int = 7):
    generator = torch.Generator().manual_seed(query_rows)
    shapes = ((3, 2, query_rows, 8), (3, 2, key_rows, 8), (3, 2, key_rows, 8))
    tensors = [torch.randn(shape, generator=generator, dtype=dtype).requires_grad_() for shape in shapes]
    mask = torch.zeros(3, 1, 1, key_rows, dtype=torch.bool)
    mask[0, ..., :2] = True  # a short document; row 1 has no key at all (an empty document); row 2 is full
    mask[2] = True
    return tensors, mask


def _refuse_the_fused_kernel(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("the fused kernel ran")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refused)


@pytest.mark.parametrize("query_rows", [1, WRITTEN_OUT_MAX_QUERIES])
def test_written_out_attention_equals_the_fused_kernel(monkeypatch, query_rows):
    (queries, keys, values), mask = _heads(query_rows)
    fused = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)
    fused_grads = torch.autograd.grad((fused * fused).sum(), (queries, keys, values))
    _refuse_the_fused_kernel(monkeypatch)  # so the comparison below is not the fused kernel against itself
    written = attention_context(queries, keys, values, mask)
    written_grads = torch.autograd.grad((written * written).sum(), (queries, keys, values))
    torch.testing.assert_close(written, fused, rtol=1e-12, atol=1e-12)
    assert written[1].abs().max() == 0  # no key: zeros, not NaN
    for mine, theirs in zip(written_grads, fused_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


def test_written_out_attention_keeps_a_given_scale_and_an_fp32_softmax_under_bf16(monkeypatch):
    (queries, keys, values), mask = _heads(4, dtype=torch.float32)
    fused = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=0.3)
    _refuse_the_fused_kernel(monkeypatch)
    torch.testing.assert_close(attention_context(queries, keys, values, mask, scale=0.3), fused)
    low = [t.detach().bfloat16().requires_grad_() for t in (queries, keys, values)]
    reference = attention_context(queries, keys, values, mask).detach()
    torch.testing.assert_close(attention_context(*low, mask).float(), reference, rtol=0.02, atol=0.02)


def test_attend_takes_keys_split_into_heads_and_one_query_side_for_every_candidate(tiny_dims):
    torch.manual_seed(0)
    attention = Attention(tiny_dims).double().eval()
    query_side = torch.randn(1, 3, tiny_dims.hidden_size, dtype=torch.float64)
    memory = torch.randn(4, 5, tiny_dims.hidden_size, dtype=torch.float64)
    mask = torch.ones(4, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 2:] = False
    keys, values = attention.project_keys_values(memory)
    # the reference: every candidate with its own copy of the query side, keys and values as projected
    expected = attention.attend(query_side.expand(4, -1, -1).clone(), keys, values, mask)
    torch.testing.assert_close(attention.attend(query_side, keys, values, mask), expected, rtol=0, atol=1e-12)
    split = attention.attend(query_side, attention.split_heads(keys), attention.split_heads(values), mask)
    torch.testing.assert_close(split, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(attention.attend(query_side, values, keys, mask), expected)  # the halves matter


def test_long_query_sides_and_calls_without_gradients_keep_the_fused_kernel(monkeypatch):
    (queries, keys, values), mask = _heads(WRITTEN_OUT_MAX_QUERIES + 1)
    short, short_mask = _heads(2)
    _refuse_the_fused_kernel(monkeypatch)
    with pytest.raises(AssertionError, match="fused kernel ran"):
        attention_context(queries, keys, values, mask)
    with torch.no_grad(), pytest.raises(AssertionError, match="fused kernel ran"):
        attention_context(*short, short_mask)
    with pytest.raises(AssertionError, match="fused kernel ran"):
        attention_context(*(t.detach() for t in short), short_mask)


def _model(kind: str, dims, tokenizer):
    torch.manual_seed(0)
    if kind == "mores":
        from pyserini_mores.models.mores import MoresConfig, MoresModel

        return MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=2, reuse="s1", doc_max_length=64), tokenizer)
    if kind == "prettr":
        from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel

        return PreTTRModel(PreTTRConfig(encoder=dims, join_layer=2, doc_max_length=64), tokenizer)
    from pyserini_mores.models.tk import TKConfig, TKModel

    return TKModel(TKConfig(embedding_dim=dims.hidden_size, vocab_size=len(tokenizer), num_layers=2, num_heads=4,
                            head_dim=8, ffn_dim=16, doc_max_length=64), tokenizer)


@pytest.mark.parametrize("kind", ["mores", "prettr", "tk"])
def test_models_score_the_same_while_training(monkeypatch, tiny_dims, tokenizer, kind):
    """The training forward (gradients recorded: short query sides written out, MORES projects only real document
    tokens) equals the scoring forward."""
    model = _model(kind, tiny_dims, tokenizer).eval()  # eval: no dropout, so the two forwards are comparable
    with torch.no_grad():  # matrices wider than BERT's init, so that the documents' scores differ clearly
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.3)
    pairs = model.tokenize_queries(["what is a text editor"] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS)
    with torch.no_grad():
        scoring = model(*pairs)
    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(a[0].shape) or fused(*a, **k))
    training = model(*pairs)
    assert training.requires_grad
    assert not any(shape[-2] <= WRITTEN_OUT_MAX_QUERIES for shape in calls)  # every short side was written out
    torch.testing.assert_close(training.detach(), scoring, rtol=1e-5, atol=1e-5)
    assert scoring.std() > 1e-4  # the documents score differently, so equal scores mean something

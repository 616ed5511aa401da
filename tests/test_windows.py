"""Windows of a long document's text and the aggregations of their scores (:mod:`pyserini_mores.windows`): where the
windows are cut, that window 0 is what the model reads without windows, what each model reads, each aggregation
against values computed by hand, and the options' refusals."""
from __future__ import annotations

import re

import numpy as np
import pytest

from pyserini_mores.errors import UsageError
from pyserini_mores.windows import (
    WindowOptions,
    aggregate_scores,
    average_windows,
    check_aggregation,
    document_capacity,
    split_text,
    split_texts,
    token_spans,
    window_starts,
)

TEXT = ("Vim is a highly configurable text editor built to make creating and changing any kind of text very "
        "efficient. It is included as vi with most UNIX systems and with Apple OS X.")


def test_windows_start_every_stride_up_to_the_one_that_reaches_the_end():
    assert window_starts(10, 4, 2, 99).tolist() == [0, 2, 4, 6]  # [6, 10) reaches the end
    assert window_starts(11, 4, 2, 99).tolist() == [0, 2, 4, 6, 8]
    assert window_starts(11, 4, 4, 99).tolist() == [0, 4, 8]
    assert window_starts(11, 4, 2, 3).tolist() == [0, 2, 4]  # at most max_windows
    assert window_starts(3, 4, 2, 99).tolist() == [0]  # shorter than a window
    assert window_starts(0, 4, 2, 99).tolist() == [0]  # no tokens: one window


def test_windows_are_the_texts_of_their_tokens(tokenizer):
    spans = token_spans(tokenizer, TEXT)
    tokens = tokenizer.tokenize(TEXT)
    assert len(spans) == len(tokens) > 30
    options = WindowOptions(window=10, stride=5, max_windows=3)
    pieces = split_text(TEXT, tokenizer, 30, options)
    assert len(pieces) == 3
    for piece, start in zip(pieces, (0, 5, 10)):
        assert piece == TEXT[spans[start, 0]:spans[start + 9, 1]]
        assert tokenizer.tokenize(piece) == [token.removeprefix("##") if i == 0 else token
                                             for i, token in enumerate(tokens[start:start + 10])]


def test_window_zero_is_the_whole_text_when_windows_are_the_models_capacity(tokenizer):
    pieces = split_text(TEXT, tokenizer, 12, WindowOptions(max_windows=4))
    assert pieces[0] == TEXT and len(pieces) == 4
    assert split_text(TEXT, tokenizer, 12, WindowOptions()) == [TEXT]  # no windows: the text as it is
    assert split_text("", tokenizer, 12, WindowOptions(max_windows=4)) == [""]
    pieces, owners = split_texts([TEXT, "a short one", TEXT], tokenizer, 12, WindowOptions(stride=6, max_windows=2))
    assert owners.tolist() == [0, 0, 1, 2, 2] and pieces[2] == "a short one"


def test_capacity_is_what_each_model_reads_of_a_documents_own_text(tokenizer):
    import torch

    from pyserini_mores.models._layers import BertDims
    from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel

    torch.manual_seed(0)
    dims = BertDims(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)
    models = {
        "mores": MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=1, doc_max_length=40), tokenizer),
        "prettr": PreTTRModel(PreTTRConfig(encoder=dims, doc_max_length=40), tokenizer),
        "cross-encoder": CrossEncoder(CrossEncoderConfig(encoder=dims, doc_max_length=40), tokenizer),
        "maxsim": DualEncoder(DualEncoderConfig(encoder=dims, doc_max_length=40), tokenizer),
        "tk": TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=1, num_heads=2, head_dim=8,
                               ffn_dim=16, doc_max_length=40), tokenizer),
    }
    long_text = " ".join([TEXT] * 4)
    for name, model in models.items():
        capacity = document_capacity(model)
        # the document's own tokens the model keeps: its tokenization less the special tokens it adds
        specials = int(model.tokenize_documents([""])["attention_mask"].sum())
        assert int(model.tokenize_documents([long_text])["attention_mask"].sum()) - specials == capacity, name
    # [CLS] d [SEP] of 40 WordPieces (PreTTR's d [SEP] was cut with its [CLS] too); TK's words have no specials
    assert {name: document_capacity(model) for name, model in models.items()} == {
        "mores": 38, "prettr": 38, "cross-encoder": 38, "maxsim": 38, "tk": 40}


def test_each_aggregation_against_values_computed_by_hand():
    scores = np.array([0.5, -1.0, 2.0, 3.0, -0.25, -0.5, 1.5])
    owners = np.array([0, 0, 0, 1, 2, 2, 3])
    assert aggregate_scores(scores, owners, 4, "firstp").tolist() == [0.5, 3.0, -0.25, 1.5]
    assert aggregate_scores(scores, owners, 4, "maxp").tolist() == [2.0, 3.0, -0.25, 1.5]
    assert aggregate_scores(scores, owners, 4, "sump").tolist() == [1.5, 3.0, -0.75, 1.5]
    assert aggregate_scores(scores, owners, 4, "firstmaxp").tolist() == [1.25, 3.0, -0.25, 1.5]
    vectors = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0], [7.0, 7.0], [1.0, 1.0], [2.0, 3.0], [0.0, -1.0]])
    assert average_windows(vectors, owners, 4).tolist() == [[3.0, 2.0], [7.0, 7.0], [1.5, 2.0], [0.0, -1.0]]
    with pytest.raises(ValueError, match="every document needs at least one window"):
        aggregate_scores(scores, owners, 5, "maxp")
    with pytest.raises(ValueError, match="consecutive"):
        aggregate_scores(scores, owners[::-1].copy(), 4, "maxp")
    with pytest.raises(ValueError, match="consecutive"):
        average_windows(vectors, owners[::-1].copy(), 4)


@pytest.mark.parametrize("options, message", [
    (dict(window=0), "--window must be a positive number of tokens, not 0"),
    (dict(stride=-1), "--stride must be a positive number of tokens, not -1"),
    (dict(window=True), "--window must be a positive number of tokens, not True"),
    (dict(max_windows=0), "--max-windows must be a positive integer, not 0"),
    (dict(window=8, stride=9), "--stride 9 is longer than --window 8: text between windows would be read by none"),
    # one window per document is what the model reads: a window or stride with it would be silently ignored
    (dict(window=64), "--window and --stride cut a document into windows: give --max-windows N too (the most windows "
                      "of one document)"),
    (dict(stride=32, max_windows=1), "--window and --stride cut a document into windows: give --max-windows N too "
                                     "(the most windows of one document)"),
])
def test_window_options_are_checked_when_made(options, message):
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
        WindowOptions(**options)


def test_window_options_resolve_against_the_models_capacity():
    assert WindowOptions().resolved(126) == (126, 126)
    assert WindowOptions(stride=63, max_windows=2).resolved(126) == (126, 63)
    assert WindowOptions(window=64, max_windows=2).resolved(126) == (64, 64)
    with pytest.raises(UsageError, match="--window 200 is longer than the 126 tokens the model reads of a document"):
        WindowOptions(window=200, max_windows=2).resolved(126)


def test_an_aggregation_is_checked_against_the_model():
    check_aggregation("avgcls", "mores", scores_cls=True)
    with pytest.raises(UsageError,
                       match="--aggregate must be one of firstp, maxp, sump, firstmaxp, avgcls, not 'meanp'"):
        check_aggregation("meanp")
    with pytest.raises(UsageError, match=r"--aggregate avgcls averages the \[CLS\] vectors a model's head reads, and "
                                         r"tk scores without one: use firstp, maxp, sump, firstmaxp"):
        check_aggregation("avgcls", "tk", scores_cls=False)

"""TK: exactness of the two modes against the training forward, kernel pooling by hand, padding/OOV invariance,
explanations, fp16 stores, autocast, checkpoints (WordPiece and GloVe), and the MiniLM-initialised embeddings."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tiny_models import spread_tk_scores

from pyserini_mores.models import load_model, pad_documents
from pyserini_mores.models.tk import (
    TK_KERNEL_MUS,
    KernelPooling,
    TKConfig,
    TKModel,
    WordTokenizer,
    load_glove_embeddings,
)

QUERY = "text editor for source code \u2603"  # the snowman is [UNK] in MiniLM's WordPiece: an OOV query term


@pytest.fixture
def tiny_tk(tokenizer) -> TKModel:
    torch.manual_seed(0)
    config = TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=2, num_heads=4, head_dim=8, ffn_dim=16,
                      doc_max_length=64)
    return spread_tk_scores(TKModel(config, tokenizer).eval())


@pytest.fixture
def doc_texts(tiny_documents) -> list[str]:
    texts = [doc["contents"] for doc in tiny_documents[:12]]
    texts[3] = texts[3] + " \u2603 editors \u2603"  # OOV terms inside a document
    return texts


def _online_twin(model: TKModel) -> TKModel:
    twin = TKModel(dataclasses.replace(model.config, mode="online"), model.tokenizer).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def _ctx_scores(model: TKModel, query: str, texts: list[str], dtype=torch.float32) -> torch.Tensor:
    state = model.encode_query(model.tokenize_queries([query]))
    docs, lengths = pad_documents([rep.to(dtype) for rep in model.encode_documents(model.tokenize_documents(texts))])
    return model.score(state, docs, lengths)


# ---- exactness of the three paths ------------------------------------------------------------------------------------
def test_config_defaults_follow_the_paper():
    config = TKConfig()
    assert config.kernel_mus == [1.0, 0.9, 0.7, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5, -0.7, -0.9] == list(TK_KERNEL_MUS)
    assert (config.kernel_sigma, config.num_layers, config.num_heads, config.head_dim, config.ffn_dim) == \
        (0.1, 2, 16, 32, 100)
    assert (config.query_max_length, config.doc_max_length, config.mode) == (30, 200, "ctx")
    with pytest.raises(ValueError, match="mode"):
        TKConfig(mode="ids")
    assert TKConfig.from_dict(config.to_dict()) == config


@torch.no_grad()
def test_ctx_scores_equal_online_scores_equal_forward(tiny_tk, doc_texts):
    ctx = _ctx_scores(tiny_tk, QUERY, doc_texts)
    online_model = _online_twin(tiny_tk)
    online = online_model.score_texts(QUERY, doc_texts, batch_size=5)
    forward = tiny_tk(tiny_tk.tokenize_queries([QUERY] * len(doc_texts)), tiny_tk.tokenize_documents(doc_texts))
    assert ctx.shape == online.shape == forward.shape == (len(doc_texts),)
    assert ctx.abs().max() > 1.0  # the tolerance below is small relative to the scores
    torch.testing.assert_close(online, ctx, rtol=0, atol=1e-4)
    torch.testing.assert_close(forward, ctx, rtol=0, atol=1e-4)
    assert tiny_tk.store_width == 32 and tiny_tk.store_variant == "ctx"
    assert online_model.store_width is None
    with pytest.raises(NotImplementedError, match="online"):
        online_model.encode_documents(online_model.tokenize_documents(doc_texts))


@torch.no_grad()
def test_stored_rows_are_unit_vectors_of_the_matching_terms_only(tiny_tk, tokenizer, doc_texts):
    batch = tiny_tk.tokenize_documents(doc_texts)
    plain = tokenizer(doc_texts[3], add_special_tokens=False)["input_ids"]
    assert tokenizer.cls_token_id not in batch["input_ids"] and tokenizer.sep_token_id not in batch["input_ids"]
    reps = tiny_tk.encode_documents(batch)
    assert len(plain) == 2 + len(reps[3]) and plain.count(tokenizer.unk_token_id) == 2  # [UNK]s dropped
    assert [len(rep) for rep in reps] == batch["attention_mask"].sum(1).tolist()
    for rep in reps:
        torch.testing.assert_close(rep.norm(dim=-1), torch.ones(len(rep)))
    # the score takes cosines itself, so a store's vector norms (fp16-rounded, or never normalised) do not matter
    state = tiny_tk.encode_query(tiny_tk.tokenize_queries([QUERY]))
    docs, lengths = pad_documents(reps)
    scales = torch.rand(docs.shape[:2]) * 3 + 0.5
    torch.testing.assert_close(tiny_tk.score(state, docs * scales[..., None], lengths),
                               tiny_tk.score(state, docs, lengths), rtol=0, atol=1e-4)


def test_training_forward_backpropagates_into_every_trainable_part(tiny_tk, doc_texts):
    tiny_tk.train()
    queries = tiny_tk.tokenize_queries([QUERY, "web server"])
    scores = tiny_tk(queries, tiny_tk.tokenize_documents(doc_texts[2:4]))
    scores.sum().backward()
    for name, parameter in tiny_tk.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    assert tiny_tk.mixer.grad.abs().item() > 0 and tiny_tk.pooled_scale.grad.abs().item() > 0
    used = torch.unique(torch.cat([queries["input_ids"].flatten(), tiny_tk.tokenize_documents(doc_texts[2:4])[
        "input_ids"].flatten()]))
    unused = torch.ones(len(tiny_tk.tokenizer), dtype=torch.bool)
    unused[used] = False
    assert (tiny_tk.embeddings.weight.grad[unused] == 0).all()
    # the query's [UNK] is in the batch but masked like padding: it must not influence anything, so no gradient
    assert (tiny_tk.embeddings.weight.grad[tiny_tk.tokenizer.unk_token_id] == 0).all()


# ---- kernel pooling by hand ----------------------------------------------------------------------------------------
def test_kernel_pooling_matches_a_hand_computation():
    pooling = KernelPooling(mus=[1.0, 0.5], sigma=0.5)  # k(m) = exp(-(m - mu)^2 / 0.5)
    pad = 0.9  # values under masks must not count
    match = torch.tensor([
        [[1.0, 0.5, pad], [0.0, 1.0, pad], [pad, pad, pad]],  # doc 1: 2 real terms; query term 3 is padding
        [[pad, pad, pad], [pad, pad, pad], [pad, pad, pad]],  # doc 2: empty
    ])
    query_mask = torch.tensor([[True, True, False]])
    doc_mask = torch.tensor([[True, True, False], [False, False, False]])
    mass, log_pooled, len_pooled = pooling(match, query_mask, doc_mask)

    e = math.exp
    # K_i^k: row 1 = (1 + e^-.5, e^-.5 + 1); row 2 = (e^-2 + 1, 2 e^-.5)
    expected_mass = torch.tensor([[[1 + e(-0.5), e(-0.5) + 1], [e(-2) + 1, 2 * e(-0.5)], [0, 0]],
                                  [[0, 0], [0, 0], [0, 0]]])
    torch.testing.assert_close(mass, expected_mass)
    expected_log = torch.tensor([
        [math.log2(1 + e(-0.5)) + math.log2(1 + e(-2)), math.log2(1 + e(-0.5)) + 1 - 0.5 / math.log(2)],
        [2 * math.log2(1e-10), 2 * math.log2(1e-10)],  # T5 clamp on an empty document, two real query terms
    ])
    torch.testing.assert_close(log_pooled, expected_log)
    expected_len = torch.tensor([[(1 + e(-0.5) + 1 + e(-2)) / 2, (1 + e(-0.5) + 2 * e(-0.5)) / 2], [0.0, 0.0]])
    torch.testing.assert_close(len_pooled, expected_len)


# ---- padding and OOV -------------------------------------------------------------------------------------------------
@torch.no_grad()
def test_padding_never_changes_a_score(tiny_tk, doc_texts):
    short = "Vim is a text editor."
    longer = doc_texts[:4]
    # stored path: alone, in a batch with longer documents, and with extra zero padding
    alone = _ctx_scores(tiny_tk, QUERY, [short])
    in_batch = _ctx_scores(tiny_tk, QUERY, longer + [short])[-1:]
    state = tiny_tk.encode_query(tiny_tk.tokenize_queries([QUERY]))
    docs, lengths = pad_documents(tiny_tk.encode_documents(tiny_tk.tokenize_documents([short])))
    extra = tiny_tk.score(state, torch.cat([docs, torch.zeros(1, 17, docs.shape[2])], dim=1), lengths)
    torch.testing.assert_close(in_batch, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(extra, alone, rtol=0, atol=1e-5)
    # training path: the pair padded on both sides by longer queries and documents in its batch
    queries = [QUERY, "a much longer query about many different text editors and web servers and databases"]
    pair_alone = tiny_tk(tiny_tk.tokenize_queries(queries[:1]), tiny_tk.tokenize_documents([short]))
    pair_padded = tiny_tk(tiny_tk.tokenize_queries(queries), tiny_tk.tokenize_documents([short, doc_texts[3]]))[:1]
    torch.testing.assert_close(pair_padded, pair_alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(pair_alone, alone, rtol=0, atol=1e-5)


@torch.no_grad()
def test_trailing_oov_terms_are_masked_like_padding(tiny_tk):
    # a trailing OOV term shifts no position, so masking it like padding must leave every score unchanged
    docs = ["Vim is a text editor.", "Vim is a text editor. \u2603 \u2603"]
    scores = _online_twin(tiny_tk).score_texts("text editor", docs)
    torch.testing.assert_close(scores[1], scores[0], rtol=0, atol=1e-5)
    with_oov_query = _online_twin(tiny_tk).score_texts("text editor \u2603", docs[:1])
    torch.testing.assert_close(with_oov_query, scores[:1], rtol=0, atol=1e-5)


# ---- explanations, stores, numerics ----------------------------------------------------------------------------------
@torch.no_grad()
def test_explain_numbers_reproduce_the_score(tiny_tk, doc_texts):
    state = tiny_tk.encode_query(tiny_tk.tokenize_queries([QUERY]))
    docs, lengths = pad_documents(tiny_tk.encode_documents(tiny_tk.tokenize_documents(doc_texts)))
    out = tiny_tk.explain(state, docs, lengths)
    batch, num_query_terms, num_kernels = len(doc_texts), state.vectors.shape[1], 11
    assert out["log_pooled"].shape == out["len_pooled"].shape == (batch, num_kernels)
    assert out["query_kernel_mass"].shape == (batch, num_query_terms, num_kernels)
    assert out["match_matrix"].shape == (batch, num_query_terms, docs.shape[1])
    torch.testing.assert_close(out["score"], tiny_tk.score(state, docs, lengths))
    # the final score from the per-kernel numbers: s = β Σ_k log_contrib + γ Σ_k len_contrib
    rebuilt = out["beta"] * out["log_contributions"].sum(-1) + out["gamma"] * out["len_contributions"].sum(-1)
    torch.testing.assert_close(rebuilt, out["score"], rtol=1e-5, atol=1e-4)
    # the pooled numbers from the per-query-term kernel mass (eqs. 7 and 8); the [UNK] query term contributes 0
    real = state.mask[0]
    assert not real.all() and (out["query_kernel_mass"][:, ~real] == 0).all()
    mass = out["query_kernel_mass"][:, real]
    torch.testing.assert_close(out["log_pooled"], torch.log2(mass.clamp(min=1e-10)).sum(1))
    torch.testing.assert_close(out["len_pooled"], mass.sum(1) / lengths[:, None].float())
    # and the text convenience names the tokens behind rows and columns
    texts = tiny_tk.explain_texts(QUERY, doc_texts[:2])
    torch.testing.assert_close(texts["score"], out["score"][:2])
    assert texts["query_tokens"][:2] == ["text", "editor"] and texts["query_tokens"][-1] == "[UNK]"
    assert [len(tokens) for tokens in texts["doc_tokens"]] == lengths[:2].tolist()


@torch.no_grad()
def test_float16_stored_documents_rank_like_float32(tiny_tk, tiny_documents):
    texts = [doc["contents"] for doc in tiny_documents]
    # (queries whose adjacent score gaps on this fixture are ~10x the fp16 error; the assertion is on the ranking)
    for query in ("web server reverse proxy", "database engine in a single file"):
        fp32 = _ctx_scores(tiny_tk, query, texts)
        fp16 = _ctx_scores(tiny_tk, query, texts, dtype=torch.float16)
        assert torch.equal(torch.argsort(fp16, descending=True), torch.argsort(fp32, descending=True)), query
        assert (fp16 - fp32).abs().max() < 0.02


@torch.no_grad()
def test_kernels_run_in_fp32_under_bf16_autocast(tiny_tk, doc_texts):
    state = tiny_tk.encode_query(tiny_tk.tokenize_queries([QUERY]))
    docs, lengths = pad_documents(tiny_tk.encode_documents(tiny_tk.tokenize_documents(doc_texts)))
    reference = tiny_tk.score(state, docs, lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = tiny_tk.score(state, docs, lengths)  # only the interaction runs: must not touch bf16 at all
        texts = _online_twin(tiny_tk).score_texts(QUERY, doc_texts)  # contextualiser in bf16
    assert scores.dtype == texts.dtype == torch.float32
    torch.testing.assert_close(scores, reference, rtol=0, atol=1e-6)
    assert torch.isfinite(texts).all()
    assert (texts - reference).abs().max() < 0.01 * reference.abs().max()


def test_store_fingerprint_covers_embeddings_contextualiser_and_mix_only(tiny_tk):
    before = tiny_tk.store_fingerprint()
    names = {name for name, _ in tiny_tk.store_parameters()}
    assert "mixer" in names and "embeddings.weight" in names and not any("weights" in name for name in names)
    with torch.no_grad():
        tiny_tk.log_weights.weight.add_(1.0)  # scoring weights do not change stored documents
    assert tiny_tk.store_fingerprint() == before
    with torch.no_grad():
        tiny_tk.mixer.add_(0.1)
    assert tiny_tk.store_fingerprint() != before


# ---- checkpoints and initialisation ----------------------------------------------------------------------------------
@torch.no_grad()
def test_save_and_load_round_trip(tiny_tk, doc_texts, tmp_path):
    tiny_tk.save_pretrained(tmp_path / "tk")
    loaded = TKModel.from_pretrained(tmp_path / "tk")
    assert loaded.config == tiny_tk.config
    assert loaded.fingerprint() == tiny_tk.fingerprint()
    assert loaded.store_fingerprint() == tiny_tk.store_fingerprint()
    assert torch.equal(_ctx_scores(loaded, QUERY, doc_texts), _ctx_scores(tiny_tk, QUERY, doc_texts))
    online = load_model("tk", tmp_path / "tk", mode="online")
    assert isinstance(online, TKModel) and online.store_width is None
    torch.testing.assert_close(online.score_texts(QUERY, doc_texts), _ctx_scores(tiny_tk, QUERY, doc_texts),
                               rtol=0, atol=1e-4)


@torch.no_grad()
def test_a_widened_tk_scores_as_the_narrow_one_until_its_new_units_move(tiny_tk, doc_texts):
    wider = tiny_tk.with_wider_feed_forward(40, seed=3)
    assert wider.config == dataclasses.replace(tiny_tk.config, ffn_dim=40)
    assert all(layer.feed_forward[0].out_features == 40 for layer in wider.contextualizer.layers)
    narrow_scores = _ctx_scores(tiny_tk, QUERY, doc_texts)
    assert narrow_scores.std() > 0.05
    torch.testing.assert_close(_ctx_scores(wider, QUERY, doc_texts), narrow_scores, rtol=0, atol=1e-5)
    # the new units are live: their input weights are not zero, and once their output weights move, scores do
    first = wider.contextualizer.layers[0].feed_forward
    assert first[0].weight[16:].abs().sum() > 0 and first[2].weight[:, 16:].abs().sum() == 0
    first[2].weight[:, 16:].normal_(std=0.5)
    assert not torch.allclose(_ctx_scores(wider, QUERY, doc_texts), narrow_scores, atol=1e-3)
    # the seed decides the new units; the copied ones are the narrow model's
    again = tiny_tk.with_wider_feed_forward(40, seed=3)
    other = tiny_tk.with_wider_feed_forward(40, seed=4)
    assert torch.equal(again.contextualizer.layers[0].feed_forward[0].weight[16:], first[0].weight[16:])
    assert not torch.equal(other.contextualizer.layers[0].feed_forward[0].weight[16:], first[0].weight[16:])
    assert torch.equal(other.contextualizer.layers[1].feed_forward[0].weight[:16],
                       tiny_tk.contextualizer.layers[1].feed_forward[0].weight)


def test_widening_needs_more_feed_forward_units(tiny_tk):
    with pytest.raises(ValueError, match="have 16 hidden units; widening needs more, not 16"):
        tiny_tk.with_wider_feed_forward(16)


def test_the_widen_command_replaces_only_an_earlier_start(tiny_tk, tmp_path, capsys):
    from pyserini_mores.train.__main__ import main

    tiny_tk.save_pretrained(tmp_path / "narrow")
    widen = ["widen-ffn", "--model", str(tmp_path / "narrow"), "--ffn-dim", "40", "--seed", "3", "--output"]
    assert main([*widen, str(tmp_path / "wide")]) == 0
    assert "stored a TK with 40 feed-forward units per layer (from 16)" in capsys.readouterr().out
    expected = tiny_tk.with_wider_feed_forward(40, seed=3).fingerprint()
    assert load_model("tk", tmp_path / "wide").fingerprint() == expected
    assert sorted(path.name for path in tmp_path.iterdir()) == ["narrow", "wide"]  # nothing left beside it

    (tmp_path / "wide" / "stale.txt").write_text("left by the earlier start")
    assert main([*widen, str(tmp_path / "wide")]) == 0
    assert not (tmp_path / "wide" / "stale.txt").exists()
    assert load_model("tk", tmp_path / "wide").fingerprint() == expected

    (tmp_path / "glove.txt").write_text("the 0.1 0.2\n")
    with pytest.raises(SystemExit, match=r"glove.txt is not a checkpoint directory, and replacing it would lose what "
                                         r"it holds"):
        main([*widen, str(tmp_path / "glove.txt")])
    assert (tmp_path / "glove.txt").read_text() == "the 0.1 0.2\n"


GLOVE_WORDS = ["the", "text", "editor", "vim", "is", "a", ".", ",", "web", "server", "-", "Text"]


def _write_glove(path, dim: int = 6):
    generator = torch.Generator().manual_seed(1)
    vectors = torch.randn(len(GLOVE_WORDS), dim, generator=generator)
    lines = [f"{word} " + " ".join(f"{value:.6f}" for value in row) for word, row in zip(GLOVE_WORDS, vectors)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return vectors


@torch.no_grad()
def test_glove_vocabulary_tokenizer_oov_and_checkpoint(tmp_path):
    vectors = _write_glove(tmp_path / "glove.txt")
    words, loaded_vectors = load_glove_embeddings(tmp_path / "glove.txt")
    assert words == GLOVE_WORDS[:-1]  # "Text" lowercases to a duplicate of "text": first occurrence wins
    torch.testing.assert_close(loaded_vectors, vectors[:-1], rtol=0, atol=1e-6)

    torch.manual_seed(0)
    model = spread_tk_scores(TKModel.from_glove(tmp_path / "glove.txt", num_layers=1, num_heads=2, head_dim=4,
                                                  ffn_dim=8))
    assert model.config.embedding_dim == 6 and model.config.vocab_size == 2 + 11
    assert model.config.tokenizer_type == "word" and model.embeddings.weight.requires_grad  # trained, as in TK
    torch.testing.assert_close(model.embeddings.weight[2:], vectors[:-1], rtol=0, atol=1e-6)
    assert (model.embeddings.weight[:2] == 0).all()

    tokenizer = model.tokenizer
    assert tokenizer.tokenize("Vim is a Text-Editor, zzyzx!") == ["vim", "is", "a", "text", "-", "editor", ",",
                                                                   "zzyzx", "!"]
    batch = model.tokenize_documents(["Vim is a Text-Editor, zzyzx!", "the web server"])
    assert batch["input_ids"][0].tolist() == [5, 6, 7, 3, 12, 4, 9, 1, 1]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert [len(rep) for rep in model.encode_documents(batch)] == [7, 3]
    # OOV words at the end change nothing (masked like padding); OOV-only queries still score finitely
    scores = model.score_texts("text editor", ["vim is a text editor", "vim is a text editor zzyzx qqq"])
    torch.testing.assert_close(scores[1], scores[0], rtol=0, atol=1e-5)
    assert torch.isfinite(model.score_texts("zzyzx", ["", "vim"])).all()

    model.save_pretrained(tmp_path / "tk-glove")
    assert (tmp_path / "tk-glove" / WordTokenizer.vocab_file_name).is_file()
    loaded = load_model("tk", tmp_path / "tk-glove")
    assert isinstance(loaded.tokenizer, WordTokenizer) and loaded.config == model.config
    assert loaded.store_fingerprint() == model.store_fingerprint()
    texts = ["vim is a text editor", "the web server", "a, the. text"]
    assert torch.equal(loaded.score_texts("text editor", texts), model.score_texts("text editor", texts))


def test_glove_loader_skips_a_word2vec_header_and_rejects_ragged_lines(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("2 3\nfoo 1 2 3\nbar 4 5 6\n")
    words, vectors = load_glove_embeddings(path)
    assert words == ["foo", "bar"] and vectors.tolist() == [[1, 2, 3], [4, 5, 6]]
    path.write_text("foo 1 2 3\nbar 4 5\n")
    with pytest.raises(ValueError, match="vectors.txt:2"):
        load_glove_embeddings(path)


def test_from_backbone_minilm_uses_its_frozen_word_embeddings(tokenizer):
    from pyserini_mores.models.backbones import load_backbone

    _, state_dict, _ = load_backbone("minilm")
    model = TKModel.from_backbone("minilm", num_layers=1)
    expected = state_dict["embeddings.word_embeddings.weight"]
    assert model.config.embedding_dim == expected.shape[1] == 384
    assert model.config.vocab_size == expected.shape[0] == len(tokenizer)
    assert torch.equal(model.embeddings.weight, expected)
    assert not model.embeddings.weight.requires_grad and model.config.freeze_embeddings
    groups = model.parameter_groups()
    assert all(parameter is not model.embeddings.weight for group in groups for parameter in group["params"])
    assert [group["lr"] for group in groups] == [1e-4, 1e-3]
    scores = model.score_texts("text editor", ["Vim is a text editor.", "nginx is a web server."])
    assert scores.shape == (2,) and torch.isfinite(scores).all()


def test_exact_match_warm_start_scores_log_term_frequency_of_query_terms(tokenizer):
    """scoring_init='exact-match' with mixer_init=1: before any training the score is
    pooled_scale * sum over query terms of log2(kernel mass at mu = 1), i.e. a log-tf exact-match scorer."""
    torch.manual_seed(0)
    model = TKModel.from_backbone("minilm", num_layers=1, scoring_init="exact-match", mixer_init=1.0).eval()
    assert model.mixer.item() == 1.0 and model.combine.weight[0, 0].item() == 1.0
    exact = model.config.kernel_mus.index(1.0)
    assert model.log_weights.weight[0, exact] == 1.0 and model.log_weights.weight.abs().sum() == 1.0
    docs = ["editor editor editor for text", "an editor for text", "nginx serves web pages fast"]
    scores = model.score_texts("editor", docs)
    assert scores[0] > scores[1] > scores[2]
    explanation = model.explain_texts("editor", docs)
    assert explanation["query_tokens"] == ["editor"]
    assert torch.allclose(scores, explanation["s_log"] + explanation["s_len"] * explanation["gamma"], atol=1e-6)
    # one query term, matched 3 times / once exactly (cosine 1); the other kernels carry no weight
    mass = explanation["query_kernel_mass"][:, 0, exact]
    assert torch.allclose(mass[:2], torch.tensor([3.0, 1.0]), atol=1e-3)
    assert torch.allclose(explanation["s_log"][:2], model.pooled_scale * torch.log2(mass[:2]), atol=1e-6)


def test_paper_init_is_the_default_and_warm_start_options_are_checked():
    from pyserini_mores.train.recipes import read_recipe

    config = TKConfig()
    assert (config.mixer_init, config.scoring_init) == (0.5, "paper")
    debian = TKConfig(**read_recipe("tk-debian")["settings"]["model_args"])  # the recipe spells the warm start right
    assert (debian.mixer_init, debian.scoring_init) == (1.0, "exact-match")
    assert "scoring_init" not in read_recipe("tk-msmarco")["settings"].get("model_args", {})  # the paper's init
    with pytest.raises(ValueError, match="scoring_init must be one of"):
        TKConfig(scoring_init="bm25")
    with pytest.raises(ValueError, match="needs a kernel centred at 1.0"):
        TKConfig(scoring_init="exact-match", kernel_mus=[0.9, 0.5])
    with pytest.raises(ValueError, match=r"mixer_init \(alpha\) must lie in \[0, 1\]"):
        TKConfig(mixer_init=1.5)

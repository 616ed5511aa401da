"""PreTTR: the split (stored) execution equals the paper's block-diagonal joint forward, CLS-only last layer,
compression, padding invariance, checkpoints, the compressor's attention-matching loss, store fingerprints."""
from __future__ import annotations

import pytest
import torch

from pyserini_mores.models import load_model, pad_documents
from pyserini_mores.models._layers import key_padding_mask
from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig, join_pairs
from pyserini_mores.models.losses import listwise_softmax_cross_entropy
from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel, PreTTRQueryState, cls_only_layer

QUERY_BLOCK = 12
DOC_MAX = 32
QUERY = "text editor for debian"
QUERIES = ["text editor", "which package manager installs and removes debian packages", "python", "linux kernel"]
LONG_DOC = " ".join(["the quick brown fox jumps over the lazy dog while the kernel schedules processes"] * 5)
ATOL = 1e-4


@pytest.fixture
def documents(tiny_documents) -> list[str]:
    return [doc["contents"] for doc in tiny_documents[:4]]


def make_model(dims, tokenizer, join_layer, compression_dim=None, seed=0, **overrides) -> PreTTRModel:
    torch.manual_seed(seed)
    values = {"query_max_length": QUERY_BLOCK, "doc_max_length": DOC_MAX, **overrides}
    config = PreTTRConfig(encoder=dims, join_layer=join_layer, compression_dim=compression_dim, **values)
    model = PreTTRModel(config, tokenizer)
    # The default head (std 0.02) gives scores near 0, which would make a 1e-4 tolerance meaningless.
    torch.nn.init.normal_(model.head.weight, std=1.0)
    torch.nn.init.normal_(model.head.bias, std=1.0)
    with torch.no_grad():  # LayerNorm's default γ = 1, β = 0 would hide a mishandled scale or shift
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(0.2 * torch.randn_like(module.weight))
                module.bias.normal_(std=0.2)
    return model.eval()


def stored_scores(model, query: str, texts: list[str]) -> torch.Tensor:
    state = model.encode_query(model.tokenize_queries([query]))
    return model.score(state, *pad_documents(model.encode_documents(model.tokenize_documents(texts))))


def assert_spread(scores: torch.Tensor) -> None:
    """Guard against vacuous equalities: the documents must get clearly different scores."""
    assert scores.std() > 0.01, scores  # 100x the tolerance


@pytest.mark.parametrize("compression_dim", [None, 8])
@pytest.mark.parametrize("join_layer", [0, 1, 2, 3])
@torch.no_grad()
def test_split_execution_equals_block_diagonal_joint_forward(tiny_dims, tokenizer, documents, join_layer,
                                                             compression_dim):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim)
    queries = model.tokenize_queries(QUERIES)
    docs = model.tokenize_documents(documents)
    reference = model.joint_forward_masked(queries, docs)
    assert_spread(reference)
    torch.testing.assert_close(model(queries, docs), reference, rtol=0, atol=ATOL)

    # one query against every candidate, through the store: encode_query once, stored documents, score
    one_query = model.tokenize_queries([QUERY])
    reference = model.joint_forward_masked(one_query, docs)
    assert_spread(reference)
    torch.testing.assert_close(stored_scores(model, QUERY, documents), reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("join_layer", [1, 3])
@torch.no_grad()
def test_stored_states_are_the_query_independent_layer_l_states_of_the_joint_layout(tiny_dims, tokenizer,
                                                                                   documents, join_layer):
    model = make_model(tiny_dims, tokenizer, join_layer)
    docs = model.tokenize_documents(documents)
    stored = model.encode_documents(docs)
    for query in ("x", QUERIES[1]):  # 3 and 12 query-block tokens in use: the offset must not move
        joined = model.joined_inputs(model.tokenize_queries([query]), docs)
        states, _ = model._joint_layer_l(joined)
        for i, rep in enumerate(stored):
            assert rep.shape == (int(docs["attention_mask"][i].sum()), tiny_dims.hidden_size)
            torch.testing.assert_close(rep, states[i, QUERY_BLOCK:QUERY_BLOCK + rep.shape[0]], rtol=0, atol=1e-5)
    assert (joined["position_ids"][0] == torch.arange(joined["input_ids"].shape[1])).all()
    segments = joined["token_type_ids"]
    assert (segments[:, :QUERY_BLOCK] == 0).all() and (segments[:, QUERY_BLOCK:] == 1).all()


@pytest.mark.parametrize("compression_dim", [None, 8])
@pytest.mark.parametrize("join_layer", [1, 3])
@torch.no_grad()
def test_score_of_stored_documents_equals_training_forward(tiny_dims, tokenizer, documents, join_layer,
                                                           compression_dim):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim)
    docs = model.tokenize_documents(documents)
    stored = model.encode_documents(docs)
    assert all(rep.shape[1] == model.store_width == (compression_dim or tiny_dims.hidden_size) for rep in stored)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    assert isinstance(state, PreTTRQueryState) and state.states.shape == (1, QUERY_BLOCK, tiny_dims.hidden_size)
    scores = model.score(state, *pad_documents(stored))
    assert_spread(scores)
    aligned = model(model.tokenize_queries([QUERY] * len(documents)), docs)
    broadcast = model(model.tokenize_queries([QUERY]), docs)
    torch.testing.assert_close(scores, aligned, rtol=0, atol=ATOL)
    torch.testing.assert_close(scores, broadcast, rtol=0, atol=ATOL)


@torch.no_grad()
def test_cls_only_last_layer_equals_the_full_layers_cls_row(tiny_dims, tokenizer):
    model = make_model(tiny_dims, tokenizer, 3)
    layer = model.encoder.layers[-1]
    torch.manual_seed(1)
    hidden = tiny_dims.hidden_size
    x = torch.randn(3, 9, hidden)
    lengths = torch.tensor([9, 5, 2])
    mask = key_padding_mask(lengths, 9)
    full = layer(x, mask)[:, 0]
    torch.testing.assert_close(cls_only_layer(layer, x[:, 0], [(x, mask[:, 0, 0])]), full, rtol=0, atol=1e-5)

    # a batch-1 query block shared by every candidate, followed by per-candidate documents
    query, query_mask = torch.randn(1, 4, hidden), torch.tensor([[True, True, True, False]])
    docs, doc_mask = torch.randn(3, 6, hidden), key_padding_mask(torch.tensor([6, 3, 1]), 6)[:, 0, 0]
    joined = torch.cat([query.expand(3, -1, -1), docs], 1)
    joined_mask = torch.cat([query_mask.expand(3, -1), doc_mask], 1)
    full = layer(joined, joined_mask[:, None, None, :])[:, 0]
    split = cls_only_layer(layer, query[:, 0], [(query, query_mask), (docs, doc_mask)])
    torch.testing.assert_close(split, full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("join_layer", [2, 3])
@torch.no_grad()
def test_compressed_documents_scored_from_the_store_equal_the_in_graph_compressed_forward(tiny_dims, tokenizer,
                                                                                         documents, join_layer):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim=8)
    docs = model.tokenize_documents(documents)
    stored = model.encode_documents(docs)
    assert [rep.shape for rep in stored] == [(int(n), 8) for n in docs["attention_mask"].sum(1)]
    assert all((rep >= -0.2).all() for rep in stored)  # GELU output: the compressed form, not layer-l states
    padded, lengths = pad_documents(stored)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    scores = model.score(state, padded, lengths)
    torch.testing.assert_close(scores, model(model.tokenize_queries([QUERY]), docs), rtol=0, atol=ATOL)
    torch.testing.assert_close(scores, model.joint_forward_masked(model.tokenize_queries([QUERY]), docs),
                               rtol=0, atol=ATOL)
    # the decompressor's cached geometry follows in-place weight updates
    model.compressor.decompress.weight.mul_(1.5)
    model.compressor.norm.bias.add_(0.3)
    state = model.encode_query(model.tokenize_queries([QUERY]))  # the query passes the decompressor too (P3)
    torch.testing.assert_close(model.score(state, padded, lengths), model(model.tokenize_queries([QUERY]), docs),
                               rtol=0, atol=ATOL)
    assert (model.score(state, padded, lengths) - scores).abs().max() > 1e-2
    model.compressor.decompress.weight.div_(1.5)
    model.compressor.norm.bias.sub_(0.3)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    # the compressor changes the scores (it is really in the path) ...
    uncompressed = make_model(tiny_dims, tokenizer, join_layer)
    assert (uncompressed(model.tokenize_queries([QUERY]), docs) - scores).abs().max() > 1e-2
    # ... and the sidecar's float16 storage costs little
    torch.testing.assert_close(model.score(state, padded.half(), lengths), scores, rtol=0, atol=2e-2)


@pytest.mark.parametrize("join_layer", [1, 3])
def test_training_forward_reaches_every_weight_that_can_matter(tiny_dims, tokenizer, documents, join_layer):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim=8).train()
    queries = model.tokenize_queries([QUERIES[0], QUERIES[0], QUERIES[1], QUERIES[1]])
    scores = model(queries, model.tokenize_documents(documents)).view(2, 2)
    listwise_softmax_cross_entropy(scores).backward()  # with groups of 2: PreTTR's pairwise softmax loss (P4)
    missing = {name for name, parameter in model.named_parameters() if parameter.grad is None}
    # the CLS-only last layer drops the key bias: it adds the same logit to every key, which softmax ignores
    assert missing == {f"encoder.layers.{tiny_dims.num_hidden_layers - 1}.attention.key.bias"}
    for name in ("encoder.embeddings.position_embeddings.weight", "encoder.layers.0.attention.query.weight",
                 "compressor.compress.weight", "compressor.norm.bias", "head.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name


@torch.no_grad()
def test_simulated_fp16_storage_makes_stored_values_exact_in_float16(tiny_dims, tokenizer, documents):
    model = make_model(tiny_dims, tokenizer, 2, compression_dim=8, simulate_fp16_storage=True)
    docs = model.tokenize_documents(documents)
    for rep in model.encode_documents(docs):
        assert torch.equal(rep.half().float(), rep)
    padded, lengths = pad_documents(model.encode_documents(docs))
    state = model.encode_query(model.tokenize_queries([QUERY]))
    torch.testing.assert_close(model.score(state, padded.half(), lengths), model.score(state, padded, lengths),
                               rtol=0, atol=1e-6)


@torch.no_grad()
def test_join_layer_zero_is_a_plain_cross_encoder_on_the_joined_layout(tiny_dims, tokenizer, documents):
    model = make_model(tiny_dims, tokenizer, 0)
    queries, docs = model.tokenize_queries(QUERIES), model.tokenize_documents(documents)
    joined = model.joined_inputs(queries, docs)
    hidden = model.encoder(joined["input_ids"], joined["attention_mask"], joined["token_type_ids"])
    logits = model.head(hidden[:, 0])
    plain = logits[:, 1] - logits[:, 0]
    assert_spread(plain)
    torch.testing.assert_close(model(queries, docs), plain, rtol=0, atol=ATOL)

    # when the query fills its block, PreTTR at l = 0 is the cross-encoder baseline, token for token
    query_tokens = len(tokenizer(QUERY)["input_ids"])
    exact = make_model(tiny_dims, tokenizer, 0, query_max_length=query_tokens)
    cross = CrossEncoder(CrossEncoderConfig(encoder=tiny_dims, query_max_length=query_tokens, doc_max_length=DOC_MAX),
                         tokenizer).eval()
    cross.load_state_dict(exact.state_dict())  # strict: the same encoder.* and head.* parameters
    texts = documents + [LONG_DOC]
    queries, docs = cross.tokenize_queries([QUERY] * len(texts)), cross.tokenize_documents(texts)
    cross_ids, _, cross_types = join_pairs(queries["input_ids"], queries["attention_mask"],
                                           docs["input_ids"], docs["attention_mask"])
    joined = exact.joined_inputs(exact.tokenize_queries([QUERY]), exact.tokenize_documents(texts))
    assert torch.equal(joined["input_ids"], cross_ids)
    assert torch.equal(joined["token_type_ids"] * joined["attention_mask"], cross_types)
    expected = cross.score_texts(QUERY, texts)
    assert_spread(expected)
    torch.testing.assert_close(stored_scores(exact, QUERY, texts), expected, rtol=0, atol=ATOL)


def test_join_layer_must_leave_a_joint_layer(tiny_dims, tokenizer):
    with pytest.raises(ValueError, match=r"join_layer=4 equals the number of layers \(4\).*same score"):
        PreTTRConfig(encoder=tiny_dims, join_layer=4)
    for bad in (5, -1):
        with pytest.raises(ValueError, match="0 <= join_layer < 4"):
            PreTTRConfig(encoder=tiny_dims, join_layer=bad)
    config = PreTTRConfig(encoder=tiny_dims)
    assert config.join_layer == 3  # default: L - 1, one CLS-only joint layer
    with pytest.raises(ValueError, match="exceeds the encoder's 256 positions"):
        PreTTRConfig(encoder=tiny_dims, query_max_length=16, doc_max_length=250)
    model = make_model(tiny_dims, tokenizer, 1)
    with pytest.raises(ValueError, match="without \\[CLS\\]"):
        model(model.tokenize_queries([QUERY]), model._tokenize(["a document"], DOC_MAX))


@torch.no_grad()
def test_tokenization_follows_the_joint_layout(tiny_dims, tokenizer):
    model = make_model(tiny_dims, tokenizer, 1)
    queries = model.tokenize_queries(["x", "a very long query " * 10])
    assert queries["input_ids"].shape == (2, QUERY_BLOCK)
    assert (queries["input_ids"][:, 0] == tokenizer.cls_token_id).all()
    assert queries["input_ids"][1, -1] == tokenizer.sep_token_id
    docs = model.tokenize_documents(["short one", LONG_DOC])
    assert docs["input_ids"].shape == (2, DOC_MAX - 1)  # doc_max_length counts the dropped [CLS], as elsewhere
    assert tokenizer.cls_token_id not in docs["input_ids"]
    lengths = docs["attention_mask"].sum(1)
    assert lengths[1] == DOC_MAX - 1
    for i, length in enumerate(lengths):
        assert docs["input_ids"][i, length - 1] == tokenizer.sep_token_id
    assert [rep.shape[0] for rep in model.encode_documents(docs)] == lengths.tolist()
    # a query batch narrower than the block is padded to it (same scores)
    narrow = tokenizer([QUERY], padding=True, return_tensors="pt")
    narrow = {"input_ids": narrow["input_ids"], "attention_mask": narrow["attention_mask"]}
    torch.testing.assert_close(model(narrow, docs), model(model.tokenize_queries([QUERY]), docs), rtol=0, atol=0)


@pytest.mark.parametrize("compression_dim", [None, 8])
@pytest.mark.parametrize("join_layer", [1, 3])
@torch.no_grad()
def test_scores_do_not_depend_on_padding(tiny_dims, tokenizer, documents, join_layer, compression_dim):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    short = documents[0]
    alone_rep = model.encode_documents(model.tokenize_documents([short]))[0]
    batch_reps = model.encode_documents(model.tokenize_documents([short, LONG_DOC, documents[1]]))
    torch.testing.assert_close(batch_reps[0], alone_rep, rtol=0, atol=1e-5)
    alone = model.score(state, *pad_documents([alone_rep]))
    in_batch = model.score(state, *pad_documents(batch_reps))
    assert batch_reps[1].shape[0] > alone_rep.shape[0]
    torch.testing.assert_close(in_batch[:1], alone, rtol=0, atol=1e-5)
    # garbage (not zeros) in the padding changes nothing either
    padded, lengths = pad_documents(batch_reps)
    noisy = padded + 100.0 * (~key_padding_mask(lengths, padded.shape[1])[:, 0, 0])[:, :, None]
    torch.testing.assert_close(model.score(state, noisy, lengths), in_batch, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compression_dim", [None, 8])
@torch.no_grad()
def test_save_and_load_round_trip(tiny_dims, tokenizer, documents, tmp_path, compression_dim):
    model = make_model(tiny_dims, tokenizer, 2, compression_dim)
    model.save_pretrained(tmp_path)
    loaded = PreTTRModel.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert loaded.fingerprint() == model.fingerprint()
    assert loaded.store_fingerprint() == model.store_fingerprint()
    expected = stored_scores(model, QUERY, documents)
    assert torch.equal(stored_scores(loaded, QUERY, documents), expected)
    via_registry = load_model("prettr", tmp_path)
    assert isinstance(via_registry, PreTTRModel)
    assert torch.equal(stored_scores(via_registry, QUERY, documents), expected)


def test_compressor_pretraining_lowers_attention_mse_and_touches_only_the_compressor(tiny_dims, tokenizer,
                                                                                    documents):
    model = make_model(tiny_dims, tokenizer, 2, compression_dim=8)
    queries, docs = model.tokenize_queries(QUERIES), model.tokenize_documents(documents)
    with pytest.raises(ValueError, match="needs a compressor"):
        make_model(tiny_dims, tokenizer, 2).attention_mse_loss(queries, docs)
    frozen_before = {name: value.clone() for name, value in model.state_dict().items()
                     if not name.startswith("compressor.")}
    compressor_before = {name: value.clone() for name, value in model.compressor.state_dict().items()}

    trainable = model.freeze_all_but_compressor()
    assert {id(p) for p in trainable} == {id(p) for p in model.parameters() if p.requires_grad}
    assert len(trainable) == 6  # compress, decompress, norm: weight and bias each
    model.train()
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    with torch.no_grad():
        initial = model.attention_mse_loss(queries, docs).item()
    assert initial > 0
    for _ in range(25):
        optimizer.zero_grad()
        loss = model.attention_mse_loss(queries, docs)
        loss.backward()
        optimizer.step()
    assert model.training  # the loss restores the mode it switched off
    with torch.no_grad():
        final = model.attention_mse_loss(queries, docs).item()
    assert final < 0.7 * initial, (initial, final)
    for name, value in model.state_dict().items():
        if name in frozen_before:
            assert torch.equal(value, frozen_before[name]), name
    assert all(not torch.equal(value, compressor_before[name]) for name, value in model.compressor.state_dict().items())


def test_head_lr_trains_the_compressor_and_the_head_while_the_encoder_keeps_lr(tiny_dims, tokenizer):
    model = make_model(tiny_dims, tokenizer, 2, compression_dim=8)
    body, new = model.optimizer_groups(lr=1e-5, head_lr=1e-3)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    new_names = {names[id(parameter)] for parameter in new["params"]}
    assert (body["lr"], new["lr"]) == (1e-5, 1e-3)
    assert new_names == {name for name, _ in model.named_parameters() if name.startswith(("compressor.", "head."))}
    assert any(name.startswith("compressor.") for name in new_names)
    assert all(names[id(parameter)].startswith("encoder.") for parameter in body["params"])


def test_store_fingerprint_covers_exactly_the_lower_layers_and_the_compressing_half(tiny_dims, tokenizer):
    model = make_model(tiny_dims, tokenizer, 2, compression_dim=8)
    assert model.store_variant == "l2-e8" and model.store_width == 8
    assert make_model(tiny_dims, tokenizer, 3).store_variant == "l3-enone"
    assert make_model(tiny_dims, tokenizer, 3).store_width == tiny_dims.hidden_size
    store_config = model.store_config()
    assert store_config["doc_position_offset"] == QUERY_BLOCK and store_config["join_layer"] == 2
    assert store_config["compression_dim"] == 8 and store_config["doc_max_length"] == DOC_MAX

    def changed(tensor_name: str) -> bool:
        before = model.store_fingerprint()
        with torch.no_grad():
            model.get_parameter(tensor_name).add_(0.01)
        return model.store_fingerprint() != before

    assert changed("encoder.embeddings.word_embeddings.weight")
    assert changed("encoder.layers.0.attention.query.weight")
    assert changed("encoder.layers.1.ffn.output.bias")  # layer l = 2
    assert changed("compressor.compress.weight")
    assert not changed("encoder.layers.2.attention.key.weight")  # layer l + 1: runs online
    assert not changed("encoder.layers.3.ffn.intermediate.weight")
    assert not changed("compressor.decompress.weight")  # the decompressor lives in the model, not the store
    assert not changed("compressor.norm.weight")
    assert not changed("head.weight")
    other_offset = make_model(tiny_dims, tokenizer, 2, compression_dim=8, query_max_length=QUERY_BLOCK + 1)
    assert other_offset.store_fingerprint() != make_model(tiny_dims, tokenizer, 2, 8).store_fingerprint()


@torch.no_grad()
def test_from_backbone_loads_the_offline_minilm(tokenizer, documents):
    model = PreTTRModel.from_backbone("minilm", compression_dim=64, query_max_length=QUERY_BLOCK,
                                      doc_max_length=DOC_MAX)
    assert model.join_layer == model.num_layers - 1 == 5 and not model.training
    assert model.store_width == 64 and model.config.backbone == "minilm"
    torch.nn.init.normal_(model.head.weight, std=1.0)  # a fresh head scores ~0: make the comparison meaningful
    texts = [documents[3], documents[0]]
    scores = stored_scores(model, "text editor", texts)
    torch.testing.assert_close(scores, model.score_texts("text editor", texts), rtol=0, atol=ATOL)
    torch.testing.assert_close(scores, model.joint_forward_masked(model.tokenize_queries(["text editor"]),
                                                                  model.tokenize_documents(texts)),
                               rtol=0, atol=ATOL)


@pytest.mark.parametrize("compression_dim", [None, 8])
@torch.no_grad()
def test_scoring_under_bfloat16_autocast(tiny_dims, tokenizer, documents, compression_dim):
    model = make_model(tiny_dims, tokenizer, 3, compression_dim)
    reference = stored_scores(model, QUERY, documents)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = stored_scores(model, QUERY, documents)
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    torch.testing.assert_close(scores, reference, rtol=0, atol=0.1 * reference.abs().max().item())


# ---- stored last-layer keys and values (reuse='kv', l = L - 1) -------------------------------------------------
@pytest.mark.parametrize("compression_dim", [None, 8])
@torch.no_grad()
def test_stored_keys_and_values_score_like_the_block_diagonal_joint_forward(tiny_dims, tokenizer, documents,
                                                                            compression_dim):
    from pyserini_mores.sidecar.reader import head_major

    model = make_model(tiny_dims, tokenizer, 3, compression_dim, reuse="kv")
    docs = model.tokenize_documents(documents)
    stored = model.encode_documents(docs)
    assert model.store_width == 2 * tiny_dims.hidden_size and model.stored_heads == 2 * tiny_dims.num_attention_heads
    assert all(rep.shape == (int(mask.sum()), model.store_width) for rep, mask in zip(stored, docs["attention_mask"]))
    reference = model.joint_forward_masked(model.tokenize_queries([QUERY]), docs)
    assert_spread(reference)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    padded, lengths = pad_documents(stored)
    torch.testing.assert_close(model.score(state, padded, lengths), reference, rtol=0, atol=ATOL)  # as stored
    head_first = head_major(padded, model.stored_heads)  # as the sidecar reader gathers them
    torch.testing.assert_close(model.score(state, head_first, lengths), reference, rtol=0, atol=ATOL)
    torch.testing.assert_close(model.score_texts(QUERY, documents), reference, rtol=0, atol=ATOL)
    # the keys are the first half: swapping the halves must change the scores
    swapped = torch.cat([padded[..., model.store_width // 2:], padded[..., :model.store_width // 2]], -1)
    assert (model.score(state, swapped, lengths) - reference).abs().max() > 100 * ATOL


@torch.no_grad()
def test_stored_keys_and_values_are_the_last_layers_projections_of_the_stored_states(tiny_dims, tokenizer, documents):
    states_model = make_model(tiny_dims, tokenizer, 3)
    kv_model = make_model(tiny_dims, tokenizer, 3, reuse="kv")  # same seed: the same weights
    docs = states_model.tokenize_documents(documents)
    last = states_model.encoder.layers[-1].attention
    for states, kv in zip(states_model.encode_documents(docs), kv_model.encode_documents(docs)):
        keys, values = last.project_keys_values(states)
        torch.testing.assert_close(kv, torch.cat([keys, values], -1), rtol=0, atol=1e-6)


def test_stored_keys_and_values_need_the_last_layer_to_be_the_only_joint_one(tiny_dims, tokenizer):
    with pytest.raises(ValueError, match=r"reuse='kv' .* needs join_layer=3, not 2"):
        make_model(tiny_dims, tokenizer, 2, reuse="kv")
    with pytest.raises(ValueError, match="reuse must be one of states, kv, not 'keys'"):
        make_model(tiny_dims, tokenizer, 3, reuse="keys")
    model = make_model(tiny_dims, tokenizer, 3, reuse="kv")
    state = model.encode_query(model.tokenize_queries([QUERY]))
    with pytest.raises(ValueError, match=r"stored keys and values come as \[B, 8, Lmax, head_dim\]"):
        model.score(state, torch.zeros(2, 4, 5, 16), torch.tensor([5, 3]))


def test_store_fingerprint_of_keys_and_values_covers_the_last_layers_projections(tiny_dims, tokenizer):
    states_model = make_model(tiny_dims, tokenizer, 3, compression_dim=8)
    model = make_model(tiny_dims, tokenizer, 3, compression_dim=8, reuse="kv")
    assert model.store_variant == "l3-e8-kv" and states_model.store_variant == "l3-e8"
    assert "reuse" not in states_model.store_config()  # state sidecars built before 'kv' existed stay valid
    assert model.store_fingerprint() != states_model.store_fingerprint()

    def changed(tensor_name: str) -> bool:
        before = model.store_fingerprint()
        with torch.no_grad():
            model.get_parameter(tensor_name).add_(0.01)
        return model.store_fingerprint() != before

    assert changed("encoder.layers.3.attention.key.weight") and changed("encoder.layers.3.attention.value.bias")
    assert changed("compressor.decompress.weight") and changed("compressor.norm.weight")
    assert changed("encoder.layers.2.ffn.output.bias")
    assert not changed("encoder.layers.3.attention.query.weight")  # the [CLS] query runs online
    assert not changed("encoder.layers.3.ffn.intermediate.weight")
    assert not changed("head.weight")


@torch.no_grad()
def test_a_tied_checkpoint_loads_untied_with_the_same_scores_and_the_same_sidecar(tiny_dims, tokenizer, documents,
                                                                                  tmp_path):
    model = make_model(tiny_dims, tokenizer, 2)
    before = stored_scores(model, QUERY, documents)
    assert_spread(before)
    model.save_pretrained(tmp_path / "tied")
    untied = load_model("prettr", tmp_path / "tied", tied=False)  # e.g. --init TIED_CHECKPOINT --model-arg tied=false
    assert untied.config.tied is False and len(untied.query_layers) == 2
    assert torch.equal(stored_scores(untied, QUERY, documents), before)
    assert untied.store_fingerprint() == model.store_fingerprint()  # the document's layers, so its sidecar, are kept
    assert untied.fingerprint() != model.fingerprint()
    # copies, not shared: moving the query's layers moves the scores and leaves the stored documents as they were
    stored = model.encode_documents(model.tokenize_documents(documents))
    untied.query_layers[0].ffn.output.weight.add_(0.5 * torch.randn_like(untied.query_layers[0].ffn.output.weight))
    assert all(torch.equal(a, b) for a, b in zip(untied.encode_documents(untied.tokenize_documents(documents)), stored))
    moved = stored_scores(untied, QUERY, documents)
    assert not torch.allclose(moved, before, atol=1e-3)
    # the training forward reads the query's own layers too, and an untied checkpoint loads as it was saved
    torch.testing.assert_close(untied(untied.tokenize_queries([QUERY]), untied.tokenize_documents(documents)), moved,
                               rtol=0, atol=ATOL)
    untied.save_pretrained(tmp_path / "untied")
    assert torch.equal(stored_scores(load_model("prettr", tmp_path / "untied"), QUERY, documents), moved)
    with pytest.raises(ValueError, match=r"untied holds a prettr model whose query has its own layers; tying them to "
                                         r"the document's would drop them \(leave tied as stored\)"):
        load_model("prettr", tmp_path / "untied", tied=True)
    with pytest.raises(ValueError, match=r"the block-diagonal reference runs one stack over query and document"):
        untied.joint_forward_masked(untied.tokenize_queries([QUERY]), untied.tokenize_documents(documents))


def test_tied_is_recorded_only_when_untied(tiny_dims):
    assert "tied" not in PreTTRConfig(encoder=tiny_dims, join_layer=2).to_dict()  # tied fingerprints stay unchanged
    assert PreTTRConfig(encoder=tiny_dims, join_layer=2, tied=False).to_dict()["tied"] is False
    with pytest.raises(ValueError, match="tied must be true or false, not 'False'"):
        PreTTRConfig(encoder=tiny_dims, join_layer=2, tied="False")


def test_an_untied_model_from_the_offline_minilm_starts_as_the_tied_one_and_its_delta_keeps_its_query_layers(
        tokenizer, documents, tmp_path):
    from pyserini_mores.models.delta import save_delta

    tied = PreTTRModel.from_backbone("minilm", join_layer=4, query_max_length=QUERY_BLOCK, doc_max_length=DOC_MAX)
    untied = PreTTRModel.from_backbone("minilm", join_layer=4, query_max_length=QUERY_BLOCK, doc_max_length=DOC_MAX,
                                       tied=False)
    torch.nn.init.normal_(untied.head.weight, std=1.0)  # the head is new in both: give both the same one
    tied.head.load_state_dict(untied.head.state_dict())
    with torch.no_grad():
        expected = stored_scores(tied, QUERY, documents)
        assert_spread(expected)
        torch.testing.assert_close(stored_scores(untied, QUERY, documents), expected, rtol=0, atol=1e-5)
        # trained apart from the document's layers, the query's are stored in the delta over the backbone
        untied.query_layers[3].ffn.output.weight.mul_(1.5)
        save_delta(untied, tmp_path / "delta", dtype=torch.float32)
        rebuilt = load_model("prettr", tmp_path / "delta")
        assert rebuilt.config.tied is False
        assert torch.equal(rebuilt.query_layers[3].ffn.output.weight, untied.query_layers[3].ffn.output.weight)
        assert torch.equal(stored_scores(rebuilt, QUERY, documents), stored_scores(untied, QUERY, documents))


# ---- avg pooling: the head reads the mean of the query block's last-layer rows ------------------------------------
def averaged_reference(model: PreTTRModel, query: str, texts: list[str]) -> torch.Tensor:
    """The joint layout run in full (every row of layers l+1..L), then the query block's real rows averaged by hand."""
    joined = model.joined_inputs(model.tokenize_queries([query]), model.tokenize_documents(texts))
    states, mask = model._joint_layer_l(joined)
    x = model.encoder.run_layers(model._roundtrip(states), mask[:, None, None, :], model.join_layer, None)
    rows, row_mask = x[:, :QUERY_BLOCK], mask[:, :QUERY_BLOCK, None].float()
    return model._head((rows * row_mask).sum(1) / row_mask.sum(1))


@pytest.mark.parametrize("compression_dim", [None, 8])
@pytest.mark.parametrize("join_layer", [1, 3])
@torch.no_grad()
def test_avg_pooling_scores_the_mean_of_the_query_rows_in_every_path(tiny_dims, tokenizer, documents, join_layer,
                                                                     compression_dim):
    model = make_model(tiny_dims, tokenizer, join_layer, compression_dim, pooling="avg")
    reference = averaged_reference(model, QUERY, documents)
    assert_spread(reference)
    torch.testing.assert_close(stored_scores(model, QUERY, documents), reference, rtol=0, atol=ATOL)
    torch.testing.assert_close(model.score_texts(QUERY, documents), reference, rtol=0, atol=ATOL)
    joint = model.joint_forward_masked(model.tokenize_queries([QUERY]), model.tokenize_documents(documents))
    torch.testing.assert_close(joint, reference, rtol=0, atol=ATOL)
    # the same weights read through [CLS] score otherwise: the pooling is not a no-op
    model.config.pooling = "cls"
    assert (stored_scores(model, QUERY, documents) - reference).abs().max() > 100 * ATOL


@torch.no_grad()
def test_avg_pooling_from_stored_keys_and_values_equals_the_mean_of_the_query_rows(tiny_dims, tokenizer, documents):
    from pyserini_mores.sidecar.reader import head_major

    model = make_model(tiny_dims, tokenizer, 3, reuse="kv", pooling="avg")
    reference = averaged_reference(model, QUERY, documents)
    state = model.encode_query(model.tokenize_queries([QUERY]))
    padded, lengths = pad_documents(model.encode_documents(model.tokenize_documents(documents)))
    torch.testing.assert_close(model.score(state, padded, lengths), reference, rtol=0, atol=ATOL)
    torch.testing.assert_close(model.score(state, head_major(padded, model.stored_heads), lengths), reference,
                               rtol=0, atol=ATOL)


def test_pooling_is_recorded_only_when_avg_and_checked(tiny_dims):
    assert "pooling" not in PreTTRConfig(encoder=tiny_dims, join_layer=3).to_dict()  # earlier fingerprints stay
    assert PreTTRConfig(encoder=tiny_dims, join_layer=3, pooling="avg").to_dict()["pooling"] == "avg"
    with pytest.raises(ValueError, match="pooling must be one of cls, avg, not 'mean'"):
        PreTTRConfig(encoder=tiny_dims, join_layer=3, pooling="mean")

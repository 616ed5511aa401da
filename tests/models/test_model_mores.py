"""MORES: forward == Reuse-S1 == Reuse-S2, padding invariance, BERT-weight-assisted init against transformers,
checkpoints (whole and per module), sidecar fingerprints, fp16 storage and bf16 autocast — on tiny random models."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import save_tiny_bert, spread_weights

from pyserini_mores.models import load_model, pad_documents
from pyserini_mores.models._layers import attention_mask_from_ids
from pyserini_mores.models.mores import MoresConfig, MoresModel
from pyserini_mores.models.mores_modules import load_modules, save_modules
from pyserini_mores.sidecar.reader import head_major as head_major_batch

QUERY = "what is a text editor"
OTHER_QUERY = "how do debian packages get installed"
DOCUMENTS = [
    "Vim is a highly configurable text editor built to make creating and changing any kind of text efficient.",
    "apt installs packages.",
    "Emacs is an extensible, customizable text editor with a Lisp interpreter at its core, and much more.",
    "The Linux kernel manages hardware, memory and processes.",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_model(dims, tokenizer, seed: int = 0, **config) -> MoresModel:
    """A tiny random MORES whose weights are spread wider than BERT's init, so scores differ clearly between
    documents and attention is far from uniform (a masking bug then shows)."""
    torch.manual_seed(seed)
    return spread_weights(MoresModel(MoresConfig(encoder=dims, **config), tokenizer)).eval()


def dims_for(tiny_dims, n_blocks: int):
    return dataclasses.replace(tiny_dims, num_hidden_layers=max(tiny_dims.num_hidden_layers, n_blocks + 1))


def stored_scores(model: MoresModel, query: str, documents: list[str], reuse: str,
                  head_major: bool = False) -> torch.Tensor:
    """Scores from stored representations; ``head_major``: laid out as ``get_batch(heads=model.stored_heads)``
    gives them (Reuse-S2)."""
    model.set_reuse(reuse)
    reps = model.encode_documents(model.tokenize_documents(documents))
    assert all(rep.shape[1] == model.store_width for rep in reps)
    docs, lengths = pad_documents(reps)
    if head_major:
        model.config.s2_reads = "heads"  # the tiny model's 8-wide heads would be read as stored under "auto"
        docs = head_major_batch(docs, model.stored_heads)
    return model.score(model.encode_query(model.tokenize_queries([query])), docs, lengths)


@pytest.mark.parametrize("interaction", ["separate", "joint"])
@pytest.mark.parametrize("pooling", ["cls", "avg"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("n_blocks", [1, 2, 3, 4])
def test_forward_equals_s1_equals_s2(tokenizer, tiny_dims, n_blocks, tied, pooling, interaction):
    model = make_model(dims_for(tiny_dims, n_blocks), tokenizer, n_interaction_blocks=n_blocks, tied=tied,
                       pooling=pooling, interaction=interaction)
    with torch.no_grad():
        trained = model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS))
        s1 = stored_scores(model, QUERY, DOCUMENTS, "s1")
        s2 = stored_scores(model, QUERY, DOCUMENTS, "s2")
        s2_heads = stored_scores(model, QUERY, DOCUMENTS, "s2", head_major=True)
    assert trained.std() > 0.05  # the documents get clearly different scores
    torch.testing.assert_close(s1, trained, atol=1e-4, rtol=0)
    torch.testing.assert_close(s2, trained, atol=1e-4, rtol=0)
    torch.testing.assert_close(s2_heads, s2, atol=1e-5, rtol=0)


@pytest.mark.parametrize("interaction", ["separate", "joint"])
@pytest.mark.parametrize("n_blocks", [1, 2])
def test_last_block_cls_only_equals_every_row(tokenizer, tiny_dims, n_blocks, interaction):
    """The last block computes only the [CLS] row (after its cross-attention, or of its joint attention); the
    paper's block computes every row and pools row 0. Same logits, and a second query of another length in the batch
    (padding) changes nothing."""
    model = make_model(dims_for(tiny_dims, n_blocks), tokenizer, n_interaction_blocks=n_blocks,
                       interaction=interaction)
    queries = model.tokenize_queries([QUERY, OTHER_QUERY, QUERY, OTHER_QUERY])
    docs = model.tokenize_documents(DOCUMENTS)
    with torch.no_grad():
        query = model.query_module(queries["input_ids"], queries["attention_mask"])
        query_mask = attention_mask_from_ids(queries["attention_mask"])
        doc_states = model.document_module(docs["input_ids"], docs["attention_mask"])
        doc_mask = attention_mask_from_ids(docs["attention_mask"])
        x = query
        for block in model.interaction_module.blocks:
            keys, values = block.document_attention.project_keys_values(doc_states)
            x = block(x, keys, values, doc_mask, query_mask)
        every_row = model.interaction_module.head(x[:, 0])
        cls_only = model.forward_logits(queries, docs)
    assert every_row.std() > 0.05
    torch.testing.assert_close(cls_only, every_row, atol=1e-5, rtol=0)


def test_score_texts_equals_forward(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=2)
    with torch.no_grad():
        trained = model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS))
    from_text = model.score_texts(QUERY, DOCUMENTS, batch_size=3)  # two batches, each padded on its own
    torch.testing.assert_close(from_text, trained, atol=1e-4, rtol=0)


def test_forward_scores_aligned_pairs_of_different_queries(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, pooling="avg")  # avg pooling also sees the query padding
    queries = [QUERY, OTHER_QUERY, "vim", OTHER_QUERY]
    with torch.no_grad():
        trained = model(model.tokenize_queries(queries), model.tokenize_documents(DOCUMENTS))
        one_by_one = torch.cat([stored_scores(model, q, [d], "s2") for q, d in zip(queries, DOCUMENTS)])
    torch.testing.assert_close(one_by_one, trained, atol=1e-4, rtol=0)


def test_store_layout(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=2)
    batch = model.tokenize_documents(DOCUMENTS)
    lengths = batch["attention_mask"].sum(1).tolist()
    model.set_reuse("s1")
    assert (model.store_width, model.store_variant) == (32, "s1")
    s1 = model.encode_documents(batch)
    assert [tuple(rep.shape) for rep in s1] == [(length, 32) for length in lengths]
    encoded = model.document_module(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(s1[0], encoded[0, :lengths[0]])
    model.set_reuse("s2")
    assert (model.store_width, model.store_variant) == (2 * 2 * 32, "s2-k2")
    s2 = model.encode_documents(batch)
    assert [tuple(rep.shape) for rep in s2] == [(length, 128) for length in lengths]
    # [K1 | V1 | K2 | V2]: block 2's values are its value projection of D
    torch.testing.assert_close(s2[1][:, 96:], model.interaction_module.blocks[1].cross_attention.value(s1[1]))
    assert model.store_config()["n_interaction_blocks"] == 2
    model.set_reuse("s1")
    assert "n_interaction_blocks" not in model.store_config()  # an S1 store does not depend on K


@pytest.mark.parametrize("reuse", ["s1", "s2"])
def test_padding_invariance(tokenizer, tiny_dims, reuse):
    model = make_model(tiny_dims, tokenizer, pooling="avg", n_interaction_blocks=2)
    short, long = DOCUMENTS[1], DOCUMENTS[2]
    with torch.no_grad():
        alone = stored_scores(model, QUERY, [short], reuse)
        batched = stored_scores(model, QUERY, [short, long], reuse)
        trained_batched = model(model.tokenize_queries([QUERY, QUERY]), model.tokenize_documents([short, long]))
        reps = model.encode_documents(model.tokenize_documents([short]))
        extra_padding = model.score(model.encode_query(model.tokenize_queries([QUERY])),
                                    torch.nn.functional.pad(reps[0], (0, 0, 0, 7))[None], torch.tensor([len(reps[0])]))
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(trained_batched[0], alone[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(extra_padding, alone, atol=1e-5, rtol=0)


def test_wrong_store_width_is_refused(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, reuse="s2", s2_reads="heads")
    state = model.encode_query(model.tokenize_queries([QUERY]))
    assert model.stored_heads == 2 * 2 * tiny_dims.num_attention_heads  # K = 2 blocks, keys and values
    with pytest.raises(ValueError, match="expects 128"):
        model.score(state, torch.zeros(2, 5, 32), torch.tensor([5, 3]))
    with pytest.raises(ValueError, match=r"are 8 heads x 16 but .* expects 128 wide in 16 heads"):
        model.score(state, torch.zeros(2, 8, 5, 16), torch.tensor([5, 3]))
    model.config.s2_reads = "tokens"  # read as stored: token-major batches
    assert model.stored_heads is None
    model.config.s2_reads = "auto"  # the tiny model's heads are 8 wide: head-major would not pay
    assert model.stored_heads is None
    model.config.s2_reads = "heads"
    model.set_reuse("s1")
    assert model.stored_heads is None
    with pytest.raises(ValueError, match=r"are 4 heads x 8 but .* expects 32 wide \(is the sidecar"):
        model.score(state, torch.zeros(2, 4, 5, 8), torch.tensor([5, 3]))


def test_config_validation(tiny_dims, tokenizer):
    with pytest.raises(ValueError, match="pooling"):
        MoresConfig(encoder=tiny_dims, pooling="max")
    with pytest.raises(ValueError, match="reuse"):
        MoresConfig(encoder=tiny_dims, reuse="s3")
    with pytest.raises(ValueError, match="s2_reads"):
        MoresConfig(encoder=tiny_dims, s2_reads="columns")
    with pytest.raises(ValueError, match="interaction"):
        MoresConfig(encoder=tiny_dims, interaction="mixed")
    with pytest.raises(ValueError, match="joint interaction blocks have none"):
        MoresConfig(encoder=tiny_dims, interaction="joint", ib_init="random")
    with pytest.raises(ValueError, match="more layers"):
        MoresConfig(encoder=tiny_dims, n_interaction_blocks=4)
    config = MoresConfig(encoder=tiny_dims, n_interaction_blocks=3)
    assert config.n_query_layers == 1 and config.to_dict()["n_query_layers"] == 1
    with pytest.raises(ValueError, match="n_query_layers"):
        MoresConfig.from_dict({**config.to_dict(), "n_query_layers": 2})


# ---- BERT-weight-assisted initialisation ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_backbone(tmp_path_factory, tokenizer):
    """A tiny random ``transformers.BertModel`` saved with the MiniLM tokenizer: (directory, model)."""
    directory = tmp_path_factory.mktemp("hf_bert")
    return directory, save_tiny_bert(directory, tokenizer, layers=4, seed=1, perturbation=0.1)


def _hf_attention(hf_layer) -> dict[str, torch.Tensor]:
    attention = hf_layer.attention
    return {"query": attention.self.query.weight, "key": attention.self.key.weight,
            "value": attention.self.value.weight, "output": attention.output.dense.weight,
            "norm": attention.output.LayerNorm.weight, "query_bias": attention.self.query.bias,
            "value_bias": attention.self.value.bias, "norm_bias": attention.output.LayerNorm.bias}


def _our_attention(attention) -> dict[str, torch.Tensor]:
    return {"query": attention.query.weight, "key": attention.key.weight, "value": attention.value.weight,
            "output": attention.output.weight, "norm": attention.norm.weight, "query_bias": attention.query.bias,
            "value_bias": attention.value.bias, "norm_bias": attention.norm.bias}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("n_blocks", [1, 2, 3])
def test_from_backbone_initialisation(hf_backbone, n_blocks, tied):
    directory, hf_model = hf_backbone
    model = MoresModel.from_backbone(directory, n_interaction_blocks=n_blocks, tied=tied)
    n_query = 4 - n_blocks
    batch = model.tokenize_queries([QUERY, "vim"])
    with torch.no_grad():
        expected = hf_model(**batch, output_hidden_states=True).hidden_states
        query_states = model.query_module(batch["input_ids"], batch["attention_mask"])
        doc_states = model.document_module(batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(query_states[real], expected[n_query][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(doc_states[real], expected[4][real], atol=1e-5, rtol=1e-5)
    assert (model.query_module.layers[0] is model.document_module.layers[0]) == tied
    assert model.query_module.embeddings is not model.document_module.embeddings
    for index, block in enumerate(model.interaction_module.blocks):
        hf_layer = hf_model.encoder.layer[n_query + index]
        for attention in (block.cross_attention, block.self_attention):
            for name, tensor in _hf_attention(hf_layer).items():
                assert torch.equal(_our_attention(attention)[name], tensor), name
        assert torch.equal(block.ffn.intermediate.weight, hf_layer.intermediate.dense.weight)
        assert block.cross_attention.query.weight is not block.self_attention.query.weight  # a copy, not a tie
    with torch.no_grad():  # the copies train as separate parameters
        model.interaction_module.blocks[0].cross_attention.key.weight.add_(1.0)
    assert not torch.equal(model.interaction_module.blocks[0].self_attention.key.weight,
                           model.interaction_module.blocks[0].cross_attention.key.weight)
    assert model.config.backbone == str(directory) and model.config.n_query_layers == n_query


def test_a_joint_block_is_a_bert_layer_for_the_query_rows_of_query_and_document(hf_backbone, tokenizer):
    """Against transformers: a joint block copied from layer L of a BertModel, fed the layer-L input states of
    ``[CLS] q [SEP] d [SEP]`` (query rows as its query, the rest as fixed documents), gives that layer's output for
    the query rows; and the [CLS]-only last block gives the [CLS] row's."""
    directory, hf_model = hf_backbone
    model = MoresModel.from_backbone(directory, n_interaction_blocks=1, interaction="joint")
    block = model.interaction_module.blocks[0]
    assert block.cross_attention is None
    pair = tokenizer([QUERY, OTHER_QUERY], [DOCUMENTS[0], DOCUMENTS[1]], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = hf_model(**pair, output_hidden_states=True).hidden_states
        for row in range(2):
            types, real = pair["token_type_ids"][row], pair["attention_mask"][row].bool()
            query_rows, doc_rows = (types == 0) & real, (types == 1) & real
            x, docs = states[3][row, query_rows][None], states[3][row, doc_rows][None]
            query_mask = torch.ones(1, 1, 1, x.shape[1], dtype=torch.bool)
            doc_mask = torch.ones(1, 1, 1, docs.shape[1], dtype=torch.bool)
            keys, values = block.document_attention.project_keys_values(docs)
            torch.testing.assert_close(block(x, keys, values, doc_mask, query_mask)[0], states[4][row, query_rows],
                                       atol=1e-5, rtol=1e-5)
            cls_only = model._interact(x, query_mask, lambda index, kv=(keys, values): kv, doc_mask)
            every_row = model.interaction_module.head(states[4][row, 0][None])
            torch.testing.assert_close(cls_only, every_row, atol=1e-5, rtol=1e-5)


def test_joint_blocks_copy_each_layer_once_and_share_the_separate_blocks_s1_sidecar(hf_backbone):
    directory, hf_model = hf_backbone
    joint = MoresModel.from_backbone(directory, n_interaction_blocks=2, interaction="joint")
    separate = MoresModel.from_backbone(directory, n_interaction_blocks=2)
    for index, block in enumerate(joint.interaction_module.blocks):
        for name, tensor in _hf_attention(hf_model.encoder.layer[2 + index]).items():
            assert torch.equal(_our_attention(block.self_attention)[name], tensor), name
    fingerprints = {}
    for reuse in ("s1", "s2"):
        joint.set_reuse(reuse)
        separate.set_reuse(reuse)
        fingerprints[reuse] = joint.store_fingerprint() == separate.store_fingerprint()
    # the same document module: the same S1 sidecar; S2 stores the projections of another attention
    assert fingerprints == {"s1": True, "s2": False}


def test_from_backbone_random_cross_attention(hf_backbone):
    directory, hf_model = hf_backbone
    model = MoresModel.from_backbone(directory, n_interaction_blocks=2, ib_init="random")
    for index, block in enumerate(model.interaction_module.blocks):
        hf_attention = _hf_attention(hf_model.encoder.layer[2 + index])
        assert not torch.equal(block.cross_attention.query.weight, hf_attention["query"])
        assert not torch.equal(block.cross_attention.key.weight, hf_attention["key"])
        assert torch.equal(block.self_attention.query.weight, hf_attention["query"])
        assert block.cross_attention.query.weight.std() < 0.05  # BERT-style N(0, 0.02)


def test_from_backbone_needs_more_layers_than_blocks(hf_backbone):
    with pytest.raises(ValueError, match="n_interaction_blocks=4 needs an encoder with more layers"):
        MoresModel.from_backbone(hf_backbone[0], n_interaction_blocks=4)


# ---- checkpoints -------------------------------------------------------------------------------------------------
def all_scores(model: MoresModel) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {
            "forward": model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS)),
            "s1": stored_scores(model, QUERY, DOCUMENTS, "s1"),
            "s2": stored_scores(model, QUERY, DOCUMENTS, "s2"),
        }


@pytest.mark.parametrize("tied, pooling", [(True, "cls"), (False, "avg")])
def test_save_pretrained_round_trip(tokenizer, tiny_dims, tmp_path, tied, pooling):
    model = make_model(tiny_dims, tokenizer, tied=tied, pooling=pooling, n_interaction_blocks=2)
    before = all_scores(model)
    model.save_pretrained(tmp_path)
    loaded = load_model("mores", tmp_path)
    assert isinstance(loaded, MoresModel) and loaded.config == model.config
    assert (loaded.query_module.layers[1] is loaded.document_module.layers[1]) == tied
    after = all_scores(loaded)
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert loaded.fingerprint() == model.fingerprint()
    s1_loaded = MoresModel.from_pretrained(tmp_path, reuse="s1")
    assert s1_loaded.store_width == 32 and s1_loaded.store_fingerprint() == (model.set_reuse("s1") or
                                                                             model.store_fingerprint())


def test_a_tied_checkpoint_loads_untied_with_the_same_scores_and_its_own_query_layers(tokenizer, tiny_dims,
                                                                                      tmp_path):
    model = make_model(tiny_dims, tokenizer, tied=True, n_interaction_blocks=2)
    before = all_scores(model)
    model.save_pretrained(tmp_path)
    untied = load_model("mores", tmp_path, tied=False)  # e.g. --init TIED_CHECKPOINT with a tied=false recipe
    assert untied.config.tied is False
    assert untied.query_module.layers[1] is not untied.document_module.layers[1]
    after = all_scores(untied)
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert untied.store_fingerprint() == model.store_fingerprint()  # the document module, so the sidecar, is kept
    with torch.no_grad():  # copies, not shared: training the query layers leaves the stored documents alone
        untied.query_module.layers[0].ffn.output.weight.add_(1.0)
    assert not torch.equal(untied.document_module.layers[0].ffn.output.weight,
                           untied.query_module.layers[0].ffn.output.weight)


def test_tied_must_be_a_boolean(tiny_dims):
    with pytest.raises(ValueError, match="tied must be true or false, not 'False'"):
        MoresConfig(encoder=tiny_dims, tied="False")


def test_an_untied_checkpoint_is_not_tied_on_load(tokenizer, tiny_dims, tmp_path):
    make_model(tiny_dims, tokenizer, tied=False, n_interaction_blocks=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"holds a mores model whose query has its own layers; tying them to the "
                                         r"document's would drop them \(leave tied as stored\)"):
        load_model("mores", tmp_path, tied=True)


@pytest.mark.parametrize("tied", [True, False])
def test_separate_module_round_trip(tokenizer, tiny_dims, tmp_path, tied):
    model = make_model(tiny_dims, tokenizer, tied=tied, n_interaction_blocks=2)
    before = all_scores(model)
    save_modules(model, tmp_path / "mores")
    for name in ("document_module", "query_module", "interaction_module"):
        assert (tmp_path / "mores" / name / "model.safetensors").is_file()
    assert not (tmp_path / "mores" / "model.safetensors").exists()
    # from_pretrained (and so load_model) recognises the module layout too
    loaded = load_modules(tmp_path / "mores") if tied else load_model("mores", tmp_path / "mores")
    after = all_scores(loaded)
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert loaded.fingerprint() == model.fingerprint()


def test_modules_can_be_swapped(tokenizer, tiny_dims, tmp_path):
    """adapt-interaction: a separately fine-tuned interaction module on the original representation modules keeps
    the S1 sidecar valid (same document module, same S1 fingerprint) and changes the S2 one."""
    base = make_model(tiny_dims, tokenizer, seed=0)
    adapted = make_model(tiny_dims, tokenizer, seed=0)
    with torch.no_grad():
        for parameter in adapted.interaction_module.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    save_modules(base, tmp_path / "base")
    save_modules(adapted, tmp_path / "adapted")
    mixed = load_modules(tmp_path / "base", interaction_module=tmp_path / "adapted" / "interaction_module")
    expected = all_scores(adapted)
    for name, scores in all_scores(mixed).items():
        assert torch.equal(scores, expected[name]), name
    assert mixed.document_module.state_dict().keys() == base.document_module.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(mixed.document_module.state_dict().values(),
                                                 base.document_module.state_dict().values()))
    with pytest.raises(ValueError, match="holds a MORES document_module"):
        load_modules(tmp_path / "base", query_module=tmp_path / "adapted" / "document_module")


def test_store_fingerprints_follow_what_is_stored(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=2)

    def fingerprints():
        return {reuse: (model.set_reuse(reuse) or model.store_fingerprint()) for reuse in ("s1", "s2")}

    original = fingerprints()
    assert original["s1"] != original["s2"]
    with torch.no_grad():
        model.interaction_module.blocks[1].cross_attention.value.weight[0, 0] += 0.5
    after_kv = fingerprints()
    assert after_kv["s1"] == original["s1"] and after_kv["s2"] != original["s2"]
    with torch.no_grad():  # not stored by either: the cross-attention query side, self-attention, head
        model.interaction_module.blocks[0].cross_attention.query.weight[0, 0] += 0.5
        model.interaction_module.blocks[0].self_attention.key.weight[0, 0] += 0.5
        model.interaction_module.head.weight[0, 0] += 0.5
    assert fingerprints() == after_kv
    with torch.no_grad():  # tied: training the query module changes the document module, so both stores go stale
        model.query_module.layers[0].ffn.output.bias[0] += 0.5
    final = fingerprints()
    assert final["s1"] != after_kv["s1"] and final["s2"] != after_kv["s2"]


# ---- precision -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reuse", ["s1", "s2"])
def test_float16_storage_keeps_ranking(tokenizer, tiny_dims, reuse):
    """Stored fp16 (the sidecar default): same ranking as fp32 on this fixture, scores within 5e-3 absolute
    (scores span several units here)."""
    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=2, reuse=reuse)
    documents = DOCUMENTS + ["A text editor edits text.", "Debian is an operating system.", "vim vim vim editor"]
    with torch.no_grad():
        state = model.encode_query(model.tokenize_queries([QUERY]))
        docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(documents)))
        full = model.score(state, docs, lengths)
        half = model.score(state, docs.half(), lengths)
    assert half.dtype == torch.float32
    assert torch.equal(half.argsort(descending=True), full.argsort(descending=True))
    torch.testing.assert_close(half, full, atol=5e-3, rtol=0)  # observed ≤ 1.6e-3


def test_bfloat16_autocast(tokenizer, tiny_dims):
    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=2)
    with torch.no_grad():
        reference = all_scores(model)
        state = model.encode_query(model.tokenize_queries([QUERY]))  # fp32 state, scored under autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = all_scores(model)
            model.set_reuse("s2")
            docs, lengths = pad_documents(model.encode_documents(model.tokenize_documents(DOCUMENTS)))
            mixed = model.score(state, docs.half(), lengths)
    spread = reference["forward"].abs().max()
    for name, scores in autocast.items():
        torch.testing.assert_close(scores.float(), reference[name], atol=0.05 * spread, rtol=0)
    torch.testing.assert_close(mixed, reference["s2"], atol=0.05 * spread, rtol=0)


def test_forward_logits_train_with_pointwise_loss(tokenizer, tiny_dims):
    from pyserini_mores.models.losses import pointwise_cross_entropy

    model = make_model(tiny_dims, tokenizer, n_interaction_blocks=1).train()
    queries, documents = model.tokenize_queries([QUERY, QUERY]), model.tokenize_documents(DOCUMENTS[:2])
    logits = model.forward_logits(queries, documents)
    assert logits.shape == (2, 2)
    pointwise_cross_entropy(logits, torch.tensor([1, 0])).backward()
    assert model.interaction_module.blocks[0].cross_attention.key.weight.grad.abs().sum() > 0
    assert model.query_module.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.document_module.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("n_blocks", [1, 2])
def test_a_shorter_document_module_scores_the_same_stored_or_not(tokenizer, tiny_dims, n_blocks, tied):
    """document_layers = L − K (the ablation): training forward = S1 = S2 as with the full document module."""
    dims = dims_for(tiny_dims, n_blocks)
    model = make_model(dims, tokenizer, n_interaction_blocks=n_blocks, tied=tied,
                       document_layers=dims.num_hidden_layers - n_blocks)
    assert len(model.document_module.layers) == dims.num_hidden_layers - n_blocks
    with torch.no_grad():
        trained = model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS))
        s1 = stored_scores(model, QUERY, DOCUMENTS, "s1")
        s2 = stored_scores(model, QUERY, DOCUMENTS, "s2")
    assert trained.std() > 0.05
    torch.testing.assert_close(s1, trained, atol=1e-4, rtol=0)
    torch.testing.assert_close(s2, trained, atol=1e-4, rtol=0)


def test_a_shorter_document_module_takes_the_backbones_first_layers(hf_backbone, tmp_path):
    directory, hf_model = hf_backbone
    model = MoresModel.from_backbone(directory, n_interaction_blocks=2, tied=False, document_layers=2)
    batch = model.tokenize_documents(["vim is a text editor", "the linux kernel"])
    with torch.no_grad():
        expected = hf_model(**batch, output_hidden_states=True).hidden_states[2]  # after the first L − K layers
        doc_states = model.document_module(batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(doc_states[real], expected[real], atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path)
    loaded = load_model("mores", tmp_path)
    assert loaded.config.document_layers == 2 and len(loaded.document_module.layers) == 2
    assert loaded.fingerprint() == model.fingerprint()
    full = MoresModel.from_backbone(directory, n_interaction_blocks=2, tied=False)
    assert full.fingerprint() != model.fingerprint()


@pytest.mark.parametrize("tied, document_layers, message", [
    (True, 1, r"document_layers must be from L − K = 2 to L = 4 \(tied\), not 1"),
    (True, 5, r"document_layers must be from L − K = 2 to L = 4 \(tied\), not 5"),
    (False, 0, "document_layers must be from 1 to L = 4, not 0"),
    (False, 5, "document_layers must be from 1 to L = 4, not 5"),
])
def test_document_layers_must_lie_within_the_encoder(tiny_dims, tokenizer, tied, document_layers, message):
    """Tied, the query module's L − K layers are the document module's first ones, so it must have them."""
    dims = dataclasses.replace(tiny_dims, num_hidden_layers=4)
    with pytest.raises(ValueError, match=message):
        make_model(dims, tokenizer, n_interaction_blocks=2, tied=tied, document_layers=document_layers)


def test_an_untied_document_module_may_be_shallower_than_the_query_module(tiny_dims, tokenizer):
    dims = dataclasses.replace(tiny_dims, num_hidden_layers=4)
    model = make_model(dims, tokenizer, n_interaction_blocks=1, tied=False, document_layers=1)
    assert (len(model.document_module.layers), len(model.query_module.layers)) == (1, 3)
    with torch.no_grad():
        trained = model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS))
        s1 = stored_scores(model, QUERY, DOCUMENTS, "s1")
    assert trained.std() > 0.05
    torch.testing.assert_close(s1, trained, atol=1e-4, rtol=0)


def _without_cross_attention(block) -> None:
    """Make ``block`` skip what reads the document: its attention over the query only, then its FFN (what folding
    keeps)."""
    block.forward = lambda x, doc_keys, doc_values, doc_mask, query_mask, cross_queries=None: block.ffn(
        block.self_attention(x, mask=query_mask))


@pytest.mark.parametrize("blocks, kept, document_layers, interaction", [
    (2, 1, 2, "separate"), (3, 1, None, "separate"), (3, 2, 1, "separate"), (2, 1, 2, "joint")])
def test_fewer_blocks_score_as_the_first_blocks_without_their_cross_attention(tiny_dims, tokenizer, blocks, kept,
                                                                             document_layers, interaction):
    dims = dataclasses.replace(tiny_dims, num_hidden_layers=4)
    model = make_model(dims, tokenizer, n_interaction_blocks=blocks, tied=False, document_layers=document_layers,
                       reuse="s1", interaction=interaction)
    smaller = model.with_fewer_blocks(kept)
    assert smaller.config.n_interaction_blocks == kept and len(smaller.query_module.layers) == 4 - kept
    assert smaller.store_fingerprint() == model.store_fingerprint()  # the same S1 sidecar serves both
    queries = model.tokenize_queries([QUERY] * len(DOCUMENTS))
    documents = model.tokenize_documents(DOCUMENTS)
    with torch.no_grad():
        folded = smaller(queries, documents)
        for block in model.interaction_module.blocks[:blocks - kept]:
            _without_cross_attention(block)
        expected = model(queries, documents)
        # The larger model's stored document vectors, scored by the smaller one.
        stored, lengths = pad_documents(model.encode_documents(documents))
        from_sidecar = smaller.score(smaller.encode_query(smaller.tokenize_queries([QUERY])), stored, lengths)
    assert folded.std() > 0.05
    torch.testing.assert_close(folded, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(from_sidecar, folded, atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides, kept, message", [
    ({"tied": False}, 2, "a MORES with 2 interaction blocks can become one of 1 to 1, not 2"),
    ({"tied": False}, 0, "a MORES with 2 interaction blocks can become one of 1 to 1, not 0"),
    ({"tied": True}, 1, r"the query module is tied to the document module \(tied=true\)"),
])
def test_fewer_blocks_refuses_what_it_cannot_fold(tiny_dims, tokenizer, overrides, kept, message):
    model = make_model(dataclasses.replace(tiny_dims, num_hidden_layers=4), tokenizer, n_interaction_blocks=2,
                       **overrides)
    with pytest.raises(ValueError, match=message):
        model.with_fewer_blocks(kept)


def test_fold_blocks_command_saves_the_smaller_model(tiny_dims, tokenizer, tmp_path, capsys):
    from pyserini_mores.train.__main__ import main

    model = make_model(dataclasses.replace(tiny_dims, num_hidden_layers=4), tokenizer, n_interaction_blocks=2,
                       tied=False, reuse="s1")
    model.save_pretrained(tmp_path / "two")
    assert main(["fold-blocks", "--model", str(tmp_path / "two"), "--blocks", "1",
                 "--output", str(tmp_path / "one")]) == 0
    assert "stored a MORES of 1 interaction block(s)" in capsys.readouterr().out
    loaded = load_model("mores", tmp_path / "one")
    assert loaded.fingerprint() == model.with_fewer_blocks(1).fingerprint()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["one", "two"]  # written beside it, renamed into place

    # made again over its earlier start (a pipeline re-folding a retrained row): replaced whole
    (tmp_path / "one" / "stale.txt").write_text("left by the earlier start")
    assert main(["fold-blocks", "--model", str(tmp_path / "two"), "--blocks", "1",
                 "--output", str(tmp_path / "one")]) == 0
    assert not (tmp_path / "one" / "stale.txt").exists()
    assert load_model("mores", tmp_path / "one").fingerprint() == loaded.fingerprint()

    # a directory that is not a checkpoint is not replaced: what it holds stays
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"models is not a checkpoint directory, and replacing it would lose what it "
                                         r"holds: name a new --output \(or an earlier checkpoint to replace\)"):
        main(["fold-blocks", "--model", str(tmp_path / "two"), "--blocks", "1", "--output", str(tmp_path / "models")])
    assert [path.name for path in (tmp_path / "models").iterdir()] == ["notes.txt"]


def test_joint_flops_count_one_attention_over_query_and_document_keys():
    from pyserini_mores.bench.flops import EncoderShape
    from pyserini_mores.bench.model_flops import mores_flops

    shape = EncoderShape(layers=2, hidden=4, ffn=8, heads=2)
    q, d = 3, 5
    count = mores_flops(shape, q, d, interaction_blocks=1, reuse="s2", every_row=True, interaction="joint")
    # query module: 1 layer over 3 tokens; block: QKV of 3 rows, attention over 3 + 5 keys and its output, FFN; head
    layer = 8 * q * 16 + 4 * q * q * 4 + 4 * q * 4 * 8
    block = 2 * q * 4 * 12 + 4 * q * (q + d) * 4 + 2 * q * 16 + 2 * (2 * q * 4 * 8)
    assert count.sum() == layer + block + 2 * 4 * 2
    assert count.sum("query") == layer + 2 * q * 4 * 12

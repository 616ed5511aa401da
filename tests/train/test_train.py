"""Training: negatives mining, the loop (loss goes down, MORES adapt-* freezing, resume, best checkpoint), the saved
output, PreTTR compressor pre-training and recipes. Tiny random models (32 wide) on the real MiniLM tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pyserini_mores.formats import FormatError, read_collection, read_qrels, read_topics
from pyserini_mores.models import MODEL_CLASSES, load_model
from pyserini_mores.models._layers import BertDims
from pyserini_mores.train import compressor as compressor_module
from pyserini_mores.train import data as train_data
from pyserini_mores.train.__main__ import build_parser, main
from pyserini_mores.train.compressor import pretrain_compressor
from pyserini_mores.train.data import (
    TrainingGroup,
    load_groups,
    mine_negatives,
    read_scored_triples,
    read_triples,
    with_batch_negatives,
    write_triples,
)
from pyserini_mores.train.objectives import mean_loss, select_trainable, set_dropout
from pyserini_mores.train.recipes import merge_settings, read_recipe, recipe_names
from pyserini_mores.train.trainer import TrainerState, TrainingSettings, last_checkpoint, train

from conftest import RESOURCES

TOPICS, QRELS, COLLECTION = (RESOURCES / "tiny_topics.tsv", RESOURCES / "tiny_qrels.txt",
                             RESOURCES / "tiny_collection.jsonl")


def _dims(layers: int = 4) -> BertDims:
    return BertDims(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=256)


def _tiny_model(model_type: str, tokenizer, **overrides):
    """A random tiny model of ``model_type`` (seeded), the kind of checkpoint ``--init`` gets in these tests."""
    from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
    from pyserini_mores.models.dual_encoder import DualEncoder, DualEncoderConfig
    from pyserini_mores.models.mores import MoresConfig, MoresModel
    from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
    from pyserini_mores.models.tk import TKConfig, TKModel

    torch.manual_seed(0)
    if model_type == "mores":
        return MoresModel(MoresConfig(encoder=_dims(), n_interaction_blocks=2, doc_max_length=48, **overrides),
                          tokenizer)
    if model_type == "cross-encoder":
        return CrossEncoder(CrossEncoderConfig(encoder=_dims(2), doc_max_length=48, **overrides), tokenizer)
    if model_type == "prettr":
        overrides = {"join_layer": 2, **overrides}
        return PreTTRModel(PreTTRConfig(encoder=_dims(), doc_max_length=48, **overrides), tokenizer)
    if model_type == "tk":
        return TKModel(TKConfig(embedding_dim=32, vocab_size=len(tokenizer), num_layers=1, num_heads=4, head_dim=8,
                                ffn_dim=16, doc_max_length=48, **overrides), tokenizer)
    if model_type == "maxsim":
        return DualEncoder(DualEncoderConfig(encoder=_dims(2), doc_max_length=48, **overrides), tokenizer)
    raise AssertionError(model_type)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def init_dirs(tmp_path_factory, tokenizer):
    """Saved tiny random checkpoints, one per model type (built once per module)."""
    root = tmp_path_factory.mktemp("train-inits")
    made = {}

    def make(model_type: str, **overrides) -> Path:
        key = (model_type, tuple(sorted(overrides.items())))
        if key not in made:
            path = root / f"{model_type}-{len(made)}"
            _tiny_model(model_type, tokenizer, **overrides).save_pretrained(path)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="module")
def triples_path(tmp_path_factory) -> Path:
    """15 triples of the tiny collection: every positive with 3 negatives drawn from all non-relevant documents."""
    topics, qrels = read_topics(TOPICS), read_qrels(QRELS)
    texts = dict(read_collection(COLLECTION))
    rankings = {qid: list(texts) for qid in topics}
    triples, _ = mine_negatives(topics, qrels, rankings, lambda ids: [texts[i] for i in ids],
                                negatives_per_query=3, depth=len(texts), seed=1)
    path = tmp_path_factory.mktemp("triples") / "triples.tsv"
    write_triples(path, triples)
    return path


def _settings(tmp_path: Path, model_type: str, init: Path, triples: Path, **values) -> TrainingSettings:
    defaults = dict(model_type=model_type, init=str(init), triples=str(triples), output=str(tmp_path / "out"),
                    batch_size=8, max_steps=4, lr=1e-3, warmup_steps=0, seed=3, save_steps=1000)
    return TrainingSettings(**{**defaults, **values})


# ------------------------------------------------------------------------------------------------- mining


def test_mine_negatives_cli_on_tiny_index_never_uses_relevant_documents(tiny_index, tmp_path):
    output = tmp_path / "triples.tsv"
    main(["mine-negatives", "--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS),
          "--negatives-per-query", "2", "--depth", "20", "--output", str(output), "--seed", "5"])
    triples = list(read_triples(output))
    texts = dict(read_collection(COLLECTION))
    docid_of = {text: docid for docid, text in texts.items()}
    qid_of = {text: qid for qid, text in read_topics(TOPICS).items()}
    qrels = read_qrels(QRELS)
    assert triples
    per_query: dict[str, set[str]] = {}
    for query, positive, negative in triples:
        qid = qid_of[query]
        assert qrels[qid][docid_of[positive]] >= 1  # positives: judged relevant, text read from the index
        assert qrels[qid].get(docid_of[negative], 0) <= 0  # negatives: never judged relevant
        per_query.setdefault(qid, set()).add(docid_of[negative])
    assert all(1 <= len(negatives) <= 2 for negatives in per_query.values())
    # the same seed gives the same file; the collection as text source gives the same texts as the index
    again = tmp_path / "again.tsv"
    main(["mine-negatives", "--index", str(tiny_index), "--topics", str(TOPICS), "--qrels", str(QRELS),
          "--negatives-per-query", "2", "--depth", "20", "--output", str(again), "--seed", "5",
          "--collection", str(COLLECTION)])
    assert again.read_text() == output.read_text()


def test_mine_negatives_from_a_run_excludes_relevant_documents_ranked_first(tmp_path):
    topics, qrels = read_topics(TOPICS), read_qrels(QRELS)
    texts = dict(read_collection(COLLECTION))
    run = tmp_path / "run.trec"
    with run.open("w") as stream:
        for qid in topics:  # relevant documents at the top of the run, everything else below
            ranked = sorted(texts, key=lambda docid: (qrels.get(qid, {}).get(docid, 0) <= 0, docid))
            for rank, docid in enumerate(ranked[:6], start=1):
                stream.write(f"{qid} Q0 {docid} {rank} {100 - rank} test\n")
    output = tmp_path / "triples.tsv"
    main(["mine-negatives", "--run", str(run), "--collection", str(COLLECTION), "--topics", str(TOPICS),
          "--qrels", str(QRELS), "--negatives-per-query", "10", "--depth", "4", "--output", str(output)])
    relevant_texts = {texts[docid] for judged in qrels.values() for docid, grade in judged.items() if grade > 0}
    triples = list(read_triples(output))
    # q1 has 2 relevant in its top 4 → 2 negatives × 2 positives; the others 3 negatives × 1 positive
    assert len(triples) == 2 * 2 + 3 * 3
    assert not {negative for _, _, negative in triples} & relevant_texts


def test_mine_negatives_with_teacher_scores_writes_the_runs_scores(tmp_path, capsys):
    topics, qrels = read_topics(TOPICS), read_qrels(QRELS)
    texts = dict(read_collection(COLLECTION))
    docid_of = {text: docid for docid, text in texts.items()}
    qid_of = {text: qid for qid, text in topics.items()}
    unscored_qid = sorted(qrels)[-1]
    run, scores = tmp_path / "teacher.trec", {}
    with run.open("w") as stream:
        for qid in topics:  # every document but the relevant ones of one query, with distinct scores
            ranked = [docid for docid in sorted(texts)
                      if not (qid == unscored_qid and qrels[qid].get(docid, 0) > 0)]
            for rank, docid in enumerate(ranked, start=1):
                scores[qid, docid] = 10.0 - rank / 7
                stream.write(f"{qid} Q0 {docid} {rank} {scores[qid, docid]!r} teacher\n")
    output = tmp_path / "scored.tsv"
    main(["mine-negatives", "--run", str(run), "--collection", str(COLLECTION), "--topics", str(TOPICS),
          "--qrels", str(QRELS), "--negatives-per-query", "2", "--depth", "10", "--output", str(output),
          "--teacher-scores"])
    assert "1 without a positive in the teacher's run" in capsys.readouterr().out
    scored = list(read_scored_triples(output))
    assert scored and unscored_qid not in {qid_of[query] for query, *_ in scored}
    for query, positive, negative, (positive_score, negative_score) in scored:
        qid = qid_of[query]
        assert positive_score == scores[qid, docid_of[positive]]
        assert negative_score == scores[qid, docid_of[negative]]
    assert [triple[:3] for triple in scored] == list(read_triples(output))
    with pytest.raises(SystemExit, match="--teacher-scores takes the scores of --run"):
        main(["mine-negatives", "--index", "unused", "--topics", str(TOPICS), "--qrels", str(QRELS),
              "--output", str(tmp_path / "x.tsv"), "--teacher-scores"])


@pytest.mark.parametrize("lines,message", [
    ("q\tp\tn\t1.5\t0.5\nq\tp\tn2\n", "line 2.*scored and unscored triples mixed"),
    ("q\tp\tn\t1.5\thigh\n", "line 1.*must be numbers"),
    ("q\tp\tn\t1.5\tnan\n", "line 1.*must be finite"),
    ("q\tp\tn\t1.5\n", "line 1.*found 4 tab-separated"),
])
def test_scored_triples_reader_reports_the_bad_line(tmp_path, lines, message):
    path = tmp_path / "bad.tsv"
    path.write_text(lines)
    with pytest.raises(FormatError, match=message):
        list(read_scored_triples(path))


def test_scored_groups_carry_the_teacher_scores_and_borrowed_positives_get_none(tmp_path):
    path = tmp_path / "scored.tsv"
    write_triples(path, [("q", "p", "n1", 3.0, 1.0), ("q", "p", "n2", 3.0, 2.0), ("q", "p", "n3", 3.0, 0.5),
                         ("r", "p2", "m1", 4.0, -1.0)])
    groups = load_groups(path, negatives_per_group=2)
    assert [(g.negatives, g.teacher_scores) for g in groups] == [
        (("n1", "n2"), (3.0, 1.0, 2.0)), (("n3", "n1"), (3.0, 0.5, 1.0)), (("m1", "m1"), (4.0, -1.0, -1.0))]
    extended = with_batch_negatives(groups[1:], 2)  # two groups: one borrowed positive, one own negative each
    assert extended[0].negatives == ("n3", "n1", "p2", "n3")
    assert extended[0].teacher_scores == (3.0, 0.5, 1.0, float("-inf"), 0.5)
    assert load_groups(path)[0].teacher_scores == (3.0, 1.0)


def test_distillation_learns_the_teachers_distribution():
    from pyserini_mores.models.losses import listwise_distillation

    teacher = torch.tensor([[2.0, 0.0, -1.0, float("-inf")]])
    student = torch.zeros(1, 4, requires_grad=True)
    loss = listwise_distillation(student, teacher)
    target = torch.tensor([2.0, 0.0, -1.0]).softmax(-1)
    torch.testing.assert_close(loss, -(target * torch.full((3,), 0.25).log()).sum())
    loss.backward()  # gradient of softmax CE: student probabilities minus target, -inf gets no target
    torch.testing.assert_close(student.grad, (torch.full((1, 4), 0.25) - torch.cat([target, torch.zeros(1)])))
    at_teacher = torch.tensor([[2.0, 0.0, -1.0, -30.0]], requires_grad=True)
    listwise_distillation(at_teacher, teacher).backward()
    assert at_teacher.grad.abs().max() < 1e-6  # the teacher's own scores are a minimum
    flat = listwise_distillation(torch.tensor([[2.0, 0.0]]), torch.tensor([[2.0, 0.0]]), temperature=1e6)
    torch.testing.assert_close(flat, -torch.tensor([2.0, 0.0]).log_softmax(-1).mean())
    with pytest.raises(ValueError, match="temperature must be positive"):
        listwise_distillation(student, teacher, temperature=0)


def test_triples_reader_reports_the_bad_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("q\tpositive\tnegative\nq\tonly two\n")
    with pytest.raises(FormatError, match="line 2.*3 tab-separated|line 2: expected"):
        list(read_triples(path))


def test_listwise_groups_pool_consecutive_triples_of_one_query(tmp_path):
    path = tmp_path / "t.tsv"
    write_triples(path, [("q", "p", "n1"), ("q", "p", "n2"), ("q", "p", "n3"), ("r", "p2", "m1")])
    groups = load_groups(path, negatives_per_group=2)
    assert [(g.query, g.negatives) for g in groups] == [("q", ("n1", "n2")), ("q", ("n3", "n1")),
                                                        ("r", ("m1", "m1"))]


def test_batch_negatives_borrow_the_next_groups_positives():
    groups = [TrainingGroup("q1", "p1", ("n1",)), TrainingGroup("q2", "p2", ("n2",)),
              TrainingGroup("q3", "p1", ("n3",)), TrainingGroup("q4", "p4", ("n4",))]
    extended = with_batch_negatives(groups, 2)
    assert [g.negatives for g in extended] == [("n1", "p2", "p4"), ("n2", "p1", "p4"), ("n3", "p4", "p2"),
                                               ("n4", "p1", "p2")]  # q1 and q3 never get their own positive
    assert [(g.query, g.positive) for g in extended] == [(g.query, g.positive) for g in groups]
    assert with_batch_negatives(groups, 0) == groups
    # q1 has only p2 and p4 to borrow: its own negative fills the third place
    assert with_batch_negatives(groups, 3)[0].negatives == ("n1", "p2", "p4", "n1")


def test_batch_negatives_need_enough_groups_per_micro_batch(tmp_path):
    with pytest.raises(ValueError, match="micro-batch, which holds 2 groups"):
        TrainingSettings(model_type="mores", init="minilm", triples="t.tsv", output=str(tmp_path), loss="listwise",
                         batch_size=4, grad_accum=2, batch_negatives=2)
    # pointwise: a group counts 1 + k + b examples
    assert TrainingSettings(model_type="mores", init="minilm", triples="t.tsv", output=str(tmp_path),
                            batch_size=9, batch_negatives=1).groups_per_step == 3


# ------------------------------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def scored_triples_path(tmp_path_factory, triples_path) -> Path:
    """The triples of :func:`triples_path` scored by a fixed made-up teacher (a hash of the passage text)."""
    def teacher(text: str) -> float:
        return (sum(map(ord, text)) % 97) / 10

    path = tmp_path_factory.mktemp("scored") / "scored.tsv"
    write_triples(path, [(q, p, n, teacher(p), teacher(n)) for q, p, n in read_triples(triples_path)])
    return path


@pytest.mark.parametrize("model_type,loss,negatives", [
    ("mores", "pointwise", 1), ("cross-encoder", "pointwise", 1), ("prettr", "listwise", 1), ("tk", "pairwise", 1),
    ("maxsim", "pairwise", 1), ("mores", "listwise", 3), ("mores", "distill", 3), ("mores", "margin-mse", 3),
    ("maxsim", "margin-mse", 3),
])
def test_a_few_steps_reduce_the_training_loss(model_type, loss, negatives, init_dirs, triples_path,
                                              scored_triples_path, tmp_path):
    init = init_dirs(model_type)
    triples_path = scored_triples_path if loss in ("distill", "margin-mse") else triples_path
    groups = load_groups(triples_path, negatives_per_group=negatives)
    before = mean_loss(load_model(model_type, init), groups, loss)
    batch = 10 if loss == "pointwise" else 5 // negatives + 1
    result = train(_settings(tmp_path, model_type, init, triples_path, loss=loss, batch_size=batch, max_steps=20,
                             lr=1e-2, negatives_per_example=negatives), progress=False)
    after = mean_loss(result.model, groups, loss)
    assert result.global_step == 20
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("loss", ["distill", "margin-mse"])
def test_distillation_needs_scored_triples(init_dirs, triples_path, tmp_path, loss):
    with pytest.raises(ValueError, match="distill loss needs scored triples.*--teacher-scores"):
        train(_settings(tmp_path, "mores", init_dirs("mores"), triples_path, loss=loss), progress=False)


def test_training_with_batch_negatives_scores_the_borrowed_positives(init_dirs, triples_path, tmp_path,
                                                                    monkeypatch):
    import pyserini_mores.train.trainer as trainer_module

    batches = []

    def recording(groups, count):
        extended = with_batch_negatives(groups, count)
        batches.append((count, [g.positive for g in groups], [g.negatives[-1] for g in extended]))
        return extended

    monkeypatch.setattr(trainer_module, "with_batch_negatives", recording)
    result = train(_settings(tmp_path, "mores", init_dirs("mores"), triples_path, loss="pointwise", batch_size=9,
                             max_steps=2, batch_negatives=1), progress=False)
    assert result.global_step == 2 and len(batches) == 2
    for count, positives, borrowed in batches:
        assert count == 1 and len(positives) == 3  # 9 pointwise examples = 3 groups of 1 + 1 + 1
        assert all(other != own and other in positives for own, other in zip(positives, borrowed))


def _changed(before: dict, after: dict, prefixes: tuple[str, ...]) -> dict[str, bool]:
    return {name: not torch.equal(before[name], after[name]) for name in before if name.startswith(prefixes)}


@pytest.mark.parametrize("train_modules", ["interaction", "representation"])
def test_mores_adapt_modules_trains_only_those_modules(train_modules, init_dirs, triples_path, tmp_path):
    init = init_dirs("mores")
    before = load_model("mores", init).state_dict()
    result = train(_settings(tmp_path, "mores", init, triples_path, train_modules=train_modules, max_steps=3),
                   progress=False)
    after = result.model.state_dict()
    interaction = _changed(before, after, ("interaction_module.",))
    representation = _changed(before, after, ("document_module.", "query_module."))
    assert interaction and representation
    trained, frozen = (interaction, representation) if train_modules == "interaction" else (representation,
                                                                                            interaction)
    assert not any(frozen.values()), [name for name, changed in frozen.items() if changed]  # bit-identical
    # The last block's self-attention runs for the [CLS] row with its keys folded into the query: a key bias adds
    # the same logit to every key, which softmax ignores, so it gets no gradient there (in any attention its true
    # gradient is zero).
    last_key_bias = f"interaction_module.blocks.{result.model.config.n_interaction_blocks - 1}.self_attention.key.bias"
    assert all(changed for name, changed in trained.items() if name != last_key_bias), \
        [name for name, changed in trained.items() if not changed]


def test_adapt_modules_is_refused_for_models_without_them(init_dirs, triples_path, tmp_path):
    with pytest.raises(ValueError, match="adapt-interaction"):
        train(_settings(tmp_path, "cross-encoder", init_dirs("cross-encoder"), triples_path,
                        train_modules="interaction"), progress=False)


def _mores_delta_over(cross_encoder: Path, output: Path):
    """A MORES 1×IB built from ``cross_encoder`` (its document module = the first layer), every parameter outside the
    document module and the embeddings moved as training against a sidecar moves them, saved as a delta over it."""
    from pyserini_mores.models.delta import save_delta

    mores = load_model("mores", str(cross_encoder), n_interaction_blocks=1, document_layers=1)
    select_trainable(mores, "all", freeze_embeddings=True)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        for name, parameter in mores.named_parameters():
            if parameter.requires_grad and not name.startswith("document_module."):
                parameter.add_(torch.randn_like(parameter) * 0.05)
    save_delta(mores, output, dtype=torch.float32)
    return mores


def test_a_cross_encoder_trained_above_frozen_lower_layers_still_carries_the_mores_delta_built_on_it(
        init_dirs, triples_path, tmp_path):
    """The shipped MORES is a delta over the shipped cross-encoder, whose first layers are its document module: the
    cross-encoder distilled further with those layers and the embeddings frozen must still carry that delta, to the
    same weights; with every layer training, the delta is refused."""
    base = tmp_path / "cross-encoder"
    shutil.copytree(init_dirs("cross-encoder"), base)
    before = load_model("cross-encoder", base).state_dict()
    mores = _mores_delta_over(base, tmp_path / "mores")
    result = train(_settings(tmp_path / "run", "cross-encoder", base, triples_path, freeze_embeddings=True,
                             freeze_layers=1, max_steps=2), progress=False)
    after = result.model.state_dict()
    kept = _changed(before, after, ("encoder.embeddings.", "encoder.layers.0."))
    moved = _changed(before, after, ("encoder.layers.1.", "head."))
    assert kept and not any(kept.values()), [name for name, changed in kept.items() if changed]
    # (a key bias adds the same logit to every key, which softmax ignores: its gradient is zero)
    assert moved and all(changed for name, changed in moved.items() if not name.endswith("key.bias")), moved
    result.model.save_pretrained(base)  # the re-trained cross-encoder, under the same name
    loaded = load_model("mores", tmp_path / "mores").state_dict()
    for name, expected in mores.state_dict().items():
        assert torch.equal(expected, loaded[name]), name

    retrained = train(_settings(tmp_path / "run-all", "cross-encoder", base, triples_path, freeze_embeddings=True,
                                max_steps=2), progress=False)
    retrained.model.save_pretrained(base)
    with pytest.raises(ValueError, match="was saved over another .* than the one installed"):
        load_model("mores", tmp_path / "mores")


def test_mores_freeze_layers_keeps_the_lower_document_layers_and_trains_the_rest_from_text(
        init_dirs, triples_path, tmp_path):
    init = init_dirs("mores", tied=False)  # untied: the query module has layers of its own, which keep training
    before = load_model("mores", init).state_dict()
    result = train(_settings(tmp_path, "mores", init, triples_path, freeze_embeddings=True, freeze_layers=3,
                             max_steps=3), progress=False)
    after = result.model.state_dict()
    assert result.model.config.n_document_layers == 4
    kept = _changed(before, after, ("document_module.embeddings.", "document_module.layers.0.",
                                    "document_module.layers.1.", "document_module.layers.2."))
    moved = _changed(before, after, ("document_module.layers.3.", "query_module.layers.", "interaction_module."))
    assert kept and not any(kept.values()), [name for name, changed in kept.items() if changed]
    # (a key bias adds the same logit to every key, which softmax ignores: its gradient is zero)
    assert moved and all(changed for name, changed in moved.items() if not name.endswith("key.bias")), \
        [name for name, changed in moved.items() if not changed]


def test_prettr_freeze_layers_keeps_the_lower_layers_and_trains_those_above_and_across_the_join(
        init_dirs, triples_path, tmp_path):
    init = init_dirs("prettr")  # 4 layers joined at 2: layer 1 runs separately, layers 2-3 on the joined sequence
    before = load_model("prettr", init).state_dict()
    result = train(_settings(tmp_path, "prettr", init, triples_path, freeze_embeddings=True, freeze_layers=1,
                             max_steps=3), progress=False)
    after = result.model.state_dict()
    kept = _changed(before, after, ("encoder.embeddings.", "encoder.layers.0."))
    moved = _changed(before, after, ("encoder.layers.1.", "encoder.layers.2.", "encoder.layers.3.", "head."))
    assert kept and not any(kept.values()), [name for name, changed in kept.items() if changed]
    assert moved and all(changed for name, changed in moved.items() if not name.endswith("key.bias")), \
        [name for name, changed in moved.items() if not changed]


def test_freeze_layers_is_refused_without_one_stack_or_beyond_its_depth(init_dirs, triples_path, tmp_path):
    with pytest.raises(ValueError, match="--freeze-layers needs a model with one stack of Transformer layers "
                                         r"\(a cross-encoder, PreTTR, MORES's document module\); "
                                         "a 'tk' model has none"):
        train(_settings(tmp_path, "tk", init_dirs("tk"), triples_path, freeze_layers=1), progress=False)
    with pytest.raises(ValueError, match="--freeze-layers 3: the model has 2 layers"):
        train(_settings(tmp_path, "cross-encoder", init_dirs("cross-encoder"), triples_path, freeze_layers=3),
              progress=False)


class _Killed(Exception):
    pass


def test_a_killed_run_resumes_to_the_same_weights(init_dirs, triples_path, tmp_path):
    init = init_dirs("mores")  # dropout 0.1 is on: the RNG state must be restored too
    common = dict(max_steps=7, warmup_steps=2, save_steps=3, grad_accum=2, batch_size=8)
    uninterrupted = train(_settings(tmp_path / "a", "mores", init, triples_path, **common), progress=False)

    def kill_after_step_5(state, model):
        if state.global_step == 5:  # checkpoint-3 exists; steps 4 and 5 are lost, as in a real kill
            raise _Killed

    interrupted = _settings(tmp_path / "b", "mores", init, triples_path, **common)
    with pytest.raises(_Killed):
        train(interrupted, on_step_end=kill_after_step_5, progress=False)
    assert last_checkpoint(interrupted.output).name == "checkpoint-3"
    with pytest.raises(ValueError, match="--resume"):  # a fresh start never mixes with an earlier run's checkpoints
        train(interrupted, progress=False)
    before = json.loads((last_checkpoint(interrupted.output) / "trainer_state.json").read_text())["trained_seconds"]
    resumed = train(interrupted, resume=True, progress=False)
    assert (resumed.resumed_from, resumed.global_step) == (3, 7)
    assert uninterrupted.total_seconds == uninterrupted.seconds
    assert before > 0 and resumed.total_seconds == before + resumed.seconds, "the run's time sums its invocations'"
    summary = json.loads((Path(interrupted.output) / "training_summary.json").read_text())
    assert (summary["seconds"], summary["total_seconds"]) == (resumed.seconds, resumed.total_seconds)
    expected = uninterrupted.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    with pytest.raises(ValueError, match="lr"):  # resuming with other settings is refused
        train(_settings(tmp_path / "b", "mores", init, triples_path, **{**common, "lr": 5e-4}), resume=True,
              progress=False)


def test_a_run_stopped_inside_its_schedule_resumes_to_the_whole_schedules_weights(init_dirs, triples_path, tmp_path):
    init = init_dirs("mores")
    common = dict(max_steps=6, warmup_steps=1, save_steps=2, batch_size=8, logging_steps=1)
    whole = train(_settings(tmp_path / "a", "mores", init, triples_path, **common), progress=False)
    stopped = train(_settings(tmp_path / "b", "mores", init, triples_path, stop_at_step=3, **common), progress=False)
    assert (stopped.global_step, stopped.total_steps) == (3, 6)
    rates = {entry["step"]: entry["lr"] for entry in whole.log_history if "lr" in entry}
    assert [entry["lr"] for entry in stopped.log_history if "lr" in entry] == [rates[1], rates[2], rates[3]], \
        "the learning rate of the whole schedule's first steps, not of a 3-step schedule"
    resumed = train(_settings(tmp_path / "b", "mores", init, triples_path, **common), resume=True, progress=False)
    assert (resumed.resumed_from, resumed.global_step) == (3, 6)
    expected = whole.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    with pytest.raises(ValueError, match="stop_at_step must be at least 1, not 0"):
        _settings(tmp_path / "c", "mores", init, triples_path, stop_at_step=0)


def test_a_checkpoint_that_did_not_count_its_seconds_leaves_the_runs_total_unknown(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 3, "trained_seconds": 12.5}))
    assert TrainerState.load(path).trained_seconds == 12.5
    path.write_text(json.dumps({"global_step": 3}))  # written before the state counted them
    assert TrainerState.load(path).trained_seconds is None
    assert TrainerState().trained_seconds == 0.0, "a fresh run starts from nothing"


def test_output_directory_loads_with_load_model_and_scores_like_the_trained_model(init_dirs, triples_path,
                                                                                  tmp_path):
    settings = _settings(tmp_path, "cross-encoder", init_dirs("cross-encoder"), triples_path, max_steps=2)
    result = train(settings, progress=False)
    loaded = load_model("cross-encoder", settings.output)
    documents = [text for _, text in read_collection(COLLECTION)][:5]
    assert torch.equal(loaded.score_texts("text editor", documents),
                       result.model.score_texts("text editor", documents))
    assert loaded.fingerprint() == result.model.fingerprint()
    assert loaded.fingerprint() != load_model("cross-encoder", settings.init).fingerprint()
    summary = json.loads((Path(settings.output) / "training_summary.json").read_text())
    assert summary["global_step"] == 2 and summary["log_history"][-1]["step"] == 2


def test_dev_evaluation_keeps_the_best_model_and_stops_early(init_dirs, triples_path, tmp_path):
    scripted = iter([0.2, 0.5, 0.4, 0.3, 0.9])  # best at the 2nd evaluation; patience 2 stops at the 4th
    weights_at: dict[int, dict] = {}

    def remember(state, model):
        weights_at[state.global_step] = {name: value.clone() for name, value in model.state_dict().items()}

    settings = _settings(tmp_path, "mores", init_dirs("mores"), triples_path, max_steps=20, eval_every=2,
                         early_stopping_patience=2)
    result = train(settings, evaluator=lambda model: {"MRR@10": next(scripted)}, on_step_end=remember,
                   progress=False)
    assert (result.best_step, result.best_metric, result.stopped_early, result.global_step) == (4, 0.5, True, 8)
    saved = load_model("mores", settings.output).state_dict()
    for name, tensor in weights_at[4].items():
        assert torch.equal(saved[name], tensor), name
    assert not all(torch.equal(saved[name], tensor) for name, tensor in weights_at[8].items())
    evaluations = [entry for entry in result.log_history if "dev_MRR@10" in entry]
    assert [entry["step"] for entry in evaluations] == [2, 4, 6, 8]


def test_dev_evaluator_reranks_bm25_candidates_of_the_dev_index(tiny_index, init_dirs):
    from pyserini_mores.eval.metrics import evaluate
    from pyserini_mores.train.dev import DevEvaluator, gather_dev_candidates

    candidates = gather_dev_candidates(TOPICS, QRELS, index=tiny_index, depth=10)
    assert set(candidates.queries) == set(read_qrels(QRELS))
    texts = dict(read_collection(COLLECTION))
    assert all(text == texts[docid] for docs in candidates.candidates.values() for docid, text in docs)
    model = load_model("cross-encoder", init_dirs("cross-encoder"))
    metrics = DevEvaluator(candidates)(model)
    run = {qid: dict(zip([d for d, _ in docs], model.score_texts(candidates.queries[qid],
                                                                 [t for _, t in docs]).tolist()))
           for qid, docs in candidates.candidates.items()}
    assert metrics["MRR@10"] == pytest.approx(evaluate(run, read_qrels(QRELS), ["MRR@10"])["MRR@10"])


def test_train_cli_with_recipe_and_bm25_dev_evaluation(tiny_index, init_dirs, scored_triples_path, tmp_path,
                                                       capsys):
    import shlex
    import shutil

    from pyserini_mores.sidecar.__main__ import main as sidecar_main

    output = tmp_path / "model"
    command = ["train", "--recipe", "mores-debian", "--init", str(init_dirs("mores")), "--triples",
               str(scored_triples_path), "--output", str(output), "--max-steps", "4", "--batch-size", "4",
               "--warmup-steps", "1", "--no-bf16", "--eval-every", "2", "--dev-topics", str(TOPICS), "--dev-qrels",
               str(QRELS), "--dev-index", str(tiny_index), "--dev-depth", "10", "--quiet"]
    # the recipe trains against the S1 sidecar beside the index: without it, the error gives the build command
    with pytest.raises(SystemExit, match="no sidecar of this mores model beside the index") as refused:
        main(command)
    build = shlex.split(str(refused.value).split("build it first: ")[1])
    assert build[:4] == ["python", "-m", "pyserini_mores.sidecar", "build"] and "reuse=s1" in build
    assert sidecar_main(build[3:]) == 0
    try:
        main(command)
    finally:
        shutil.rmtree(next(Path(f"{tiny_index}.sidecars").glob("mores-s1-*")))  # the tiny index is shared
    printed = capsys.readouterr().out
    assert "best dev MRR@10" in printed
    args = json.loads((output / "training_args.json").read_text())
    assert (args["max_steps"], args["lr"], args["model_args"]["n_interaction_blocks"]) == (4, 1e-4, 2)
    assert args["doc_sidecar"] == "default" and args["loss"] == "distill"
    assert load_model("mores", output).score_texts("text editor", ["vim", "python"]).shape == (2,)


# ------------------------------------------------------------------------------------------------- compressor


def test_pretrain_compressor_lowers_attention_mse_and_changes_only_the_compressor(init_dirs, tmp_path):
    init = init_dirs("prettr", compression_dim=8)
    result = pretrain_compressor(init, COLLECTION, tmp_path / "out", steps=25, batch_size=7, lr=1e-2,
                                 heldout_pairs=6, progress=False)
    assert result.loss_after < 0.8 * result.loss_before, result
    before, after = load_model("prettr", init).state_dict(), load_model("prettr", tmp_path / "out").state_dict()
    changed = {name: not torch.equal(before[name], after[name]) for name in before}
    assert all(changed[name] for name in changed if name.startswith("compressor."))
    assert not any(changed[name] for name in changed if not name.startswith("compressor."))


def test_an_interrupted_compressor_pretraining_resumes_to_the_same_weights(init_dirs, tmp_path, monkeypatch):
    init = init_dirs("prettr", compression_dim=8)
    common = dict(steps=7, batch_size=5, lr=1e-2, heldout_pairs=6, save_steps=3, progress=False)
    uninterrupted = pretrain_compressor(init, COLLECTION, tmp_path / "a", **common)

    step, taken = compressor_module._compressor_step, []

    def killed_in_step_5(*args):
        taken.append(1)
        if len(taken) == 5:  # checkpoint-3 exists; step 4 is lost, as in a real kill
            raise _Killed
        return step(*args)

    output = tmp_path / "b"
    monkeypatch.setattr(compressor_module, "_compressor_step", killed_in_step_5)
    with pytest.raises(_Killed):
        pretrain_compressor(init, COLLECTION, output, **common)
    monkeypatch.setattr(compressor_module, "_compressor_step", step)
    assert last_checkpoint(output).name == "checkpoint-3"
    with pytest.raises(ValueError, match="holds checkpoints of an earlier run: continue it with --resume"):
        pretrain_compressor(init, COLLECTION, output, **common)
    with pytest.raises(ValueError, match=r"settings that differ from the interrupted run \(lr: 0.01 → 0.02\)"):
        pretrain_compressor(init, COLLECTION, output, **{**common, "lr": 2e-2}, resume=True)

    resumed = pretrain_compressor(init, COLLECTION, output, **common, resume=True)
    assert (resumed.loss_before, resumed.loss_after) == (uninterrupted.loss_before, uninterrupted.loss_after)
    expected = load_model("prettr", tmp_path / "a").state_dict()
    for name, tensor in load_model("prettr", output).state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert resumed.total_seconds > resumed.seconds, "the run's time counts the interrupted invocation's steps"


def test_pretrain_compressor_cli_adds_a_compressor_to_a_checkpoint_without_one(init_dirs, triples_path, tmp_path,
                                                                               capsys):
    init = init_dirs("prettr")  # no compressor: --model-arg compression_dim adds a new one
    output = tmp_path / "compressed"
    main(["pretrain-compressor", "--init", str(init), "--texts", str(triples_path), "--model-arg",
          "compression_dim=8", "--output", str(output), "--steps", "3", "--batch-size", "4", "--quiet"])
    assert "attention MSE" in capsys.readouterr().out
    model = load_model("prettr", output)
    assert model.config.compression_dim == 8
    base = load_model("prettr", init).state_dict()
    for name, tensor in model.state_dict().items():
        if not name.startswith("compressor."):
            assert torch.equal(tensor, base[name]), name


def test_compressor_pairs_from_queries_pair_each_query_with_a_passage():
    pairs = train_data.compressor_pairs(COLLECTION, queries=["text editor", "web server"], seed=0)
    passages = {text for _, text in read_collection(COLLECTION)}
    assert sorted(query for query, _ in pairs) == ["text editor", "web server"]
    assert all(passage in passages for _, passage in pairs)


def test_compressor_pairs_read_scored_triples_as_the_same_pairs(tmp_path):
    plain, scored = tmp_path / "plain.tsv", tmp_path / "scored.tsv"
    write_triples(plain, [("q", "p", "n1"), ("r", "p2", "m1")])
    write_triples(scored, [("q", "p", "n1", 3.0, 1.0), ("r", "p2", "m1", 2.0, -1.0)])
    pairs = train_data.compressor_pairs(scored, seed=0)
    assert pairs == train_data.compressor_pairs(plain, seed=0)
    assert sorted(pairs) == [("q", "n1"), ("q", "p"), ("r", "m1"), ("r", "p2")]


def test_compressor_pairs_follow_the_paper_half_with_their_own_heading():
    pairs = train_data.compressor_pairs(COLLECTION, seed=0)
    passages = {text for _, text in read_collection(COLLECTION)}
    own = sum(1 for heading, paragraph in pairs
              if any(text.startswith(heading) and text.endswith(paragraph) for text in passages))
    assert len(pairs) == 20 and own == 10


# ------------------------------------------------------------------------------------------------- recipes


def test_every_shipped_recipe_is_valid():
    names = recipe_names()
    for expected in ("mores-msmarco", "mores-debian", "cross-encoder-msmarco", "cross-encoder-debian",
                     "prettr-msmarco", "prettr-debian", "prettr-compressor-debian", "tk-msmarco", "tk-debian",
                     "mores-adapt-interaction", "mores-adapt-representation"):
        assert expected in names
    for name in names:
        recipe = read_recipe(name)
        if recipe["command"] == "train":
            values = {"init": "x", "triples": "t", "dev_topics": "t", "dev_qrels": "q", "dev_index": "i",
                      **recipe["settings"], "output": "o"}
            TrainingSettings(**values)  # raises for a bad value or combination


def test_recipes_carry_the_papers_hyperparameters():
    mores = read_recipe("mores-msmarco")["settings"]
    assert (mores["lr"], mores["batch_size"], mores["warmup_steps"], mores["scheduler"], mores["loss"]) == \
        (3e-5, 128, 1000, "linear", "pointwise")
    prettr = read_recipe("prettr-msmarco")["settings"]
    assert (prettr["lr"], prettr["head_lr"], prettr["batch_size"], prettr["loss"]) == (2e-5, 1e-3, 16, "listwise")
    tk = read_recipe("tk-msmarco")["settings"]
    assert (tk["lr"], tk["head_lr"], tk["batch_size"], tk["loss"], tk["margin"]) == (1e-4, 1e-3, 64, "pairwise", 1.0)


def test_cli_flags_override_recipe_values():
    args = build_parser().parse_args(["train", "--recipe", "mores-debian", "--lr", "1e-3", "--model-arg",
                                      "n_interaction_blocks=1", "--output", "o", "--triples", "t"])
    from pyserini_mores.train.__main__ import _given

    values = merge_settings("train", args.recipe, _given(args, ("command", "recipe", "resume", "quiet")))
    recipe = read_recipe("mores-debian")["settings"]
    assert values["lr"] == 1e-3 and values["batch_size"] == recipe["batch_size"]
    assert values["model_args"] == {**recipe["model_args"], "n_interaction_blocks": 1}
    assert "warmup_steps" in values and values["warmup_steps"] == recipe["warmup_steps"]


def test_the_embedding_flag_reaches_tks_own_config_and_no_other():
    """TK freezes its borrowed embeddings by a field of its config (the tk-debian recipe sets it): an explicit
    --[no-]freeze-embeddings must set that field too, and say so when a --model-arg contradicts it."""
    from pyserini_mores.train.__main__ import _given

    def merged(*flags):
        args = build_parser().parse_args(["train", *flags, "--output", "o", "--triples", "t"])
        return merge_settings("train", args.recipe, _given(args, ("command", "recipe", "resume", "quiet")))

    assert read_recipe("tk-debian")["settings"]["model_args"]["freeze_embeddings"] is True
    assert merged("--recipe", "tk-debian", "--no-freeze-embeddings")["model_args"]["freeze_embeddings"] is False
    assert merged("--recipe", "tk-debian")["model_args"]["freeze_embeddings"] is True
    assert merged("--model-type", "tk", "--freeze-embeddings")["model_args"] == {"freeze_embeddings": True}
    mores = merged("--recipe", "mores-debian", "--no-freeze-embeddings")
    assert mores["freeze_embeddings"] is False and "freeze_embeddings" not in mores["model_args"]
    with pytest.raises(ValueError, match="--model-arg freeze_embeddings=True contradicts --no-freeze-embeddings"):
        merged("--recipe", "tk-debian", "--no-freeze-embeddings", "--model-arg", "freeze_embeddings=true")


def test_no_freeze_embeddings_trains_the_embeddings_of_a_tk_that_froze_them(init_dirs, triples_path, tmp_path):
    init = init_dirs("tk", freeze_embeddings=True)
    output = tmp_path / "tk"
    main(["train", "--model-type", "tk", "--init", str(init), "--triples", str(triples_path), "--no-freeze-embeddings",
          "--max-steps", "2", "--batch-size", "4", "--lr", "1e-2", "--seed", "3", "--output", str(output), "--quiet"])
    trained, start = load_model("tk", output), load_model("tk", init)
    assert start.config.freeze_embeddings and not trained.config.freeze_embeddings
    assert not torch.equal(trained.embeddings.weight, start.embeddings.weight)


@pytest.mark.parametrize("model_type", ["mores", "prettr", "cross-encoder"])
def test_dropout_zero_makes_training_forwards_deterministic(tokenizer, model_type):
    model = _tiny_model(model_type, tokenizer).train()
    query_batch = model.tokenize_queries(["text editor", "web server"])
    doc_batch = model.tokenize_documents(["vim is a text editor for the terminal", "nginx serves the web"])
    with torch.no_grad():
        assert not torch.equal(model(query_batch, doc_batch), model(query_batch, doc_batch)), "BERT's 0.1 acts"
        assert set_dropout(model, 0.0) > 0
        torch.testing.assert_close(model(query_batch, doc_batch), model(query_batch, doc_batch), rtol=0, atol=0)
        assert model.training


def test_training_sets_the_dropout_it_is_given(init_dirs, triples_path, tmp_path, caplog):
    with caplog.at_level("INFO", logger="pyserini_mores.train.trainer"):
        train(_settings(tmp_path, "mores", init_dirs("mores"), triples_path, max_steps=1, dropout=0.0),
              progress=False)
    assert "dropout 0 while training (" in caplog.text


def test_dropout_flag_reaches_the_settings_and_bad_values_are_refused():
    from pyserini_mores.train.__main__ import _given

    args = build_parser().parse_args(["train", "--recipe", "mores-debian", "--dropout", "0.05", "--output", "o",
                                      "--triples", "t"])
    values = merge_settings("train", args.recipe, _given(args, ("command", "recipe", "resume", "quiet")))
    assert values["dropout"] == 0.05 and read_recipe("mores-debian")["settings"]["dropout"] == 0.0
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), not 1.0"):
        TrainingSettings(model_type="mores", init="x", triples="t", output="o", dropout=1.0)


def test_unknown_recipes_and_settings_are_reported(tmp_path):
    with pytest.raises(ValueError, match="mores-debian"):
        read_recipe("no-such-recipe")
    with pytest.raises(ValueError, match="learning_rate"):
        read_recipe('{"settings": {"learning_rate": 1}}')
    with pytest.raises(ValueError, match="pretrain-compressor command, not train"):
        merge_settings("train", "prettr-compressor-debian", {})


def test_cli_model_types_match_the_model_registry():
    from pyserini_mores.train._choices import MODEL_TYPES

    assert sorted(MODEL_TYPES) == sorted(MODEL_CLASSES)


def test_each_model_defaults_to_its_papers_loss():
    def loss_of(model_type):
        return TrainingSettings(model_type=model_type, init="x", triples="t", output="o").loss

    assert [loss_of(m) for m in ("mores", "cross-encoder", "prettr", "tk")] == \
        ["pointwise", "pointwise", "listwise", "pairwise"]

"""Per-module learning rates: ``--head-lr`` moves the new layers, ``--joint-lr`` the layers that read query and
document together above those that read them apart, and ``--lr`` everything else — checked by what one AdamW step
changes, not by how the groups are labelled."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pyserini_mores.models.cross_encoder import CrossEncoder, CrossEncoderConfig
from pyserini_mores.models.mores import MoresConfig, MoresModel
from pyserini_mores.models.prettr import PreTTRConfig, PreTTRModel
from pyserini_mores.models.tk import TKConfig, TKModel
from pyserini_mores.train.__main__ import _given, build_parser
from pyserini_mores.train.objectives import parameter_groups
from pyserini_mores.train.recipes import merge_settings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERY = "debian package manager"
DOCUMENTS = ["apt installs and removes packages", "vim is a text editor", "a library of sorting routines"]


def changed_by_one_step(model, **rates) -> set[str]:
    """Names of the parameters one AdamW step changes, after asserting that every :func:`trainable` one had a
    gradient (so a parameter left unchanged was held by its rate, not starved of signal)."""
    torch.manual_seed(0)
    model.train()
    scores = model(model.tokenize_queries([QUERY] * len(DOCUMENTS)), model.tokenize_documents(DOCUMENTS))
    (scores * torch.tensor([1.0, -1.0, 0.5])).sum().backward()
    movable = trainable(model, "")
    no_gradient = [name for name, parameter in model.named_parameters()
                   if name in movable and (parameter.grad is None or not parameter.grad.any())]
    assert not no_gradient, no_gradient
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    optimizer = torch.optim.AdamW(parameter_groups(model, **rates), weight_decay=0.0)
    optimizer.step()
    return {name for name, parameter in model.named_parameters()
            if not torch.equal(parameter, before[name]) and not name.endswith("key.bias")}


def trainable(model, *prefixes: str) -> set[str]:
    """Trainable parameters under ``prefixes``, but for the attention key biases, left out of both sides: softmax is
    blind to a shift shared by every key, so their gradient is zero up to rounding."""
    return {name for name, parameter in model.named_parameters()
            if parameter.requires_grad and name.startswith(prefixes) and not name.endswith("key.bias")}


@pytest.mark.parametrize("join_layer", [2, 3])
def test_joint_lr_moves_exactly_prettrs_layers_above_the_join(tiny_dims, tokenizer, join_layer):
    torch.manual_seed(1)
    model = PreTTRModel(PreTTRConfig(encoder=tiny_dims, join_layer=join_layer, query_max_length=8,
                                     doc_max_length=16), tokenizer)
    above = tuple(f"encoder.layers.{index}." for index in range(join_layer, tiny_dims.num_hidden_layers))
    assert changed_by_one_step(model, lr=0.0, head_lr=0.0, joint_lr=1e-2) == trainable(model, *above)
    assert changed_by_one_step(model, lr=0.0, head_lr=1e-2, joint_lr=0.0) == trainable(model, "head.")
    assert changed_by_one_step(model, lr=1e-2, head_lr=0.0, joint_lr=0.0) == \
        trainable(model, "encoder.") - trainable(model, *above)


def test_joint_lr_moves_exactly_mores_interaction_blocks_and_not_its_head(tiny_dims, tokenizer):
    torch.manual_seed(2)
    dims = dataclasses.replace(tiny_dims, num_hidden_layers=3)
    model = MoresModel(MoresConfig(encoder=dims, n_interaction_blocks=2), tokenizer)
    blocks = trainable(model, "interaction_module.blocks.")
    assert blocks and changed_by_one_step(model, lr=0.0, head_lr=0.0, joint_lr=1e-2) == blocks
    # without --head-lr the head trains at --lr with the representation modules
    assert changed_by_one_step(model, lr=1e-2, joint_lr=0.0) == trainable(model, "") - blocks


def test_joint_lr_is_refused_by_models_without_apart_and_joint_layers(tiny_dims, tokenizer):
    cross_encoder = CrossEncoder(CrossEncoderConfig(encoder=tiny_dims), tokenizer)
    with pytest.raises(ValueError, match="cross-encoder has no layers that read query and document together above "
                                         "layers that read them apart: --joint-lr applies to PreTTR and MORES"):
        parameter_groups(cross_encoder, lr=1e-5, joint_lr=1e-4)
    tk = TKModel(TKConfig(vocab_size=tokenizer.vocab_size, embedding_dim=16, num_layers=1, num_heads=2, head_dim=8,
                          ffn_dim=16), tokenizer)
    with pytest.raises(ValueError, match="tk has no layers .* --joint-lr applies to PreTTR and MORES"):
        parameter_groups(tk, lr=1e-5, head_lr=1e-3, joint_lr=1e-4)
    assert len(parameter_groups(tk, lr=1e-5, head_lr=1e-3)) == 2


def test_the_joint_lr_flag_overrides_the_recipe():
    args = build_parser().parse_args(["train", "--recipe", "prettr-debian-l5-ce", "--joint-lr", "5e-4",
                                      "--output", "o", "--triples", "t"])
    values = merge_settings("train", args.recipe, _given(args, ("command", "recipe", "resume", "quiet")))
    assert (values["joint_lr"], values["lr"]) == (5e-4, 1e-4)

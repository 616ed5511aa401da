"""Helpers that make the tests' tiny random models meaningful: weights spread wider than BERT's init (so scores and
attention differ clearly and a masking bug shows) and tiny Hugging Face BERT checkpoints to use as backbones."""
from __future__ import annotations

from pathlib import Path

import torch


def spread_weights(model: torch.nn.Module, seed: int | None = None) -> torch.nn.Module:
    """Matrices from N(0, 0.3) (score heads N(0, 1)), other non-LayerNorm vectors from N(0, 0.1); with ``seed``, drawn
    after ``torch.manual_seed(seed)``, else from the current random state."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.3 if "head" not in name else 1.0)
            elif "norm" not in name:
                parameter.normal_(0, 0.1)
    return model


def spread_tk_scores(model):
    """TK as the paper initialises it scores ~1e-3; spread its scoring weights so that tolerances mean something."""
    with torch.no_grad():
        model.mixer.fill_(0.3)
        model.pooled_scale.fill_(1.0)
        model.log_weights.weight.uniform_(-1, 1)
        model.len_weights.weight.uniform_(-1, 1)
        model.combine.weight.copy_(torch.tensor([[0.7, 1.3]]))
    return model


def save_tiny_bert(directory: Path, tokenizer, *, layers: int, seed: int, perturbation: float = 0.0):
    """A random ``transformers.BertModel`` (32 wide, 4 heads), its weights moved by ``perturbation`` × N(0, 1) when
    given (so that copies are told apart from a fresh init), saved with ``tokenizer`` to ``directory``: a local
    backbone like bert-base-uncased, but tiny. Returns the model."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=256)
    model = BertModel(config).eval()
    if perturbation:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * perturbation)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model

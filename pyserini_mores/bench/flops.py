"""The benchmark's FLOP accounting. Each model counts its own online FLOPs
(:meth:`~pyserini_mores.models.base.RankingModel.flops`, the formula beside the model; the vocabulary and conventions
in :mod:`pyserini_mores.models.flops`); here are the names the reports and tests use, how many batches a query is
scored in, and a counter that checks the formulas against a real run.
"""
from __future__ import annotations

import math

from ..models.cross_encoder import cross_encoder_flops
from ..models.flops import (KINDS, SCOPES, EncoderShape, FlopCount, Term, attention, bert_layer, cls_only_layer,
                            linear)
from ..models.mores import mores_flops
from ..models.prettr import prettr_flops
from ..models.tk import KERNEL_FLOPS_PER_VALUE, TKShape, tk_flops, tk_layer


def batches_for(candidates: int, batch_size: int) -> int:
    """How many batches the reranker scores ``candidates`` in."""
    return max(1, math.ceil(candidates / batch_size))


def flop_counter():
    """A :class:`torch.utils.flop_counter.FlopCounterMode` that also counts CPU fused attention (which torch's
    registry leaves out), for checking the formulas against a real run."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        batch, heads, rows, head_dim = query_shape
        keys, value_dim = key_shape[-2], value_shape[-1]
        return 2 * batch * heads * rows * keys * (head_dim + value_dim)

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu}
    return FlopCounterMode(display=False, custom_mapping=mapping)


__all__ = ["KERNEL_FLOPS_PER_VALUE", "KINDS", "SCOPES", "Term", "FlopCount", "EncoderShape", "TKShape", "linear",
           "attention", "bert_layer", "cls_only_layer", "tk_layer", "cross_encoder_flops", "mores_flops",
           "prettr_flops", "tk_flops", "batches_for", "flop_counter"]

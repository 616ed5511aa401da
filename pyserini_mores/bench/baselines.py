"""The cross-encoders a user could run instead of the project's, timed beside it in the same run: Hugging Face
``BertForSequenceClassification`` with ``sdpa`` attention, and sentence-transformers ``CrossEncoder``.

Both run the project's cross-encoder's own weights, saved once per cell as a Hugging Face checkpoint (model and
tokenizer) in the benchmark's scratch directory and loaded from there, offline, as a user would load a published
cross-encoder. Its two-logit head becomes one logit (``logits[1] − logits[0]``, the project's score), and the pooler
becomes the identity: the project's head reads the [CLS] row itself, while Hugging Face's BERT classifier always runs
a pooler (``tanh(W·[CLS])``). The pooler's product is kept, so each baseline pays the cost its architecture has, and
its tanh (negligible work) is dropped, so all three compute the same scores — which the benchmark checks on every run,
as evidence that they see the same weights and the same tokens. Speed-ups are reported against the fastest of the
three (:data:`CROSS_ENCODERS`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..models._layers import convert_hf_bert_state_dict
from ..models.cross_encoder import CrossEncoder
from ..models.trust import check_model_directory
from .flops import EncoderShape, FlopCount, Term, bert_layer, linear
from .names import BASELINES, HF_BERT, ST_CROSS_ENCODER

#: the project's cross-encoder, whose weights the baselines run
PROJECT_CROSS_ENCODER = CrossEncoder.model_type
#: the models a speed-up is measured against: the fastest of them in each (backbone, doc_len, precision)
CROSS_ENCODERS = (PROJECT_CROSS_ENCODER, *BASELINES)

#: ``score(query, documents)`` → ``[len(documents)]`` fp32 scores on the CPU, in input order
Scorer = Callable[[str, list[str]], torch.Tensor]


class BaselineUnavailable(RuntimeError):
    """A baseline cannot run here (its library is missing); the message says why."""


def applies_to(model) -> bool:
    """Whether the baselines can run ``model``'s weights (they are BERT cross-encoders)."""
    return isinstance(model, CrossEncoder)


def unavailable_reason(name: str) -> str | None:
    """Why baseline ``name`` cannot run in this environment, or ``None``."""
    if name == ST_CROSS_ENCODER:
        try:
            import sentence_transformers  # noqa: F401
        except ImportError:
            return "sentence-transformers is not installed (pip install sentence-transformers)"
    elif name not in BASELINES:
        raise ValueError(f"unknown baseline '{name}'; known: {', '.join(BASELINES)}")
    return None


def save_checkpoint(model: CrossEncoder, directory: Path) -> Path:
    """``model``'s weights as a Hugging Face ``BertForSequenceClassification`` (one logit, identity pooler; see the
    module docstring) with its tokenizer, saved to ``directory``."""
    from transformers import BertConfig, BertForSequenceClassification

    dims = model.config.encoder
    config = BertConfig(**dims.to_dict(), num_labels=1)
    classifier = BertForSequenceClassification._from_config(config, attn_implementation="sdpa")
    ours = {name: tensor.detach().float().cpu() for name, tensor in model.encoder.state_dict().items()}
    encoder_names = [name for name in classifier.state_dict()
                     if name.startswith("bert.") and not name.startswith("bert.pooler.")]
    hf_name_of = convert_hf_bert_state_dict({name: name for name in encoder_names})  # our name → HF name
    if set(hf_name_of) != set(ours):
        raise RuntimeError("the cross-encoder's encoder and Hugging Face's BERT differ in their tensors: "
                           f"{sorted(set(hf_name_of) ^ set(ours))[:4]}")
    state = {hf_name: ours[our_name] for our_name, hf_name in hf_name_of.items()}
    weight, bias = model.head.weight.detach().float().cpu(), model.head.bias.detach().float().cpu()
    if weight.shape[0] == 2:  # the project's score of two logits is their difference: one logit of it
        weight, bias = weight[1:] - weight[:1], bias[1:] - bias[:1]
    hidden = dims.hidden_size
    state.update({"bert.pooler.dense.weight": torch.eye(hidden), "bert.pooler.dense.bias": torch.zeros(hidden),
                  "classifier.weight": weight, "classifier.bias": bias})
    classifier.load_state_dict(state, strict=True)
    with _quiet_transformers():
        classifier.save_pretrained(directory)
        model.tokenizer.save_pretrained(directory)
    return Path(directory)


def build_scorer(name: str, checkpoint: Path, *, precision: str, device: torch.device, batch_size: int,
                 max_length: int) -> Scorer:
    """The :data:`Scorer` of baseline ``name`` over ``checkpoint`` (:func:`save_checkpoint`) on ``device``, in
    ``batch_size`` pairs per forward pass, pairs up to ``max_length`` tokens.

    ``precision`` is the benchmark's: ``fp32``; ``bf16`` and ``bf16-copy`` — weights cast to bf16 once, as the
    project's cross-encoder does under bf16; ``bf16-autocast`` — fp32 weights under autocast.
    """
    reason = unavailable_reason(name)
    if reason:
        raise BaselineUnavailable(reason)
    weights_dtype = torch.float32 if precision in ("fp32", "bf16-autocast") else torch.bfloat16
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16-autocast" \
        else contextlib.nullcontext
    check_model_directory(checkpoint)
    if name == HF_BERT:
        return _hf_scorer(checkpoint, weights_dtype, autocast, device, batch_size)
    return _st_scorer(checkpoint, weights_dtype, autocast, device, batch_size, max_length)


def _hf_scorer(checkpoint: Path, dtype: torch.dtype, autocast, device: torch.device, batch_size: int) -> Scorer:
    from transformers import AutoTokenizer, BertForSequenceClassification

    with _quiet_transformers():
        model = BertForSequenceClassification.from_pretrained(checkpoint, attn_implementation="sdpa",
                                                              local_files_only=True, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True, trust_remote_code=False)
    model = _identity_pooler(model).to(device, dtype).eval()

    def score(query: str, documents: list[str]) -> torch.Tensor:
        scores = []
        with torch.inference_mode(), autocast():
            for start in range(0, len(documents), batch_size):
                chunk = documents[start:start + batch_size]
                batch = tokenizer([query] * len(chunk), chunk, padding=True, return_tensors="pt").to(device)
                scores.append(model(**batch).logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.empty(0)

    return score


def _st_scorer(checkpoint: Path, dtype: torch.dtype, autocast, device: torch.device, batch_size: int,
               max_length: int) -> Scorer:
    from sentence_transformers import CrossEncoder as SentenceTransformersCrossEncoder

    with _quiet_transformers():
        model = SentenceTransformersCrossEncoder(str(checkpoint), device=str(device), local_files_only=True,
                                                 max_length=max_length, trust_remote_code=False,
                                                 model_kwargs={"attn_implementation": "sdpa"})
    model = _identity_pooler(model).to(dtype).eval()
    identity = nn.Identity()  # the raw logit, as the other two score (its default sigmoid is monotone anyway)

    def score(query: str, documents: list[str]) -> torch.Tensor:
        if not documents:
            return torch.empty(0)
        with torch.inference_mode(), autocast():
            scores = model.predict([(query, document) for document in documents], batch_size=batch_size,
                                   show_progress_bar=False, activation_fn=identity, convert_to_tensor=True)
        return scores.float().cpu().reshape(-1)

    return score


def _identity_pooler(model: nn.Module) -> nn.Module:
    """``model`` with every BERT pooler's tanh replaced by the identity (see the module docstring)."""
    from transformers.models.bert.modeling_bert import BertPooler

    for module in model.modules():
        if isinstance(module, BertPooler):
            module.activation = nn.Identity()
    return model


@contextlib.contextmanager
def _quiet_transformers():
    """Without transformers' progress bars (saving and loading a checkpoint draws two per baseline and cell)."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def baseline_flops(shape: EncoderShape, query_tokens: int, doc_tokens: int) -> FlopCount:
    """FLOPs of Hugging Face's BERT classifier on one pair: every layer over every row (the project's cross-encoder
    computes only the [CLS] row of its last layer), the pooler and a one-logit head. Notation in
    :mod:`.flops`."""
    joint = query_tokens + doc_tokens
    return FlopCount((
        Term("encoder", shape.layers * bert_layer(joint, shape)),
        Term("pooler", linear(1, shape.hidden, shape.hidden)),
        Term("head", linear(1, shape.hidden, 1)),
    ))


__all__ = ["HF_BERT", "ST_CROSS_ENCODER", "BASELINES", "PROJECT_CROSS_ENCODER", "CROSS_ENCODERS", "Scorer",
           "BaselineUnavailable", "applies_to", "unavailable_reason", "save_checkpoint", "build_scorer",
           "baseline_flops"]

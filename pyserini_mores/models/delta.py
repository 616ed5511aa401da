"""Delta checkpoints: a trained model stored as only the tensors that differ from its backbone initialisation.

A model trained with frozen embeddings (``train --freeze-embeddings``) shares half its weights with the
pip-installed backbone; TK shares its whole embedding table. Storing the rest — in float16 by default — is what lets
the package ship trained models for its embedded default in a few MB. Loading rebuilds the model from the backbone
exactly as training started it (:meth:`~.base.RankingModel.initialised`, same seed) and overwrites the stored
tensors, so a delta loads to the same weights in every process (and so finds the same sidecar).

A model initialised from a fine-tuned ranker (``--init`` a trained cross-encoder) or trained with its embeddings
free moves only the embedding rows of the tokens its training text contained: those tables are stored row-sparse —
the changed rows under the tensor's name and their indices under ``NAME@rows`` — when that is smaller.

The stored tensors only make sense on top of the tensors they were not stored with, so the delta records a digest of
those (``"reference"``: every tensor of the rebuilt model that the delta does not store whole) and loading refuses a
model rebuilt differently (e.g. over a re-trained shipped cross-encoder of the same name). Only the tensors the
delta leaves to the rebuild count: a newly initialised head that training changed is stored, so its random start
may differ between PyTorch versions without refusing the delta.

Layout: ``config.json`` (the model's, plus ``"delta"``: dtype, the number of tensors and the reference's
fingerprint) and ``delta.safetensors``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .base import CONFIG_NAME, RankingModel

DELTA_WEIGHTS_NAME = "delta.safetensors"
#: config fields that ``from_backbone`` derives from the backbone itself (and so must not be passed back to it)
BACKBONE_DERIVED_FIELDS = ("encoder", "backbone", "embedding_dim", "vocab_size", "tokenizer_type")
#: suffix of the tensor holding the row indices of a row-sparse stored table
ROWS_SUFFIX = "@rows"


def is_delta_checkpoint(directory: str | os.PathLike) -> bool:
    return (Path(directory) / DELTA_WEIGHTS_NAME).is_file()


def save_delta(model: RankingModel, directory: str | os.PathLike, dtype: torch.dtype = torch.float16,
               backbone: str | None = None) -> dict:
    """Write the tensors of ``model`` that differ from its backbone initialisation to ``directory``.

    ``backbone`` replaces the one the model records (the name it will be rebuilt from on load): a model trained from
    a local checkpoint ships over the name that checkpoint ships under. Every tensor that differs from that
    rebuild at ``dtype`` is stored, so the delta loads to the model's weights over any backbone of the same shapes;
    the nearer the backbone, the smaller the delta.

    Returns a summary: tensors and parameters stored, of how many, and the file size.

    Raises:
        ValueError: the model has no ``config.backbone`` to be rebuilt from, or ``backbone`` rebuilds a model of
            another configuration.
    """
    model_config = model.config.to_dict()
    if backbone is not None:
        model_config["backbone"] = backbone
    reference = rebuild_from_backbone(type(model), model_config)
    reference_state = reference.state_dict()
    changed, seen = {}, set()
    total = 0
    for name, tensor in model.state_dict().items():
        total += tensor.numel()
        if tensor.data_ptr() in seen:  # tied modules (e.g. MORES's shared layers): store each tensor once
            continue
        seen.add(tensor.data_ptr())
        stored, stored_reference = _as_stored(tensor, dtype).cpu(), _as_stored(reference_state[name], dtype).cpu()
        if not torch.equal(stored, stored_reference):
            changed.update(_changed_part(name, stored, stored_reference))
    tensors = sum(not name.endswith(ROWS_SUFFIX) for name in changed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model.model_type, **model_config,
              "delta": {"dtype": str(dtype).removeprefix("torch."), "tensors": tensors,
                        "reference": _rebuilt_digest(reference_state, _stored_whole(changed))}}
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(changed, str(directory / DELTA_WEIGHTS_NAME))
    stored = sum(tensor.numel() for name, tensor in changed.items() if not name.endswith(ROWS_SUFFIX))
    return {"tensors": tensors, "parameters": stored, "of_parameters": total,
            "bytes": (directory / DELTA_WEIGHTS_NAME).stat().st_size}


def _stored_whole(stored: dict[str, torch.Tensor]) -> set[str]:
    return {name for name in stored if not name.endswith(ROWS_SUFFIX) and name + ROWS_SUFFIX not in stored}


def _rebuilt_digest(state: dict[str, torch.Tensor], stored_whole: set[str]) -> str:
    """sha256 of the tensors of ``state`` (a rebuilt model's) that the delta takes from the rebuild."""
    digest = hashlib.sha256()
    for name, tensor in state.items():
        if name not in stored_whole:
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _as_stored(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` as the delta would store it. Tensors (and rows) are compared in this form, so a model trained from
    a float16 delta's weights (a shipped cross-encoder) does not store the tensors it kept frozen: they differ from
    that delta's rebuild by less than float16 resolves, the error every stored tensor carries anyway."""
    return tensor.detach().to(dtype) if tensor.is_floating_point() else tensor.detach()


def _changed_part(name: str, stored: torch.Tensor, stored_reference: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the delta keeps of a changed tensor, given it and its reference as stored (:func:`_as_stored`): the
    whole, or — for a 2-D table whose changed rows and their int64 indices take fewer bytes than the whole table —
    those rows and indices."""
    if stored.dim() == 2:
        rows = (stored != stored_reference).any(dim=1).nonzero().flatten()
        row_bytes = stored.shape[1] * stored.element_size()
        if len(rows) * (row_bytes + torch.int64.itemsize) < len(stored) * row_bytes:
            return {name: stored[rows].clone(), name + ROWS_SUFFIX: rows.to(torch.int64)}
    return {name: stored.clone()}


def load_delta(model_cls: type[RankingModel], directory: str | os.PathLike, **overrides) -> RankingModel:
    """Rebuild the model from its backbone and apply the stored tensors; ``overrides`` replace config fields
    that do not change weights (e.g. MORES's ``reuse``).

    Raises:
        ValueError: the delta does not fit the rebuilt model (another backbone, a changed config).
    """
    directory = Path(directory)
    values = json.loads((directory / CONFIG_NAME).read_text())
    recorded = values.pop("delta", {}).get("reference")
    if values.get("model_type") != model_cls.model_type:
        raise ValueError(f"{directory} holds a '{values.get('model_type')}' model, not '{model_cls.model_type}'")
    return model_cls.load_overridden(directory, values, overrides,
                                     lambda **given: _apply_delta(model_cls, directory, values, given, recorded))


def _apply_delta(model_cls: type[RankingModel], directory: Path, values: dict, overrides: dict,
                 reference: str | None = None) -> RankingModel:
    model = rebuild_from_backbone(model_cls, {**values, **overrides})
    state = model.state_dict()
    stored = load_file(str(directory / DELTA_WEIGHTS_NAME))
    # checked without overrides only: one that restructures the model (MORES untying) renames its tensors
    rebuilt_differently = reference is not None and not overrides and _rebuilt_digest(
        state, _stored_whole(stored)) != reference
    with torch.no_grad():
        for name, tensor in stored.items():
            if name.endswith(ROWS_SUFFIX):
                continue
            rows = stored.get(name + ROWS_SUFFIX)
            target = state.get(name)
            if rows is not None and target is not None and target.dim() == 2 \
                    and tensor.shape[1:] == target.shape[1:] and (rows.numel() == 0 or int(rows.max()) < len(target)):
                target[rows] = tensor.to(target.dtype)
            elif rows is None and target is not None and target.shape == tensor.shape:
                target.copy_(tensor.to(target.dtype))
            else:
                raise ValueError(f"{directory / DELTA_WEIGHTS_NAME}: tensor '{name}' "
                                 f"{tuple(tensor.shape)} does not fit the model rebuilt from "
                                 f"'{values.get('backbone')}'; was it saved from another backbone?")
    if rebuilt_differently:
        raise ValueError(f"{directory} was saved over another '{values.get('backbone')}' than the one installed "
                         "(the tensors it leaves to the rebuild differ): the delta cannot be applied to it")
    return model.eval()


def rebuild_from_backbone(model_cls: type[RankingModel], config: dict) -> RankingModel:
    """The model as :meth:`~.base.RankingModel.initialised` builds it from ``config['backbone']`` with
    ``config``'s other fields; its config must come out equal to ``config``."""
    backbone = config.get("backbone")
    if not backbone:
        raise ValueError("the model records no backbone to rebuild it from; save it with save_pretrained instead")
    fields = {item.name for item in dataclasses.fields(model_cls.config_class)}  # not derived values
    overrides = {key: value for key, value in config.items()
                 if key in fields and key not in BACKBONE_DERIVED_FIELDS}
    model = model_cls.initialised(backbone, **overrides)
    rebuilt = {key: value for key, value in model.config.to_dict().items() if key in config}
    wanted = {key: value for key, value in config.items() if key in rebuilt}
    if json.dumps(rebuilt, sort_keys=True) != json.dumps(wanted, sort_keys=True):
        differing = sorted(key for key in wanted if rebuilt[key] != wanted[key])
        raise ValueError(f"backbone '{backbone}' rebuilds a different model (config fields {differing} differ)")
    return model

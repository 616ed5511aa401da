"""What the benchmark needs of each model type, beside the model itself: the variants it measures, why one cannot be
built, how a random-weight config is made, how the model reads a document, and its FLOP formula.

A model type is benchmarked when it has an entry in :data:`BENCHMARKS` (built-in types here, others through
:func:`register_benchmark`); the models themselves know nothing of the benchmark.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..models.mores import REUSES, MoresConfig
from ..models.tk import MODES
from . import model_flops
from .flops import FlopCount

#: ``(name, config overrides)`` of each variant measured on an encoder of ``num_layers`` layers; ``compression_dim``
#: is the backbone's width for compressed stores
Variants = Callable[[int, int], list[tuple[str, dict]]]


def _always_feasible(options: dict, num_layers: int) -> str | None:
    return None


def _default_random_config(cls: type, dims, tokenizer, **fields):
    return cls.config_class(encoder=dims, **fields)


@dataclass(frozen=True)
class BenchmarkHooks:
    """How the benchmark builds, feeds and counts one model type.

    Attributes:
        variants: the settings measured (see :data:`Variants`).
        flops: ``flops(model, query_tokens, doc_tokens)``, the analytic online FLOPs of a built model scoring one
            query of ``query_tokens`` tokens (specials included) against candidates of ``doc_tokens`` tokens as the
            model reads them (see ``joint_input`` and ``document_special_tokens``).
        skip_reason: ``skip_reason(options, num_layers)``: why the variant with config ``options`` cannot be built
            on ``num_layers`` layers, or ``None``.
        random_config: ``random_config(cls, dims, tokenizer, **fields)``: the config of a new model with random
            weights at BERT shape ``dims`` on ``tokenizer`` (the benchmark's random-weight backbones).
        joint_input: the model reads query and document as one sequence ``[CLS] q [SEP] d [SEP]``: the document
            without its own [CLS], both within the encoder's positions.
        document_special_tokens: special tokens its tokenizer puts around a document's words ([CLS] and [SEP]).
        stores_unit_vectors: its stored rows are unit vectors (the synthetic sidecar normalises them).
    """

    variants: Variants
    flops: Callable[..., FlopCount]
    skip_reason: Callable[[dict, int], str | None] = _always_feasible
    random_config: Callable = _default_random_config
    joint_input: bool = False
    document_special_tokens: int = 2
    stores_unit_vectors: bool = False


def cross_encoder_variants(num_layers: int, compression_dim: int) -> list[tuple[str, dict]]:
    return [("full", {})]


def mores_variants(num_layers: int, compression_dim: int) -> list[tuple[str, dict]]:
    """1 and 2 interaction blocks, Reuse-S1 and Reuse-S2, and Reuse-S2 read as stored and head-major beside the
    default (``s2_reads='auto'`` picks one by head width)."""
    variants = []
    for blocks in (1, 2):
        for reuse in REUSES:
            variants.append((f"{blocks}xIB-{reuse}", {"n_interaction_blocks": blocks, "reuse": reuse}))
        for reads in ("tokens", "heads"):
            variants.append((f"{blocks}xIB-s2-{reads}",
                             {"n_interaction_blocks": blocks, "reuse": "s2", "s2_reads": reads}))
    return variants


def mores_skip_reason(options: dict, num_layers: int) -> str | None:
    blocks = options.get("n_interaction_blocks", MoresConfig.n_interaction_blocks)
    if blocks >= num_layers:
        return f"MORES with {blocks} interaction blocks needs more than {num_layers} layers"
    return None


def prettr_variants(num_layers: int, compression_dim: int) -> list[tuple[str, dict]]:
    """Joins at ``L−1`` and ``L−2``, uncompressed and at ``compression_dim``; the last layer's document keys and
    values stored (the sidecar variant beyond the paper); and at ``L−1`` the head reading the query block's mean
    (``pooling='avg'``), from stored states and from stored keys and values."""
    variants = []
    for join in (num_layers - 1, num_layers - 2):
        if join < 0:
            continue
        for compression in (None, compression_dim):
            name = f"l{join}" + (f"-e{compression}" if compression else "")
            variants.append((name, {"compression_dim": compression, "join_layer": join}))
    last_join = {"compression_dim": None, "join_layer": num_layers - 1}
    variants.append((f"l{num_layers - 1}-kv", {**last_join, "reuse": "kv"}))
    variants.append((f"l{num_layers - 1}-avg", {**last_join, "pooling": "avg"}))
    variants.append((f"l{num_layers - 1}-kv-avg", {**last_join, "reuse": "kv", "pooling": "avg"}))
    return variants


def tk_variants(num_layers: int, compression_dim: int) -> list[tuple[str, dict]]:
    return [(mode, {"mode": mode}) for mode in MODES]


def tk_random_config(cls: type, dims, tokenizer, **fields):
    """Term embeddings as wide as ``dims``'s hidden states, over ``tokenizer``'s WordPiece vocabulary."""
    return cls.config_class(embedding_dim=dims.hidden_size, vocab_size=len(tokenizer), tokenizer_type="wordpiece",
                            **fields)


#: model type → how the benchmark measures it; a type without an entry is not benchmarked (MaxSim)
BENCHMARKS: dict[str, BenchmarkHooks] = {
    "cross-encoder": BenchmarkHooks(cross_encoder_variants, model_flops.cross_encoder_model_flops, joint_input=True),
    "mores": BenchmarkHooks(mores_variants, model_flops.mores_model_flops, skip_reason=mores_skip_reason),
    "prettr": BenchmarkHooks(prettr_variants, model_flops.prettr_model_flops, joint_input=True),
    "tk": BenchmarkHooks(tk_variants, model_flops.tk_model_flops, random_config=tk_random_config,
                         document_special_tokens=0, stores_unit_vectors=True),
}


def register_benchmark(model_type: str, hooks: BenchmarkHooks, *, replace: bool = False) -> None:
    """Benchmark the registered model type ``model_type`` as ``hooks`` say.

    Raises:
        ValueError: the type has hooks already (unless ``replace``).
    """
    if model_type in BENCHMARKS and not replace:
        raise ValueError(f"the benchmark already measures model type '{model_type}'")
    BENCHMARKS[model_type] = hooks


def benchmark_hooks(model_type: str) -> BenchmarkHooks:
    """The hooks of ``model_type``.

    Raises:
        ValueError: for a type the benchmark does not measure, naming those it does.
    """
    try:
        return BENCHMARKS[model_type]
    except KeyError:
        raise ValueError(f"the benchmark does not measure model type '{model_type}'; it measures "
                         f"{', '.join(sorted(BENCHMARKS))}") from None


__all__ = ["BENCHMARKS", "BenchmarkHooks", "Variants", "benchmark_hooks", "register_benchmark"]

"""TK's score taken apart (paper §6, Figure 3): per-query-term kernel mass, per-kernel log/length scores with the
model weights included, each query term's share of the score, and every document term's best match.

Each decomposition is exact: the kernel contributions and the query-term contributions both sum to the score.
"""
from __future__ import annotations

import torch

from ..models import pad_documents
from ..models.tk import LOG_CLAMP_MIN
from ._types import KernelScores, rounded


@torch.no_grad()
def tk_kernel_scores(model, query: str, texts: list[str], *, docs: torch.Tensor | None = None,
                     lengths: torch.Tensor | None = None) -> list[KernelScores]:
    """:class:`KernelScores` of ``query`` against each of ``texts`` under a :class:`~pyserini_mores.models.tk.TKModel`.

    With ``docs``/``lengths`` (a ``ctx`` sidecar batch, in the order of ``texts``) the stored contextualised terms
    are scored and the texts only name them; otherwise the documents are contextualised from their text.

    Raises:
        ValueError: when a stored document holds another number of terms than its text tokenizes to.
    """
    query_batch = model.tokenize_queries([query])
    state = model.encode_query(query_batch)
    doc_batch = model.tokenize_documents(texts)
    term_mask = doc_batch["attention_mask"].bool()  # already False on padding and OOV
    if docs is None:
        vectors, mask = model.represent(doc_batch)
        docs, lengths = pad_documents([row[keep] for row, keep in zip(vectors, mask)])
    else:
        expected = term_mask.sum(1)
        mismatched = [i for i, (stored, text) in enumerate(zip(lengths.tolist(), expected.tolist())) if stored != text]
        if mismatched:
            i = mismatched[0]
            raise ValueError(f"the sidecar holds {int(lengths[i])} terms for document {i + 1} but its text has "
                             f"{int(expected[i])}: was the sidecar built from another text or model?")
    out = model.explain(state, docs, lengths)

    ids_to_tokens = model.tokenizer.convert_ids_to_tokens
    query_real = state.mask[0].cpu()
    query_tokens = [token for token, keep in
                    zip(ids_to_tokens(query_batch["input_ids"][0].tolist()), query_real.tolist()) if keep]
    scale = float(model.pooled_scale)
    log_weights, len_weights = model.log_weights.weight[0].float().cpu(), model.len_weights.weight[0].float().cpu()
    beta, gamma = float(out["beta"]), float(out["gamma"])
    mus = [float(mu) for mu in model.config.kernel_mus]  # as configured, not the float32 buffer's rounding
    results = []
    for row, text in enumerate(texts):
        length = int(lengths[row])
        mass = out["query_kernel_mass"][row].float().cpu()[query_real]  # [q, K]
        # score = β·Σ_k W_log,k·scale·Σ_q log2 m_qk + γ·Σ_k W_len,k·scale·Σ_q m_qk/d_len; split the sums
        # over q
        log_share = (torch.log2(mass.clamp(min=LOG_CLAMP_MIN)) * scale * log_weights).sum(-1)
        len_share = (mass / max(length, 1) * scale * len_weights).sum(-1)
        offsets, read_chars = _term_offsets(model, text, term_mask[row])
        results.append(KernelScores(
            query_tokens=query_tokens,
            doc_tokens=ids_to_tokens(doc_batch["input_ids"][row][term_mask[row]].tolist()),
            term_offsets=offsets, read_chars=read_chars,
            kernel_mus=mus,
            match_matrix=out["match_matrix"][row].float().cpu()[query_real][:, :length],
            query_kernel_mass=mass,
            log_pooled=out["log_pooled"][row].float().cpu(),
            len_pooled=out["len_pooled"][row].float().cpu(),
            log_contributions=out["log_contributions"][row].float().cpu(),
            len_contributions=out["len_contributions"][row].float().cpu(),
            beta=beta, gamma=gamma,
            s_log=float(out["s_log"][row]), s_len=float(out["s_len"][row]), score=float(out["score"][row]),
            query_term_contributions=beta * log_share + gamma * len_share,
        ))
    return results


def compare_kernel_scores(first: KernelScores, second: KernelScores) -> dict:
    """What separates two documents' scores for one query: per kernel (and per query term) the difference of
    their shares of the score. Each set of differences sums to ``first.score - second.score``."""
    first_kernels, second_kernels = first.kernel_contributions, second.kernel_contributions
    difference = first_kernels - second_kernels
    order = sorted(range(len(first.kernel_mus)), key=lambda k: -abs(float(difference[k])))
    comparison = {
        "score_difference": first.score - second.score,
        "kernel_mus": first.kernel_mus,
        "first_kernel_contributions": rounded(first_kernels),
        "second_kernel_contributions": rounded(second_kernels),
        "kernel_differences": rounded(difference),
        "kernels_by_influence": [first.kernel_mus[k] for k in order],
        "log_differences": rounded(first.beta * (first.log_contributions - second.log_contributions)),
        "len_differences": rounded(first.gamma * (first.len_contributions - second.len_contributions)),
    }
    if first.query_tokens == second.query_tokens:
        comparison["query_tokens"] = first.query_tokens
        comparison["query_term_differences"] = rounded(first.query_term_contributions
                                                        - second.query_term_contributions)
    return comparison


def _term_offsets(model, text: str, term_mask: torch.Tensor) -> tuple[list[tuple[int, int]] | None, int | None]:
    """Character spans of the matching terms in ``text`` and how many characters the model read (a fast HF
    tokenizer's offsets), else ``(None, None)``."""
    tokenizer = model.tokenizer
    if not getattr(tokenizer, "is_fast", False):
        return None, None
    limit = model.config.doc_max_length
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                        verbose=False)["offset_mapping"]
    read = offsets[:limit]
    read_chars = read[-1][1] if len(offsets) > limit else len(text)
    mask = term_mask.tolist()
    if len(read) > len(mask) or any(mask[len(read):]):
        return None, None  # not the tokenization the model saw: better no offsets than wrong ones
    return [tuple(span) for span, keep in zip(read, mask) if keep], read_chars

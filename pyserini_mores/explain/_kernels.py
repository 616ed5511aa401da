"""TK's score taken apart (paper §6, Figure 3): per-query-term kernel mass, per-kernel log/length scores with the
model weights included, each query term's share of the score, and every document term's best match.

Each decomposition is exact: the kernel contributions and the query-term contributions both sum to the score.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import pad_documents
from ..models.tk import LOG_CLAMP_MIN
from ._types import rounded as _rounded


@dataclass
class KernelScores:
    """Why TK gave one document its score for one query.

    Attributes:
        query_tokens: the query terms that take part in matching (padding and OOV left out), rows below.
        doc_tokens: the document terms that take part in matching, the columns of ``match_matrix``.
        term_offsets: per document term its ``(start, end)`` characters in the text, or ``None`` when the
            tokenizer cannot tell (word-level vocabularies).
        read_chars: how many characters of the text the model read (the rest was cut at ``doc_max_length``), or
            ``None`` when unknown.
        kernel_mus: the kernel centres ``[K]``.
        match_matrix: cosines ``[q, d]``.
        query_kernel_mass: ``K_i^k`` (eq. 6) ``[q, K]``.
        log_pooled, len_pooled: ``s^k_log`` (eq. 7, log base 2) and ``s^k_len`` (eq. 8) ``[K]``, unweighted.
        log_contributions, len_contributions: the same with the learned scale and ``W_log``/``W_len`` applied
            ``[K]`` (the paper's "model weights included" numbers); they sum to ``s_log``/``s_len``.
        beta, gamma: the final weights: ``score = beta * s_log + gamma * s_len``.
        query_term_contributions: each query term's share of the score ``[q]`` (sums to ``score``).
    """

    query_tokens: list[str]
    doc_tokens: list[str]
    term_offsets: list[tuple[int, int]] | None
    read_chars: int | None
    kernel_mus: list[float]
    match_matrix: torch.Tensor
    query_kernel_mass: torch.Tensor
    log_pooled: torch.Tensor
    len_pooled: torch.Tensor
    log_contributions: torch.Tensor
    len_contributions: torch.Tensor
    beta: float
    gamma: float
    s_log: float
    s_len: float
    score: float
    query_term_contributions: torch.Tensor

    @property
    def kernel_contributions(self) -> torch.Tensor:
        """``[K]``: each kernel's share of the score, ``beta * log_k + gamma * len_k`` (sums to ``score``)."""
        return self.beta * self.log_contributions + self.gamma * self.len_contributions

    @property
    def best_match(self) -> torch.Tensor:
        """``[d]``: each document term's highest cosine with any query term (0 without query terms)."""
        if not self.query_tokens:
            return torch.zeros(len(self.doc_tokens))
        return self.match_matrix.max(0).values

    @property
    def best_query_term(self) -> torch.Tensor:
        """``[d]``: the index (in :attr:`query_tokens`) of each document term's best-matching query term."""
        if not self.query_tokens:
            return torch.zeros(len(self.doc_tokens), dtype=torch.long)
        return self.match_matrix.argmax(0)

    @property
    def nearest_kernel(self) -> torch.Tensor:
        """``[d]``: the index of the kernel whose centre is closest to each term's best match (Figure 3's colour)."""
        mus = torch.tensor(self.kernel_mus)
        return (self.best_match[:, None] - mus[None, :]).abs().argmin(1)

    def to_json(self) -> dict:
        return {
            "score": self.score, "s_log": self.s_log, "s_len": self.s_len, "beta": self.beta, "gamma": self.gamma,
            "kernel_mus": self.kernel_mus,
            "query_tokens": self.query_tokens,
            "doc_tokens": self.doc_tokens,
            "term_offsets": self.term_offsets,
            "read_chars": self.read_chars,
            "query_kernel_mass": _rounded(self.query_kernel_mass),
            "log_pooled": _rounded(self.log_pooled),
            "len_pooled": _rounded(self.len_pooled),
            "log_contributions": _rounded(self.log_contributions),
            "len_contributions": _rounded(self.len_contributions),
            "kernel_contributions": _rounded(self.kernel_contributions),
            "query_term_contributions": _rounded(self.query_term_contributions),
            "best_match": _rounded(self.best_match),
            "best_query_term": self.best_query_term.tolist(),
            "nearest_kernel_mu": [self.kernel_mus[index] for index in self.nearest_kernel.tolist()],
            "match_matrix": _rounded(self.match_matrix),
        }


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
        "first_kernel_contributions": _rounded(first_kernels),
        "second_kernel_contributions": _rounded(second_kernels),
        "kernel_differences": _rounded(difference),
        "kernels_by_influence": [first.kernel_mus[k] for k in order],
        "log_differences": _rounded(first.beta * (first.log_contributions - second.log_contributions)),
        "len_differences": _rounded(first.gamma * (first.len_contributions - second.len_contributions)),
    }
    if first.query_tokens == second.query_tokens:
        comparison["query_tokens"] = first.query_tokens
        comparison["query_term_differences"] = _rounded(first.query_term_contributions
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

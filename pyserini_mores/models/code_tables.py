"""Inner products of query vectors with stored vectors kept as additive codes, without decoding them: asymmetric
distance computation (Jégou et al., "Product Quantization for Nearest Neighbor Search", TPAMI 2011) for codes whose
vector is the sum of one entry of each of ``M`` codebooks (an ``rq`` sidecar's).

``q · x̂ = Σ_m q · C_m[c_m]``: once per query every query vector's inner product with every codebook entry is tabled
(``M K dim q`` multiply-adds); a stored vector's products with the query's vectors are then ``M`` look-ups each,
summed, instead of decoding it (``M dim`` adds) and multiplying (``dim q``). A model whose only use of a stored vector
is such products (TK's cosines, MaxSim's maxima) scores from these. A code whose first two bytes are a word id (an
``rq`` word stage) adds that word's mean vector: one more look-up, in a table of every word mean against the query.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

WORD_ID_BYTES = 2  # a word stage's id, little-endian, before the codebook bytes (sidecar.rq's layout)


class CodeTables(NamedTuple):
    """One query against an additive codec's codebooks (:func:`query_code_tables`): ``table [M * K (+ V), q]``,
    the inner product of entry ``k`` of codebook ``m`` (row ``m * K + k``; with a word stage then word ``v``, row
    ``M * K + v``) with each query vector, and the query's ``mask`` as its model keeps it."""

    table: torch.Tensor
    mask: torch.Tensor
    entries: int  # K, entries per codebook
    word_stage: bool = False  # codes start with a word id whose mean's products follow the codebooks' in the table


def query_code_tables(vectors: torch.Tensor, mask: torch.Tensor, codebooks: torch.Tensor,
                      words: torch.Tensor | None = None) -> CodeTables:
    """The tables of one query's ``vectors [q, dim]`` against ``codebooks [M, K, dim]`` (and a word stage's means
    ``words [V, dim]``), in float32 whatever the autocast (a bf16 table would round every product before ``M`` of
    them are summed)."""
    entries, width = codebooks.shape[1], codebooks.shape[2]
    rows = codebooks.reshape(-1, width) if words is None else torch.cat([codebooks.reshape(-1, width), words])
    with torch.autocast(device_type=codebooks.device.type, enabled=False):
        table = rows.float() @ vectors.float().T
    return CodeTables(table, mask, entries, words is not None)


def code_inner_products(tables: CodeTables, codes: torch.Tensor) -> torch.Tensor:
    """``[B, q, Lmax]`` float32: the inner products of the query's vectors with the vectors that ``codes
    [B, Lmax, M]`` (integer entries; with a word stage ``[B, Lmax, 2 + M]``, the word id's two bytes first) decode
    to, as ``M`` (+ 1) look-ups summed per pair (one ``embedding_bag``). Padding codes give the products of whatever
    they decode to: the caller masks them."""
    batch, length = codes.shape[:2]
    entries = codes[..., WORD_ID_BYTES:] if tables.word_stage else codes
    books = entries.shape[-1]
    offsets = torch.arange(books, device=codes.device) * tables.entries
    index = entries.long() + offsets
    if tables.word_stage:
        word = codes[..., 0].long() + (codes[..., 1].long() << 8) + books * tables.entries
        if word.numel() and int(word.max()) >= len(tables.table):  # damaged codes: refused, never another row read
            raise ValueError(f"a code holds word id {int(word.max()) - books * tables.entries}, beyond the table's "
                             f"{len(tables.table) - books * tables.entries} words")
        index = torch.cat([index, word[..., None]], dim=-1)
    index = index.reshape(batch * length, -1)
    with torch.autocast(device_type=codes.device.type, enabled=False):
        dots = F.embedding_bag(index, tables.table, mode="sum")  # [B * Lmax, q]
    return dots.reshape(batch, length, -1).transpose(1, 2)


__all__ = ["CodeTables", "code_inner_products", "query_code_tables"]

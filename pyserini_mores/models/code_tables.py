"""Inner products of query vectors with stored vectors kept as additive codes, without decoding them: asymmetric
distance computation (Jégou et al., "Product Quantization for Nearest Neighbor Search", TPAMI 2011) for codes whose
vector is the sum of one entry of each of ``M`` codebooks (an ``rq`` sidecar's).

``q · x̂ = Σ_m q · C_m[c_m]``: once per query every query vector's inner product with every codebook entry is tabled
(``M K dim q`` multiply-adds); a stored vector's products with the query's vectors are then ``M`` look-ups each,
summed, instead of decoding it (``M dim`` adds) and multiplying (``dim q``). A model whose only use of a stored vector
is such products (TK's cosines, MaxSim's maxima) scores from these.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class CodeTables(NamedTuple):
    """One query against an additive codec's codebooks (:func:`query_code_tables`): ``table [M * K, q]``, the inner
    product of entry ``k`` of codebook ``m`` (row ``m * K + k``) with each query vector, and the query's ``mask``
    as its model keeps it."""

    table: torch.Tensor
    mask: torch.Tensor
    entries: int  # K, entries per codebook


def query_code_tables(vectors: torch.Tensor, mask: torch.Tensor, codebooks: torch.Tensor) -> CodeTables:
    """The tables of one query's ``vectors [q, dim]`` against ``codebooks [M, K, dim]``, in float32 whatever the
    autocast (a bf16 table would round every product before ``M`` of them are summed)."""
    entries, width = codebooks.shape[1], codebooks.shape[2]
    with torch.autocast(device_type=codebooks.device.type, enabled=False):
        table = codebooks.reshape(-1, width).float() @ vectors.float().T
    return CodeTables(table, mask, entries)


def code_inner_products(tables: CodeTables, codes: torch.Tensor) -> torch.Tensor:
    """``[B, q, Lmax]`` float32: the inner products of the query's vectors with the vectors that ``codes
    [B, Lmax, M]`` (integer entries) decode to, as ``M`` look-ups summed per pair (one ``embedding_bag``). Padding
    codes give the products of whatever they decode to: the caller masks them."""
    batch, length, books = codes.shape
    offsets = torch.arange(books, device=codes.device) * tables.entries
    index = (codes.long() + offsets).reshape(-1, books)
    with torch.autocast(device_type=codes.device.type, enabled=False):
        dots = F.embedding_bag(index, tables.table, mode="sum")  # [B * Lmax, q]
    return dots.reshape(batch, length, -1).transpose(1, 2)


__all__ = ["CodeTables", "code_inner_products", "query_code_tables"]

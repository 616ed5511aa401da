"""Inner products of query vectors with stored vectors kept as additive codes, without decoding them: asymmetric
distance computation (Jégou et al., "Product Quantization for Nearest Neighbor Search", TPAMI 2011) for codes whose
vector is the sum of one entry of each of ``M`` codebooks (an ``rq`` sidecar's).

``q · x̂ = Σ_m q · C_m[c_m]``: once per query every query vector's inner product with every codebook entry is tabled
(``M K dim q`` multiply-adds); a stored vector's products with the query's vectors are then ``M`` look-ups each,
summed, instead of decoding it (``M dim`` adds) and multiplying (``dim q``). A model whose only use of a stored vector
is such products (TK's cosines, MaxSim's maxima) scores from these. A code whose first two bytes are a word id (an
``rq`` word stage) adds that word's mean vector: one more look-up, in a table of word means against the query whose
rows are made the first time a candidate holds their word (a query's candidates hold a fraction of the vocabulary).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

WORD_ID_BYTES = 2  # a word stage's id, little-endian, before the codebook bytes (sidecar.rq's layout)


class WordRows:
    """The rows of a query's table that hold word means' inner products with its vectors: row ``offset + v`` for
    word ``v`` of ``means [V, dim]``, made the first time :meth:`make` is asked for it, then kept for the query's
    later candidates."""

    def __init__(self, table: torch.Tensor, offset: int, means: torch.Tensor, vectors: torch.Tensor):
        self.table, self.offset, self.means, self.vectors = table, offset, means, vectors
        self.made = torch.zeros(len(means), dtype=torch.bool, device=means.device)

    def __len__(self) -> int:
        return len(self.means)

    def make(self, ids: torch.Tensor) -> None:
        """Make the rows of the words ``ids`` (any shape) not made yet; refuses an id beyond the words."""
        if ids.numel() and int(ids.max()) >= len(self):  # damaged codes: refused, never another row read
            raise ValueError(f"a code holds word id {int(ids.max())}, beyond the table's {len(self)} words")
        missing = ids[~self.made[ids]]
        if len(missing):
            new = torch.unique(missing)
            with torch.no_grad(), torch.autocast(device_type=self.means.device.type, enabled=False):
                self.table[self.offset + new] = self.means[new].float() @ self.vectors.T
            self.made[new] = True


class CodeTables(NamedTuple):
    """One query against an additive codec's codebooks (:func:`query_code_tables`): ``table [M * K (+ V), q]``,
    the inner product of entry ``k`` of codebook ``m`` (row ``m * K + k``; with a word stage then word ``v``, row
    ``M * K + v``, made as :attr:`words` is asked) with each query vector, and the query's ``mask`` as its model
    keeps it."""

    table: torch.Tensor
    mask: torch.Tensor
    entries: int  # K, entries per codebook
    words: WordRows | None = None  # with a word stage (codes then start with a word id)


def query_code_tables(vectors: torch.Tensor, mask: torch.Tensor, codebooks: torch.Tensor,
                      words: torch.Tensor | None = None) -> CodeTables:
    """The tables of one query's ``vectors [q, dim]`` against ``codebooks [M, K, dim]`` (and a word stage's means
    ``words [V, dim]``, their rows made as candidates ask for them), in float32 whatever the autocast (a bf16 table
    would round every product before ``M`` of them are summed)."""
    books, entries, width = codebooks.shape
    table = torch.empty(books * entries + (0 if words is None else len(words)), len(vectors), dtype=torch.float32,
                        device=codebooks.device)
    # for scoring only: never a training graph, so the table is written in place (its word rows as they are asked)
    with torch.no_grad(), torch.autocast(device_type=codebooks.device.type, enabled=False):
        vectors = vectors.float()
        torch.matmul(codebooks.reshape(-1, width).float(), vectors.T, out=table[:books * entries])
    return CodeTables(table, mask, entries, None if words is None else WordRows(table, books * entries, words,
                                                                                 vectors))


def code_inner_products(tables: CodeTables, codes: torch.Tensor) -> torch.Tensor:
    """``[B, q, Lmax]`` float32: the inner products of the query's vectors with the vectors that ``codes
    [B, Lmax, M]`` (integer entries; with a word stage ``[B, Lmax, 2 + M]``, the word id's two bytes first) decode
    to, as ``M`` (+ 1) look-ups summed per pair (one ``embedding_bag``). Padding codes give the products of
    whatever they decode to: the caller masks them."""
    batch, length = codes.shape[:2]
    entries = codes[..., WORD_ID_BYTES:] if tables.words is not None else codes
    books = entries.shape[-1]
    offsets = torch.arange(books, device=codes.device, dtype=torch.int32) * tables.entries
    # int32 (half the bytes of int64), each look-up's row written once into one index: the entries', then the word's
    index = torch.empty(batch, length, books + (tables.words is not None), dtype=torch.int32, device=codes.device)
    torch.add(entries, offsets, out=index[..., :books])
    if tables.words is not None:
        word = codes[..., 0].int() | (codes[..., 1].int() << 8)
        tables.words.make(word)
        torch.add(word, tables.words.offset, out=index[..., books])
    with torch.autocast(device_type=codes.device.type, enabled=False):
        dots = F.embedding_bag(index.reshape(batch * length, -1), tables.table, mode="sum")  # [B * Lmax, q]
    return dots.reshape(batch, length, -1).transpose(1, 2)


__all__ = ["CodeTables", "WordRows", "code_inner_products", "query_code_tables"]

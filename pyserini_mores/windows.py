"""Long documents as overlapping windows of their text, and the aggregations that turn window scores into one score.

A model reads at most its :func:`document_capacity` tokens of a document; a longer document is cut into windows of
``window`` tokens every ``stride`` tokens (at most ``max_windows`` of them), each window a piece of the original text
that the model reads as it would read a short document. Window 0 is the document's whole text, which the model cuts
at its capacity as it always has, so the first window is exactly what a model without windows reads (FirstP).
Windows are cut from the text at token boundaries (the tokenizer's character offsets), so the same windows come out
of the sidecar build and of scoring from text, and a window's tokens are the document's tokens at those positions
(but for a word split by a window's start, whose first piece the model then reads as a word's start).

Aggregations (``--aggregate``), after Dai and Callan (SIGIR 2019, "Deeper Text Understanding for IR with Contextual
Neural Language Modeling"): ``firstp`` the first window's score, ``maxp`` the best window's, ``sump`` the sum of the
windows' scores; ``firstmaxp``, the mean of FirstP and MaxP: a document's start, where a page says what it is
about, always counts, and its best window anywhere counts too, so a long document is neither judged by its opening
alone (FirstP) nor by whichever later window happens to score high (MaxP); and ``avgcls``, the ranker of MacAvaney
et al. (SIGIR 2019, "CEDR"), which PreTTR (MacAvaney et al., SIGIR 2020) is evaluated with: the windows' [CLS]
vectors averaged, then scored once by the model's head (for a linear head, as every shipped model's is, that is the
mean of the windows' scores).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import UsageError

AGGREGATIONS = ("firstp", "maxp", "sump", "firstmaxp", "avgcls")
# The aggregations that need nothing of the model but one score per window.
SCORE_AGGREGATIONS = ("firstp", "maxp", "sump", "firstmaxp")
#: the aggregation of a reranker that is not given one; with one window per document every aggregation but
#: ``avgcls`` gives that window's score, so it changes nothing for documents the model reads whole
DEFAULT_AGGREGATION = "firstmaxp"


def check_aggregation(how: str, model_type: str | None = None, scores_cls: bool = True) -> None:
    """Refuse an aggregation that is not one of :data:`AGGREGATIONS`, or ``avgcls`` for a model whose score is not
    a head on one vector (``scores_cls``: its capabilities')."""
    if how not in AGGREGATIONS:
        raise UsageError(f"--aggregate must be one of {', '.join(AGGREGATIONS)}, not {how!r}")
    if how == "avgcls" and not scores_cls:
        raise UsageError(f"--aggregate avgcls averages the [CLS] vectors a model's head reads, and {model_type} "
                         f"scores without one: use {', '.join(SCORE_AGGREGATIONS)}")


@dataclass(frozen=True)
class WindowOptions:
    """How a document longer than a model reads is cut.

    Attributes:
        window: tokens per window (the model's tokenizer's tokens: WordPieces, or words for a word-level TK); ``None``
            = what the model reads of a document (:func:`document_capacity`).
        stride: tokens from one window's start to the next's; ``None`` = ``window`` (windows that touch, no overlap).
        max_windows: the most windows of one document (its first ones); 1 = truncation, as without windows, and
            then ``window`` and ``stride`` must be ``None`` (a window of one document is what the model reads).
    """

    window: int | None = None
    stride: int | None = None
    max_windows: int = 1

    def __post_init__(self):
        for flag, value in (("--window", self.window), ("--stride", self.stride)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"{flag} must be a positive number of tokens, not {value!r}")
        if isinstance(self.max_windows, bool) or not isinstance(self.max_windows, int) or self.max_windows < 1:
            raise UsageError(f"--max-windows must be a positive integer, not {self.max_windows!r}")
        if self.window is not None and self.stride is not None and self.stride > self.window:
            raise UsageError(f"--stride {self.stride} is longer than --window {self.window}: text between windows "
                             "would be read by none")
        if not self.windowed and (self.window is not None or self.stride is not None):
            # one window is what the model reads of a document, whatever --window says: refused, not ignored
            raise UsageError("--window and --stride cut a document into windows: give --max-windows N too (the most "
                             "windows of one document)")

    @property
    def windowed(self) -> bool:
        """Whether a document can have more than one window."""
        return self.max_windows > 1

    def resolved(self, capacity: int) -> tuple[int, int]:
        """``(window, stride)`` in tokens for a model that reads ``capacity`` tokens of a document."""
        window = capacity if self.window is None else self.window
        if window > capacity:
            raise UsageError(f"--window {window} is longer than the {capacity} tokens the model reads of a document")
        return window, window if self.stride is None else min(self.stride, window)

    def to_dict(self) -> dict:
        return {"window": self.window, "stride": self.stride, "max_windows": self.max_windows}


def document_capacity(model) -> int:
    """Tokens of a document's own text that ``model`` reads: what its document tokenization keeps of a text longer
    than ``doc_max_length``, less the special tokens it adds to an empty one (``[CLS] d [SEP]``: 2 of a BERT
    tokenizer's 128; PreTTR's ``d [SEP]`` drops the [CLS] it was cut with, so also 2; none of TK's)."""
    specials = int(model.tokenize_documents([""])["attention_mask"].sum())
    kept = int(model.tokenize_documents([" ".join(["x"] * (model.config.doc_max_length + 1))])["attention_mask"].sum())
    return kept - specials


def token_spans(tokenizer, text: str) -> np.ndarray:
    """``[num_tokens, 2]`` character ``(start, end)`` of each token of ``text`` (no special tokens), in order.

    A Hugging Face fast tokenizer gives its offsets; a tokenizer with a ``_token_pattern`` (TK's word tokenizer) is
    matched with that pattern over the text as the tokenizer sees it (lowercasing keeps character positions)."""
    pattern = getattr(tokenizer, "_token_pattern", None)
    if isinstance(pattern, re.Pattern):
        spans = [match.span() for match in pattern.finditer(text.lower())]
    else:
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(f"{type(tokenizer).__name__} gives no character offsets; windows need a fast tokenizer")
        spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                          truncation=False, verbose=False)["offset_mapping"]
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def window_starts(num_tokens: int, window: int, stride: int, max_windows: int) -> np.ndarray:
    """Token position where each window of a ``num_tokens``-token document starts: 0, stride, 2·stride, … up to the
    one that reaches the document's end, at most ``max_windows`` of them (a document with no tokens has one)."""
    count = 1 + max(0, -(-(num_tokens - window) // stride))
    return np.arange(min(count, max_windows), dtype=np.int64) * stride


def full_window_count(num_tokens: int, window: int, stride: int) -> int:
    """Windows a ``num_tokens``-token document would have with no cap (what ``--max-windows`` drops is the rest)."""
    return 1 + max(0, -(-(num_tokens - window) // stride))


def split_text(text: str, tokenizer, capacity: int, options: WindowOptions) -> list[str]:
    """The texts of ``text``'s windows (see the module docstring); one, ``text`` itself, without windowing.

    Window 0 is ``text`` whole when windows are the model's capacity long, since the model cuts it there itself;
    every other window is the text from its first token's first character to its last token's last character."""
    if not options.windowed:
        return [text]
    window, stride = options.resolved(capacity)
    spans = token_spans(tokenizer, text)
    starts = window_starts(len(spans), window, stride, options.max_windows)
    pieces = []
    for start in starts:
        stop = min(len(spans), int(start) + window)
        if start == 0 and window == capacity:
            pieces.append(text)
        elif stop > start:
            pieces.append(text[spans[start, 0]:spans[stop - 1, 1]])
        else:  # a document without tokens: its one window is its text
            pieces.append(text)
    return pieces


def split_texts(texts: Sequence[str], tokenizer, capacity: int, options: WindowOptions
                ) -> tuple[list[str], np.ndarray]:
    """Every window text of ``texts`` in order, and ``owners[j]`` = the index in ``texts`` of window ``j``'s
    document (windows of one document are consecutive, the first one first)."""
    pieces: list[str] = []
    owners: list[int] = []
    for position, text in enumerate(texts):
        windows = split_text(text, tokenizer, capacity, options)
        pieces.extend(windows)
        owners.extend([position] * len(windows))
    return pieces, np.asarray(owners, dtype=np.int64)


def aggregate_scores(window_scores: np.ndarray, owners: np.ndarray, num_documents: int, how: str) -> np.ndarray:
    """``[num_documents]`` scores from ``window_scores[j]`` of window ``j`` of document ``owners[j]`` (windows of a
    document consecutive, first first; every document has at least one): ``firstp``, ``maxp``, ``sump`` or
    ``firstmaxp``."""
    window_scores = np.asarray(window_scores, dtype=np.float64)
    owners = np.asarray(owners, dtype=np.int64)
    if len(owners) != len(window_scores):
        raise ValueError(f"{len(window_scores)} window scores for {len(owners)} windows")
    counts = np.bincount(owners, minlength=num_documents)
    if len(counts) != num_documents or not counts.all():
        raise ValueError("every document needs at least one window, and no window may name a document beyond "
                         f"the {num_documents} given")
    if np.any(np.diff(owners) < 0):
        raise ValueError("the windows of one document must be consecutive and in document order")
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if how == "firstp":
        return window_scores[firsts]
    if how == "maxp":
        return np.maximum.reduceat(window_scores, firsts)
    if how == "sump":
        return np.add.reduceat(window_scores, firsts)
    if how == "firstmaxp":
        return (window_scores[firsts] + np.maximum.reduceat(window_scores, firsts)) / 2
    raise ValueError(f"aggregation {how!r} is not one of {SCORE_AGGREGATIONS} (avgcls needs the model's [CLS] vectors)")


def average_windows(vectors: np.ndarray, owners: np.ndarray, num_documents: int) -> np.ndarray:
    """``[num_documents, n]`` the mean of each document's window vectors ``vectors [W, n]`` (window ``j`` of document
    ``owners[j]``, a document's windows consecutive): what ``avgcls`` gives the model's head."""
    vectors = np.asarray(vectors, dtype=np.float64)
    owners = np.asarray(owners, dtype=np.int64)
    counts = np.bincount(owners, minlength=num_documents)
    if len(owners) != len(vectors) or len(counts) != num_documents or not counts.all():
        raise ValueError(f"{len(vectors)} window vectors for {len(owners)} windows of {num_documents} documents")
    if np.any(np.diff(owners) < 0):
        raise ValueError("the windows of one document must be consecutive and in document order")
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.add.reduceat(vectors, firsts, axis=0) / counts[:, None]

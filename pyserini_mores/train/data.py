"""Training data in MS MARCO formats: text triples (``query \\t positive \\t negative``, as in
``triples.train.small.tsv``), hard-negative mining from qrels + a first-stage ranking, the grouping of triples into
training examples, and the collator that tokenizes them into the query/document batches every model takes.

A *group* is one query with one positive and ``k`` negatives (``k = 1`` for a plain triple). How a group becomes loss
terms is the loss's business (:mod:`.objectives`): pointwise splits it into ``1 + k`` labelled (query, document)
examples, pairwise/listwise score it as one row of ``1 + k`` candidates with the positive first.

*Scored* triples carry a teacher's scores of the positive and the negative as two more fields (``query \t positive
\t negative \t positive_score \t negative_score``, what ``mine-negatives --teacher-scores`` writes from a teacher
reranker's run); the ``distill`` loss learns the teacher's distribution over a group instead of the labels.
"""
from __future__ import annotations

import logging
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from ..formats import FormatError, atomic_writer, numbered_lines, read_collection

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


@dataclass(frozen=True)
class TrainingGroup:
    """One query, its positive passage and ``k >= 1`` negatives (all text)."""

    query: str
    positive: str
    negatives: tuple[str, ...]
    #: a teacher's scores of ``(positive, *negatives)``, or ``None`` for unscored triples; ``-inf`` marks a passage
    #: the teacher did not score that must get none of the probability (another query's positive)
    teacher_scores: tuple[float, ...] | None = None


# ---------------------------------------------------------------------------------------------------- triples files


def read_triples(path: PathLike, max_triples: int | None = None) -> Iterator[tuple[str, str, str]]:
    """``(query, positive, negative)`` texts from a ``triples.train.small.tsv``-style file (optionally gzipped);
    the teacher scores of a scored file are left out (:func:`read_scored_triples` keeps them).

    Raises:
        FormatError: a line without three tab-separated non-empty fields (or five, the last two numbers), with its
            line number.
    """
    for query, positive, negative, _ in read_scored_triples(path, max_triples):
        yield query, positive, negative


def read_scored_triples(path: PathLike, max_triples: int | None = None
                        ) -> Iterator[tuple[str, str, str, tuple[float, float] | None]]:
    """``(query, positive, negative, scores)`` from a triples file whose lines all have three fields (``scores`` is
    ``None``) or all five (``scores`` = the teacher's ``(positive_score, negative_score)``).

    Raises:
        FormatError: a line with another number of fields, empty texts, scores that are not finite numbers, or a
            file that mixes scored and unscored lines (with the line number).
    """
    count, scored = 0, None
    for line_number, line in numbered_lines(path):
        if max_triples is not None and count >= max_triples:
            return
        fields = line.split("\t")
        if len(fields) not in (3, 5):
            raise FormatError(path, line_number, "expected 'query<TAB>positive<TAB>negative' (and optionally "
                                                 "<TAB>positive_score<TAB>negative_score), found "
                                                 f"{len(fields)} tab-separated field(s)", line)
        if scored is None:
            scored = len(fields) == 5
        elif scored != (len(fields) == 5):
            raise FormatError(path, line_number, "scored and unscored triples mixed in one file: every line needs "
                                                 "5 fields or every line 3", line)
        if not all(field.strip() for field in fields[:3]):
            raise FormatError(path, line_number, "empty query, positive or negative text", line)
        scores = None
        if scored:
            try:
                scores = (float(fields[3]), float(fields[4]))
            except ValueError:
                raise FormatError(path, line_number, "the teacher scores (fields 4 and 5) must be numbers",
                                  line) from None
            if not all(math.isfinite(score) for score in scores):
                raise FormatError(path, line_number, "the teacher scores (fields 4 and 5) must be finite", line)
        count += 1
        yield fields[0], fields[1], fields[2], scores


def _tsv_field(text: str) -> str:
    """Text made safe for one TSV field: tabs and line breaks become spaces."""
    return re.sub(r"[\t\r\n]+", " ", text).strip()


def write_triples(path: PathLike, triples: Iterable[tuple]) -> int:
    """Write ``query \\t positive \\t negative`` lines atomically, or scored lines for 5-tuples ``(query, positive,
    negative, positive_score, negative_score)``; returns the number of lines."""
    count = 0
    with atomic_writer(path) as stream:
        for triple in triples:
            fields = [_tsv_field(text) for text in triple[:3]] + [repr(float(score)) for score in triple[3:]]
            stream.write("\t".join(fields) + "\n")
            count += 1
    return count


def load_groups(path: PathLike, negatives_per_group: int = 1, max_triples: int | None = None) -> list[TrainingGroup]:
    """Training groups from a triples file (with their teacher scores when the file is scored).

    With ``negatives_per_group = 1`` every line is a group. With ``k > 1`` (listwise losses), consecutive lines that
    share their query and positive (what :func:`mine_negatives` writes) are pooled and cut into groups of ``k``
    negatives; a pool that does not divide evenly fills its last group by cycling through its own negatives.
    """
    if negatives_per_group < 1:
        raise ValueError(f"negatives_per_group must be at least 1, not {negatives_per_group}")
    # (query, positive) → its negatives and scores (the positive's from the pool's first line) in file order
    pooled: list[tuple[tuple[str, str], list[str], list[float]]] = []
    for query, positive, negative, scores in read_scored_triples(path, max_triples):
        if negatives_per_group > 1 and pooled and pooled[-1][0] == (query, positive):
            pooled[-1][1].append(negative)
        else:
            pooled.append(((query, positive), [negative], [] if scores is None else [scores[0]]))
        if scores is not None:
            pooled[-1][2].append(scores[1])
    groups = []
    for (query, positive), negatives, scores in pooled:
        for start in range(0, len(negatives), negatives_per_group):
            chosen = [(start + offset) % len(negatives) for offset in range(negatives_per_group)]
            teacher = (scores[0], *(scores[1 + index] for index in chosen)) if scores else None
            groups.append(TrainingGroup(query, positive, tuple(negatives[index] for index in chosen), teacher))
    if not groups:
        raise ValueError(f"{path} holds no training triples")
    return groups


# ---------------------------------------------------------------------------------------------------- batching
def with_batch_negatives(groups: Sequence[TrainingGroup], count: int) -> list[TrainingGroup]:
    """Each group with the positives of the next ``count`` groups of the batch (cyclically) added as negatives.

    Mined negatives leave a shortcut: a passage relevant to *some* query tends to look unlike the ones BM25 returns
    around it (on debian-packages, models that could not match learned that query-free prior: their pos > neg
    accuracy was the same with every query swapped for another). Another query's positive has that look too, so only
    matching the query separates it from the group's own positive. Borrowed positives are distinct, and one
    identical to the group's own is skipped for the next.
    """
    if count == 0:
        return list(groups)
    extended = []
    for index, group in enumerate(groups):
        others = [groups[(index + step) % len(groups)].positive for step in range(1, len(groups))]
        borrowed = [text for text in dict.fromkeys(others) if text != group.positive][:count]
        # Too few other positives (a tiny batch, or one passage relevant to most of its queries): the group's own
        # negatives fill the rest, so every group of the batch keeps the same size.
        fillers = count - len(borrowed)
        teacher = group.teacher_scores
        if teacher is not None:  # the teacher never scored the borrowed positives: none of its probability
            teacher += (-math.inf,) * len(borrowed) + tuple(teacher[1 + i % len(group.negatives)]
                                                           for i in range(fillers))
        borrowed += [group.negatives[i % len(group.negatives)] for i in range(fillers)]
        extended.append(TrainingGroup(group.query, group.positive, group.negatives + tuple(borrowed), teacher))
    return extended




def batch_group_size(groups: Sequence[TrainingGroup]) -> int:
    """``1 + k``, the pairs per group of a batch whose groups must all have ``k`` negatives."""
    sizes = {len(group.negatives) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups in one batch must have the same number of negatives, got {sorted(sizes)}")
    return 1 + sizes.pop()


def batch_teacher_scores(groups: Sequence[TrainingGroup]):
    """``[G, 1 + k]`` float32 tensor of the groups' teacher scores, or ``None`` when no group has any.

    Raises:
        ValueError: when only some groups of the batch are scored.
    """
    import torch

    scored = [group.teacher_scores is not None for group in groups]
    if not any(scored):
        return None
    if not all(scored):
        raise ValueError("a batch mixes groups with and without teacher scores")
    return torch.tensor([group.teacher_scores for group in groups], dtype=torch.float32)


class GroupCollator:
    """Tokenizes a list of :class:`TrainingGroup` into one flat batch of ``G·(1+k)`` aligned (query, document) pairs,
    each group's positive first, with the tokenizers of ``model`` (so PreTTR, TK etc. get their own layouts).

    Returns ``{"query_batch": {...}, "doc_batch": {...}, "labels": [G·(1+k)] (1 = positive), "group_size": 1+k,
    "teacher_scores": [G, 1+k] or None}``; with ``hidden`` (a :class:`~.hidden.HiddenStateDistillation`), also its
    teacher's inputs of the same pairs (``teacher_query_batch``, ``teacher_doc_batch``).
    """

    def __init__(self, model, hidden=None):
        self.model = model
        self.hidden = hidden

    def __call__(self, groups: Sequence[TrainingGroup]) -> dict:
        import torch

        group_size = batch_group_size(groups)
        queries, documents, labels = [], [], []
        for group in groups:
            queries.extend([group.query] * group_size)
            documents.extend((group.positive, *group.negatives))
            labels.extend([1] + [0] * (group_size - 1))
        batch = {
            "query_batch": self.model.tokenize_queries(queries),
            "doc_batch": self.model.tokenize_documents(documents),
            "labels": torch.tensor(labels, dtype=torch.long),
            "group_size": group_size,
            "teacher_scores": batch_teacher_scores(groups),
        }
        if self.hidden is not None:
            batch.update(self.hidden.tokenize(queries, documents))
        return batch


# ---------------------------------------------------------------------------------------------------- negatives


@dataclass
class MiningReport:
    """What :func:`mine_negatives` did: queries used and skipped, triples written."""

    queries: int = 0
    triples: int = 0
    skipped_no_positive: int = 0
    skipped_no_candidates: int = 0
    skipped_unscored_positive: int = 0  # with teacher scores: no positive of the query is in the teacher's run
    short_of_negatives: int = 0  # queries with fewer non-relevant candidates than requested


def sample_negatives(
    ranking: Sequence[str],
    judgments: Mapping[str, int],
    count: int,
    depth: int,
    rng: random.Random,
) -> list[str]:
    """Up to ``count`` distinct docids drawn uniformly from the first ``depth`` of ``ranking`` that carry no
    positive judgment (grade > 0 at any level: a graded "related" document is never used as a negative)."""
    candidates = [docid for docid in dict.fromkeys(ranking[:depth]) if judgments.get(docid, 0) <= 0]
    return rng.sample(candidates, min(count, len(candidates)))


def mine_negatives(
    topics: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    rankings: Mapping[str, Sequence[str]],
    fetch_texts,
    *,
    negatives_per_query: int,
    depth: int = 100,
    seed: int = 42,
    relevance_level: int = 1,
    teacher_scores: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[list[tuple], MiningReport]:
    """Text triples with negatives sampled from each query's first-stage top ``depth``.

    Every query of ``topics`` with at least one document judged ``>= relevance_level`` gets ``negatives_per_query``
    negatives (fewer when its top ``depth`` has fewer unjudged/non-relevant documents); each of its positives is
    paired with each of those negatives, positives in qrels order. Sampling uses one RNG per query seeded from
    ``(seed, qid)``, so a query's negatives do not depend on which other queries are mined.

    Args:
        topics: qid → query text.
        qrels: qid → {docid → grade}.
        rankings: qid → docids of the first stage, best first.
        fetch_texts: ``list[docid] → list[text]``.
        teacher_scores: qid → {docid → score} of a teacher (its run): every triple then also carries the scores of
            its positive and negative, and positives the teacher did not score are left out (a query without a
            scored positive is skipped).

    Returns:
        ``(triples, report)``; triples in topic order, 5-tuples with ``teacher_scores``.
    """
    if negatives_per_query < 1:
        raise ValueError(f"negatives_per_query must be at least 1, not {negatives_per_query}")
    report = MiningReport()
    planned: list[tuple[str, list[str], list[str]]] = []
    for qid, query in topics.items():
        judgments = qrels.get(qid, {})
        positives = [docid for docid, grade in judgments.items() if grade >= relevance_level]
        if not positives:
            report.skipped_no_positive += 1
            continue
        if teacher_scores is not None:
            positives = [docid for docid in positives if docid in teacher_scores.get(qid, {})]
            if not positives:
                report.skipped_unscored_positive += 1
                continue
        ranking = rankings.get(qid, [])
        if teacher_scores is not None:  # negatives need a teacher score too
            ranking = [docid for docid in ranking if docid in teacher_scores.get(qid, {})]
        negatives = sample_negatives(ranking, judgments, negatives_per_query, depth,
                                     random.Random(f"{seed}:{qid}"))
        if not negatives:
            report.skipped_no_candidates += 1
            continue
        if len(negatives) < negatives_per_query:
            report.short_of_negatives += 1
        planned.append((qid, positives, negatives))
    needed = list(dict.fromkeys(docid for _, positives, negatives in planned for docid in positives + negatives))
    texts = dict(zip(needed, fetch_texts(needed)))
    triples = []
    for qid, positives, negatives in planned:
        report.queries += 1
        for positive in positives:
            for negative in negatives:
                triple = (topics[qid], texts[positive], texts[negative])
                if teacher_scores is not None:
                    triple += (teacher_scores[qid][positive], teacher_scores[qid][negative])
                triples.append(triple)
    report.triples = len(triples)
    return triples, report


def collection_texts(path: PathLike, docids: Iterable[str]) -> dict[str, str]:
    """docid → text for ``docids`` from a collection file (one pass, keeping only what is asked for).

    Raises:
        KeyError: when a requested docid is not in the collection.
    """
    wanted = set(docids)
    found = {docid: text for docid, text in read_collection(path) if docid in wanted}
    missing = wanted - set(found)
    if missing:
        raise KeyError(f"{len(missing)} document(s) not in {path}, e.g. {sorted(missing)[:3]}")
    return found


# ------------------------------------------------------------------------------------- compressor pre-training pairs

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
PSEUDO_QUERY_WORDS = 12  # a heading-sized pseudo-query when a passage has no sentence boundary


def split_pseudo_query(text: str) -> tuple[str, str]:
    """``(heading-like pseudo-query, paragraph)`` from one passage: its first sentence and the rest.

    A passage of a single sentence gives its first :data:`PSEUDO_QUERY_WORDS` words and the whole passage.
    """
    parts = _SENTENCE_END.split(text.strip(), maxsplit=1)
    if len(parts) == 2 and parts[1].strip():
        return parts[0], parts[1]
    return " ".join(text.split()[:PSEUDO_QUERY_WORDS]), text


def compressor_pairs(
    path: PathLike,
    *,
    queries: Sequence[str] | None = None,
    max_pairs: int | None = None,
    seed: int = 42,
) -> list[tuple[str, str]]:
    """Unlabelled (query, passage) pairs for compressor pre-training, in a seeded random order.

    * ``path`` is a triples file, scored or not: ``(query, positive)`` and ``(query, negative)`` of every line.
    * ``path`` is a collection and ``queries`` are given: each query with a random passage.
    * ``path`` is a collection alone: the paper's TREC CAR (heading, paragraph) pairs adapted to passages. The
      heading is a passage's first sentence (:func:`split_pseudo_query`), the paragraph the rest of it; as in the
      paper (NSP-like), half of the pairs keep their own heading and half take the heading of another passage.

    Args:
        max_pairs: keep at most this many (after shuffling).
    """
    rng = random.Random(seed)
    if _looks_like_triples(path):
        pairs = []
        for query, positive, negative in read_triples(path):
            pairs.extend([(query, positive), (query, negative)])
    else:
        passages = [text for _, text in read_collection(path) if text.strip()]
        if not passages:
            raise ValueError(f"{path} holds no passages")
        if queries:
            pairs = [(query, passages[rng.randrange(len(passages))]) for query in queries]
        else:
            split = [split_pseudo_query(text) for text in passages]
            pairs = []
            for index, (heading, paragraph) in enumerate(split):
                if index % 2 == 1 and len(split) > 1:
                    other = rng.randrange(len(split) - 1)
                    heading = split[other + (other >= index)][0]  # any other passage's heading
                pairs.append((heading, paragraph))
    rng.shuffle(pairs)
    return pairs[:max_pairs] if max_pairs is not None else pairs


def _looks_like_triples(path: PathLike) -> bool:
    """A file whose first line has three tab-separated fields, or five (scored triples; :func:`read_triples` drops the
    scores); a collection TSV has two, JSONL none."""
    if Path(path).is_dir():
        return False
    for _, line in numbered_lines(path):
        return len(line.split("\t")) in (3, 5)
    return False


__all__ = [
    "TrainingGroup", "read_triples", "read_scored_triples", "write_triples", "load_groups", "GroupCollator", "MiningReport",
    "sample_negatives", "mine_negatives", "collection_texts", "split_pseudo_query", "compressor_pairs",
]

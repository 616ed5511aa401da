"""PyTerrier transformers (PyTerrier 1.x, ``pip install 'pyserini-mores[pyterrier]'``): every reranker as a
``pt.Transformer`` over PyTerrier's result frames, and the package's first stage as one, so that
``first_stage >> reranker`` is a PyTerrier pipeline that ``pt.Experiment`` evaluates.

Example:
    >>> import pyterrier as pt  # doctest: +SKIP
    >>> from pyserini_mores.pyterrier import first_stage, reranker  # doctest: +SKIP
    >>> pipeline = first_stage("indexes/debian", num_results=100) >> reranker("maxsim", index="indexes/debian")
    >>> pipeline.search("visualize ABI changes of a C library")  # doctest: +SKIP

Neither transformer needs PyTerrier's Java (Terrier): candidates come from Pyserini, scores from the reranker.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd

from .rerankers import Reranker, get_reranker
from .search.searcher import RerankingSearcher
from .types import Query, Text

try:
    import pyterrier as pt
except ImportError as error:  # an optional extra: say how to get it
    raise ImportError("pyserini_mores.pyterrier needs PyTerrier 1.x: pip install 'pyserini-mores[pyterrier]'"
                      ) from error

#: The columns a reranker reads from each row of its input frame (``text`` too, when it scores text that the frame
#: must then carry, or that the index given to it stores).
RERANK_COLUMNS = ("qid", "query", "docno")


class MoresReranker(pt.Transformer):
    """A reranker as a PyTerrier transformer: each query's candidates (rows ``qid, query, docno``) get the reranker's
    ``score`` and a new ``rank``; the other columns are kept.

    A reranker with a sidecar reads each candidate's stored representation by its ``docno`` (a docid of the
    sidecar's index); otherwise it scores the candidate's text: the frame's ``text`` column, or, when there is none
    and an index is known, the text the index stores.

    Args:
        reranker: a :class:`~pyserini_mores.rerankers.Reranker`, a registered name (``maxsim``, ``tk``, ``mores``,
            ...; ``reranker_kwargs`` go to its factory, e.g. ``aggregate='maxp'`` and ``windows=WindowOptions(...)``
            for long documents), or a :class:`~pyserini_mores.search.RerankingSearcher`
            whose reranker (with its sidecar) and index are used.
        index: with a name: the Lucene index whose sidecar (``sidecar``: ``"auto"``, the default place beside it; a
            path; or ``None``) the reranker reads, checked to be built for that index and model, and whose stored
            text it scores otherwise.
        text_field: the column holding the candidates' text.
        batch_size: candidates scored per model batch (default: the reranker's).
    """

    def __init__(self, reranker: Reranker | RerankingSearcher | str = "maxsim", *,
                 index: str | os.PathLike | None = None, sidecar: str | os.PathLike | None = "auto",
                 require_sidecar: bool = False, text_field: str = "text", **reranker_kwargs):
        self.searcher: RerankingSearcher | None = None
        if isinstance(reranker, RerankingSearcher):
            if index is not None or reranker_kwargs:
                raise TypeError("a RerankingSearcher brings its own index and reranker: pass no index or options")
            self.searcher = reranker
        elif index is not None:
            self.searcher = RerankingSearcher(index, reranker, sidecar=sidecar, require_sidecar=require_sidecar,
                                              rerank_depth=0, **reranker_kwargs)
        elif isinstance(reranker, str):
            reranker = get_reranker(reranker, **reranker_kwargs)
        elif reranker_kwargs:
            raise TypeError("options go with a reranker's name, not with a Reranker instance")
        self.reranker: Reranker = self.searcher.reranker if self.searcher is not None else reranker
        self.text_field = text_field

    def __repr__(self) -> str:
        return f"MoresReranker({self.reranker.name!r})"

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """``inp`` (``qid, query, docno`` and, for a reranker that scores text without an index, ``text``) with
        each query's candidates rescored: ``score`` replaced, ``rank`` recomputed (PyTerrier's ranks, from 0), rows
        sorted by query (in their first order) and rank.

        Raises:
            KeyError: a missing column.
            CandidateError: a ``docno`` twice in a query's candidates.
        """
        missing = [column for column in RERANK_COLUMNS if column not in inp.columns]
        if missing:
            raise KeyError(f"{self!r} needs the columns {', '.join(RERANK_COLUMNS)} (missing: {', '.join(missing)})")
        if len(inp) == 0:
            out = inp.copy()
            out["score"], out["rank"] = pd.Series(dtype="float64"), pd.Series(dtype="int64")
            return out
        texts_needed = self.reranker.needs_text
        if texts_needed and self.text_field not in inp.columns and self.searcher is None:
            raise KeyError(f"reranker '{self.reranker.name}' scores text: give the frame a {self.text_field!r} column "
                           "(e.g. pt.text.get_text) or the reranker an index")
        groups = []
        for qid, group in inp.groupby("qid", sort=False):
            scores = self._scores(str(qid), group, texts_needed)
            rescored = group.copy()
            rescored["score"] = scores
            order = sorted(range(len(scores)), key=lambda i: -scores[i])  # ties keep their input order
            rescored = rescored.iloc[order]
            rescored["rank"] = range(pt.model.FIRST_RANK, pt.model.FIRST_RANK + len(order))
            groups.append(rescored)
        return pd.concat(groups, ignore_index=True)

    def _scores(self, qid: str, group: pd.DataFrame, texts_needed: bool) -> list[float]:
        docnos = [str(docno) for docno in group["docno"]]
        if not texts_needed:
            texts: Sequence[str | None] = [None] * len(docnos)
        elif self.text_field in group.columns:
            texts = list(group[self.text_field])
        else:
            from .index import fetch_texts

            texts = fetch_texts(self.searcher.searcher, docnos)
        candidates = [Text(text=text, metadata={"docid": docno}) for text, docno in zip(texts, docnos)]
        ranked = self.reranker.rerank(Query(str(group["query"].iloc[0]), qid), candidates)
        score_of = {text.metadata["docid"]: text.score for text in ranked}
        return [float(score_of[docno]) for docno in docnos]


class FirstStage(pt.Transformer):
    """The first stage of a :class:`~pyserini_mores.search.RerankingSearcher` (BM25 with Pyserini, BM25 + RM3, a
    dense index or the hybrid) as a PyTerrier retriever: queries (``qid, query``) → its top ``num_results``
    candidates per query (``qid, query, docno, score, rank``), in its order.

    Args:
        searcher: the searcher, or a Lucene index (a directory or Pyserini prebuilt name) for BM25 with
            ``searcher_kwargs`` (``k1``, ``b``, ``first_stage``, ``rm3``, ...; see ``RerankingSearcher``).
        num_results: candidates per query.
        threads: threads Pyserini searches on.
    """

    def __init__(self, searcher: RerankingSearcher | str | os.PathLike, num_results: int = 1000, *, threads: int = 1,
                 **searcher_kwargs):
        if not isinstance(searcher, RerankingSearcher):
            searcher = RerankingSearcher(searcher, "bm25", rerank_depth=0, sidecar=None, **searcher_kwargs)
        elif searcher_kwargs:
            raise TypeError("options go with an index, not with a RerankingSearcher")
        if num_results < 1:
            raise ValueError(f"num_results must be >= 1, not {num_results}")
        self.searcher, self.num_results, self.threads = searcher, num_results, threads

    def __repr__(self) -> str:
        return f"FirstStage({self.searcher.first_stage_name!r}, num_results={self.num_results})"

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        missing = [column for column in ("qid", "query") if column not in inp.columns]
        if missing:
            raise KeyError(f"{self!r} needs the columns qid, query (missing: {', '.join(missing)})")
        queries = inp.drop_duplicates("qid")
        qids, texts = [str(qid) for qid in queries["qid"]], [str(query) for query in queries["query"]]
        found = self.searcher.first_stage(texts, qids, k=self.num_results, threads=self.threads)
        rows = [(qid, query, hit.docid, float(hit.score), pt.model.FIRST_RANK + position)
                for qid, query in zip(qids, texts)
                for position, hit in enumerate(list(found.get(qid, []))[:self.num_results])]
        return pd.DataFrame(rows, columns=["qid", "query", "docno", "score", "rank"])


def reranker(name: str | Reranker | RerankingSearcher = "maxsim", *, index: str | os.PathLike | None = None,
             **kwargs) -> MoresReranker:
    """:class:`MoresReranker` of the reranker ``name`` (options in ``kwargs``), reading ``index``'s sidecar."""
    return MoresReranker(name, index=index, **kwargs)


def first_stage(index: str | os.PathLike | RerankingSearcher, num_results: int = 1000, **kwargs) -> FirstStage:
    """:class:`FirstStage` over ``index`` (BM25 unless ``kwargs`` say otherwise), ``num_results`` per query."""
    return FirstStage(index, num_results, **kwargs)

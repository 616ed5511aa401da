"""An interrupted ``search --output FILE`` resumes: the queries it finished are kept in ``FILE.partial/``, and the
same command run again searches only the others.

The directory holds ``identity.json`` (what decides the run: the result-bearing arguments, the topics, the index,
the model's weights, the candidates of ``--run``; written first) and chunks ``chunk-NNNNNN.json``, each written
atomically once :data:`CHUNK_SECONDS` of searching have passed since the last: for its queries, in the topics'
order, the reranked hits, what the rerank stage did and the first stage's kept hits. That is all the finished command
writes and prints, so a resumed search writes the run an uninterrupted one writes, byte for byte, and its metrics
and times cover every query. A kill loses at most the queries of one chunk's time. A re-run with another identity
is refused with the difference named, and the partial search stays as it was; ``--restart`` discards it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_writer, write_json_atomic
from ..types import RerankedHit, RerankStats
from .topic_search import TopicSearch

logger = logging.getLogger(__name__)

CHUNK_SECONDS = 30.0  # at most this much searching is lost to a kill
IDENTITY_FILE = "identity.json"
CHUNK_PATTERN = "chunk-*.json"


class PartialSearchMismatchError(ValueError):
    """``FILE.partial`` holds an interrupted search of something else than the command asks for."""


def partial_directory(output: str | Path) -> Path:
    return Path(f"{output}.partial")


class PartialSearch:
    """The queries an interrupted search finished, and those this one finishes, kept beside its run file.

    Open with :meth:`open`; hand each finished query to :meth:`add`; :meth:`discard` once the run file is written.
    """

    def __init__(self, directory: Path, chunks: int, chunk_seconds: float):
        self.directory = directory
        self.chunk_seconds = chunk_seconds
        self._chunks = chunks
        self._pending: list[dict[str, Any]] = []
        self._last_write = time.monotonic()

    @classmethod
    def open(cls, output: str | Path, identity: Mapping[str, Any], qids: Sequence[str], *, restart: bool = False,
             chunk_seconds: float | None = None) -> tuple[PartialSearch, TopicSearch]:
        """The partial search of ``output`` (created when there is none, or discarded first with ``restart``) and
        what it holds: the queries already searched, a prefix of ``qids`` (the topics, in order). ``chunk_seconds``:
        :data:`CHUNK_SECONDS` by default.

        Raises:
            PartialSearchMismatchError: the partial search is of another identity (or not a partial search).
        """
        directory = partial_directory(output)
        chunk_seconds = CHUNK_SECONDS if chunk_seconds is None else chunk_seconds
        if restart and directory.exists():
            shutil.rmtree(directory)
            logger.info("discarded the interrupted search in %s (--restart)", directory)
        identity = json.loads(json.dumps(identity))  # as stored: tuples become lists
        found = TopicSearch()
        if not directory.exists():
            directory.mkdir(parents=True)
            write_json_atomic(directory / IDENTITY_FILE, identity, sort_keys=True)
            return cls(directory, 0, chunk_seconds), found
        stored = _read_identity(directory)
        differences = identity_differences(stored, identity)
        if differences:
            raise PartialSearchMismatchError(
                f"{directory} holds an interrupted search with other inputs ({'; '.join(differences)}): run the "
                "command that started it to finish it, or add --restart to discard it")
        chunks = sorted(directory.glob(CHUNK_PATTERN))
        for chunk in chunks:
            for query in json.loads(chunk.read_text())["queries"]:
                _restore(query, found)
        if list(found.results) != list(qids[:len(found.results)]):
            raise PartialSearchMismatchError(f"{directory} holds queries that are not the first of the topics, in "
                                             "order; add --restart to discard it")
        logger.info("resuming %s: %d of %d queries already searched", directory, len(found.results), len(qids))
        return cls(directory, len(chunks), chunk_seconds), found

    def add(self, qid: str, found: TopicSearch) -> None:
        """Keep query ``qid`` as ``found`` holds it; a chunk is written when :attr:`chunk_seconds` have passed."""
        self._pending.append(_record(qid, found))
        if time.monotonic() - self._last_write >= self.chunk_seconds:
            self.write_chunk()

    def write_chunk(self) -> None:
        """Write the queries kept since the last chunk (atomically: a kill leaves the chunk whole or absent)."""
        if self._pending:
            with atomic_writer(self.directory / f"chunk-{self._chunks:06d}.json") as stream:
                json.dump({"queries": self._pending}, stream, separators=(",", ":"))
            self._chunks += 1
            self._pending = []
        self._last_write = time.monotonic()

    def discard(self) -> None:
        shutil.rmtree(self.directory)


def identity_differences(stored: Mapping[str, Any], identity: Mapping[str, Any]) -> list[str]:
    """What differs between two identities, one ``name: stored → asked`` each (nested mappings by dotted name)."""
    differences = []
    for name in sorted(set(stored) | set(identity)):
        before, after = stored.get(name), identity.get(name)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            differences += [f"{name}.{difference}" for difference in identity_differences(before, after)]
        elif before != after:
            differences.append(f"{name}: {_shown(before)} → {_shown(after)}")
    return differences


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_identity(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / IDENTITY_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as error:
        raise PartialSearchMismatchError(f"{directory} is not an interrupted search of this command (no readable "
                                         f"{IDENTITY_FILE}: {error}); move it away, or add --restart to discard it"
                                         ) from error


def _record(qid: str, found: TopicSearch) -> dict[str, Any]:
    record = {"qid": qid, "hits": [_hit_row(hit) for hit in found.results[qid]],
              "stats": dataclasses.asdict(found.stats[qid])}
    if qid in found.first_stage:
        record["first_stage"] = [_hit_row(hit) for hit in found.first_stage[qid]]
    return record


def _hit_row(hit: RerankedHit) -> tuple:
    # the fields in RerankedHit's order, read directly: dataclasses.astuple deep-copies, once per hit of every query
    return hit.docid, hit.score, hit.lucene_docid, hit.first_stage_score, hit.first_stage_rank


def _restore(record: Mapping[str, Any], found: TopicSearch) -> None:
    qid = record["qid"]
    found.results[qid] = [RerankedHit(*hit) for hit in record["hits"]]
    found.stats[qid] = RerankStats(**record["stats"])
    if "first_stage" in record:
        found.first_stage[qid] = [RerankedHit(*hit) for hit in record["first_stage"]]

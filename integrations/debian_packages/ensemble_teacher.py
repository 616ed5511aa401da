"""Write an ensemble teacher's run: two rerankers' runs over the same candidates, fused as ``--interpolate`` fuses.

Each query's two score lists are min–max normalised and mixed, ``alpha × first + (1 − alpha) × second``
(:func:`pyserini_mores.search.fusion.interpolate_runs`, alpha chosen on dev with ``tune_interpolation.py``). The fused
score is then mapped back onto the first run's score range for that query (0 → its minimum, 1 → its maximum), so
that ``mine-negatives --teacher-scores`` on the ensemble's run gives Margin-MSE score margins in the first teacher's
units, not in [0, 1] (a student continued from a model distilled on that teacher keeps its scale)::

    python integrations/debian_packages/tune_interpolation.py --reranked ce.dev.trec --first-stage maxsim.dev.trec \\
        --qrels qrels.dev.txt                                   # best alpha, e.g. 0.15
    python integrations/debian_packages/ensemble_teacher.py --first ce.train.trec --second maxsim.train.trec \\
        --alpha 0.15 --output ensemble.train.trec
    python -m pyserini_mores.train mine-negatives --run ensemble.train.trec --teacher-scores ...
"""
from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

from pyserini_mores.formats import read_ranked_run, write_run
from pyserini_mores.search.fusion import interpolate_runs


def ensemble_run(first: dict[str, list[tuple[str, float]]], second: dict[str, list[tuple[str, float]]],
                 alpha: float) -> dict[str, list[tuple[str, float]]]:
    """qid → [(docid, fused score in the first run's units)], best first, over each query of ``first``.

    Raises:
        ValueError: a candidate of ``first`` that ``second`` does not score for its query.
    """
    fused = interpolate_runs(first, second, alpha)
    ensemble = {}
    for qid, ranking in first.items():
        scores = [score for _, score in ranking]
        low, high = min(scores), max(scores)
        ensemble[qid] = sorted(((docid, low + (high - low) * score) for docid, score in fused[qid].items()),
                               key=lambda hit: -hit[1])
    return ensemble


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", required=True, help="the first teacher's run (its scores set the units)")
    parser.add_argument("--second", required=True, help="the second teacher's run over the same candidates")
    parser.add_argument("--alpha", type=float, required=True, help="the first teacher's weight")
    parser.add_argument("--output", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ensemble = ensemble_run(read_ranked_run(args.first), read_ranked_run(args.second), args.alpha)
    hits = {qid: [SimpleNamespace(docid=docid, score=score) for docid, score in ranking]
            for qid, ranking in ensemble.items()}
    count = write_run(args.output, hits, tag=f"ensemble-{args.alpha:g}")
    print(f"wrote {count} hits for {len(hits)} queries to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

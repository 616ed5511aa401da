#!/usr/bin/env bash
# Rerank time per query and bytes per document of every reranker (untrained MiniLM models) over the embedded
# debian sample index: builds each sidecar (skipped when present), then times BM25 top-1000 reranking of
# debian-packages dev queries. Usage: rerank_speed.sh [DATA_DIR] [QUERIES] [PRECISION]
set -euo pipefail
DATA=${1:-../shared/data/debian-packages}
N=${2:-10}
PREC=${3:-bf16}
IDX=$(python -c "from pyserini_mores.search.sample import prepare_sample; print(prepare_sample().index)" | tail -1)
VARIANTS=(
  "maxsim"
  "mores --model-arg reuse=s1"
  "mores --model-arg reuse=s2"
  "mores --model-arg reuse=s2 --model-arg n_interaction_blocks=1"
  "prettr --model-arg join_layer=5"
  "prettr --model-arg join_layer=3"
  "prettr --model-arg join_layer=1"
  "prettr --model-arg join_layer=5 --model-arg compression_dim=256"
  "prettr --model-arg join_layer=5 --model-arg compression_dim=128"
  "tk"
)
for variant in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2086
  python -m pyserini_mores.sidecar build --index "$IDX" --reranker $variant --model minilm --precision bf16
done
SEARCH=(python -m pyserini_mores.search --index "$IDX" --topics "$DATA/queries.dev.tsv" --qrels "$DATA/qrels.dev.txt"
        --model minilm --precision "$PREC" --max-queries "$N" --hits 1000)
for variant in "${VARIANTS[@]}" "tk --model-arg mode=online" "cross-encoder"; do
  echo "=== $variant"
  # shellcheck disable=SC2086
  "${SEARCH[@]}" --reranker $variant 2>&1 | grep -E "Rerank time|error"
done
for sidecar in "$IDX".sidecars/*; do python -m pyserini_mores.sidecar info "$sidecar" | grep -E "^sidecar|^size"; done

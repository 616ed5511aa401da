#!/usr/bin/env bash
# The GPU check: on one bare CUDA machine (driver present, Python 3.11, no network), in at most 8 minutes, install
# pyserini_mores offline from a wheelhouse, then run the CUDA cases of the tests, build the embedded sample's MaxSim
# sidecar on the GPU (docs/s), rerank its 200 dev queries' BM25 top 1000 on the GPU and on the CPU (ms/query, MRR@10;
# the two MRR@10 must agree within bf16 tolerance) and run the quick benchmark on the GPU.
#
#   integrations/gpu_check.sh --download WHEELHOUSE         on a networked machine: fill WHEELHOUSE with the wheels
#   integrations/gpu_check.sh --wheelhouse WHEELHOUSE [--work DIR]      on the GPU machine, from the repository root
#   integrations/gpu_check.sh --dry-run [--wheelhouse WHEELHOUSE]       print every command, check files and flags
#
# The dry run needs no GPU and installs nothing: it checks, with the Python on PATH, that every file and flag the
# check uses exists, so a renamed flag fails here and not on the borrowed machine.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=check
WHEELHOUSE=""
WORK=${TMPDIR:-/tmp}/pyserini-mores-gpu-check
QUERIES=200
DEPTH=1000
PRECISION=bf16
MRR_TOLERANCE=0.01  # bf16 rounding reorders near-ties in a top 1000; MRR@10 over 200 queries moves by less
DEADLINE_S=480
CUDA_TESTS=(tests/test_device.py tests/test_device_commands.py)  # the files whose cases are parametrised on cuda

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --download) MODE=download; WHEELHOUSE=${2:?--download needs a directory}; shift 2 ;;
    --wheelhouse) WHEELHOUSE=${2:?--wheelhouse needs a directory}; shift 2 ;;
    --work) WORK=${2:?--work needs a directory}; shift 2 ;;
    --dry-run) MODE=dry-run; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

STARTED=$SECONDS
step() { echo "=== $* ($((SECONDS - STARTED)) s)"; }
fail() { echo "error: $*" >&2; exit 1; }
# Each step gets what is left of the deadline: the check as a whole never runs past it.
run() {
  if [ "$MODE" = dry-run ]; then printf '+'; printf ' %q' "$@"; printf '\n'; return 0; fi
  local left=$((DEADLINE_S - (SECONDS - STARTED)))
  [ "$left" -gt 0 ] || fail "the ${DEADLINE_S} s deadline passed before: $*"
  timeout "$left" "$@"
}

# ---- download: the wheels for the GPU machine --------------------------------------------------------------------
if [ "$MODE" = download ]; then
  mkdir -p "$WHEELHOUSE"
  python -m pip wheel --no-deps --wheel-dir "$WHEELHOUSE" "$REPO"
  PROJECT_WHEEL=$(ls -t "$WHEELHOUSE"/pyserini_mores-*.whl | head -1)
  # Binary wheels for the GPU machine's Python and platform, whatever this machine runs; torch's PyPI wheels for
  # Linux x86-64 are the CUDA ones.
  python -m pip download --dest "$WHEELHOUSE" --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "$PROJECT_WHEEL" pytest
  echo "wheelhouse ready: $WHEELHOUSE ($(ls "$WHEELHOUSE" | wc -l) files, $(du -sh "$WHEELHOUSE" | cut -f1))"
  exit 0
fi

# ---- the Python that runs the check ------------------------------------------------------------------------------
if [ "$MODE" = dry-run ]; then
  PY=python
  if [ -n "$WHEELHOUSE" ] && ! ls "$WHEELHOUSE"/pyserini_mores-*.whl >/dev/null 2>&1; then
    fail "$WHEELHOUSE holds no pyserini_mores wheel: fill it with --download first"
  fi
else
  [ -n "$WHEELHOUSE" ] || fail "--wheelhouse is required (fill one with --download on a networked machine)"
  ls "$WHEELHOUSE"/pyserini_mores-*.whl >/dev/null 2>&1 || fail "$WHEELHOUSE holds no pyserini_mores wheel"
  command -v nvidia-smi >/dev/null || fail "nvidia-smi is missing: no CUDA driver on this machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  step "install offline from $WHEELHOUSE"
  mkdir -p "$WORK"
  run python3.11 -m venv "$WORK/venv"
  PY="$WORK/venv/bin/python"
  run "$PY" -m pip install --quiet --no-index --find-links "$WHEELHOUSE" pyserini_mores pytest
  run "$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; print(torch.__version__, torch.cuda.get_device_name(0))"
fi
export PYSERINI_MORES_CACHE="$WORK/cache"

# ---- what the check needs exists (the dry run stops after this) ---------------------------------------------------
for file in "${CUDA_TESTS[@]}"; do [ -f "$REPO/$file" ] || fail "missing test file $file"; done
grep -q "cuda" "$REPO/${CUDA_TESTS[0]}" || fail "${CUDA_TESTS[0]} has no cuda case any more"
require_flags() {  # MODULE FLAG...: the module's --help lists every flag
  local module=$1 help; shift
  help=$("$PY" -m "$module" --help 2>&1) || fail "python -m $module --help failed: $help"
  for flag in "$@"; do grep -q -- "$flag" <<<"$help" || fail "python -m $module has no $flag"; done
}
SIDECAR_BUILD_HELP=$("$PY" -m pyserini_mores.sidecar build --help 2>&1) || fail "sidecar build --help failed"
for flag in --index --reranker --device --precision --output --overwrite; do
  grep -q -- "$flag" <<<"$SIDECAR_BUILD_HELP" || fail "python -m pyserini_mores.sidecar build has no $flag"
done
require_flags pyserini_mores.search --index --topics --qrels --reranker --sidecar --rerank-depth --hits --device \
  --precision --max-queries --output --examples
require_flags pyserini_mores.bench --quick --device --json
"$PY" -c "import pyserini_mores.search.sample, pyserini_mores.eval" || fail "pyserini_mores does not import"

# ---- the check -----------------------------------------------------------------------------------------------------
step "the CUDA cases of the tests"
PYTEST_LOG="$WORK/pytest.log"
if [ "$MODE" = dry-run ]; then
  run "$PY" -m pytest -q -rs "${CUDA_TESTS[@]}"
else
  (cd "$REPO" && run "$PY" -m pytest -q -rs "${CUDA_TESTS[@]}") | tee "$PYTEST_LOG"
  ! grep -q "torch.cuda.is_available" "$PYTEST_LOG" || fail "CUDA cases were skipped: torch sees no GPU"
fi

step "the embedded sample"
if [ "$MODE" = dry-run ]; then
  SAMPLE='$SAMPLE'
  run "$PY" -c "from pyserini_mores.search.sample import prepare_sample; print(prepare_sample().cache)"
else
  SAMPLE=$(run "$PY" -c "from pyserini_mores.search.sample import prepare_sample; print(prepare_sample().cache)" \
           | tail -1)
fi
SIDECAR="$WORK/maxsim-sidecar"

step "sidecar build on the GPU"
run "$PY" -m pyserini_mores.sidecar build --index "$SAMPLE/index" --reranker maxsim --device cuda \
  --precision "$PRECISION" --output "$SIDECAR" --overwrite
if [ "$MODE" != dry-run ]; then
  "$PY" - "$SIDECAR" <<'EOF'
import json, sys
manifest = json.load(open(f"{sys.argv[1]}/manifest.json"))
seconds = manifest["build"]["encode_seconds"]
print(f"sidecar build on {manifest['build'].get('device')}: {manifest['num_docs']} docs in {seconds:.1f} s, "
      f"{manifest['num_docs'] / seconds:.0f} docs/s")
EOF
fi

for device in cuda cpu; do
  step "search on $device: BM25 top $DEPTH of $QUERIES queries reranked"
  if [ "$MODE" = dry-run ]; then
    run "$PY" -m pyserini_mores.search --index "$SAMPLE/index" --topics "$SAMPLE/queries.dev.tsv" \
      --qrels "$SAMPLE/qrels.dev.txt" --reranker maxsim --sidecar "$SIDECAR" --rerank-depth "$DEPTH" \
      --hits "$DEPTH" --device "$device" --precision "$PRECISION" --max-queries "$QUERIES" --examples 0 \
      --output "$WORK/run-$device.trec"
  else
    run "$PY" -m pyserini_mores.search --index "$SAMPLE/index" --topics "$SAMPLE/queries.dev.tsv" \
      --qrels "$SAMPLE/qrels.dev.txt" --reranker maxsim --sidecar "$SIDECAR" --rerank-depth "$DEPTH" \
      --hits "$DEPTH" --device "$device" --precision "$PRECISION" --max-queries "$QUERIES" --examples 0 \
      --output "$WORK/run-$device.trec" --restart | tee "$WORK/search-$device.log" | grep -E "Rerank time|MRR|maxsim"
  fi
done
if [ "$MODE" != dry-run ]; then
  "$PY" - "$SAMPLE/qrels.dev.txt" "$WORK/run-cuda.trec" "$WORK/run-cpu.trec" "$MRR_TOLERANCE" <<'EOF'
import sys
from pyserini_mores.eval import evaluate
qrels, gpu_run, cpu_run, tolerance = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
gpu, cpu = (evaluate(run, qrels, ["MRR@10"]).aggregate["MRR@10"] for run in (gpu_run, cpu_run))
print(f"MRR@10 cuda {gpu:.4f}, cpu {cpu:.4f}, difference {gpu - cpu:+.4f} (tolerance {tolerance})")
sys.exit(0 if abs(gpu - cpu) <= tolerance else 1)
EOF
fi

step "quick benchmark on the GPU"
run "$PY" -m pyserini_mores.bench --quick --device cuda --json "$WORK/bench-gpu.json"

if [ "$MODE" = dry-run ]; then
  echo "dry run: every file and flag the check uses exists"
else
  step "GPU check passed"
fi

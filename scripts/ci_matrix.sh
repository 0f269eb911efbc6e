#!/usr/bin/env bash
# The suite under the settings that differ between the x86-64 machines CI may land on:
# the kernels PyTorch, oneDNN and fbgemm pick for the CPU's instruction sets, one thread,
# several threads, and a random test order. Any failure fails the script; each run's log
# is kept. pytest runs on every core (pyproject.toml's addopts), each worker with its share
# of the cores' threads: one on a 2-core machine, so `serial` is the setting that runs the
# kernels on several threads (one process, `-n 0`).
#
#   scripts/ci_matrix.sh                 every setting, the whole suite
#   scripts/ci_matrix.sh -m kernels      every setting, only the tests of numeric kernels
#   MATRIX="avx2 random" scripts/ci_matrix.sh   chosen settings only
#   MATRIX="plain plain plain" scripts/ci_matrix.sh   the plain suite three times
#
# Extra arguments go to pytest. Needs the README's test install (.venv with '.[dev]').
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
LOGS="${LOGS:-$(mktemp -d -t meancache-matrix.XXXX)}"
mkdir -p "$LOGS"
SEED="${SEED:-$RANDOM}"  # the random order's seed, printed so a failing order can be replayed

run() {  # run NAME VAR=VALUE... : the suite with those variables set
    local name=$((++runs))-$1; shift
    local start=$SECONDS
    echo "== $name: $*" >&2
    if env "$@" "$PYTHON" -m pytest -q -p no:cacheprovider "${PYTEST_ARGS[@]}" \
            >"$LOGS/$name.log" 2>&1; then
        echo "   passed in $((SECONDS - start)) s ($(tail -1 "$LOGS/$name.log"))" >&2
    else
        echo "   FAILED in $((SECONDS - start)) s; log: $LOGS/$name.log; its end:" >&2
        tail -n 60 "$LOGS/$name.log" >&2
        failed+=("$name")
    fi
}

PYTEST_ARGS=("$@")
failed=()
runs=0
for setting in ${MATRIX:-default avx2 one-thread serial random}; do
    case "$setting" in
        plain) run plain ;;
        # PyTorch's portable kernels (no AVX2/AVX-512 vectorisation), fbgemm's AVX2 ones.
        default) run default ATEN_CPU_CAPABILITY=default FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ;;
        # An AVX2-only CPU: ATen, oneDNN and fbgemm all stop at AVX2.
        avx2) run avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
                  FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ;;
        one-thread) run one-thread OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ;;
        # One process with every core's threads (other reduction orders than one thread).
        serial) PYTEST_ARGS+=(-n 0)
                run serial
                PYTEST_ARGS=("$@") ;;
        random) echo "   (random order seed $SEED: SEED=$SEED replays it)" >&2
                PYTEST_ARGS+=(--random-order "--random-order-seed=$SEED")
                run random
                PYTEST_ARGS=("$@") ;;
        *) echo "unknown setting '$setting' (plain, default, avx2, one-thread, serial, random)" >&2
           exit 2 ;;
    esac
done
if ((${#failed[@]})); then
    echo "failed under: ${failed[*]} (logs in $LOGS; random order seed $SEED)" >&2
    exit 1
fi
echo "all settings passed (logs in $LOGS)" >&2

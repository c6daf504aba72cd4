#!/usr/bin/env bash
# Every test of the project: the Rust workspace (`cargo test --workspace`), then the Python
# package installed into a fresh virtual environment exactly as the README says
# (`pip install ./python`) and its pytest suite (with PyTorch when HCCL_TEST_TORCH=1).
# Arguments go to `cargo test`.
#
# The package is built with the dev profile here (HCCL_PY_PROFILE=release to change it): the
# dev and test profiles have the same settings (Cargo.toml), so it reuses hccl-ir, -topologies
# and -compiler as `cargo test` just compiled them (the executor is built again, without the
# fault injection its tests turn on) instead of building every crate again; the Python tests
# need correctness, not speed. Users' `pip install ./python` builds release.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace $* ($(date +%T))"
# Build every test first; then, while the Rust tests run, set up the Python package (its build
# waits on little but the compiler, the tests much on sleeps and sockets).
cargo test --workspace --no-run "$@"

python=${PYTHON:-python3}
venv=target/py-test-venv
profile=${HCCL_PY_PROFILE:-dev}
extras=test
# PyTorch (for hccl.torch's tests) is large: installed when HCCL_TEST_TORCH=1 (CI sets it),
# from pip's cache after the first time; without it those tests say they skipped.
if [[ "${HCCL_TEST_TORCH:-0}" == 1 ]]; then
  extras=test,torch
  free_kib=$(df -Pk target | awk 'NR == 2 { print $4 }')
  if [[ -n "$free_kib" ]] && ((free_kib < 8 * 1024 * 1024)); then
    echo "warning: $((free_kib / 1024)) MiB free under target/; PyTorch's install needs about 6 GB"
  fi
fi
rm -rf "$venv"
setup_log=target/py-test-setup.log
(
  "$python" -m venv "$venv" &&
    "$venv/bin/pip" install -q "./python[$extras]" --config-settings=build-args="--profile $profile"
) >"$setup_log" 2>&1 &
setup=$!

status=0
cargo test --workspace "$@" || status=$?

echo "== Python: a fresh venv, pip install ./python, pytest ($(date +%T))"
if ! wait "$setup"; then
  # On standard output too, and last, so that a CI log that keeps only its tail shows why.
  echo "installing the Python package failed; the end of $setup_log:"
  tail -n 40 "$setup_log"
  echo "free space where it installs (PyTorch with its CUDA wheels takes about 6 GB):"
  df -h "$venv" 2>/dev/null || df -h .
  echo "installing the Python package failed (above)" >&2
  exit 1
fi
if ((status != 0)); then
  echo "cargo test failed" >&2
  exit "$status"
fi
# hcclc for the agreement tests (plan hashes): built by the cargo test above.
export HCCLC=${HCCLC:-$PWD/target/debug/hcclc}
"$venv/bin/python" -m pytest -q python/tests
echo "== all tests passed ($(date +%T))"

#!/usr/bin/env bash
# Every test of the project: the Rust workspace (`cargo test --workspace`), then the Python
# package installed into a fresh virtual environment exactly as the README says
# (`pip install ./python`) and its pytest suite (with PyTorch when HCCL_TEST_TORCH=1).
# Arguments go to `cargo test`.
#
# The package is built with the dev profile here (HCCL_PY_PROFILE=release to change it), so it
# reuses what `cargo test` just compiled instead of building every crate again in release; the
# Python tests need correctness, not speed. Users' `pip install ./python` builds release.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace $* ($(date +%T))"
cargo test --workspace "$@"

echo "== Python: a fresh venv, pip install ./python, pytest ($(date +%T))"
python=${PYTHON:-python3}
venv=target/py-test-venv
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip >/dev/null
profile=${HCCL_PY_PROFILE:-dev}
extras=test
# PyTorch (for hccl.torch's tests) is large: installed when HCCL_TEST_TORCH=1 (CI sets it),
# from pip's cache after the first time; without it those tests say they skipped.
if [[ "${HCCL_TEST_TORCH:-0}" == 1 ]]; then
  extras=test,torch
fi
"$venv/bin/pip" install -q "./python[$extras]" --config-settings=build-args="--profile $profile"
# hcclc for the agreement tests (plan hashes): built by the cargo test above.
export HCCLC=${HCCLC:-$PWD/target/debug/hcclc}
"$venv/bin/python" -m pytest -q python/tests
echo "== all tests passed ($(date +%T))"

#!/usr/bin/env bash
# The Python package against hcclc, side by side in one run (python/benches/bench.py): compile
# time of whole machines in back-to-back pairs, verify + cost of an algorithm written in
# hccl.lang, and the communicator's cost per call from Python. Builds hcclc and a release install of the package in target/py-bench-venv.
# Usage: scripts/bench-python.sh [--pairs N] [--topo NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p hcclc
venv=target/py-bench-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q ./python
exec "$venv/bin/python" python/benches/bench.py target/release/hcclc "$@"

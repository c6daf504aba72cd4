#!/usr/bin/env bash
# torch.distributed with hccl_aot against Gloo, side by side in one run
# (python/benches/bench_torch.py): all_reduce, all_gather_into_tensor, reduce_scatter_tensor
# from 8 B to 256 MiB on 2 and 4 processes, and a DDP step of a 26M-parameter model (also
# with no communication at all: the step no backend can beat).
# A release install of the package and PyTorch in target/py-bench-venv.
# Usage: scripts/bench-torch.sh [--pairs N] [--procs 2 4] [--colls LIST|none] [--no-ddp]
# (--colls none: the DDP step alone, against Gloo and against DDP with no communication)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-bench-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "./python[torch]"
cargo build --release -q -p hccl-perf
exec "$venv/bin/python" python/benches/bench_torch.py --hccl-perf target/release/hccl-perf "$@"

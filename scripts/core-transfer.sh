#!/usr/bin/env bash
# The machine's core-to-core transfers, without hccl (scripts/core-transfer.c): a writer
# thread and a reader thread on two cores pass 256 KiB messages through two slots, with
# regular and with streamed (non-temporal) stores, round after round, in LAUNCHES fresh
# processes. Shows the periods in which this VM's regular stores to lines another core
# holds run 4x slower (what the executor's large messages detect and stream around, see
# docs/benchmarks.md, "Slow launches").
# Usage: scripts/core-transfer.sh [LAUNCHES] [ROUNDS]   (x86-64 with AVX2, a C compiler, 2 CPUs)
set -euo pipefail
cd "$(dirname "$0")"
launches=${1:-10}
rounds=${2:-3}
bin=$(mktemp /tmp/core-transfer.XXXXXX)
trap 'rm -f "$bin"' EXIT
cc -O2 -o "$bin" core-transfer.c -lpthread
for ((i = 1; i <= launches; i++)); do
    echo "launch $i"
    "$bin" "$rounds"
done

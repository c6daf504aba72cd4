#!/usr/bin/env bash
# Regenerates the compiler tables shown in docs/benchmarks.md (DGX-1 and a 2-node DGX-H100
# cluster; the README quotes rows of the DGX-1's), straight from `hcclc compile`, so the docs
# never quote numbers the tool does not print.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p hcclc
out="$(mktemp -d)"
for machine in dgx1-v100 h100-cluster-2node; do
  echo "### $machine"
  echo '```'
  ./target/release/hcclc compile "topologies/machines/$machine.ron" -c allreduce \
    -o "$out/$machine.plan.ron" | tail -n +3 | grep -v '^calibration: '
  echo '```'
done
rm -rf "$out"

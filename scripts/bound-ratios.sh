#!/usr/bin/env bash
# Ratio of the compiled plan's predicted time to the compiler's own lower bound, per machine
# and collective, at one size (default 1 GiB): the table issue 11 is measured by.
#   scripts/bound-ratios.sh [SIZE] [HCCLC]
# Needs a built hcclc (default target/release/hcclc; `cargo build --release` first).
# SYNTH=off|auto|full picks the synthesizers (default auto).
set -euo pipefail
size=${1:-1G}
hcclc=${2:-target/release/hcclc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
machines=(dgx1-v100 dgx-a100 dgx-h100 ascend910-8 azure-ndv2-2node h100-cluster-2node h100-cluster-4node)
"$hcclc" topo gen ring --ranks 8 --bw 100 --latency 1 -o "$tmp/ring-8.ron" >/dev/null
"$hcclc" topo gen torus --dims 4x4 --bw 50 --latency 1 -o "$tmp/torus-4x4.ron" >/dev/null
"$hcclc" topo gen fat-tree --ranks 16 --per-leaf 4 --bw 50 --latency 1 -o "$tmp/fat-tree-16.ron" >/dev/null
for f in "$tmp"/*.ron; do machines+=("$f"); done
colls=broadcast,reduce,allgather,reducescatter,allreduce,alltoall
printf '| machine | Broadcast | Reduce | AllGather | ReduceScatter | AllReduce | AllToAll | compile s |\n|---|---|---|---|---|---|---|---|\n'
for m in "${machines[@]}"; do
  start=$(date +%s.%N)
  "$hcclc" compile "$m" -c "$colls" --sizes "$size..$size" --synth "${SYNTH:-auto}" --json -o "$tmp/out.plan" >"$tmp/out.json"
  end=$(date +%s.%N)
  python3 - "$tmp/out.json" "$(basename "$m" .ron)" "$(echo "$end - $start" | bc)" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
by = {r["collective"]: r for r in doc["rows"]}
cells = []
for c in ["broadcast", "reduce", "allgather", "reducescatter", "allreduce", "alltoall"]:
    r = by.get(c)
    cells.append(f'{r["bound_ratio"]:.2f} {r["algorithm"]}' if r else "-")
print(f'| {sys.argv[2]} | ' + " | ".join(cells) + f' | {float(sys.argv[3]):.1f} |')
PY
done

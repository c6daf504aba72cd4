#!/usr/bin/env bash
# LL against Simple on this machine: the same family compiled with one protocol at a time
# (hccl-perf --proto), run back to back in alternating order, medians of the pairs.
#
#   scripts/ll-vs-simple.sh                       # 2 ranks, process backend, oneshot, 8 B .. 8 KiB
#   RANKS=3 BACKEND=threads ALGO=ring PAIRS=5 scripts/ll-vs-simple.sh
#
# Env: RANKS (2), BACKEND (process), ALGO (oneshot), MINB (8), MAXB (8K), FACTOR (4),
#      PAIRS (4), TARGET (0.1 s per size), OUT (target/ll-vs-simple).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RANKS="${RANKS:-2}"
BACKEND="${BACKEND:-process}"
ALGO="${ALGO:-oneshot}"
MINB="${MINB:-8}"
MAXB="${MAXB:-8K}"
FACTOR="${FACTOR:-4}"
PAIRS="${PAIRS:-4}"
TARGET="${TARGET:-0.1}"
OUT="${OUT:-$ROOT/target/ll-vs-simple}"
mkdir -p "$OUT"
rm -f "$OUT"/*.json
cargo build --release -q -p hccl-perf
PERF="$ROOT/target/release/hccl-perf"
for p in $(seq 1 "$PAIRS"); do
  for proto in $([[ $((p % 2)) == 1 ]] && echo "LL Simple" || echo "Simple LL"); do
    "$PERF" --backend "$BACKEND" -g "$RANKS" --algo "$ALGO" --proto "$proto" -b "$MINB" \
      -e "$MAXB" -f "$FACTOR" -T "$TARGET" --json > "$OUT/${proto}_p$p.json"
  done
done
python3 - "$OUT" "$PAIRS" "$RANKS" "$BACKEND" "$ALGO" <<'PY'
import json, os, statistics, sys
out, pairs, ranks, backend, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def rows(proto, p):
    d = json.load(open(os.path.join(out, f"{proto}_p{p}.json")))
    return {r["bytes"]: (r["time_us"], r["algorithm"]) for r in d["rows"]}
ll = [rows("LL", p) for p in range(1, pairs + 1)]
simple = [rows("Simple", p) for p in range(1, pairs + 1)]
print(f"# {algo}, {ranks} ranks, {backend} backend: medians of {pairs} back-to-back pairs")
print("| size (B) | LL (us) | Simple (us) | Simple / LL (median of pairs) | ran |")
print("|---:|---:|---:|---:|---|")
for b in sorted(ll[0]):
    l = [r[b][0] for r in ll]
    s = [r[b][0] for r in simple]
    ratio = statistics.median(y / x for x, y in zip(l, s))
    ran = f"{ll[0][b][1]} / {simple[0][b][1]}"
    print(f"| {b} | {statistics.median(l):.2f} | {statistics.median(s):.2f} | {ratio:.2f} | {ran} |")
PY

#!/usr/bin/env bash
# What the executor's run-time checks cost, side by side: `HCCL_CHECKSUM=0` against `1`
# (one host, and two emulated hosts talking TCP over loopback), and `HCCL_CHECK_CALLS=0`
# against the default `waits` (every message carries its sender's call: one host, threads and
# processes, and two emulated hosts). Each comparison runs REPS back-to-back pairs of
# `hccl-perf -g 2` AllReduce at 8 B (`--algo oneshot`, LL), 64 KiB (one host) and 16 MiB
# (`--algo ring`, Simple) and prints the medians and the median of the per-pair ratios.
#
#   scripts/bench-checks.sh              # 7 pairs per line
#   REPS=3 PERF_BIN=target/release/hccl-perf scripts/bench-checks.sh
#   ONLY=calls scripts/bench-checks.sh   # the call fingerprints on one host only
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-7}
PERF=${PERF_BIN:-}
if [[ -z "$PERF" ]]; then
  cargo build --release -q -p hccl-perf
  PERF=target/release/hccl-perf
fi

# One time in µs: run ENV SIZE ITERS ALGO [hccl-perf flags...]
run() {
  local envs=$1 size=$2 iters=$3 algo=$4
  shift 4
  env $envs "$PERF" --backend "${BACKEND:-process}" -g 2 -b "$size" -e "$size" -n "$iters" \
    -w $((iters / 10 + 5)) --algo "$algo" --json "$@" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"][0]["time_us"])'
}

# pairs LABEL OFF_ENV ON_ENV SIZE ITERS ALGO [flags...]
pairs() {
  local label=$1 off=$2 on=$3
  shift 3
  local times=()
  for _ in $(seq "$REPS"); do
    times+=("$(run "$off" "$@") $(run "$on" "$@")")
  done
  printf '%s\n' "${times[@]}" | python3 -c '
import statistics as st, sys
label = sys.argv[1]
pairs = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
off = st.median(a for a, _ in pairs); on = st.median(b for _, b in pairs)
ratios = [b / a for a, b in pairs]
print(f"{label:44s} off {off:10.2f} us  on {on:10.2f} us  median ratio {st.median(ratios):.3f}"
      f"  (pairs {min(ratios):.2f}-{max(ratios):.2f})")' "$label"
}

for size in "8 400000 oneshot" "64K 20000 ring"; do
  set -- $size
  for backend in threads process; do
    BACKEND=$backend pairs "call fingerprints, one host, $backend, $1 B" \
      HCCL_CHECK_CALLS=0 HCCL_CHECK_CALLS=waits "$@"
  done
done
[[ "${ONLY:-}" == calls ]] && exit 0

for size in "8 20000 oneshot" "16M 40 ring"; do
  set -- $size
  pairs "checksum, one host, $1 B" HCCL_CHECKSUM=0 HCCL_CHECKSUM=1 "$@"
  pairs "checksum, two hosts, $1 B" HCCL_CHECKSUM=0 HCCL_CHECKSUM=1 "$@" --hosts 2
  pairs "call fingerprints, two hosts, $1 B" HCCL_CHECK_CALLS=0 HCCL_CHECK_CALLS=waits "$@" --hosts 2
done

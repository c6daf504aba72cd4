#!/usr/bin/env bash
# Soak: random collectives for MINUTES (shared by the backends: threads, processes of one host,
# processes of 2 emulated hosts talking TCP over loopback), with HCCL_CHECKSUM=1 and
# HCCL_CHECK_CALLS=1, every result checked against a reference (examples/soak.rs).
# Reports calls, failures, resident memory growth and open file descriptors per backend;
# exits 1 on any failure, on a process whose resident memory (after malloc_trim) grows by more
# than --max-rss-growth MiB (default 32) from the start (after a warm-up of one call of each
# kind at the largest size) to the end, or on one that ends with more open descriptors.
#
#   scripts/soak.sh 10                        # 10 minutes, optimised build
#   scripts/soak.sh 0.5 --max-bytes 1M        # arguments after MINUTES go to the driver
#   scripts/soak.sh 1 --seed 1234 --json      # replay a run's calls; JSON report on stdout
#   SOAK_PROFILE=test scripts/soak.sh 0.5     # the build `cargo test --workspace` made (CI)
#   SOAK_PROFILE=dev scripts/soak.sh 0.5      # the dev build (`cargo build`)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
minutes=$1
shift

case "${SOAK_PROFILE:-release}" in
  release)
    cargo build --release -q -p hccl --example soak
    bin=target/release/examples/soak
    ;;
  dev)
    cargo build -q -p hccl --example soak
    bin=target/debug/examples/soak
    ;;
  test)
    # `cargo test --workspace` builds the examples too, with the test profile and every
    # dev-dependency's features; asking it for the same units finds them built (a
    # `cargo build` of the example would compile the workspace's crates again, a minute on 2
    # cores). Its JSON messages name the executable (compiler errors still print, on stderr).
    bin=$(cargo test --workspace --no-run -q --message-format=json-render-diagnostics |
      { grep -o '"executable":"[^"]*/examples/soak"' || true; } | head -n 1 | cut -d'"' -f4)
    if [[ -z "$bin" ]]; then
      echo "soak: cargo test --workspace --no-run built no soak example" >&2
      exit 1
    fi
    ;;
  *)
    echo "SOAK_PROFILE=${SOAK_PROFILE}: expected release, dev or test" >&2
    exit 2
    ;;
esac
exec "$bin" --minutes "$minutes" "$@"

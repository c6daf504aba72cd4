#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS (default 20) each, starting from the committed
# corpus, when cargo-fuzz and the nightly toolchain are installed; says it skipped otherwise
# (it never installs them). New inputs go to a scratch directory, never into fuzz/corpus.
# Built without AddressSanitizer (`-s none`; overflow checks and debug assertions stay on),
# which keeps the build to a few minutes; the long runs of fuzz/README.md use it.
# Exit 1 when a target finds a crash (the input is under fuzz/artifacts/TARGET/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "   skipped: cargo-fuzz or the nightly toolchain is not installed"
  echo "   (cargo install cargo-fuzz; rustup toolchain install nightly; see fuzz/README.md)"
  exit 0
fi
if ! (cd fuzz && cargo +nightly fuzz build -s none) >/dev/null 2>&1; then
  echo "cannot build the fuzz targets: cd fuzz && cargo +nightly fuzz build -s none" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for target in $(cd fuzz && cargo +nightly fuzz list); do
  mkdir -p "$work/$target"
  log="$work/$target.log"
  if ! (cd fuzz && cargo +nightly fuzz run -s none "$target" "$work/$target" "corpus/$target" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10) >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz target $target failed: the input is under fuzz/artifacts/$target/" >&2
    exit 1
  fi
  echo "   $target: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)"
done

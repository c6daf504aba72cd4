#!/usr/bin/env bash
# GPU check of the CUDA backend, for a machine with an NVIDIA GPU (run from the repository
# root): release build with `--features cuda`, the GPU correctness tests, and a short perf
# sweep (AllReduce f32 sum, 8 ranks on one GPU: 8 B, 1 MiB, 64 MiB, 1 GiB; busbw; D2D copy
# bandwidth; per-call time at 8 B with and without CUDA Graphs). Everything is bounded to
# finish within 8 minutes. Results go to $OUT/gpu-check-results.txt when OUT is set, else to
# ./gpu-check-results.txt. Exit status: 0 when every step passed.
#
# The GPU machine may have no Rust toolchain and no network: `scripts/gpu-check.sh --prepare DIR`
# builds the test and example binaries here (x86-64 only) and copies them into DIR; carry DIR
# and run `GPU_CHECK_BIN=DIR scripts/gpu-check.sh` there, which skips the build.
set -uo pipefail

cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  dir="${2:?usage: gpu-check.sh --prepare DIR}"
  mkdir -p "$dir"
  cargo build --release -p hccl-executor --features cuda --examples || exit 1
  msgs=$(cargo test --release -p hccl-executor --features cuda --no-run --message-format=json 2>/dev/null) || exit 1
  # The executor's integration tests are one binary, `it` (the CUDA suite is its module
  # cuda_collectives); its unit tests are hccl_executor.
  for t in it hccl_executor; do
    exe=$(echo "$msgs" | grep -o '"executable":"[^"]*/'"$t"'-[^"]*"' | tail -1 | cut -d'"' -f4)
    [ -n "$exe" ] && cp "$exe" "$dir/$t"
  done
  cp target/release/examples/cuda_perf "$dir/cuda_perf"
  # The release profile keeps debug info (hundreds of MB); the symbols stay for backtraces.
  for f in "$dir"/*; do objcopy --strip-debug "$f"; done
  ls -l "$dir"
  exit 0
fi
RESULTS="${OUT:+$OUT/}gpu-check-results.txt"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
: >"$RESULTS"
say() { echo "$*" | tee -a "$RESULTS"; }

# NVRTC is part of the toolkit; make sure the loader finds it (the driver is on the default
# path). pip's nvidia-cuda-nvrtc wheel is a fallback.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/local/cuda-*/lib64 \
         $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null)/cuda_nvrtc/lib \
         $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null)/cu13/lib; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done

# cudarc looks for the unversioned `libnvrtc.so` (or `.so.12`); a CUDA 13 wheel ships only
# `libnvrtc.so.13`, so give the loader the unversioned name in a private folder.
have=""; lib=""
IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do
  [ -e "$d/libnvrtc.so" ] && have=1
  for f in "$d"/libnvrtc.so.*; do
    case "$f" in *alt*|*'*'*) ;; *) [ -z "$lib" ] && lib="$f" ;; esac
  done
done
if [ -z "$have" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so '; then
  if [ -n "$lib" ]; then
    link="${TMPDIR:-/tmp}/hccl-nvrtc"; mkdir -p "$link"; ln -sf "$lib" "$link/libnvrtc.so"
    export LD_LIBRARY_PATH="$link:$LD_LIBRARY_PATH"
  fi
fi

say "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$RESULTS"

status=0
step() {
  local name="$1" limit="$2"; shift 2
  say "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$RESULTS"
  local rc=${PIPESTATUS[0]}
  say "== $name: rc=$rc in $((SECONDS - t0))s"
  [ "$rc" -ne 0 ] && status=1
  return "$rc"
}

if [ -n "${GPU_CHECK_BIN:-}" ]; then
  B="$GPU_CHECK_BIN"
  # One test at a time, each with its own limit, so a hang costs one test, not the rest.
  for t in $("$B/it" --list 2>/dev/null | sed -n 's/^\(cuda_collectives::[a-z0-9_]*\): test$/\1/p'); do
    step "${t#cuda_collectives::}" 45 "$B/it" "$t" --exact --nocapture --test-threads=1
  done
  step lower 40 "$B/hccl_executor" cuda::
  step perf 120 "$B/cuda_perf" 8
else
  step build 200 cargo build --release --offline -p hccl-executor --features cuda --tests --examples \
    || { say "build failed"; exit 1; }
  step tests 150 cargo test --release --offline -p hccl-executor --features cuda --test it -- cuda_collectives:: --nocapture --test-threads=1
  step lower 40 cargo test --release --offline -p hccl-executor --features cuda --lib cuda::
  step perf 90 cargo run --release --offline -p hccl-executor --features cuda --example cuda_perf -- 8
fi
say "== done: status=$status (results in $RESULTS)"
exit "$status"

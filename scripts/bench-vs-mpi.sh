#!/usr/bin/env bash
# Side-by-side benchmark: hccl-perf against OpenMPI's collectives (../shared/bench), run back
# to back on the same machine, repeated, and reported as median busbw ratios per size.
#
#   scripts/bench-vs-mpi.sh                       # allreduce, 2 4 8 ranks, 8 B .. 256 MiB
#   RANKS="2 4" COLL=allgather MAXB=64M REPS=5 scripts/bench-vs-mpi.sh
#
# Env: RANKS ("2 4 8"), COLL (allreduce), MINB (8), MAXB (256M), FACTOR (4), REPS (3),
#      TARGET (0.2 s per size), BACKEND (process: ranks as processes, like MPI; or threads),
#      BENCH_DIR (peer sources, default ../shared/bench), OUT (results dir, default target/bench-vs-mpi),
#      TOPO (a topology file for hccl-perf's plan, e.g. one `hccl-perf --calibrate` wrote; default:
#      this machine as hccl-perf probes it in each launch).
# Besides the medians, the table gives each side's 90th percentile time over the launches
# (REPS of them per side), for launch-to-launch spread: REPS=10 or more for that.
# Needs OpenMPI (installs openmpi-bin and libopenmpi-dev with apt-get if missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RANKS="${RANKS:-2 4 8}"
COLL="${COLL:-allreduce}"
MINB="${MINB:-8}"
MAXB="${MAXB:-256M}"
FACTOR="${FACTOR:-4}"
REPS="${REPS:-3}"
TARGET="${TARGET:-0.2}"
BACKEND="${BACKEND:-process}"
BENCH_DIR="${BENCH_DIR:-$ROOT/../shared/bench}"
OUT="${OUT:-$ROOT/target/bench-vs-mpi}"
mkdir -p "$OUT"

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null \
   || ! echo "#include <mpi.h>" | mpicc -E -x c - >/dev/null 2>&1; then
  echo "installing OpenMPI (openmpi-bin libopenmpi-dev)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
[[ -f "$BENCH_DIR/mpi_coll_bench.c" ]] || { echo "no $BENCH_DIR/mpi_coll_bench.c (set BENCH_DIR)" >&2; exit 2; }
mpicc -O2 -o "$OUT/mpi_coll_bench" "$BENCH_DIR/mpi_coll_bench.c" -lm
gcc -O2 -fopenmp -o "$OUT/stream_bw" "$BENCH_DIR/stream_bw.c"
cargo build --release -q -p hccl-perf
PERF="$ROOT/target/release/hccl-perf"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

rm -f "$OUT"/*.csv
# The memory ceiling, measured in this run (before and after the pairs): STREAM with two
# threads, 256 MiB arrays.
OMP_NUM_THREADS=2 "$OUT/stream_bw" 256 10 "$OUT/stream.csv" before > /dev/null
for n in $RANKS; do
  for rep in $(seq 1 "$REPS"); do
    # Alternate who goes first so drift in machine load hits both sides alike.
    for side in $([[ $((rep % 2)) == 1 ]] && echo "hccl mpi" || echo "mpi hccl"); do
      if [[ $side == hccl ]]; then
        "$PERF" --backend "$BACKEND" -g "$n" -c "$COLL" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
          -T "$TARGET" -w 5 ${TOPO:+--topo "$TOPO"} --json > "$OUT/hccl_n${n}_r${rep}.json"
      else
        "${MPIRUN[@]}" -np "$n" "$OUT/mpi_coll_bench" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
          -T "$TARGET" -o "$COLL" -C "$OUT/mpi_n${n}_r${rep}.csv" > /dev/null
      fi
    done
  done
done

OMP_NUM_THREADS=2 "$OUT/stream_bw" 256 10 "$OUT/stream.csv" after > /dev/null

python3 - "$OUT" "$RANKS" "$REPS" "$COLL" <<'PY'
import csv, json, statistics, sys, os
out, ranks, reps, coll = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
print(f"# hccl-perf vs OpenMPI, busbw medians over {reps} back-to-back pairs; ratio = median of per-pair ratios")
stream = {}
for row in csv.DictReader(open(os.path.join(out, "stream.csv"))):
    stream.setdefault(row["test"], []).append(float(row["best_GBps"]))
add = statistics.mean(stream["add"])
print(f"# memory (stream_bw, 2 threads, 256 MiB arrays, best of 10, mean of before/after): "
      f"copy {statistics.mean(stream['copy']):.1f}, add {add:.1f}, memcpy {statistics.mean(stream['memcpy']):.1f} GB/s")
if coll == "allreduce":
    # A 2-rank AllReduce of M bytes must read both inputs (2M) and write both outputs (2M):
    # 4M bytes of traffic whatever the algorithm, the pattern of STREAM's add (two reads, one
    # write), so busbw (= algbw at 2 ranks) <= add / 4.
    print(f"# ceiling of 2-rank AllReduce busbw: add / 4 = {add / 4:.2f} GB/s")
for n in ranks:
    pairs = {}
    for r in range(1, reps + 1):
        h = json.load(open(os.path.join(out, f"hccl_n{n}_r{r}.json")))
        hb = {row["bytes"]: (row["busbw_gbps"], row["time_us"], row.get("predicted_us")) for row in h["rows"]}
        with open(os.path.join(out, f"mpi_n{n}_r{r}.csv")) as f:
            for row in csv.DictReader(f):
                size = int(row["size_bytes"])
                # hccl rounds nominal sizes the same way for allreduce; match on the nearest size.
                key = min(hb, key=lambda b: abs(b - size)) if hb else None
                if key is None:
                    continue
                pairs.setdefault(size, []).append((hb[key], (float(row["busbw_GBps"]), float(row["time_us"]))))
    ceil = n == "2" and coll == "allreduce"
    print(f"\n## {n} ranks")
    print(f"| size (B) | hccl busbw | mpi busbw | busbw ratio | hccl us | mpi us | time ratio (mpi/hccl) |"
          f" hccl us p90 | mpi us p90 | hccl / predicted |" + (" hccl / ceiling |" if ceil else ""))
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if ceil else ""))
    for size in sorted(pairs):
        p = pairs[size]
        hb = statistics.median(x[0][0] for x in p); mb = statistics.median(x[1][0] for x in p)
        ht = statistics.median(x[0][1] for x in p); mt = statistics.median(x[1][1] for x in p)
        ratio = statistics.median(x[0][0] / x[1][0] if x[1][0] > 0 else float("nan") for x in p)
        tratio = statistics.median(x[1][1] / x[0][1] for x in p)
        # The 90th percentile over launches (nearest rank).
        p90 = lambda v: sorted(v)[max(0, -(-9 * len(v) // 10) - 1)]
        hp90 = p90([x[0][1] for x in p]); mp90 = p90([x[1][1] for x in p])
        # Measured over the plan's prediction (median over launches; the prediction is the
        # plan's, for the topology hccl-perf compiled for: TOPO, or this machine as probed).
        preds = [x[0][1] / x[0][2] for x in p if x[0][2]]
        vs_pred = f"{statistics.median(preds):.2f}" if preds else "-"
        print(f"| {size} | {hb:.3f} | {mb:.3f} | {ratio:.2f} | {ht:.2f} | {mt:.2f} | {tratio:.2f} | {hp90:.2f} | {mp90:.2f} | {vs_pred} |"
              + (f" {hb / (add / 4) * 100:.0f}% |" if ceil else ""))
PY

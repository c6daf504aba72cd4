#!/usr/bin/env bash
# Side-by-side benchmark over a network path, in one run: hccl's AllReduce between ranks on
# different "hosts", OpenMPI's AllReduce over its TCP transport on the same path, and the raw
# TCP ceiling of that path (8-byte ping-pong latency, one-way stream), repeated back to back
# and reported as medians and median per-pair ratios per size.
#
#   scripts/bench-net.sh                             # all paths, 8 B .. 256 MiB, 3 reps
#   RATE=1 REPS=5 scripts/bench-net.sh               # host links limited to 1 Gbit/s each way
#   PATHS=veth MAXB=1M REPS=1 SKIP_HCCL=1 scripts/bench-net.sh   # a quick MPI + TCP check
#
# Paths:
#   lo      2 ranks on 2 "hosts" (distinct HCCL_HOST_ID) in this namespace, over loopback
#   veth    2 ranks in 2 network namespaces joined by a bridge (scripts/netns-cluster.sh)
#   veth4   4 ranks as 2 hosts x 2 ranks over the same namespaces
# Env: PATHS ("lo veth veth4"), MINB (8), MAXB (256M), FACTOR (4), REPS (3), TARGET (0.2 s
#      per size), RATE (Gbit/s per host link and direction for the namespace paths; empty:
#      unlimited), NIC_BW (GB/s per direction the plan's NIC gets; default RATE/8, else the
#      measured raw TCP stream of the path), NIC_LAT (µs; default the measured 8 B half-RTT),
#      MEM_BW (GB/s per rank for the plan; default hcclc's memory probe), STREAM_S (1.0 s per
#      raw stream), PERF_BIN, HCCLC_BIN (prebuilt hccl-perf and hcclc; default: cargo build
#      --release of this workspace), MPI_BTL (self,tcp; self,vader,tcp lets MPI use shared
#      memory between the ranks of one host in veth4), PREFIX (hccl-bn: namespace names),
#      RUN_TIMEOUT (900 s per run), SKIP_HCCL=1, SKIP_MPI=1, BENCH_DIR (../shared/bench),
#      OUT (target/bench-net).
# Needs root for the namespace paths (without it they are skipped), gcc, python3, OpenMPI
# (installs openmpi-bin and libopenmpi-dev with apt-get if missing, unless SKIP_MPI=1).
#
# OpenMPI flags, and why (found by trying them with OpenMPI 4.1.4):
#   --mca pml ob1            otherwise the UCX PML may be chosen; it ignores --mca btl and
#                            moves data through shared memory
#   --mca btl self,tcp       TCP between ranks, also between ranks of one namespace
#   loopback: --mca btl_tcp_if_include 127.0.0.0/8 --mca btl_tcp_disable_family 6
#                            the TCP BTL excludes 127.0.0.1/8 by default (btl_tcp_if_exclude);
#                            naming it in if_include overrides that, so two ranks on one
#                            machine do talk TCP over lo (verified: "path from 127.0.0.1 to
#                            127.0.0.1" with --mca btl_base_verbose 100); family 6 off keeps
#                            it on IPv4. Without if_include the BTL picks eth0's address.
#   namespaces: mpirun runs inside host 0's namespace (its daemons must reach it over the
#     veth network) with a hostfile naming h0, h1 and --mca plm_rsh_agent $OUT/netns-rsh, a
#     stand-in for ssh: it is called as `netns-rsh HOST COMMAND...` and runs the command
#     with `ip netns exec $PREFIX-HOST sh -c`. Plus --mca btl_tcp_if_include 198.18.0.0/24
#     and --mca oob_tcp_if_include 198.18.0.0/24 (data and bootstrap on the veth network),
#     --mca plm_rsh_no_tree_spawn 1 (every daemon started by mpirun itself).
#   binding: with no more ranks than cores, rank r is bound to core r on both sides (mpirun:
#     --map-by core --bind-to core, or a rankfile across namespaces, since each "host"
#     would otherwise bind its first rank to core 0; hccl-perf: HCCL_PERF_BIND=1). With
#     more ranks than cores both sides run unbound and MPI gets --mca mpi_yield_when_idle 1
#     (busy-polling ranks that share a core otherwise take milliseconds per message).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PATHS="${PATHS:-lo veth veth4}"
MINB="${MINB:-8}"
MAXB="${MAXB:-256M}"
FACTOR="${FACTOR:-4}"
REPS="${REPS:-3}"
TARGET="${TARGET:-0.2}"
RATE="${RATE:-}"
NIC_BW="${NIC_BW:-}"
NIC_LAT="${NIC_LAT:-}"
MEM_BW="${MEM_BW:-}"
STREAM_S="${STREAM_S:-1.0}"
MPI_BTL="${MPI_BTL:-self,tcp}"
PREFIX="${PREFIX:-hccl-bn}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
SKIP_HCCL="${SKIP_HCCL:-0}"
SKIP_MPI="${SKIP_MPI:-0}"
BENCH_DIR="${BENCH_DIR:-$ROOT/../shared/bench}"
OUT="${OUT:-$ROOT/target/bench-net}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
NCPU="$(nproc)"
log() { echo "bench-net: $*" >&2; }

# --- which paths can run ---------------------------------------------------------------
want_netns=0
for p in $PATHS; do
  case "$p" in
    lo) ;;
    veth|veth4) want_netns=1 ;;
    *) log "unknown path \`$p\` (lo, veth, veth4)"; exit 2 ;;
  esac
done
if ((want_netns)) && { [[ $EUID -ne 0 ]] || ! command -v ip >/dev/null; }; then
  log "skipping the namespace paths: they need root and \`ip\`"
  PATHS="$(printf '%s\n' $PATHS | grep -x lo | tr '\n' ' ' || true)"
  want_netns=0
fi
[[ -n ${PATHS// /} ]] || { log "no path left to run"; exit 2; }

# --- tools -----------------------------------------------------------------------------
command -v gcc >/dev/null || { log "needs gcc"; exit 2; }
command -v python3 >/dev/null || { log "needs python3"; exit 2; }
[[ -f "$BENCH_DIR/tcp_pingpong.c" ]] || { log "no $BENCH_DIR/tcp_pingpong.c (set BENCH_DIR)"; exit 2; }
if [[ $SKIP_MPI != 1 ]]; then
  if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    log "installing OpenMPI (openmpi-bin libopenmpi-dev)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  fi
  [[ -f "$BENCH_DIR/mpi_coll_bench.c" ]] || { log "no $BENCH_DIR/mpi_coll_bench.c (set BENCH_DIR)"; exit 2; }
  mpicc -O2 -o "$OUT/mpi_coll_bench" "$BENCH_DIR/mpi_coll_bench.c" -lm
fi
gcc -O2 -Wall -o "$OUT/tcp_pingpong" "$BENCH_DIR/tcp_pingpong.c"

# tcp_pingpong.c forks its peer on 127.0.0.1, so it cannot span two namespaces; this is the
# same pair of measurements (8-byte TCP_NODELAY ping-pong as half the round trip, one-way
# stream of 1 MiB writes acked at the end) with the two ends started separately.
cat > "$OUT/net_stream.c" <<'EOF'
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#define BIG (1u << 20)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void die(const char *m) { perror(m); exit(1); }
static void xfer(int fd, char *b, size_t n, int tx) {
  for (size_t d = 0; d < n;) {
    ssize_t r = tx ? send(fd, b + d, n - d, 0) : recv(fd, b + d, n - d, 0);
    if (r <= 0) die(tx ? "send" : "recv");
    d += (size_t)r;
  }
}
static void nodelay(int fd) { int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); }
/* net_stream server PORT (serves one client) | net_stream client HOST PORT [SECONDS] */
int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: net_stream server PORT | client HOST PORT [SECONDS]\n"); return 2; }
  char *buf = malloc(BIG); memset(buf, 1, BIG);
  const long iters = 20000;
  if (!strcmp(argv[1], "server")) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_ANY); a.sin_port = htons(atoi(argv[2]));
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1)) die("bind/listen");
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    nodelay(fd);
    for (long i = 0; i < iters + 100; i++) { xfer(fd, buf, 8, 0); xfer(fd, buf, 8, 1); }
    long long got = 0;
    for (;;) { ssize_t r = recv(fd, buf, BIG, 0); if (r < 0) die("recv"); if (r == 0) break; got += r; }
    xfer(fd, (char *)&got, sizeof got, 1);
    close(fd);
    return 0;
  }
  if (argc < 4) return 2;
  double secs = argc > 4 ? atof(argv[4]) : 1.0;
  struct addrinfo hints = {0}, *ai;
  hints.ai_family = AF_INET; hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(argv[2], argv[3], &hints, &ai)) { fprintf(stderr, "bad address %s\n", argv[2]); return 2; }
  int fd = -1;
  for (double t0 = now(); now() - t0 < 10;) { /* the server may still be starting */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) break;
    close(fd); fd = -1; usleep(20000);
  }
  if (fd < 0) die("connect");
  nodelay(fd);
  for (int i = 0; i < 100; i++) { xfer(fd, buf, 8, 1); xfer(fd, buf, 8, 0); }
  double t0 = now();
  for (long i = 0; i < iters; i++) { xfer(fd, buf, 8, 1); xfer(fd, buf, 8, 0); }
  printf("latency_us %.3f\n", (now() - t0) / iters / 2 * 1e6);
  long long sent = 0, got = 0;
  t0 = now();
  while (now() - t0 < secs) { xfer(fd, buf, BIG, 1); sent += BIG; }
  shutdown(fd, SHUT_WR);
  xfer(fd, (char *)&got, sizeof got, 0);
  double dt = now() - t0;
  if (got != sent) { fprintf(stderr, "sent %lld, the server got %lld\n", sent, got); return 1; }
  printf("stream_gbps %.4f\nstream_bytes %lld\nstream_s %.3f\n", sent / dt / 1e9, sent, dt);
  return 0;
}
EOF
gcc -O2 -Wall -o "$OUT/net_stream" "$OUT/net_stream.c"

PERF="${PERF_BIN:-}"
HCCLC="${HCCLC_BIN:-}"
if [[ $SKIP_HCCL != 1 && ( -z $PERF || -z $HCCLC ) ]]; then
  if cargo build --release -q -p hccl-perf -p hcclc; then
    PERF="${PERF:-$ROOT/target/release/hccl-perf}"
    HCCLC="${HCCLC:-$ROOT/target/release/hcclc}"
  else
    log "building hccl-perf/hcclc failed: running without the hccl side"
    SKIP_HCCL=1
  fi
fi

# --- the namespaces --------------------------------------------------------------------
cleanup() {
  if ((want_netns)); then
    "$ROOT/scripts/netns-cluster.sh" down --prefix "$PREFIX" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if ((want_netns)); then
  "$ROOT/scripts/netns-cluster.sh" down --prefix "$PREFIX" >/dev/null
  "$ROOT/scripts/netns-cluster.sh" up 2 --prefix "$PREFIX" ${RATE:+--rate "$RATE"} >&2
  # mpirun's "ssh": HOST is h0 or h1; the rest is a command line for a remote shell.
  cat > "$OUT/netns-rsh" <<EOF
#!/bin/sh
host="\$1"; shift
exec ip netns exec "$PREFIX-\$host" /bin/sh -c "\$*"
EOF
  chmod +x "$OUT/netns-rsh"
fi

# --- per-path settings -----------------------------------------------------------------
world_of() { [[ $1 == veth4 ]] && echo 4 || echo 2; }
# Host of rank r on path p, and the prefix that runs a command there.
host_of() { echo $(($2 / ($(world_of "$1") / 2))); }
on_host() { # path host -> command prefix
  if [[ $1 == lo ]]; then echo ""; else echo "ip netns exec $PREFIX-h$2"; fi
}
addr_of() { if [[ $1 == lo ]]; then echo 127.0.0.1; else echo "198.18.0.$(($2 + 1))"; fi; }
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Raw TCP of path p, host 0 -> host 1 (on lo: two processes of this namespace).
raw_tcp() {
  local p="$1" file="$2" port
  port="$(free_port)"
  # shellcheck disable=SC2046
  $(on_host "$p" 1) "$OUT/net_stream" server "$port" &
  local server=$!
  # shellcheck disable=SC2046
  if ! timeout 120 $(on_host "$p" 0) "$OUT/net_stream" client "$(addr_of "$p" 1)" "$port" "$STREAM_S" > "$file"; then
    log "raw TCP on $p failed"
    rm -f "$file"
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

# The plan for path p: two hosts of world/2 ranks, with a NIC of the path's bandwidth.
make_plan() {
  local p="$1" world per dir nic_bw nic_lat mem
  world="$(world_of "$p")"
  per=$((world / 2))
  dir="$OUT/plan-$p"
  mkdir -p "$dir"
  nic_bw="$NIC_BW"
  nic_lat="$NIC_LAT"
  if [[ -z $nic_bw && -n $RATE && $p != lo ]]; then
    nic_bw="$(awk -v r="$RATE" 'BEGIN { printf "%.4f", r / 8 }')"
  fi
  local measured
  measured="$(python3 - "$OUT" "$p" <<'PY'
import glob, os, statistics, sys
out, p = sys.argv[1], sys.argv[2]
vals = {"stream_gbps": [], "latency_us": []}
for f in glob.glob(os.path.join(out, f"{p}_tcp_r*.txt")):
    for line in open(f):
        k, _, v = line.partition(" ")
        if k in vals:
            vals[k].append(float(v))
print(",".join(f"{statistics.median(vals[k]):.4f}" if vals[k] else "" for k in ("stream_gbps", "latency_us")))
PY
)"
  [[ -n $nic_bw ]] || nic_bw="$(echo "$measured" | cut -d, -f1)"
  [[ -n $nic_lat ]] || nic_lat="$(echo "$measured" | cut -d, -f2)"
  mem=()
  [[ -z $MEM_BW ]] || mem=(--mem-bw "$MEM_BW")
  local help
  help="$("$HCCLC" topo gen host --help 2>&1 || true)"
  : > "$dir/hcclc.log"
  hcclc() { "$HCCLC" "$@" >> "$dir/hcclc.log" 2>&1 || { log "hcclc $* failed:"; cat "$dir/hcclc.log" >&2; return 1; }; }
  if [[ $help == *--nic-bw* && -n $nic_bw ]]; then
    hcclc topo gen host --ranks "$per" "${mem[@]}" --nic-bw "$nic_bw" \
      ${nic_lat:+--nic-latency "$nic_lat"} -o "$dir/host.ron" || return 1
    hcclc topo gen cluster --nodes 2 --box "$dir/host.ron" -o "$dir/cluster.ron" || return 1
    # The plan's sizes are the benchmark's: below its smallest entry a call runs that entry,
    # which for 8 B would be a schedule chosen for 1 KiB (hcclc's default range starts there).
    hcclc compile "$dir/cluster.ron" -c allreduce --sizes "$MINB..$MAXB" -o "$dir/plan.ron" || return 1
    log "$p: plan for 2 hosts x $per rank(s), NIC $nic_bw GB/s, ${nic_lat:-default} µs ($dir)"
  else
    # TODO(bench-net): this hcclc has no `topo gen host --nic-bw` yet; the plan is for one
    # host of all ranks, so its choices ignore the network. Drop this branch once it lands.
    hcclc topo gen host --ranks "$world" "${mem[@]}" -o "$dir/host.ron" || return 1
    hcclc compile "$dir/host.ron" -c allreduce --sizes "$MINB..$MAXB" -o "$dir/plan.ron" || return 1
    log "$p: hcclc has no --nic-bw: plan for one host of $world ranks (TODO) ($dir)"
  fi
  echo "$dir/plan.ron"
}

# One hccl-perf job: every rank started here, rank 0's JSON to $file.
run_hccl() {
  local p="$1" plan="$2" file="$3" world port token r h bind=0 rc=0 jobdir
  world="$(world_of "$p")"
  port="$(free_port)"
  token="$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
  ((world > NCPU)) || bind=1
  jobdir="$OUT/job-$p"
  rm -rf "$jobdir"
  mkdir -p "$jobdir"
  for ((r = 0; r < world; r++)); do
    h="$(host_of "$p" "$r")"
    (
      # shellcheck disable=SC2046
      timeout "$RUN_TIMEOUT" $(on_host "$p" "$h") env RANK="$r" WORLD_SIZE="$world" \
        MASTER_ADDR="$(addr_of "$p" 0)" MASTER_PORT="$port" HCCL_JOB_TOKEN="$token" \
        HCCL_PLAN="$plan" HCCL_HOST_ID="bench-net-$token-h$h" \
        $( ((bind)) && echo HCCL_PERF_BIND=1) \
        "$PERF" --backend process -c allreduce -b "$MINB" -e "$MAXB" -f "$FACTOR" \
        -T "$TARGET" -w 5 --json \
        > "$( ((r == 0)) && echo "$file.part" || echo /dev/null)" 2>> "$OUT/${p}_hccl.log" &
      echo $! > "$jobdir/pid.$r"
      wait $! && echo 0 > "$jobdir/rc.$r" || echo $? > "$jobdir/rc.$r"
    ) &
  done
  # The first rank to fail ends the job (the others would wait for it until they time out).
  local done_ranks failed
  while :; do
    done_ranks=0
    failed=0
    for ((r = 0; r < world; r++)); do
      if [[ -f $jobdir/rc.$r ]]; then
        done_ranks=$((done_ranks + 1))
        [[ $(cat "$jobdir/rc.$r") == 0 ]] || failed=1
      fi
    done
    if ((failed)); then
      rc=1
      for ((r = 0; r < world; r++)); do
        [[ -f $jobdir/rc.$r || ! -f $jobdir/pid.$r ]] || kill "$(cat "$jobdir/pid.$r")" 2>/dev/null || true
      done
    fi
    ((done_ranks < world)) || break
    sleep 0.2
  done
  wait
  if ((rc == 0)); then
    mv "$file.part" "$file"
  else
    log "hccl on $p failed (exit codes: $(cat "$jobdir"/rc.* | tr '\n' ' '); see $OUT/${p}_hccl.log)"
    rm -f "$file.part"
  fi
  rm -rf "$jobdir"
}

run_mpi() {
  local p="$1" file="$2" world args
  world="$(world_of "$p")"
  args=(--allow-run-as-root -np "$world" --mca pml ob1 --mca btl "$MPI_BTL")
  if ((world > NCPU)); then
    args+=(--bind-to none --mca mpi_yield_when_idle 1)
  fi
  if [[ $p == lo ]]; then
    args+=(--mca btl_tcp_if_include 127.0.0.0/8 --mca btl_tcp_disable_family 6
      --mca oob_tcp_if_include 127.0.0.0/8)
    ((world > NCPU)) || args+=(--map-by core --bind-to core)
  else
    local per=$((world / 2)) r
    printf 'h0 slots=%d\nh1 slots=%d\n' "$per" "$per" > "$OUT/hostfile-$p"
    args+=(--hostfile "$OUT/hostfile-$p"
      --mca plm_rsh_agent "$OUT/netns-rsh" --mca plm_rsh_no_tree_spawn 1
      --mca btl_tcp_if_include 198.18.0.0/24 --mca btl_tcp_disable_family 6
      --mca oob_tcp_if_include 198.18.0.0/24)
    if ((world <= NCPU)); then
      : > "$OUT/rankfile-$p"
      for ((r = 0; r < world; r++)); do
        echo "rank $r=h$((r / per)) slot=$r" >> "$OUT/rankfile-$p"
      done
      args+=(--rankfile "$OUT/rankfile-$p")
    else
      args+=(--map-by slot)
    fi
  fi
  # shellcheck disable=SC2046
  if ! timeout "$RUN_TIMEOUT" $(on_host "$p" 0) mpirun "${args[@]}" "$OUT/mpi_coll_bench" \
    -b "$MINB" -e "$MAXB" -f "$FACTOR" -T "$TARGET" -o allreduce -C "$file.part" \
    > "$OUT/${p}_mpi.log" 2>&1; then
    log "MPI on $p failed (see $OUT/${p}_mpi.log)"
    rm -f "$file.part"
    return 0
  fi
  mv "$file.part" "$file"
}

# --- the runs --------------------------------------------------------------------------
rm -f "$OUT"/*_tcp_r*.txt "$OUT"/*_hccl_r*.json "$OUT"/*_mpi_r*.csv "$OUT"/*.part "$OUT"/*.log
"$OUT/tcp_pingpong" > "$OUT/tcp_pingpong_lo.txt" 2>&1 || log "tcp_pingpong failed"
for p in $PATHS; do
  log "path $p: raw TCP"
  for rep in $(seq 1 "$REPS"); do
    raw_tcp "$p" "$OUT/${p}_tcp_r$rep.txt"
  done
  plan=""
  if [[ $SKIP_HCCL != 1 ]]; then
    plan="$(make_plan "$p")" || { log "no plan for $p"; plan=""; }
  fi
  for rep in $(seq 1 "$REPS"); do
    # Alternate who goes first so drift in machine load hits both sides alike.
    for side in $([[ $((rep % 2)) == 1 ]] && echo "hccl mpi" || echo "mpi hccl"); do
      if [[ $side == hccl && -n $plan ]]; then
        log "path $p rep $rep: hccl"
        run_hccl "$p" "$plan" "$OUT/${p}_hccl_r$rep.json"
      elif [[ $side == mpi && $SKIP_MPI != 1 ]]; then
        log "path $p rep $rep: OpenMPI"
        run_mpi "$p" "$OUT/${p}_mpi_r$rep.csv"
      fi
    done
  done
done

python3 - "$OUT" "$PATHS" "$REPS" "${RATE:-}" <<'PY'
import csv, json, os, statistics, sys
out, paths, reps, rate = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
med = lambda xs: statistics.median(xs) if xs else None
fmt = lambda x, d=3: "-" if x is None else f"{x:.{d}f}"
describe = {"lo": "2 ranks, 2 hosts over loopback",
            "veth": "2 ranks, 2 hosts (namespaces) over veth + bridge",
            "veth4": "4 ranks, 2 hosts x 2 ranks over veth + bridge"}

def tcp(p, r):
    try:
        return {k: float(v) for k, v in (l.split() for l in open(os.path.join(out, f"{p}_tcp_r{r}.txt")))}
    except (OSError, ValueError):
        return {}

def hccl(p, r):
    try:
        doc = json.load(open(os.path.join(out, f"{p}_hccl_r{r}.json")))
        return {row["bytes"]: (row["busbw_gbps"], row["time_us"], row.get("predicted_us"))
                for row in doc["rows"]}
    except (OSError, ValueError, KeyError):
        return {}

def mpi(p, r):
    try:
        with open(os.path.join(out, f"{p}_mpi_r{r}.csv")) as f:
            return {int(row["size_bytes"]): (float(row["busbw_GBps"]), float(row["time_us"]))
                    for row in csv.DictReader(f) if row.get("size_bytes")}
    except (OSError, ValueError, KeyError):
        return {}

lo_ref = None
try:
    for line in open(os.path.join(out, "tcp_pingpong_lo.txt")):
        if line.startswith("# stream:"):
            lo_ref = float(line.split("=")[1].split()[0])
except OSError:
    pass

print(f"# hccl vs OpenMPI (TCP) AllReduce over a network path, float32 sum; medians over {reps} "
      "back-to-back pairs; ratio = median of per-pair hccl/MPI busbw ratios")
if rate:
    print(f"\nNamespace host links limited to {rate} Gbit/s each way (tc tbf).")
summary = []
for p in paths:
    t = [tcp(p, r) for r in range(1, reps + 1)]
    stream = med([x["stream_gbps"] for x in t if "stream_gbps" in x])
    lat = med([x["latency_us"] for x in t if "latency_us" in x])
    sizes = set()
    runs = []
    for r in range(1, reps + 1):
        h, m = hccl(p, r), mpi(p, r)
        runs.append((h, m))
        sizes |= set(h) | set(m)
    print(f"\n## {p}: {describe[p]}")
    print(f"\nRaw TCP (host 0 -> host 1): stream {fmt(stream)} GB/s, 8 B half-RTT {fmt(lat, 2)} µs")
    print("\n| size (B) | hccl busbw | MPI busbw | ratio | hccl µs | MPI µs | hccl/TCP | MPI/TCP | "
          "hccl predicted µs | measured/predicted |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = {}
    for size in sorted(sizes):
        hb = [h[size][0] for h, _ in runs if size in h]
        ht = [h[size][1] for h, _ in runs if size in h]
        mb = [m[size][0] for _, m in runs if size in m]
        mt = [m[size][1] for _, m in runs if size in m]
        # hccl/MPI busbw of one pair, as MPI time / hccl time (the same number, but exact
        # where busbw rounds to 0 at small sizes).
        ratios = [m[size][1] / h[size][1] for h, m in runs if size in h and size in m and h[size][1] > 0]
        row = (med(hb), med(mb), med(ratios), med(ht), med(mt))
        first.setdefault("row", (size, row))
        first["last"] = (size, row)
        of = lambda b: None if b is None or not stream else b / stream
        pred = med([h[size][2] for h, _ in runs if size in h and h[size][2] is not None])
        vs = None if pred is None or row[3] is None or pred <= 0 else row[3] / pred
        print(f"| {size} | {fmt(row[0])} | {fmt(row[1])} | {fmt(row[2], 2)} | {fmt(row[3], 2)} | "
              f"{fmt(row[4], 2)} | {fmt(of(row[0]), 2)} | {fmt(of(row[1]), 2)} | {fmt(pred, 2)} | {fmt(vs, 2)} |")
    small = first.get("row", (None, (None,) * 5))
    big = first.get("last", (None, (None,) * 5))
    summary.append((p, stream, lat, small, big))

print("\n## Summary")
print("\n| path | raw TCP GB/s | raw TCP 8 B µs | hccl µs, smallest size | MPI µs, smallest size | "
      "largest size | hccl busbw | MPI busbw | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for p, stream, lat, small, big in summary:
    print(f"| {p} | {fmt(stream)} | {fmt(lat, 2)} | {fmt(small[1][3], 2)} | {fmt(small[1][4], 2)} | "
          f"{big[0] if big[0] is not None else '-'} | {fmt(big[1][0])} | {fmt(big[1][1])} | {fmt(big[1][2], 2)} |")
if lo_ref is not None:
    print(f"\nReference: ../shared/bench/tcp_pingpong (loopback, 256 MiB stream): {lo_ref:.2f} GB/s.")
PY

#!/usr/bin/env bash
# A pretend cluster on one machine: K network namespaces ("hosts") joined by veth pairs to a
# bridge (the "switch") that lives in a namespace of its own, so the root namespace's
# networking is never touched (nothing is created in it, not even briefly).
#
#   scripts/netns-cluster.sh up K [--rate GBIT] [--prefix NAME]   # prints namespaces and addresses
#   scripts/netns-cluster.sh down [--prefix NAME]                   # idempotent
#   scripts/netns-cluster.sh status [--prefix NAME]
#
#   ip netns exec hccl-h1 ping -c1 198.18.0.1                       # host 1 -> host 0
#
# Layout (prefix P, default `hccl`):
#   P-sw         bridge `br0`, ports `h0` .. `h<K-1>` (switch ends of the veth pairs)
#   P-h<i>       `eth0` with 198.18.0.<i+1>/24 (198.18.0.0/15 is the benchmarking range of
#                RFC 2544, so it cannot collide with a real network), loopback up
# With --rate, each host's link is limited in both directions: a `tc tbf` qdisc on the egress
# of both ends of its veth pair (eth0 in P-h<i> for what the host sends, h<i> in P-sw for what
# it receives). A host's traffic can be cut with `ip -n P-sw link set h<i> down` (its eth0 loses
# carrier, like a pulled cable) and restored with `... up`.
#
# Every object lives inside the namespaces, so `down` only has to kill what still runs in
# them and delete them; it finds them by name, so it also cleans up after a partial `up`.
# Exit codes: 0 ok; 1 failure (after cleaning up what this run made); 2 bad usage, not root,
# or `ip`/`tc` missing.
set -euo pipefail

usage() {
  sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die2() { echo "netns-cluster: $*" >&2; exit 2; }

cmd="${1:-}"
[[ -n $cmd ]] || usage
shift
K=""
RATE=""
PREFIX="hccl"
if [[ $cmd == up ]]; then
  [[ $# -ge 1 ]] || usage
  K="$1"
  shift
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) [[ $# -ge 2 ]] || usage; RATE="$2"; shift 2 ;;
    --rate=*) RATE="${1#--rate=}"; shift ;;
    --prefix) [[ $# -ge 2 ]] || usage; PREFIX="$2"; shift 2 ;;
    --prefix=*) PREFIX="${1#--prefix=}"; shift ;;
    -h|--help) usage ;;
    *) echo "netns-cluster: unknown argument \`$1\`" >&2; usage ;;
  esac
done
[[ $PREFIX =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$ ]] \
  || die2 "--prefix \`$PREFIX\`: letters, digits, '_', '.', '-' (at most 31)"

SW="$PREFIX-sw"
host_ns() { echo "$PREFIX-h$1"; }
host_addr() { echo "198.18.0.$(($1 + 1))"; }

# The namespaces of this prefix that exist now (switch last, so hosts go first on delete).
existing() {
  local all re
  all="$(ip netns list 2>/dev/null | awk '{print $1}')"
  re="^$(printf '%s' "$PREFIX" | sed 's/[.]/\\./g')-"
  { grep -E "${re}h[0-9]+$" <<<"$all" | sort -V; grep -E "${re}sw$" <<<"$all"; } || true
}

need_tools() {
  [[ $EUID -eq 0 ]] || die2 "must run as root (network namespaces need CAP_SYS_ADMIN)"
  command -v ip >/dev/null || die2 "\`ip\` (iproute2) not found"
  if [[ -n ${1:-} ]]; then
    command -v tc >/dev/null || die2 "\`tc\` (iproute2) not found, needed for --rate"
  fi
}

do_down() {
  local names ns pids
  names="$(existing)"
  if [[ -z $names ]]; then
    echo "netns-cluster: nothing to remove for prefix $PREFIX"
    return 0
  fi
  for ns in $names; do
    # A process left inside would keep the namespace (and its links) alive after `del`.
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
    fi
  done
  for ns in $names; do
    ip netns del "$ns" 2>/dev/null || true
    echo "removed $ns"
  done
  # Deleting the namespaces destroyed their interfaces (the veth pairs go with either end).
  names="$(existing)"
  if [[ -n $names ]]; then
    echo "netns-cluster: could not remove: $names" >&2
    return 1
  fi
}

# tbf on the egress of DEV in NS at RATE Gbit/s. Burst: 2 ms at the rate, at least 256 KiB,
# so a few 64 KiB GSO segments pass in one go (a smaller bucket would cut them up or make
# TCP stall); latency 20 ms bounds the queue (rate x 20 ms) so TCP sees drops, not delay.
add_tbf() {
  local ns="$1" dev="$2"
  local bps burst
  bps="$(awk -v r="$RATE" 'BEGIN { printf "%d", r * 1e9 / 8 }')"
  burst=$((bps / 500))
  ((burst >= 262144)) || burst=262144
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "${RATE}gbit" burst "$burst" latency 20ms
}

up_exit() {
  local rc=$?
  if [[ $UP_DONE != 1 ]]; then
    echo "netns-cluster: up failed; removing what it made" >&2
    do_down >/dev/null 2>&1 || true
    exit 1
  fi
  exit "$rc"
}

do_up() {
  [[ $K =~ ^[0-9]+$ ]] && ((K >= 1 && K <= 253)) || die2 "K must be 1..253, got \`$K\`"
  if [[ -n $RATE ]]; then
    awk -v r="$RATE" 'BEGIN { exit !(r + 0 > 0 && r + 0 <= 1000) }' \
      || die2 "--rate must be a number of Gbit/s in (0, 1000], got \`$RATE\`"
  fi
  need_tools "$RATE"
  local left
  left="$(existing)"
  if [[ -n $left ]]; then
    echo "netns-cluster: namespaces of prefix $PREFIX exist already ($(echo $left)); run: $0 down --prefix $PREFIX" >&2
    exit 1
  fi
  # From here on, a failure (or a signal) removes whatever this run made.
  UP_DONE=0
  trap 'up_exit' EXIT
  trap 'exit 1' INT TERM HUP
  ip netns add "$SW"
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  # A pure L2 switch: no STP delay before ports forward.
  ip -n "$SW" link set br0 type bridge stp_state 0 forward_delay 0
  ip -n "$SW" link set br0 up
  local i ns
  for ((i = 0; i < K; i++)); do
    ns="$(host_ns "$i")"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends are created inside their namespaces directly.
    ip -n "$ns" link add eth0 type veth peer name "h$i" netns "$SW"
    ip -n "$SW" link set "h$i" master br0
    ip -n "$SW" link set "h$i" up
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ -n $RATE ]]; then
      add_tbf "$ns" eth0
      add_tbf "$SW" "h$i"
    fi
  done
  UP_DONE=1
  echo "# netns cluster $PREFIX: $K host(s), switch namespace $SW${RATE:+, links limited to $RATE Gbit/s each way}"
  for ((i = 0; i < K; i++)); do
    echo "$(host_ns "$i") $(host_addr "$i")"
  done
}

do_status() {
  local names ns
  names="$(existing)"
  if [[ -z $names ]]; then
    echo "# netns cluster $PREFIX: down"
    return 0
  fi
  echo "# netns cluster $PREFIX"
  for ns in $names; do
    if [[ $ns == "$SW" ]]; then
      echo "$ns switch: $(ip -n "$ns" -br link show master br0 2>/dev/null | awk '{printf "%s(%s) ", $1, $2}')"
    else
      echo "$ns $(ip -n "$ns" -4 -br addr show dev eth0 2>/dev/null | awk '{print $3, $2}')" \
        "$(tc -n "$ns" qdisc show dev eth0 2>/dev/null | awk '$2 == "tbf" {print "tbf", $8}')"
    fi
  done
}

case "$cmd" in
  up) do_up ;;
  down) need_tools; do_down ;;
  status) need_tools; do_status ;;
  *) usage ;;
esac

#!/usr/bin/env bash
# What measured timelines cost, side by side, and how they compare with the prediction:
# `hccl-perf -g 4` (threads) AllReduce at 8 B and 16 MiB on one plan, in ROUNDS rounds of
# three back-to-back runs (their order rotated): a build without tracing (BASE_BIN, e.g.
# one built at the commit before tracing; skipped when unset), this build with tracing off,
# and with tracing on (`--trace`, every call traced). Prints the medians and the medians of
# the per-round ratios, then the predicted (`hcclc explain --trace`) against the measured
# step and call times of the last traced run.
#
#   scripts/bench-trace.sh
#   ROUNDS=21 BASE_BIN=/tmp/old/target/release/hccl-perf scripts/bench-trace.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
PERF=${PERF_BIN:-}
HCCLC=${HCCLC_BIN:-}
if [[ -z "$PERF" || -z "$HCCLC" ]]; then
  cargo build --release -q -p hccl-perf
  cargo build --release -q -p hcclc
  PERF=target/release/hccl-perf
  HCCLC=target/release/hcclc
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# This machine as the probe measures it, so the prediction is for the machine it runs on.
"$HCCLC" topo gen host --ranks 4 -o "$work/host4.ron" >/dev/null
"$HCCLC" compile "$work/host4.ron" -c allreduce --sizes 8..16M -o "$work/host4.plan.ron" >/dev/null
for size in 8 16M; do
  "$HCCLC" explain "$work/host4.plan.ron" --topo "$work/host4.ron" --size "$size" \
    --trace "$work/pred-$size.json" >/dev/null
done
python3 - "$PERF" "${BASE_BIN:-}" "$work" "$ROUNDS" <<'PY'
import json, os, statistics as st, subprocess, sys
perf, base, work, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = f"{work}/host4.plan.ron"
iters = {"8": (3000, 200), "16M": (10, 3)}

def run(kind, size):
    n, w = iters[size]
    cmd = [base if kind == "base" else perf, "-g", "4", "-b", size, "-e", size,
           "-n", str(n), "-w", str(w), "--plan", plan, "--json"]
    env = dict(os.environ)
    if kind == "on":
        cmd += ["--trace", f"{work}/on-{size}.json"]
        env["HCCL_TRACE_CALLS"] = "100000"
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)["rows"][0]["time_us"]

kinds = (["base"] if base else []) + ["off", "on"]
for size in iters:
    rows = []
    for r in range(rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        rows.append({k: run(k, size) for k in order})
    med = {k: st.median(x[k] for x in rows) for k in kinds}
    line = f"{size:>4}: " + "  ".join(f"{k} {med[k]:.2f} us" for k in kinds)
    for a, b in ([("base", "off")] if base else []) + [("off", "on")]:
        q = [x[b] / x[a] for x in rows]
        line += f"  {b}/{a} {st.median(q):.3f} ({min(q):.2f}-{max(q):.2f})"
    print(line)
for size, (n, w) in iters.items():
    pred = json.load(open(f"{work}/pred-{size}.json"))
    meas = json.load(open(f"{work}/on-{size}.json"))
    timed = {(e["pid"], e["args"]["call"]) for e in meas["traceEvents"]
             if e.get("cat") == "call" and e["args"]["call"] > w}
    calls = [e["dur"] for e in meas["traceEvents"]
             if e.get("cat") == "call" and (e["pid"], e["args"]["call"]) in timed]
    print(f"{size}: predicted call {pred['otherData']['predicted_us']:.2f} us; measured median "
          f"{st.median(calls):.2f} us (mean {st.mean(calls):.2f})")
    steps = {}
    for e in pred["traceEvents"]:
        if e["ph"] == "X":
            steps.setdefault(e["name"], ([], []))[0].append(e["dur"])
    for e in meas["traceEvents"]:
        if e.get("cat") == "step" and (e["pid"], e["args"]["call"]) in timed:
            steps.setdefault(e["name"], ([], []))[1].append(e["dur"])
    for name, (p, m) in sorted(steps.items()):
        f = lambda v: f"{st.median(v):10.2f} ({st.mean(v):.2f})" if v else "         -"
        print(f"  {name:24s} predicted {f(p)}  measured {f(m)}")
PY

"""hccl_aot against Gloo through the same torch.distributed calls, side by side in one run:
both backends in the same processes (python/benches/torch_job.py: hccl_aot the default group,
Gloo a second one), timed alternately per collective and size, in back-to-back rounds (the
median of the rounds' ratios per collective and size), for 2 and 4 processes; all_reduce
against hccl-perf on the same plan, each size right after the job timed it (the overhead of
PyTorch); and the DDP step of a 26M-parameter model over each backend and with no
communication, alternating in one job.
Usage: python bench_torch.py [--pairs 3] [--procs 2 4] [--colls ...|none] [--no-ddp] [--min-bytes B] [--max-bytes B]"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).with_name("torch_job.py")


def launch(n, env):
    """One torch_job.py job on n processes (both backends, see its docs): its JSON lines."""
    import hccl

    e = dict(os.environ, BACKEND="hccl_aot", OMP_NUM_THREADS="1", **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
           f"--master-port={hccl.Communicator.free_port()}", str(JOB)]
    try:
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as t:
        sys.exit(f"torch_job.py x{n} did not finish in {t.timeout:.0f} s:\n{t.stdout}\n{t.stderr}")
    if r.returncode:
        sys.exit(f"torch_job.py x{n} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def human(b):
    for u, s in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << s:
            return f"{b >> s}{u}"
    return f"{b}B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--colls", default="all_reduce,all_gather_into_tensor,reduce_scatter_tensor",
                    help="collectives to time, comma-separated; 'none' for the DDP step alone")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--min-bytes", type=int, default=0, help="smallest size of the collectives (8 B .. 256 MiB by 4)")
    ap.add_argument("--max-bytes", type=int, default=256 << 20, help="largest size of the collectives")
    ap.add_argument("--plan", help="plan file for hccl_aot and hccl-perf (HCCL_PLAN); default: the built-in plans, "
                    "what init_process_group('hccl_aot') runs without HCCL_PLAN; 'host': compiled for this host")
    ap.add_argument("--hccl-perf", help="hccl-perf binary: all_reduce on the same plan, for the overhead of PyTorch")
    a = ap.parse_args()
    import tempfile

    import hccl

    tmp = tempfile.mkdtemp()
    for n in a.procs:
        plan = a.plan
        if plan in (None, "host"):
            path = os.path.join(tmp, f"plan{n}.plan.ron")
            if plan is None:
                hccl.Plan.builtin(n).save(path)
            else:  # what hccl-perf runs when given no plan: compiled for this host's ranks
                hccl.compile(hccl.Topology.host(n), sizes="8..256M").save(path)
            plan = path
        print(f"\nplan: {a.plan or 'built-in'} ({plan})")
        os.environ["HCCL_PLAN"] = plan
        runs = {"gloo": [], "hccl_aot": []}
        perf = []
        env = {"MODE": "collectives", "COLLS": a.colls, "MINB": str(a.min_bytes), "MAXB": str(a.max_bytes)}
        with_perf = a.hccl_perf and "all_reduce" in a.colls
        if with_perf:
            env["BENCH_HCCL_PERF"] = str(Path(a.hccl_perf).resolve())
        for p in range(a.pairs if a.colls != "none" else 0):
            # One round: one job timing Gloo and hccl_aot alternately (which goes first
            # alternates from size to size and from round to round) and, per all_reduce size,
            # hccl-perf on the same plan right after them.
            rows = launch(n, dict(env, ORDER=str(p)))
            for name in runs:
                runs[name].append({(x["coll"], x["bytes"]): x for x in rows if x["backend"] == name})
            if with_perf:
                perf.append({x["bytes"]: x["us"] for x in rows if x["backend"] == "hccl-perf"})
        keys = list(runs["gloo"][0]) if runs["gloo"] else []
        print(f"\n{n} processes, {a.pairs} back-to-back rounds, both backends in each round's job; times are medians "
              "over rounds, ratio = median of per-round gloo/hccl_aot")
        if keys:
            print(f"{'collective':<24}{'size':>6}{'gloo us':>12}{'hccl us':>12}{'gloo busbw':>12}{'hccl busbw':>12}{'ratio':>8}")
        for k in keys:
            g = [r[k]["us"] for r in runs["gloo"]]
            h = [r[k]["us"] for r in runs["hccl_aot"]]
            gb = statistics.median(r[k]["busbw"] for r in runs["gloo"])
            hb = statistics.median(r[k]["busbw"] for r in runs["hccl_aot"])
            ratio = statistics.median(x / y for x, y in zip(g, h))
            print(f"{k[0]:<24}{human(k[1]):>6}{statistics.median(g):>12.1f}{statistics.median(h):>12.1f}{gb:>12.3f}{hb:>12.3f}{ratio:>8.2f}")
        if with_perf:
            print(f"all_reduce through PyTorch (hccl_aot) against hccl-perf (Rust), same plan, {n} processes; "
                  "overhead and ratio: medians of the per-round differences and ratios")
            print(f"{'size':>6}{'hccl-perf us':>14}{'torch us':>10}{'overhead us':>13}{'ratio':>8}   per round (perf/torch us)")
            for k in keys:
                if k[0] != "all_reduce" or k[1] not in perf[0]:
                    continue
                rust = [pp[k[1]] for pp in perf]
                tor = [r[k]["us"] for r in runs["hccl_aot"]]
                rounds = ", ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(rust, tor))
                print(f"{human(k[1]):>6}{statistics.median(rust):>14.2f}{statistics.median(tor):>10.2f}"
                      f"{statistics.median(y - x for x, y in zip(rust, tor)):>13.2f}"
                      f"{statistics.median(y / x for x, y in zip(rust, tor)):>8.3f}   {rounds}")
        if not a.no_ddp:
            # Gloo, hccl_aot, and DDP with communication hooks that return the gradients as
            # they are (the step with no communication at all, which no backend can beat) or
            # after copying each bucket twice in memory: one job, a.pairs rounds, the order
            # rotating from round to round.
            ms = {b: [] for b in ["gloo", "hccl_aot", "none", "copy"]}
            for x in launch(n, {"MODE": "ddp", "ROUNDS": str(a.pairs)}):
                ms[x["backend"]].append(x["ms"])
            g, h, z = ms["gloo"], ms["hccl_aot"], ms["none"]
            print(f"DDP step, 26.2M parameters, {n} processes, {a.pairs} rounds in one job: gloo {statistics.median(g):.1f} ms, "
                  f"hccl_aot {statistics.median(h):.1f} ms, ratio {statistics.median(x / y for x, y in zip(g, h)):.2f} "
                  f"(rounds: {', '.join(f'{x:.0f}/{y:.0f}' for x, y in zip(g, h))})")
            print(f"  no communication (DDP with a hook that returns the gradients): {statistics.median(z):.1f} ms; "
                  f"the most any backend could gain over gloo: {statistics.median(x / y for x, y in zip(g, z)):.2f}x; "
                  f"hccl_aot's step over it: {statistics.median(y / x for x, y in zip(z, h)):.3f}")
            c = ms["copy"]
            print(f"  no communication, each bucket copied twice in memory: {statistics.median(c):.1f} ms; "
                  f"hccl_aot's step over it: {statistics.median(y / x for x, y in zip(c, h)):.3f}")

if __name__ == "__main__":
    main()

"""The Python front end against hcclc, side by side in one run.

1. Compile time: ``hcclc compile TOPO -o PLAN`` and the same compile from Python
   (``hccl.compile(TOPO).save(PLAN)``), each as a fresh process, in back-to-back pairs
   (alternating which goes first); also the in-process time of ``hccl.compile`` alone. The two
   plans must be identical (same hash), or the run stops.
2. The language: writing, verifying and costing an 8-rank algorithm of a few hundred steps
   (a ring AllGather, blocks in 4 pieces: 372 steps) on the DGX-1 at 1K..1G, in-process.
3. The communicator's cost per call from Python: a blocking ``all_reduce`` of 8 bytes on a
   one-rank communicator (no peer to wait for, so what is timed is the Python side, the
   native call and the executor's bookkeeping), NumPy in place and out of place and a PyTorch
   tensor if PyTorch is installed; each with NumPy arrays read in one native call and with the
   general path (``__array_interface__``, which every array took before), in back-to-back
   pairs.

Usage: python bench.py HCCLC [--pairs N] [--topo NAME ...]   (scripts/bench-python.sh runs it)
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hccl
from hccl import Algorithm, Buffer

COMPILE = """
import sys, time, hccl
t0 = time.perf_counter()
plan = hccl.compile(sys.argv[1])
t1 = time.perf_counter()
plan.save(sys.argv[2])
print(t1 - t0)
"""


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return wall, r.stdout


def ring_allgather(n, pieces):
    a = Algorithm("allgather", ranks=n, chunks=n * pieces, name="ring_ag")
    for r in range(n):
        a.chunk(r, Buffer.input, 0, pieces).copy(r, Buffer.output, r * pieces)
    for p in range(pieces):
        for hop in range(n - 1):
            for owner in range(n):
                src = (owner + hop) % n
                a.chunk(src, Buffer.output, owner * pieces + p).copy((src + 1) % n)
    return a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hcclc")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--topo", nargs="+", default=["dgx1-v100", "h100-cluster-2node"])
    args = ap.parse_args()
    print(f"hccl {hccl.__version__}, Python {sys.version.split()[0]}, {args.pairs} pairs per topology")
    with tempfile.TemporaryDirectory() as tmp:
        for topo in args.topo:
            rust, py, inproc = [], [], []
            for i in range(args.pairs):
                a, b = Path(tmp) / "rust.plan.ron", Path(tmp) / "py.plan.ron"
                runs = [
                    ("rust", [args.hcclc, "compile", topo, "-o", str(a)]),
                    ("py", [sys.executable, "-c", COMPILE, topo, str(b)]),
                ]
                if i % 2:
                    runs.reverse()
                for name, cmd in runs:
                    wall, out = timed(cmd)
                    if name == "rust":
                        rust.append(wall)
                    else:
                        py.append(wall)
                        inproc.append(float(out.strip().splitlines()[-1]))
                ha, hb = hccl.Plan.load(a).hash, hccl.Plan.load(b).hash
                if ha != hb:
                    sys.exit(f"{topo}: hcclc and Python wrote different plans ({ha} vs {hb})")
            ratios = [p / r for p, r in zip(py, rust)]
            print(f"\ncompile {topo} (every collective, 1K..4G), plans identical")
            print(f"  {'pair':>4} {'hcclc s':>9} {'python s':>9} {'in-proc s':>9} {'py/hcclc':>9}")
            for i, (r, p, q, x) in enumerate(zip(rust, py, inproc, ratios), 1):
                print(f"  {i:>4} {r:>9.3f} {p:>9.3f} {q:>9.3f} {x:>9.3f}")
            print(
                f"  median {statistics.median(rust):>9.3f} {statistics.median(py):>9.3f} "
                f"{statistics.median(inproc):>9.3f} {statistics.median(ratios):>9.3f}"
            )

    topo = hccl.topology("dgx1-v100")
    rows = []
    for i in range(11):
        t0 = time.perf_counter()
        a = ring_allgather(8, 4)
        t1 = time.perf_counter()
        a.verify()
        t2 = time.perf_counter()
        a.cost(topo, "1K..1G")
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    print(f"\nlanguage: ring AllGather, 8 ranks, 4 pieces ({a.steps} steps), on dgx1-v100 at 1K..1G (21 sizes)")
    print(f"  {'':>6} {'write ms':>9} {'verify ms':>9} {'cost ms':>9} {'total ms':>9}")
    print("  first  " + " ".join(f"{1e3 * x:>9.2f}" for x in rows[0]))
    med = [statistics.median(col) for col in zip(*rows[1:])]
    print("  median " + " ".join(f"{1e3 * x:>9.2f}" for x in med) + "   (of the next 10)")

    per_call(args.pairs)


def per_call(pairs):
    import timeit

    import numpy as np

    import hccl.comm

    comm = hccl.Communicator.connect(0, 1, f"127.0.0.1:{hccl.Communicator.free_port()}")
    x, y = np.ones(2, np.float32), np.ones(2, np.float32)
    cases = [("numpy, in place", lambda: comm.all_reduce(x)),
             ("numpy, out of place", lambda: comm.all_reduce(x, out=y))]
    try:
        import torch

        t = torch.ones(2)
        cases.append(("torch tensor, in place", lambda: comm.all_reduce(t)))
    except ImportError:
        pass
    native = hccl.comm._array_info
    general = lambda obj, writable: None  # noqa: E731 - what the general path sees
    n = 50000
    print(f"\ncommunicator: blocking all_reduce of 8 B on one rank, µs per call (median of {n} calls x {pairs} pairs)")
    print(f"  {'':<24} {'general':>9} {'native':>9} {'ratio':>7}")
    try:
        for name, call in cases:
            g, f = [], []
            for _ in range(pairs):
                for path, out in ((general, g), (native, f)):
                    hccl.comm._array_info = path
                    call()
                    out.append(timeit.timeit(call, number=n) / n * 1e6)
            ratios = [a / b for a, b in zip(g, f)]
            print(f"  {name:<24} {statistics.median(g):>9.2f} {statistics.median(f):>9.2f} "
                  f"{statistics.median(ratios):>7.2f}")
    finally:
        hccl.comm._array_info = native
        comm.finalize()


if __name__ == "__main__":
    main()

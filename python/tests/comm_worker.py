"""One rank of the communicator tests (tests/test_comm.py starts one process per rank).

Every collective, element type and reduction on arrays of odd and prime lengths, in place and
out of place, blocking and asynchronous, checked element by element against NumPy on data
every rank can compute for every other rank.
"""

import os
import sys

import numpy as np

import hccl

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
OPS = ["sum", "prod", "min", "max", "avg"]


def data(rank, n, dtype, salt):
    # Small values so that sums and products of a few ranks fit every type exactly.
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype.startswith("float"):
        return rng.integers(-3, 4, n).astype(dtype)
    lo = 0 if dtype.startswith("u") else -2
    return rng.integers(lo, 3, n).astype(dtype)


def reference(inputs, op, dtype):
    stack = np.stack(inputs).astype(np.float64 if dtype.startswith("float") else np.int64)
    if op == "sum":
        r = stack.sum(0)
    elif op == "prod":
        r = stack.prod(0)
    elif op == "min":
        r = stack.min(0)
    elif op == "max":
        r = stack.max(0)
    else:
        s = stack.sum(0)
        r = s / len(inputs) if dtype.startswith("float") else np.trunc(s / len(inputs))
    return r.astype(dtype)


def check(got, want, what):
    if not np.array_equal(got, want):
        bad = np.nonzero(got != want)[0][:5]
        raise AssertionError(f"{what}: elements {bad.tolist()} are {got[bad]} not {want[bad]}")


def main():
    comm = hccl.Communicator.from_env(plan=os.environ.get("TEST_PLAN") or None)
    r, w = comm.rank, comm.world_size
    salt = 0
    for dtype in DTYPES:
        for n in (1, 7, 1031):
            salt += 1
            for op in OPS:
                salt += 1
                ins = [data(k, n, dtype, salt) for k in range(w)]
                want = reference(ins, op, dtype)
                x = ins[r].copy()
                comm.all_reduce(x, op=op)
                check(x, want, f"all_reduce {dtype} {op} n={n} in place")
                out = np.empty_like(x)
                comm.all_reduce(ins[r], out=out, op=op)
                check(out, want, f"all_reduce {dtype} {op} n={n}")
                # ReduceScatter: block r of the reduction.
                big = [data(k, n * w, dtype, salt + 7) for k in range(w)]
                mine = np.empty(n, dtype)
                comm.reduce_scatter(big[r], mine, op=op)
                check(mine, reference(big, op, dtype)[r * n:(r + 1) * n], f"reduce_scatter {dtype} {op} n={n}")
                # Reduce to the last rank.
                out = np.zeros_like(x)
                comm.reduce(ins[r], root=w - 1, out=out, op=op)
                if r == w - 1:
                    check(out, want, f"reduce {dtype} {op} n={n}")
            ins = [data(k, n, dtype, salt) for k in range(w)]
            out = np.empty(n * w, dtype)
            comm.all_gather(ins[r], out)
            check(out, np.concatenate(ins), f"all_gather {dtype} n={n}")
            # In place: this rank's block of the output is its input.
            out2 = np.zeros(n * w, dtype)
            out2[r * n:(r + 1) * n] = ins[r]
            comm.all_gather(out2[r * n:(r + 1) * n], out2)
            check(out2, np.concatenate(ins), f"all_gather {dtype} n={n} in place")
            x = ins[r].copy()
            comm.broadcast(x, root=w // 2)
            check(x, ins[w // 2], f"broadcast {dtype} n={n}")
            blocks = [data(k, n * w, dtype, salt + 3) for k in range(w)]
            out = np.empty(n * w, dtype)
            comm.all_to_all(blocks[r], out)
            want = np.concatenate([blocks[k][r * n:(r + 1) * n] for k in range(w)])
            check(out, want, f"all_to_all {dtype} n={n}")
    # AllToAllv: rank s sends s + p + 1 elements to rank p.
    send_counts = [r + p + 1 for p in range(w)]
    recv_counts = [s + r + 1 for s in range(w)]
    x = np.arange(sum(send_counts), dtype=np.float32) + 1000 * r
    out = np.empty(sum(recv_counts), np.float32)
    comm.all_to_all_v(x, send_counts, out, recv_counts)
    want = []
    for s in range(w):
        xs = np.arange(sum(s + p + 1 for p in range(w)), dtype=np.float32) + 1000 * s
        off = sum(s + p + 1 for p in range(r))
        want.append(xs[off:off + s + r + 1])
    check(out, np.concatenate(want), "all_to_all_v")
    # Asynchronous calls, queued back to back, then waited for in order.
    xs = [np.full(4099, r + k, np.float64) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    for k, (x, work) in enumerate(zip(xs, works)):
        work.wait()
        assert work.is_completed()
        check(x, np.full(4099, sum(q + k for q in range(w)), np.float64), f"async all_reduce {k}")
    # A call whose Work and arrays are dropped while it waits for a late rank: the queued
    # call holds them until it has run (8 MiB: freed, NumPy's memory would go back to the
    # system, and the call's writes would fault).
    import gc
    import time

    if r == w - 1:
        time.sleep(0.3)
    comm.all_reduce(np.ones(1 << 20), out=np.empty(1 << 20), async_op=True)
    gc.collect()
    z = np.ones(3)
    comm.all_reduce(z)
    check(z, np.full(3, float(w)), "blocking after a dropped asynchronous call")
    # Buffers other than NumPy arrays.
    import array

    buf = array.array("d", [float(r)] * 5)
    comm.all_reduce(buf)
    assert list(buf) == [float(sum(range(w)))] * 5, list(buf)
    comm.barrier()
    print(f"rank {r}: ok ({comm.plan_hash[:12]})")
    comm.finalize()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a clear line for the test's report
        print(f"rank {os.environ.get('RANK')}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        raise

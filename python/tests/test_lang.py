"""hccl.lang: writing, verifying, costing and exporting algorithms; errors at the author's line."""

import json
import time

import pytest

import hccl
from hccl import Algorithm, Buffer


def ring_allgather(n, pieces=1, name="ring_ag"):
    a = Algorithm("allgather", ranks=n, chunks=n * pieces, name=name)
    for r in range(n):
        a.chunk(r, Buffer.input, 0, pieces).copy(r, Buffer.output, r * pieces)
    for p in range(pieces):
        for hop in range(n - 1):
            for owner in range(n):
                src = (owner + hop) % n
                a.chunk(src, Buffer.output, owner * pieces + p).copy((src + 1) % n)
    return a


def ring_allreduce(n, in_place=True):
    a = Algorithm("allreduce", ranks=n, in_place=in_place, name="ring_ar")
    for step in range(n - 1):
        for i in range(n):
            r = (i + step) % n
            a.chunk((r + 1) % n, Buffer.input, i).reduce(a.chunk(r, Buffer.input, i))
    for step in range(n - 1):
        for i in range(n):
            r = (i + step + n - 1) % n
            a.chunk(r, Buffer.input, i).copy((r + 1) % n)
    return a


def test_ring_allgather_verifies_and_fuses():
    a = ring_allgather(5)
    report = a.verify()
    assert report["ranks"] == 5 and report["messages"] == 5 * 4
    ops = [s["op"] for rank in a.programs() for st in rank["streams"] for s in st["steps"]]
    assert "rcs" in ops, "a forwarded receive becomes receive-copy-send"
    unfused = ring_allgather(5)
    unfused.fusion = False
    unfused._built = None
    ops = [s["op"] for rank in unfused.programs() for st in rank["streams"] for s in st["steps"]]
    assert "rcs" not in ops
    assert unfused.verify()["steps"] > report["steps"]


def test_ring_allreduce_verifies():
    for n in (2, 3, 4, 7):
        assert ring_allreduce(n).verify()["reductions"] > 0


def test_every_step_names_the_line_that_wrote_it():
    a = ring_allgather(3)
    for rank in a.programs():
        for st in rank["streams"]:
            for s in st["steps"]:
                assert s["ops"], s
                file, line = a.where(s["ops"][0])
                assert file == __file__ and line > 0


def test_verify_error_points_at_the_wrong_line():
    n = 4
    a = Algorithm("allgather", ranks=n, name="oops")
    for r in range(n):
        a.chunk(r, "input", 0).copy(r, "output", r)
    for hop in range(n - 1):
        for owner in range(n):
            src = (owner + hop) % n
            dst = (src + 1) % n
            a.chunk(src, "output", owner).copy(dst, "output", owner if dst != 2 else 0)  # BUG
    with pytest.raises(hccl.VerifyError) as e:
        a.verify()
    err = e.value
    bug_line = next(i for i, l in enumerate(open(__file__), 1) if l.rstrip().endswith("# BUG"))
    assert err.lineno == bug_line and err.filename == __file__
    assert f"test_lang.py:{bug_line}:" in str(err)
    assert "# BUG" in str(err), "the message quotes the line"
    assert err.errors and all("where" in x for x in err.errors)


def test_deadlock_points_at_a_line():
    # Each rank forwards what it receives before sending its own: both wait forever.
    a = Algorithm("allgather", ranks=2, name="deadlock")
    for r in (0, 1):
        a.copy(a.input(r, 0), a.output(r, r))
    for r in (0, 1):
        a.recv(a.output(r, 1 - r), 1 - r)
        a.send(a.output(r, 1 - r), 1 - r)  # needs the receive above: a cycle
    with pytest.raises(hccl.VerifyError) as e:
        a.verify()
    assert any(x["kind"] == "deadlock" for x in e.value.errors), e.value.errors
    assert e.value.lineno is not None


def test_missing_data_points_at_the_algorithm():
    a = Algorithm("allgather", ranks=2, name="half")
    a.copy(a.input(0, 0), a.output(0, 0))
    with pytest.raises(hccl.VerifyError) as e:
        a.verify()
    assert "no op of this algorithm writes it" in str(e.value)
    assert e.value.lineno == a.defined_at[1]


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda a: a.chunk(0, "input", 0).copy(9, "input", 0), "out of range"),
        (lambda a: a.chunk(0, "input", 7).copy(1, "input", 0), "exceeds"),
        (lambda a: a.chunk(0, "input", 0).copy(1, "scratch", 4_000_000_000), "exceeds"),
        (lambda a: a.chunk(0, "input", 0).copy(1, "input", 0, ch=-1), "negative"),
        (lambda a: a.send(a.input(0, 0), 0), "itself"),
    ],
)
def test_bad_ops_raise_algorithm_error_at_their_line(write, message):
    a = Algorithm("allreduce", ranks=4)
    with pytest.raises(hccl.AlgorithmError, match=message) as e:
        write(a)
        a.verify()
    assert e.value.filename == __file__ and e.value.lineno > 0
    assert f"{__file__}:" in str(e.value)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: Algorithm("gather", ranks=4), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=0), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks="4"), TypeError),
        (lambda: Algorithm("allgather", ranks=4, chunks=6).chunk(0, "input", 0).copy(1, "output", 0).algorithm.verify(), hccl.AlgorithmError),
        (lambda: Algorithm("broadcast", ranks=4, root=9).chunk(0, "input", 0).copy(1).algorithm.verify(), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=4).verify(), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=4).chunk(0, "nowhere", 0), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=4).chunk(0, "input", 0, 2).split(3), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=4).chunk(0, "input", 0).reduce(Algorithm("allreduce", ranks=4).chunk(1, "input", 0)), hccl.AlgorithmError),
        (lambda: Algorithm("allreduce", ranks=4).chunk(0, "input", 0).reduce("x"), TypeError),
    ],
)
def test_invalid_algorithms(make, error):
    with pytest.raises(error):
        make()


def test_reduce_outside_a_reducing_collective_is_a_verify_error():
    a = Algorithm("allgather", ranks=2)
    for r in (0, 1):
        a.copy(a.input(r, 0), a.output(r, r))
    a.chunk(1, "output", 1).reduce(a.chunk(0, "output", 0))
    with pytest.raises(hccl.VerifyError, match="does not reduce"):
        a.verify()


def test_cost_rows(dgx1):
    a = ring_allgather(8, pieces=2)
    a.verify()
    rows = a.cost(dgx1, "1K..1M")
    assert [r.bytes for r in rows] == hccl.sizes("1K..1M")
    for r in rows:
        assert r.algorithm == "ring_ag" and r.time_us > 0 and r.bound_ratio >= 1
        assert r.baseline_us and r.speedup == pytest.approx(r.baseline_us / r.time_us, rel=1e-2)
    simple = a.cost(dgx1, "1M", proto="Simple")
    assert simple[0].protocol == "Simple"
    with pytest.raises(hccl.CompileError):
        a.cost(dgx1, "1M", proto="LL256")
    with pytest.raises(hccl.CompileError, match="ranks"):
        ring_allgather(4).cost(dgx1, "1M")


def test_cost_agrees_with_explaining_the_plan(dgx1):
    a = ring_allgather(8)
    mine = a.cost(dgx1, "1K..1M", proto="LL128")
    theirs = a.to_plan("LL128").explain(dgx1, "1K..1M")
    for x, y in zip(mine, theirs):
        assert x.time_us == pytest.approx(y.time_us, rel=1e-9)
        assert x.baseline_us == pytest.approx(y.baseline_us, rel=1e-9)


def test_an_algorithm_competes_in_compile_and_wins_where_fastest(dgx1):
    a = ring_allgather(8, name="my_ring")
    a.verify()
    plan = hccl.compile(dgx1, collectives="allgather", sizes="1K..1M", candidates=[a], algo="my_ring")
    assert {r.algorithm for r in plan.rows} == {"my_ring"}
    assert [r.time_us for r in plan.rows] == pytest.approx([r.time_us for r in a.cost(dgx1, "1K..1M")], rel=1e-6)
    # Among every family it loses (a ring in rank order on DGX-1 crosses missing links).
    best = hccl.compile(dgx1, collectives="allgather", sizes="1K..1M", candidates=[a])
    assert "my_ring" not in {r.algorithm for r in best.rows}


def test_export(tmp_path):
    a = ring_allreduce(4)
    xml = a.to_msccl_xml(path=tmp_path / "ring.xml")
    assert "<algo" in xml and (tmp_path / "ring.xml").read_text() == xml
    back = hccl.Plan.from_msccl_xml(tmp_path / "ring.xml")
    back.verify()
    a.save(tmp_path / "ring.plan.ron")
    plan = hccl.Plan.load(tmp_path / "ring.plan.ron")
    assert plan.entries[0]["hash"] == a.hash
    assert plan.entries[0]["algorithm"] == "ring_ar"


def test_low_level_ops_build_the_same_schedule_as_copy():
    hi = ring_allgather(3)
    lo = Algorithm("allgather", ranks=3, name="ring_ag")
    n = 3
    for r in range(n):
        lo.copy(lo.input(r, 0), lo.output(r, r))
    for hop in range(n - 1):
        for owner in range(n):
            src = (owner + hop) % n
            loc = lo.output(src, owner)
            lo.send(loc, (src + 1) % n)
            lo.recv(lo.output((src + 1) % n, owner), src)
    assert lo.hash == hi.hash


def test_explicit_fused_ops_verify():
    # A 3-rank chain Reduce to root 2 written with recv-reduce-send and recv-reduce-copy.
    a = Algorithm("reduce", ranks=3, root=2, fusion=False)
    a.send(a.input(0, 0, 3), 1)
    a.recv_reduce_send(0, 2, a.input(1, 0, 3))
    a.recv_reduce_copy(1, a.input(2, 0, 3), a.output(2, 0, 3))
    a.chunks  # 3 chunks by default
    assert a.verify()["reductions"] == 2


def test_split_pipelines():
    a = Algorithm("broadcast", ranks=3, chunks=4, root=0)
    for part in a.chunk(0, "input", 0, 4).split(4):
        part.copy(0, "output").copy(1, "output").copy(2, "output")
    report = a.verify()
    assert report["messages"] == 8


def test_an_algorithm_of_a_few_hundred_steps_verifies_and_costs(dgx1):
    # (How long this takes is measured by scripts/bench-python.sh, not here.)
    a = ring_allgather(8, pieces=4)
    assert a.steps >= 200
    assert a.verify()["steps"] == a.steps
    assert len(a.cost(dgx1, "1K..1G")) == 21


def test_the_first_error_reported_is_the_earliest_written_cause():
    # Line A puts rank 2's block where rank 1's own belongs; correct code (line B) then
    # forwards it. The error reported first is line A, where the wrong data came from.
    a = Algorithm("allgather", ranks=3, name="cascade")
    for r in range(3):
        a.input(r, 0).copy(r, "output", r)
    a.output(2, 2).copy(1, index=1)  # A
    for s in range(3):
        for d in range(3):
            if d != s:
                a.output(s, s).copy(d)  # B
    with pytest.raises(hccl.VerifyError) as e:
        a.verify()
    line_a = next(i for i, l in enumerate(open(__file__), 1) if l.rstrip().endswith("# A"))
    assert e.value.lineno == line_a, str(e.value)
    assert len(e.value.errors) > 1


def test_cost_table_prints_what_compile_prints(dgx1):
    a = ring_allgather(8)
    text = str(a.cost(dgx1, "64K", proto="LL"))
    explained = str(a.to_plan("LL").explain(dgx1, "64K"))
    row = lambda t: next(l for l in t.splitlines() if l.strip().startswith("64K"))
    assert row(text) == row(explained)

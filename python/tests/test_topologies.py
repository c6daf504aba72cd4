"""Topologies: shipped, loaded, generated, detected; inspected as Python data."""

import json

import pytest

import hccl


def test_shipped(dgx1):
    assert "dgx1-v100" in hccl.Topology.shipped_names()
    assert dgx1.name == "dgx1-v100" and dgx1.nranks == 8 and dgx1.nhosts == 1
    assert len(dgx1.hash) == 64
    kinds = {l["kind"] for l in dgx1.links}
    assert "NvLink" in kinds
    m = dgx1.bandwidth_matrix
    assert len(m) == 8 and all(len(row) == 8 for row in m)
    assert all(bw > 0 for bw in dgx1.injection_bw)
    assert dgx1.devices and dgx1.hosts
    # The hybrid cube-mesh: fully connected quads, and rank i wired to i + 4.
    assert dgx1.neighbors(0) == [1, 2, 3, 4]
    assert dgx1.neighbors(5) == [1, 4, 6, 7]
    nv = [l for l in dgx1.rank_links if l["kind"] == "NvLink"]
    assert len(nv) == 32 and all(l["bw"] > 0 and l["latency"] > 0 for l in nv)


def test_every_shipped_machine_loads():
    for name in hccl.Topology.shipped_names():
        t = hccl.Topology.shipped(name)
        assert t.nranks >= 1


def test_round_trip_through_ron(tmp_path, dgx1):
    path = tmp_path / "m.ron"
    dgx1.save(path)
    again = hccl.Topology.load(path)
    assert again.hash == dgx1.hash
    assert hccl.Topology.from_ron(dgx1.to_ron()).hash == dgx1.hash


def test_pictures(dgx1):
    svg = dgx1.svg()
    assert svg.lstrip().startswith("<svg") or "<svg" in svg[:200]
    assert dgx1._repr_svg_() == svg
    assert "digraph" in dgx1.dot() or "graph" in dgx1.dot()


def test_generators():
    assert hccl.Topology.ring(5, 10.0, 1.0).nranks == 5
    assert hccl.Topology.torus((2, 3), 10.0, 1.0).nranks == 6
    c = hccl.Topology.cluster(2, "dgx1-v100")
    assert c.nranks == 16 and c.nhosts == 2
    h = hccl.Topology.host(4, mem_bw=5.0)
    assert h.nranks == 4
    box = hccl.Topology.host(2, mem_bw=5.0, nic_bw=1.0)
    assert hccl.Topology.cluster(3, box).nranks == 6


def test_detect_this_machine():
    t = hccl.Topology.detect(mem_bw=5.0)
    assert t.nranks >= 1
    assert t.notes, "detect says what it found and assumed"
    # Every fact says where it was found, that it was given, or why it was assumed.
    assert all(" [found: " in n or " [given: " in n or " [assumed: " in n for n in t.notes), t.notes
    assert any(n.startswith("memory bandwidth 5.0 GB/s") and "[given: --mem-bw]" in n for n in t.notes) or any(
        "GPUs [found" in n for n in t.notes
    ), t.notes


def test_predictions_say_which_calibration(dgx1):
    # A shipped GPU machine has none; a CPU host without one of its own gets the built-in
    # default of the development machine, and both say how to calibrate.
    assert dgx1.calibration["kind"] == "none" and dgx1.calibration["how_to_calibrate"]
    host = hccl.Topology.host(2, mem_bw=5.0)
    cal = host.calibration
    assert cal["kind"] == "built-in" and "development VM" in cal["source"], cal
    assert "hccl-perf --calibrate" in cal["how_to_calibrate"]
    table = str(hccl.compile(host, collectives="allreduce", sizes="1K").rows)
    assert "calibration: the built-in default, not measured on this machine" in table, table


@pytest.mark.parametrize(
    "make",
    [
        lambda: hccl.Topology.ring(0, 10, 1),
        lambda: hccl.Topology.ring(4, -1, 1),
        lambda: hccl.Topology.ring(4, float("nan"), 1),
        lambda: hccl.Topology.torus((), 10, 1),
        lambda: hccl.Topology.torus((2, 0), 10, 1),
        lambda: hccl.Topology.host(2, nic_latency=3.0),
        lambda: hccl.Topology.cluster(2, hccl.Topology.host(2, mem_bw=5.0)),
        lambda: hccl.Topology.detect(sysfs="/nonexistent"),
        lambda: hccl.topology("no-such-machine"),
        lambda: hccl.topology("/nonexistent/m.ron"),
        lambda: hccl.Topology.shipped("nope"),
    ],
)
def test_bad_topologies_raise_topology_error(make):
    with pytest.raises(hccl.TopologyError):
        make()


def test_malformed_ron_is_located(tmp_path):
    path = tmp_path / "broken.ron"
    path.write_text("(\n  name: \"x\",\n  hosts: [ (id: 3) ],\n)\n")
    with pytest.raises(hccl.TopologyError) as e:
        hccl.Topology.load(path)
    assert "broken.ron:3:" in str(e.value)


@pytest.mark.parametrize("text", ["", "(", "\x00\x01", "(name: \"a\", hosts: [], links: [])", "[1,2,3]"])
def test_hostile_ron_never_crashes(text):
    with pytest.raises(hccl.TopologyError):
        hccl.Topology.from_ron(text, "fuzz.ron")


def test_wrong_types():
    with pytest.raises(TypeError):
        hccl.Topology.load(42)
    with pytest.raises(TypeError):
        hccl.Topology.ring("four", 10, 1)
    with pytest.raises(TypeError):
        hccl.Topology(None)

"""The package as users see it: imports, stubs, docstrings, the error hierarchy, sizes."""

import inspect
from pathlib import Path

import pytest

import hccl
from hccl import _hccl


def test_version_and_public_names():
    assert hccl.__version__
    for name in hccl.__all__:
        assert hasattr(hccl, name), name


def test_error_hierarchy():
    for cls in (hccl.TopologyError, hccl.PlanError, hccl.VerifyError, hccl.CompileError, hccl.AlgorithmError):
        assert issubclass(cls, hccl.Error)
        assert not issubclass(hccl.Error, cls)
    assert issubclass(hccl.Error, Exception)


def test_everything_public_is_documented():
    for name in hccl.__all__:
        obj = getattr(hccl, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"
    for cls in (hccl.Topology, hccl.Plan, hccl.Algorithm, hccl.Ref, hccl.Table):
        for attr, member in vars(cls).items():
            if attr.startswith("_") or not callable(member):
                continue
            if attr in ("input", "output", "scratch"):
                continue
            assert getattr(cls, attr).__doc__, f"{cls.__name__}.{attr} has no docstring"


def test_type_stubs_ship_with_the_package():
    pkg = Path(hccl.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = (pkg / "_hccl.pyi").read_text()
    for name in ("class Topology", "class Plan", "class Built", "def compile", "def build_algorithm"):
        assert name in stub
    # Every native function and class the stub declares exists.
    for name in ("Topology", "Plan", "Built", "compile", "build_algorithm", "trace_svg", "parse_bytes", "geometric_sizes"):
        assert hasattr(_hccl, name), name


@pytest.mark.parametrize(
    "spec, want",
    [
        ("1K..8K", [1024, 2048, 4096, 8192]),
        ("16M", [16 << 20]),
        (4096, [4096]),
        (["1K", 512, "1K"], [512, 1024]),
    ],
)
def test_sizes(spec, want):
    assert hccl.sizes(spec) == want


def test_default_sizes_are_hcclcs():
    s = hccl.sizes()
    assert s[0] == 1024 and s[-1] == 4 << 30 and len(s) == 23


@pytest.mark.parametrize("bad", ["", "12Q", "8K..1K", "0", 0, -3, []])
def test_bad_sizes(bad):
    with pytest.raises(hccl.CompileError):
        hccl.sizes(bad)


@pytest.mark.parametrize("bad", [1.5, object(), True])
def test_sizes_of_wrong_type(bad):
    with pytest.raises(TypeError):
        hccl.sizes(bad)

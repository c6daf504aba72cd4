"""Shared fixtures: the repository, shipped topologies, the msccl-tools XML and hcclc."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hccl

# Compiles read and write the synthesis cache: the tests' own, never the user's.
os.environ["HCCL_CACHE_DIR"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"hccl-pytest-cache-{os.getpid()}"
)

REPO = Path(__file__).resolve().parents[2]
# MSCCL XML that msccl-tools generated (copied from ../shared/msccl with its provenance).
MSCCL = REPO / "ir" / "tests" / "data" / "msccl"


@pytest.fixture(scope="session")
def dgx1() -> hccl.Topology:
    return hccl.topology("dgx1-v100")


@pytest.fixture(scope="session")
def msccl_dir() -> Path:
    if not MSCCL.is_dir():
        pytest.skip(f"{MSCCL}: the msccl-tools XML test data is missing from this checkout")
    return MSCCL


@pytest.fixture(scope="session")
def hcclc() -> str:
    """The hcclc binary: $HCCLC, else target/{release,debug}/hcclc, else on PATH."""
    candidates = [os.environ.get("HCCLC")]
    candidates += [str(REPO / "target" / p / "hcclc") for p in ("release", "debug")]
    candidates.append(shutil.which("hcclc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    pytest.skip("no hcclc binary: build it with `cargo build -p hcclc`")


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)

"""`python/examples/tutorial.py` runs top to bottom (its own asserts check what its prose
claims) and shows the VerifyError at the line of its deliberate bug."""

import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "examples" / "tutorial.py"


def test_tutorial_runs_and_shows_the_bug_line(tmp_path):
    lines = TUTORIAL.read_text(encoding="utf-8").splitlines()
    (bug_line,) = [i for i, line in enumerate(lines, 1) if line.rstrip().endswith("<- bug")]
    done = subprocess.run(
        [sys.executable, str(TUTORIAL)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"VerifyError: {TUTORIAL}:{bug_line}: rank 0" in out, out
    assert f"at line {bug_line}: " in out
    assert "all claims hold" in out
    assert list(tmp_path.iterdir()) == []  # its files went to a temporary directory

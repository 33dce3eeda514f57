"""Every Triton kernel, launched as its wrapper launches it at the 27B shapes, compiles for sm_86 (RTX 3090) and
sm_90 and fits the card's shared memory — checked without a GPU by tools/aot_compile.py, in a process of its own
because the kernels must be imported without TRITON_INTERPRET."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_kernels_compile_for_sm86_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tools.aot_compile"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert " 0 failed" in run.stdout

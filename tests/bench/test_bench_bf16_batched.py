"""bench/bench_bf16_batched.py times one batched row under each arm that runs here, each arm's
product checked against float32's. Run in a child process: bf16 is the process's precision."""
import pathlib
import subprocess
import sys

import pytest

from cct import _C
from cct.backend import mkl

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_each_arm_times_the_row_and_agrees_with_float32():
    if not _C.bf16_kernel_supported() and mkl.library_path() is None:
        pytest.skip("no bf16 engine here: neither AVX512-BF16 nor MKL (pip install -e "
                    "\".[mkl]\")")
    bench = ROOT / "bench" / "bench_bf16_batched.py"
    code = f"""
import importlib.util, sys
sys.path.insert(0, {str(ROOT)!r})
spec = importlib.util.spec_from_file_location("b", {str(bench)!r})
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
from cct import _C
from cct.backend import onednn, precision
assert precision.set_precision("bf16", emulate=True) == "bf16"
onednn.offer()  # where installed, its matmul is an arm (13) too
arms = b.arms_here()
assert (13 in arms) == _C.onednn_offered(True)
# Winograd's forward products: 16 items of (m x k) by (k x n), written over
row = (False, False, 24, 40, 16, 16, 2, _C.blas_num_threads(), False, 7)
t = b.row_times(row, arms, 2)
assert sorted(t) == arms and all(v > 0 for v in t.values()), t
assert 0 in arms and 7 in arms
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr

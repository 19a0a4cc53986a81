"""bench/bench_thin_gemm.py times MKL's sgemm (cct's GEMM choice 5) on the operands of cct's
plan rows. It checks MKL's result against OpenBLAS's direct order on every row, so a row whose
operands did not mean what the row says would fail; here every operand order and accumulate
runs once, in a child process (MKL's threading layer is set once per process)."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_thin_gemm",
                                              ROOT / "bench" / "bench_thin_gemm.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_operands_are_stored_as_the_row_says(ta, tb):
    a, b, out = bench.operands([ta, tb, 3, 5, 7, 4, 1, False, False],
                               np.random.default_rng(0))
    assert a.shape == ((7, 3) if ta else (3, 7))
    assert b.shape == ((5, 7) if tb else (7, 5))
    assert out.shape == (3, 5) and not out.any()


def test_every_gemm_choice_has_a_name():
    """The table names each row's plan; a choice only some CPUs make (the 16-lane skinny tile,
    on AVX-512 ones) once ended the bench there with a KeyError."""
    from cct.backend import plans
    for choice in (0, 1, 2, 3, plans.MKL_CHOICE, *plans.SKINNY_CHOICES,
                   *plans.BF16_ENGINE_CHOICES):
        assert choice in bench.CHOICE_NAMES, choice


def needs_mkl():
    from cct.backend import mkl
    if mkl.library_path() is None:
        pytest.skip("MKL is not installed (pip install -e \".[mkl]\")")


def run_with_the_bench(body: str, with_mkl: bool = True) -> None:
    """Runs ``body`` in a child process with the bench loaded as ``b`` and, ``with_mkl``, MKL
    loaded through it (MKL's threading layer is set once per process); it must print "ok"."""
    code = f"""
import importlib.util, pathlib, sys
sys.path.insert(0, {str(ROOT)!r})
spec = importlib.util.spec_from_file_location("b", {str(ROOT / "bench" / "bench_thin_gemm.py")!r})
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
""" + ("with_mkl, note = b.load_mkl()\nassert with_mkl, note\n" if with_mkl else "") + \
        body + "\nprint('ok')\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_mkl_computes_the_rows_product_in_every_operand_order():
    needs_mkl()
    run_with_the_bench("""
from cct import _C
for ta in (False, True):
    for tb in (False, True):
        for acc in (False, True):
            row = [ta, tb, 13, 70, 33, 4, _C.blas_num_threads(), acc, False]
            t = b.shape_times(row, with_mkl, 1)
            assert set(t) == {"cct", "mkl"}, t
# PyTorch's libgomp would be the one MKL's threads run on (cct/backend/mkl.py).
assert "torch" not in sys.modules
""")


def test_pytorch_is_timed_in_a_process_of_its_own():
    """One time per shape from the worker, and PyTorch never imported by the bench's own
    process, where MKL runs."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (the bench's peer column)")
    run_with_the_bench("""
rows = [[False, True, 3, 5, 7, 4, 1, False, False], [True, False, 9, 2, 4, 4, 1, True, 5]]
times = b.torch_times(rows, 1, 1)
assert len(times) == 2 and all(t > 0 for t in times), times
assert "torch" not in sys.modules
""", with_mkl=False)


def test_the_iteration_is_timed_with_mkl_in_the_races_and_without():
    """Both tables run LeNet (the same convolution plans, the GEMM choices each race's), and
    the count of shapes that chose MKL comes from the table the races made with it."""
    needs_mkl()
    from bench.bench_train import default_zoo  # importable once the bench put the repo on the path
    zoo = default_zoo()
    net = zoo / bench.NETS["lenet"][0]
    if not net.is_file():
        pytest.skip(f"no {net} (the shared folder's caffe-zoo; set CCT_SHARED)")
    run_with_the_bench(f"""
it = b.iteration_with_and_without("lenet", pathlib.Path({str(zoo)!r}), 1, 1)
assert it["with"] > 0 and it["without"] > 0, it
assert it["shapes"] > 0 and 0 <= it["chose_mkl"] <= it["shapes"], it
""")


def test_a_batched_row_is_timed_in_openblas_and_in_mkl():
    """A batched row as the plan table holds it (ten fields, float32's element size 4): both
    engines timed on the same operands (the bench checks their products agree), and the row's
    own choice installed again after."""
    needs_mkl()
    run_with_the_bench("""
from cct import _C
row = [False, True, 24, 40, 16, 16, 4, _C.blas_num_threads(), True, 0]
t = b.batch_shape_times(row, 1)
assert set(t) == {"blas", "mkl"} and min(t.values()) > 0, t
assert _C.gemm_batch_choices() == [tuple(row)], _C.gemm_batch_choices()
""")

"""Shared test settings: where the large fixtures written by real Caffe live.

CCT_SHARED points at the shared folder (default: ../shared beside the repository); tests that
need it skip with the reason when it is absent.
"""
import os
import pathlib

import pytest

# Kernel plans are timed per test process, not read from or written to the user's cache
# (tests/test_reproducible.py and tests/backend/test_plans.py give it a folder of their own).
os.environ.setdefault("CCT_PLAN_CACHE", "off")

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("CCT_SHARED", REPO.parent / "shared"))
CAFFE_FIXTURES = SHARED / "fixtures" / "caffe"
CAFFE_ZOO = SHARED / "caffe-zoo"


def need(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (set CCT_SHARED to the folder holding fixtures/ and "
                    f"caffe-zoo/)")
    return path


@pytest.fixture
def caffe_fixtures() -> pathlib.Path:
    return need(CAFFE_FIXTURES)


@pytest.fixture
def caffe_zoo() -> pathlib.Path:
    return need(CAFFE_ZOO)


@pytest.fixture(autouse=True)
def thread_counts_kept():
    """A test leaves the process's thread counts as it found them: the GEMMs' plans are keyed
    by the BLAS's count and OpenBLAS rounds with it, so one left behind (a scheduler never
    closed) made a later test's bit-for-bit comparison depend on which order a timing race
    chose."""
    from cct.native import _C
    before = (_C.blas_num_threads(), _C.get_num_threads())
    yield
    after = (_C.blas_num_threads(), _C.get_num_threads())
    if after != before:
        _C.set_blas_num_threads(before[0])
        _C.set_num_threads(before[1])
        pytest.fail(f"the test left (BLAS threads, cct threads) at {after}, not {before} (put "
                    f"back now): close what set them", pytrace=False)

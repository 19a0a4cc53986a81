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

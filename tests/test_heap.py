"""cct/heap.py: glibc's malloc keeps freed memory once a net is built, unless the user said
otherwise; checked in fresh interpreters (the setting is process-wide and once only)."""
import os
import platform
import subprocess
import sys

import pytest

from cct import heap

PROBE = """
from cct import heap
first = heap.keep_freed_memory()
again = heap.keep_freed_memory()
print(first, again)
"""


def run_probe(**env):
    clean = {k: v for k, v in os.environ.items()
             if k not in heap._USER_SETTINGS and k != "CCT_MALLOC"}
    clean.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt: Linux with glibc only")
def test_thresholds_are_set_once_on_glibc():
    assert run_probe() == ["True", "False"]


@pytest.mark.parametrize("env", [{"CCT_MALLOC": "default"},
                                 {"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"MALLOC_TRIM_THRESHOLD_": "131072"}])
def test_the_users_allocator_settings_are_left_alone(env):
    assert run_probe(**env) == ["False", "False"]


def test_building_a_net_sets_them(tmp_path):
    code = ("import cct\nfrom cct import heap\nfrom cct.glog import set_quiet\nset_quiet(True)\n"
            "assert not heap._state['done']\n"
            "cct.Net(cct.proto.caffe_pb2.NetParameter(name='empty'), cct.TEST)\n"
            "print(heap._state['done'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"]

"""cct's AVX-512 tiles, run on a CPU without AVX-512 (csrc/avx512.h).

The skinny GEMM engine's 16-lane tile, the thin GEMM engine's 16-lane tile and the direct
convolution's 16-pixel tile run only on CPUs with AVX-512F, and bf16's kernel (its direct
order, skinny and thin forms) only on CPUs with AVX512-BF16; the races pick them by speed
there. A wrong index in any would train wrong numbers on exactly those CPUs, while every test
on an AVX2 machine skipped them. This builds a second ``_C`` from the source tree with CMake's
CCT_EMULATE_AVX512, whose tiles are the same source compiled for AVX2 through SIMDe's AVX-512
intrinsics (each lane's FMA rounded once, as AVX-512's) and, for VDPBF16PS, cct's emulation of
the instruction as Intel's SDM defines it. It runs the tiles' own tests on it in a subprocess:
they compare the 16-lane tiles with the 8-lane ones and with the FMA chains they promise, and
bf16's forms with each other and with VDPBF16PS's chain (test_bf16_kernel.py). Where the CPU
has AVX-512F and AVX512-BF16, those tests run the real tiles in the ordinary run and this one
skips; where it has AVX-512F alone (a Skylake-X, an Ice Lake), this one runs for bf16's kernel.

Needs the source tree, GCC, CMake, pybind11 and SIMDe's headers (``simde-py``): the
``test-full`` extra, which CI installs. It skips, saying which is missing, without them.
"""
import os
import pathlib
import platform
import shutil
import subprocess
import sys

import pytest

import cct
from cct import _C

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(cct.__file__).resolve().parent
#: the tests of the tiles (and of the plans that race them), run on the emulated build
TILE_TESTS = ("test_gemm_skinny.py", "test_gemm_thin.py", "test_cpu_kernels.py",
              "test_plans.py", "test_bf16_kernel.py", "test_bf16_skinny.py", "test_bf16_thin.py",
              "test_bf16.py")


def _why_not() -> str:
    """Why the emulated build cannot be made or is not needed here; '' when it can."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return "the AVX-512 tiles are x86-64 Linux code"
    if not _C.gemm_skinny_available():
        return "this CPU has no AVX2 and FMA, which the emulated tiles are built for"
    if _C.cpu_has_avx512() and _C.bf16_kernel_supported():
        return ("this CPU has AVX-512F and AVX512-BF16: the tiles' tests (test_gemm_skinny.py, "
                "test_bf16_kernel.py, ...) run the real tiles")
    if not (REPO / "CMakeLists.txt").is_file() or not (REPO / "csrc" / "avx512.h").is_file():
        return f"{REPO} is not cct's source tree (CMakeLists.txt, csrc/)"
    missing = [name for name in ("simde_py", "pybind11")
               if not _importable(name)]
    if _cmake() is None:
        missing.append("cmake")
    if missing:
        return (f"the emulated build needs {', '.join(missing)} (pip install simde-py pybind11 "
                f"cmake, or the test-full extra)")
    return ""


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _cmake():
    found = shutil.which("cmake")
    if found:
        return found
    try:
        import cmake  # the PyPI package puts its binary beside itself
    except ImportError:
        return None
    candidate = pathlib.Path(cmake.CMAKE_BIN_DIR) / "cmake"
    return str(candidate) if candidate.is_file() else None


def _blas_args() -> list:
    """The BLAS the installed _C links: the scipy-openblas32 library setup.py put beside it, or
    the system's."""
    vendored = sorted(PACKAGE.glob("libscipy_openblas*.so*"))
    if vendored:
        return ["-DCCT_BLAS=scipy", f"-DCCT_BLAS_LIBRARY={vendored[0]}"]
    return ["-DCCT_BLAS=system"]


def _run(command, cwd, **kwargs):
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kwargs)
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """A folder holding a copy of the cct package whose _C emulates the AVX-512 tiles, and a
    copy of tests/ beside it (run from there, no source tree's cct/ can shadow the copy)."""
    why = _why_not()
    if why:
        pytest.skip(why)
    import pybind11
    import simde_py

    root = tmp_path_factory.mktemp("avx512_emulated")
    build, out = root / "build", root / "out"
    build.mkdir()
    configure = [_cmake(), str(REPO), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}",
                 f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                 f"-DCCT_EMULATE_AVX512={simde_py.get_include()}"] + _blas_args()
    rc, log = _run(configure, build)
    if rc != 0 and "CCT_EMULATE_AVX512 needs GCC" in log:
        pytest.skip("the emulated build needs GCC (csrc/avx512.h)")
    assert rc == 0, f"CMake's configure failed:\n{log[-4000:]}"
    rc, log = _run([_cmake(), "--build", ".", "-j", str(os.cpu_count() or 1)], build)
    assert rc == 0, f"the emulated build failed:\n{log[-4000:]}"
    built = list(out.glob("_C*.so"))
    assert len(built) == 1, f"expected one _C in {out}, found {built}"

    site = root / "site"
    shutil.copytree(PACKAGE, site / "cct",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*.so", "_C*.pyd"))
    shutil.copy2(built[0], site / "cct" / built[0].name)
    shutil.copytree(REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    # The fixtures stay where this run finds them (tests/conftest.py's SHARED).
    from tests.conftest import SHARED
    env["CCT_SHARED"] = str(SHARED)
    return root, site, env


def test_the_emulated_build_runs_the_tiles_and_nothing_else_changes(emulated):
    root, site, env = emulated
    probe = ("import cct\nfrom cct import _C\n"
             "print(cct.__file__)\n"
             "print(_C.cpu_has_avx512(), _C.gemm_skinny16_available(),"
             " _C.gemm_thin16_available(), _C.bf16_kernel_supported())\n")
    rc, out = _run([sys.executable, "-c", probe], root, env=env)
    assert rc == 0, out
    path, flags = out.split("\n")[:2]
    assert pathlib.Path(path).resolve().is_relative_to(site.resolve()), (
        f"the subprocess imported {path}, not the emulated copy under {site}")
    assert flags == "True True True True", (
        f"the emulated build does not offer the tiles: {flags}")


def test_the_16_lane_tiles_give_the_bits_they_promise(emulated):
    root, _, env = emulated
    tests = [str(root / "tests" / "backend" / name) for name in TILE_TESTS]
    rc, out = _run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
                   + tests, root, env=env, timeout=1800)
    tail = out[-6000:]
    assert rc == 0, f"the tiles' tests failed on the emulated AVX-512 build:\n{tail}"
    # Every test of the tiles ran: none skipped for want of AVX-512 or AVX512-BF16.
    summary = out.split("short test summary info")[-1]
    assert "AVX-512" not in summary and "AVX512-BF16" not in summary, tail
    assert " passed" in tail, tail

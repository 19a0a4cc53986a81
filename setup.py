"""Build cct: the Python package plus the C++ extension ``cct._C`` compiled by CMake.

BLAS: by default ``cct._C`` links the OpenBLAS shipped in the ``scipy-openblas32`` wheel (a
pinned build requirement in pyproject.toml) and that library is copied next to ``cct/_C*.so``,
found at run time through an ``$ORIGIN`` rpath, so the installed package does not need the
wheel. ``CCT_BLAS=system pip install .`` links the system's BLAS instead (CMake's
``find_package(BLAS)``; ``CCT_BLA_VENDOR=OpenBLAS`` picks a vendor).
"""
import os
import pathlib
import runpy
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


def _blas_cmake_args(out_dir: pathlib.Path, vendored: list) -> list:
    """CMake arguments choosing the BLAS. For the wheel's OpenBLAS, also copies its shared
    libraries into ``out_dir`` (the package folder that receives ``_C``), listing their names
    in ``vendored``."""
    choice = os.environ.get("CCT_BLAS", "scipy").lower()
    if choice == "system":
        args = ["-DCCT_BLAS=system"]
        if os.environ.get("CCT_BLA_VENDOR"):
            args.append(f"-DBLA_VENDOR={os.environ['CCT_BLA_VENDOR']}")
        return args
    if choice != "scipy":
        sys.exit(f"CCT_BLAS must be 'scipy' (the default) or 'system', not {choice!r}")
    import scipy_openblas32

    lib_dir = pathlib.Path(scipy_openblas32.get_lib_dir())
    library = scipy_openblas32.get_library(fullname=True)
    # The library and whatever it loads beside it (some builds ship libgfortran there).
    for so in lib_dir.glob("*.so*"):
        shutil.copy2(so, out_dir / so.name)
        vendored.append(so.name)
    return ["-DCCT_BLAS=scipy", f"-DCCT_BLAS_LIBRARY={out_dir / library}"]


class CMakeBuild(build_ext):
    """Configure and build CMakeLists.txt, placing the module where setuptools expects it."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.vendored = []  # names of the BLAS libraries copied beside _C

    def build_extension(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = pathlib.Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if self.debug else "Release"
        cmake_args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
        ] + _blas_cmake_args(out_dir, self.vendored)
        cmake = os.environ.get("CMAKE", "cmake")
        subprocess.check_call([cmake, str(ROOT)] + cmake_args, cwd=build_dir)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call([cmake, "--build", ".", "--config", cfg, "-j", jobs], cwd=build_dir)

    def copy_extensions_to_source(self) -> None:
        """In-place and editable builds: the vendored BLAS goes beside ``_C`` as well."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            for name in self.vendored:
                src = pathlib.Path(regular_file).parent / name
                self.copy_file(str(src), str(pathlib.Path(inplace_file).parent / name))


MKL = "mkl>=2021; platform_machine == 'x86_64' and sys_platform == 'linux'"

# The distribution name, kept in cct/install.py with the install hints that name it; read
# without importing cct, whose dependencies are not installed yet.
DIST = runpy.run_path(str(ROOT / "cct" / "install.py"))["DIST"]

EXTRAS = {
    # cct train -precision=bf16: Intel MKL's bf16 GEMM, loaded at run time
    # (cct/backend/precision.py). x86-64 Linux only, as the wheel is.
    "bf16": [MKL],
    # Intel MKL's sgemm as a candidate in the float32 GEMM races (cct/backend/mkl.py): on
    # Intel's CPUs the small-GEMM kernels OpenBLAS lacks there.
    "mkl": [MKL],
    # oneDNN's convolutions as a layout in the convolution races (cct/backend/onednn.py): on
    # Intel's Xeons with AMX, bf16 convolutions on AMX's tiles. x86-64 Linux, GNU OpenMP build.
    "onednn": ["onednn-cpu-gomp>=2023.0; platform_machine == 'x86_64' and sys_platform == "
               "'linux'"],
    # cct train --engine=ray: groups and the parameter store's shards as Ray actors.
    "ray": ["ray>=2.60"],
    # caffe.io.resize_image calls what Caffe's io.py calls (scikit-image, SciPy's zoom)
    # when they are there; without them orders 0 and 1 agree to 2e-6, 2 to 5 are refused.
    "io": ["scikit-image>=0.19", "scipy>=1.6"],
    # cct export_onnx writes ONNX through the onnx package; --check runs ONNX Runtime.
    "onnx": ["onnx>=1.16", "onnxruntime>=1.18"],
    # cct plot_log needs matplotlib; cct draw_net uses Graphviz through pydot when both
    # are there (`dot` comes from the system's graphviz package) and Pillow otherwise.
    "plot": ["matplotlib>=3.5", "pydot>=1.4"],
    # Data layers with `backend: LEVELDB` (Caffe's default backend) read through plyvel.
    "leveldb": ["plyvel>=1.3"],
    # bench/bench_train.py compares with PyTorch (CPU) when it is installed.
    "bench": ["torch==2.13.0"],
    # The GPU backend (cct/backend/gpu.py) runs on CuPy: one wheel per CUDA major version,
    # to match the NVIDIA driver. Without it cct runs on the CPU and says so once.
    # cuDNN's convolutions come through NVIDIA's frontend (cct/backend/cudnn.py) with the
    # cuDNN runtime of the same CUDA major; without them the GPU lowers every convolution.
    "gpu": ["cupy-cuda12x>=13.3,<15", "nvidia-cudnn-frontend>=1.8", "nvidia-cudnn-cu12>=9"],
    "gpu-cuda13": ["cupy-cuda13x>=13.6,<15", "nvidia-cudnn-frontend>=1.8",
                   "nvidia-cudnn-cu13>=9"],
    # The quick start's test run: what every test needs (hypothesis drives tests/fuzz). The
    # tests of the optional parts skip, saying why, without their packages.
    "test": ["pytest>=7", "hypothesis>=6.100"],
}
# CI's run (.ci/run): the light extra plus the optional parts whose tests skip without them,
# about 2.1 GB (MKL, oneDNN, Ray, ONNX Runtime). grpcio-tools is pinned to the protoc that generated the
# committed caffe_pb2.py, for tests/test_proto.py's freshness check; it requires protobuf 6,
# so this extra downgrades a protobuf 7 and the light one must never hold it.
# simde-py, pybind11 and CMake: tests/backend/test_avx512_emulated.py builds a second _C whose
# AVX-512 tiles run on AVX2 through SIMDe's headers (pinned: an sdist of headers only).
EXTRAS["test-full"] = (EXTRAS["test"] + EXTRAS["onnx"] + EXTRAS["io"] + EXTRAS["ray"]
                       + EXTRAS["bf16"] + EXTRAS["onednn"] + ["matplotlib>=3.5", "grpcio-tools==1.75.1",
                                           "simde-py==0.8.2.post1", "pybind11>=2.12",
                                           "cmake>=3.18"])

setup(
    name=DIST,
    version="0.1.0",
    description="Caffe-compatible CNN training engine (Caffe con Troll lineage)",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-2-Clause",
    python_requires=">=3.9",
    packages=find_packages(include=["cct", "cct.*"]),
    ext_modules=[CMakeExtension("cct._C")],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=[
        "numpy>=1.24",
        # The committed caffe_pb2.py is generated by protoc 6.31.1 (grpcio-tools 1.75.1);
        # such gencode runs on the 6.x runtimes from 6.31.1 on and on 7.x.
        "protobuf>=6.31.1,<8",
        "lmdb>=1.4",
        "h5py>=3.8",
        "Pillow>=9.0",
        # cct train's live progress line on a terminal (cct/progress.py).
        "tqdm>=4.60",
        # The solver rules other than SGD as fused CPU kernels (cct/backend/jit.py).
        "numba>=0.59",
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["cct=cct.cli:main"]},
    zip_safe=False,
)

"""Installing cct (issue 31): the source tree without its extension says so, every install hint
names cct's own distribution, and the quick start's light test extra stays light."""
import ast
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys

import pytest
import setuptools

from cct import install

REPO = pathlib.Path(__file__).resolve().parents[1]
# The packages of the optional parts, which the light `test` extra leaves out: a test module
# importing one at its top would stop the quick start's run at collection instead of skipping.
HEAVY = {"onnx", "onnxruntime", "ray", "skimage", "scipy", "grpc_tools", "matplotlib", "mkl",
         "pydot", "plyvel", "torch", "cupy"}
HEAVY_DISTS = {"onnx", "onnxruntime", "ray", "scikit-image", "scipy", "grpcio-tools",
               "matplotlib", "mkl", "pydot", "plyvel", "torch"}


@pytest.fixture(scope="module")
def setup_kwargs():
    """What setup.py hands to setuptools.setup, without building anything."""
    seen = {}
    real, cwd = setuptools.setup, os.getcwd()
    setuptools.setup = lambda **kwargs: seen.update(kwargs)
    os.chdir(REPO)  # find_packages looks in the current folder, as pip runs setup.py
    try:
        runpy.run_path(str(REPO / "setup.py"))
    finally:
        setuptools.setup = real
        os.chdir(cwd)
    return seen


def dist_names(requirements) -> set:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.fixture
def source_tree_without_extension(tmp_path):
    """The package's Python files alone, as `pip install .` leaves the checkout (the extension
    and the BLAS beside it go to site-packages)."""
    shutil.copytree(REPO / "cct", tmp_path / "cct",
                    ignore=shutil.ignore_patterns("*.so", "*.so.*", "__pycache__"))
    return tmp_path


def import_cct(cwd, path_first) -> subprocess.CompletedProcess:
    """`import cct` with ``path_first`` ahead of the installed cct. An editable install's
    finder would hand the tree the checkout's cct._C; a `pip install .` has no such finder, so
    it goes."""
    code = (f"import sys; sys.path.insert(0, {str(path_first)!r}); "
            f"sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in f.__module__]; "
            f"import cct")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_source_tree_without_its_extension_says_so(source_tree_without_extension):
    tree = source_tree_without_extension
    run = import_cct(tree, tree)
    assert run.returncode != 0
    assert "circular import" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: cct's compiled extension cct._C is not in {tree / 'cct'}: "
                    f"you are importing the source tree at {tree} (the current folder) rather "
                    f"than the installed cct; run from another folder, or build in place with "
                    f"pip install -e ."), run.stderr


def test_from_another_folder_the_message_names_the_tree(source_tree_without_extension, tmp_path):
    tree = source_tree_without_extension
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = import_cct(elsewhere, tree)
    assert "circular import" not in run.stderr
    assert run.stderr.strip().endswith(f"source tree at {tree} rather than the installed cct; "
                                       f"run from another folder, or build in place with "
                                       f"pip install -e {tree}"), run.stderr


def test_install_hint_in_the_checkout(monkeypatch, tmp_path):
    assert install.source_checkout() == REPO
    monkeypatch.chdir(REPO)
    assert install.install_hint("onnx") == "pip install -e '.[onnx]'"
    monkeypatch.chdir(tmp_path)
    assert install.install_hint("onnx") == f"pip install -e '{REPO}[onnx]'"


def test_install_hint_for_an_installed_copy(tmp_path):
    """In site-packages no setup.py sits beside the package: the hint names the distribution,
    never `cct`, which on PyPI is another project."""
    (tmp_path / "cct").mkdir()
    shutil.copy(REPO / "cct" / "install.py", tmp_path / "cct" / "install.py")
    copy = runpy.run_path(str(tmp_path / "cct" / "install.py"))
    assert copy["source_checkout"]() is None
    assert copy["install_hint"]("ray") == "pip install 'cct-caffe[ray]'"


def test_the_distribution_is_cct_caffe(setup_kwargs):
    assert setup_kwargs["name"] == install.DIST == "cct-caffe"
    assert setup_kwargs["packages"][0] == "cct"


def test_every_message_names_an_extra_that_exists_and_never_the_pypi_cct(setup_kwargs):
    extras = setup_kwargs["extras_require"]
    wrong = []
    for path in sorted((REPO / "cct").rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(REPO)
        wrong += [f"{where}: install_hint({name!r}) is no extra"
                  for name in re.findall(r"install_hint\(\s*['\"]([\w-]+)['\"]", text)
                  if name not in extras]
        if path.name != "install.py":
            wrong += [f"{where}: {m.group(0)}"
                      for m in re.finditer(r"pip install ['\"]?(cct|\.)\[", text)]
    assert not wrong, "; ".join(wrong) + " (use cct.install.install_hint)"


def test_the_light_test_extra_holds_no_heavy_package(setup_kwargs):
    extras = setup_kwargs["extras_require"]
    light, full = dist_names(extras["test"]), dist_names(extras["test-full"])
    assert {"pytest", "hypothesis"} <= light
    assert not light & HEAVY_DISTS, light & HEAVY_DISTS
    # grpcio-tools needs protobuf 6: in the light extra it would downgrade a protobuf 7.
    assert light | {"grpcio-tools", "onnx", "onnxruntime", "ray", "scipy", "scikit-image",
                    "mkl", "matplotlib"} <= full
    assert any(r.startswith("protobuf") and "<8" in r for r in setup_kwargs["install_requires"])


def test_ci_installs_the_full_extra_and_runs_the_readme_command():
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert any("pip install" in line and '".[test-full]"' in line
               and line.endswith("python -m pytest -q") for line in lines)


def module_level_imports(path: pathlib.Path) -> set:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_an_optional_package_at_its_top():
    offenders = [f"{path.relative_to(REPO)} imports {', '.join(sorted(heavy))}"
                 for path in sorted((REPO / "tests").rglob("*.py"))
                 for heavy in [module_level_imports(path) & HEAVY] if heavy]
    assert not offenders, ("; ".join(offenders) + ": use pytest.importorskip(name, reason=...) "
                           "so the light test extra skips them")

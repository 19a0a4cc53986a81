"""``import caffe`` answered by cct: a Python layer module written for Caffe (``import caffe``,
``class L(caffe.Layer)``) trains unchanged under cct.Net, a cct Solver and ``cct train``; the
log says which ``caffe`` it got; ``python -m cct.as_caffe`` runs unchanged scripts; an installed
Caffe is never shadowed unless asked."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cct
from cct import caffe_alias

LAYER_SOURCE = '''
import caffe


class Scale(caffe.Layer):
    """top = w * bottom, w a learnable scalar starting at 2."""

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[...] = 2.0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        import caffe   # a later import inside a method finds the same package
        assert issubclass(Scale, caffe.Layer)
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += (top[0].diff * bottom[0].data).sum()
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff
'''

NET = '''
name: "alias"
layer { name: "data" type: "DummyData" top: "data"
        dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "constant" value: 1 } } }
layer { name: "scale" type: "Python" bottom: "data" top: "scaled"
        python_param { module: "MODULE" layer: "Scale" } }
layer { name: "loss" type: "Reduction" bottom: "scaled" top: "loss"
        reduction_param { operation: SUMSQ } loss_weight: 1 }
'''

SOLVER = '''
net: "net.prototxt"
base_lr: 0.01
lr_policy: "fixed"
max_iter: 2
display: 1
snapshot_after_train: false
solver_mode: CPU
'''


@pytest.fixture
def layer_dir(tmp_path, monkeypatch, request):
    """A layer module beginning ``import caffe``, a net and a solver in tmp_path; ``caffe`` and
    the module are forgotten afterwards so other tests see a clean sys.modules."""
    module = "cct_alias_layer_" + request.node.name.replace("[", "_").replace("]", "")
    (tmp_path / f"{module}.py").write_text(LAYER_SOURCE)
    (tmp_path / "net.prototxt").write_text(NET.replace("MODULE", module))
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(caffe_alias.ENV, raising=False)
    yield tmp_path, module
    for name in [n for n in sys.modules if n == "caffe" or n.startswith("caffe.") or n == module]:
        del sys.modules[name]
    if caffe_alias._FINDER in sys.meta_path:
        sys.meta_path.remove(caffe_alias._FINDER)
    caffe_alias._reported.discard(module)


def _env(*paths):
    env = dict(os.environ)
    env.pop(caffe_alias.ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")])
    return env


def _fake_caffe(root):
    """A 'real' Caffe package, as an installed pycaffe would be, with its own Layer."""
    (root / "caffe").mkdir(parents=True)
    (root / "caffe" / "__init__.py").write_text("REAL = True\n\nclass Layer:\n    pass\n")
    return root


def test_a_caffe_layer_module_runs_unchanged_in_net_and_solver(layer_dir, caplog):
    tmp_path, module = layer_dir
    net = cct.Net(str(tmp_path / "net.prototxt"), cct.TRAIN)
    assert sys.modules["caffe"] is cct
    assert isinstance(net.layer_dict["scale"].impl, cct.Layer)
    out = net.forward()
    assert out["loss"] == pytest.approx(6 * 2.0 ** 2)

    solver = cct.SGDSolver(str(tmp_path / "solver.prototxt"))
    w0 = float(solver.net.params["scale"][0].data[0])
    solver.step(2)
    assert solver.iter == 2
    # d/dw sum((w x)^2) = 2 w sum(x^2) = 24 at w = 2: the param moved by lr times that.
    assert float(solver.net.params["scale"][0].data[0]) < w0 - 0.2


def test_the_log_says_which_caffe_a_layer_module_got(layer_dir, capfd):
    tmp_path, module = layer_dir
    cct.Net(str(tmp_path / "net.prototxt"), cct.TRAIN)
    err = capfd.readouterr().err
    assert (f"python_layer.py:0] `import caffe` in Python layer module '{module}' is cct "
            f"{cct.__version__} (no Caffe installed)") in err


def test_submodules_alias_to_cct(layer_dir):
    cct.install_as_caffe()
    from caffe.proto import caffe_pb2
    import caffe.io
    assert caffe_pb2 is cct.proto.caffe_pb2
    assert caffe.io is sys.modules["cct.io"]
    assert sys.modules["cct.io"].__spec__.name == "cct.io"


def test_cct_train_runs_a_caffe_layer_module_unchanged(layer_dir):
    tmp_path, module = layer_dir
    (tmp_path / "caffe").mkdir()   # a folder without __init__.py (a source checkout) is no Caffe
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "-solver", "solver.prototxt"],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"'{module}' is cct {cct.__version__}" in run.stderr
    assert "Iteration 2" in run.stderr and "Optimization Done" in run.stderr


def test_an_installed_caffe_is_not_shadowed(layer_dir, tmp_path_factory):
    tmp_path, module = layer_dir
    real = _fake_caffe(tmp_path_factory.mktemp("site"))
    script = textwrap.dedent(f"""
        import cct, caffe
        assert getattr(caffe, "REAL", False) and caffe is not cct
        try:
            cct.Net("net.prototxt", cct.TRAIN)
        except cct.CCTError as e:
            print("ERROR", e)
        import caffe
        assert caffe.REAL
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path,
                         env=_env(real, tmp_path), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"'{module}' is the installed Caffe at {real / 'caffe'}" in run.stderr
    assert "ERROR" in run.stdout and f"'{module}.Scale'" in run.stdout
    assert "CCT_AS_CAFFE=1" in run.stdout

    # The opt-in: CCT_AS_CAFFE=1 gives the layer module cct although a Caffe is installed.
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "-solver", "solver.prototxt"],
                         cwd=tmp_path, env={**_env(real, tmp_path), caffe_alias.ENV: "1"},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"'{module}' is cct {cct.__version__} (CCT_AS_CAFFE=1)" in run.stderr


def test_as_caffe_runs_an_unchanged_script(tmp_path):
    real = _fake_caffe(tmp_path / "site")
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import sys
        import caffe
        import caffe.driver   # a cct submodule not loaded yet: the same object, not a copy
        from caffe.proto import caffe_pb2
        print(caffe.__name__, caffe.__version__, caffe.Layer.__module__, sys.argv[1:])
        print(caffe_pb2.NetParameter.__module__, caffe.driver is sys.modules["cct.driver"],
              sys.modules["cct.driver"].__spec__.name, __name__)
    """))
    run = subprocess.run([sys.executable, "-m", "cct.as_caffe", "script.py", "a", "--b"],
                         cwd=tmp_path, env=_env(real), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"cct {cct.__version__} cct.layers.python_layer ['a', '--b']"
    assert lines[1].endswith(" True cct.driver __main__")


def test_as_caffe_without_a_script(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cct.as_caffe"], capture_output=True, text=True)
    assert run.returncode == 2 and "usage: python -m cct.as_caffe" in run.stderr

"""Python layers: pycaffe's interface (setup/reshape/forward/backward, param_str, phase,
blobs.add_blob), classes with and without the cct base class, import errors, gradients through
a user layer, and use inside a Net."""
import sys
import textwrap

import numpy as np
import pytest
from google.protobuf import text_format

from cct.errors import LayerError
from cct.layers.python_layer import PythonLayer
from cct.net import Net
from cct.proto import caffe_pb2
from tests.gradient_check import build_layer, check_gradient, run_forward

MODULE = "cct_test_user_layers"

SOURCE = '''
import numpy as np
from cct.layers.python_layer import PythonLayer


class ScaleByParam(PythonLayer):
    """top = w * bottom + offset; w a learnable scalar blob, offset from param_str."""

    def setup(self, bottom, top):
        if len(bottom) != 1:
            raise Exception("ScaleByParam takes one bottom")
        self.offset = float(self.param_str or 0)
        self.blobs.add_blob(1)
        self.blobs[0].data[...] = 2.0
        self.seen_phase = self.phase

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data + self.offset

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += (top[0].diff * bottom[0].data).sum()
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff


class Square:
    """No base class and no constructor argument, as some user code is written."""

    def setup(self, bottom, top):
        self.calls = ["setup"]

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data ** 2

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * bottom[0].data * top[0].diff


class Source(PythonLayer):
    """A data layer: no bottoms, fills its top with a fixed ramp."""

    def setup(self, bottom, top):
        self.shape = tuple(int(s) for s in self.param_str.split(","))

    def reshape(self, bottom, top):
        top[0].reshape(*self.shape)

    def forward(self, bottom, top):
        top[0].data[...] = np.arange(top[0].count).reshape(top[0].shape) * 0.1

    def backward(self, top, propagate_down, bottom):
        pass


class NoForward:
    pass


class ListBlobs(PythonLayer):
    """Rebinds self.blobs to a plain list, which must still become the layer's params."""

    def setup(self, bottom, top):
        from cct.blob import Blob
        self.blobs = [Blob((2,))]

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data


class BrokenSetup(PythonLayer):
    def setup(self, bottom, top):
        raise ValueError("bad param_str")
'''


@pytest.fixture(scope="module", autouse=True)
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pylayers")
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    (folder / "cct_test_broken_module.py").write_text("import not_a_module_anywhere_xyz\n")
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def py_body(layer, param_str=None):
    extra = f' param_str: "{param_str}"' if param_str is not None else ""
    return f'type: "Python" python_param {{ module: "{MODULE}" layer: "{layer}"{extra} }}'


def test_subclass_with_param_str_phase_and_blobs():
    x = np.random.default_rng(0).standard_normal((2, 3))
    layer, bottom, top = build_layer(py_body("ScaleByParam", "0.5"), [x],
                                     phase=caffe_pb2.TRAIN)
    assert isinstance(layer.impl, PythonLayer)
    assert layer.impl.param_str == "0.5" and layer.impl.seen_phase == caffe_pb2.TRAIN
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (1,)
    assert layer.blobs is layer.impl.blobs
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, 2 * x + 0.5)
    assert layer.type == "Python"


def test_gradient_through_a_user_layer_including_its_param():
    x = np.random.default_rng(1).standard_normal((2, 3))
    layer, bottom, top = build_layer(py_body("ScaleByParam"), [x])
    check_gradient(layer, bottom, top)


def test_class_without_base_class():
    x = np.random.default_rng(2).standard_normal((3, 2))
    layer, bottom, top = build_layer(py_body("Square"), [x])
    assert layer.impl.calls == ["setup"]
    assert layer.impl.param_str == "" and layer.impl.phase == caffe_pb2.TEST
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, x ** 2)
    check_gradient(layer, bottom, top)


def test_user_attributes_are_reachable_through_the_layer():
    layer, _, _ = build_layer(py_body("Square"), [np.zeros((1, 1))])
    assert layer.calls == ["setup"]
    with pytest.raises(AttributeError):
        layer.no_such_attribute


def test_rebound_blob_list_becomes_the_param_list():
    layer, _, _ = build_layer(py_body("ListBlobs"), [np.zeros((1, 2))])
    assert [b.shape for b in layer.blobs] == [(2,)]
    layer.blobs.add_blob(3, 1)
    assert layer.impl.blobs[1].shape == (3, 1)


def test_errors_raised_by_user_code_propagate():
    with pytest.raises(ValueError, match="bad param_str"):
        build_layer(py_body("BrokenSetup"), [np.zeros((1,))])


@pytest.mark.parametrize("body,match", [
    ('type: "Python" python_param { module: "cct_no_such_module_xyz" layer: "L" }',
     r"cannot import module 'cct_no_such_module_xyz'.*class 'L'"),
    ('type: "Python" python_param { module: "cct_test_broken_module" layer: "L" }',
     r"cannot import module 'cct_test_broken_module'.*not_a_module_anywhere_xyz"),
    (py_body("NoSuchClass"), f"module '{MODULE}'.*has no class 'NoSuchClass'"),
    ('type: "Python" python_param { layer: "L" }', "needs both module and layer"),
    ('type: "Python"', "needs both module and layer"),
    (py_body("NoForward"), r"has no forward\(\) method"),
])
def test_bad_parameters_name_the_layer(body, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros((1, 2))])
    assert "Python layer 'under_test'" in str(err.value)


def test_base_class_defaults():
    layer = PythonLayer()
    assert layer.param_str == "" and layer.phase == 0 and list(layer.blobs) == []
    layer.setup([], [])
    layer.reshape([], [])
    with pytest.raises(NotImplementedError):
        layer.forward([], [])
    layer.blobs.add_blob(2, 3)
    assert layer.blobs[0].shape == (2, 3) and layer.blobs[0].count == 6


def test_python_layers_in_a_net():
    text = f'''
    name: "py"
    layer {{ name: "data" type: "Python" top: "data"
            python_param {{ module: "{MODULE}" layer: "Source" param_str: "2,3" }} }}
    layer {{ name: "scale" type: "Python" bottom: "data" top: "scaled"
            python_param {{ module: "{MODULE}" layer: "ScaleByParam" param_str: "1" }} }}
    layer {{ name: "square" type: "Python" bottom: "scaled" top: "loss" loss_weight: 1
            python_param {{ module: "{MODULE}" layer: "Square" }} }}
    '''
    param = caffe_pb2.NetParameter()
    text_format.Merge(text, param)
    net = Net(param, phase=caffe_pb2.TRAIN)
    assert list(net.params) == ["scale"] and net.params["scale"][0].shape == (1,)
    assert net.layer_dict["scale"].offset == 1.0
    net.forward_backward()
    data = np.arange(6).reshape(2, 3) * 0.1
    np.testing.assert_allclose(net.blobs["loss"].data, (2 * data + 1) ** 2)
    # d(sum of loss)/dw = sum 2 (w x + 1) x
    np.testing.assert_allclose(net.params["scale"][0].diff, [(2 * (2 * data + 1) * data).sum()])


def test_user_params_are_host_arrays_on_a_device_backend():
    """On a device backend the user's NumPy code sees its params as pycaffe does, host arrays
    (Caffe's cpu_data), while the layer's params stay device blobs that device code and the
    solver use: ``self.blobs[0].data[0] * bottom[0].data`` must not mix the two."""
    from cct import backend as backends
    from cct.blob import Blob, DeviceBlob, HostBlob
    from cct.layers import create_layer
    from tests.gradient_check import make_layer_param

    numpy_backend = backends.get("numpy")
    layer = create_layer(make_layer_param(py_body("ScaleByParam", "0.5")), numpy_backend,
                         np.float64)
    x = np.random.default_rng(3).standard_normal((2, 3))
    bottom = [Blob(x.shape, np.float64, numpy_backend.xp)]
    bottom[0].host_view().data[...] = x
    top = [Blob((), np.float64, numpy_backend.xp)]
    layer.setup(bottom, top)
    assert len(layer.blobs) == 1 and isinstance(layer.blobs[0], DeviceBlob)
    assert len(layer.impl.blobs) == 1 and isinstance(layer.impl.blobs[0], HostBlob)
    assert layer.impl.blobs[0].blob is layer.blobs[0]
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].host_view().data, 2 * x + 0.5)
    check_gradient(layer, bottom, top)
    layer.impl.blobs.add_blob(4)                 # a device param of the layer, seen as host
    assert isinstance(layer.blobs[1], DeviceBlob) and layer.impl.blobs[1].shape == (4,)

"""cct/backend/cudnn.py without a GPU: what it says when the frontend is missing, the routing
of the convolution kernels (engine CAFFE and the geometries cuDNN refuses stay lowered, and
the lowering is the reference an engine is checked against), and the engine table kept with
the CPU's plans. On a GPU, scripts/cudnn_probe.py and tests/test_gpu_backend.py check the
engines themselves against the lowering and Caffe's numbers."""
import numpy as np
import pytest

from cct.backend import cudnn, plans, shapes
from cct.backend.array_kernels import ArrayKernels


def test_without_the_frontend_it_says_which_extra_to_install(monkeypatch):
    monkeypatch.setattr(cudnn, "_fe", None)
    ok, why = cudnn.available()
    assert not ok and "gpu-cuda13" in why and "cudnn frontend" in why
    assert cudnn.convolutions(np) is None


class Refusing:
    """cuDNN refusing every geometry, recording each call and its reference."""

    def __init__(self):
        self.calls = []

    def _record(self, op, lowered):
        self.calls.append((op, lowered()))
        return None

    def forward(self, x, weight, stride, pad, dilation, out, lowered):
        return self._record("fprop", lowered)

    def backward_data(self, dy, weight, x_shape, stride, pad, dilation, out, lowered):
        return self._record("dgrad", lowered)

    def backward_weight(self, x, dy, shape, stride, pad, dilation, out, accumulate, lowered):
        return self._record("wgrad", lowered)


def test_refused_geometries_and_engine_caffe_run_lowered():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    geom = ((3, 3), (2, 2), (1, 1), (1, 1), 2)    # kernel, stride, pad, dilation, group
    plain = ArrayKernels(np)
    y = plain.conv_forward(x, w, b, *geom)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    want = (y, plain.conv_backward_data(dy, w, x.shape, *geom),
            plain.conv_backward_weight(x, dy, *geom))
    wrapped, convs = ArrayKernels(np), Refusing()
    cudnn.wrap_lowering(wrapped, convs, shapes.pair)
    for engine, asked in (("CAFFE", []), ("DEFAULT", ["fprop", "dgrad", "wgrad"])):
        convs.calls.clear()
        got = (wrapped.conv_forward(x, w, b, *geom, engine=engine),
               wrapped.conv_backward_data(dy, w, x.shape, *geom, engine=engine),
               wrapped.conv_backward_weight(x, dy, *geom, engine=engine))
        for g, v in zip(got, want):
            np.testing.assert_array_equal(g, v)
        assert [op for op, _ in convs.calls] == asked
    # the reference handed over is the lowering's result (without the bias: cuDNN adds none)
    np.testing.assert_array_equal(convs.calls[0][1], plain.conv_forward(x, w, None, *geom))
    np.testing.assert_array_equal(convs.calls[2][1], want[2])


def test_the_engine_table_goes_with_the_cpus_plans(monkeypatch):
    convs = cudnn.Convolutions(cupy=None)
    key = ("fprop", 0, (64, 20, 12, 12), (50, 20, 5, 5), (64, 50, 8, 8), (1, 1), (0, 0), (1, 1),
           "float32", False)
    convs.table[key] = "eng28_k2=4_k3=0"
    row = ["fprop", [64, 20, 12, 12], [50, 20, 5, 5], [64, 50, 8, 8], [1, 1], [0, 0], [1, 1],
           "float32", False, "eng28_k2=4_k3=0"]
    assert convs.rows() == [row]
    monkeypatch.setattr(plans, "_device_tables", {})
    plans.register_device_table("cudnn", convs.rows, convs.install_rows)
    tab = plans.table()
    assert tab["cudnn"] == [row]
    other = cudnn.Convolutions(cupy=None)
    monkeypatch.setattr(plans, "_device_tables", {})
    plans.register_device_table("cudnn", other.rows, other.install_rows)
    assert plans.install(tab) >= 1
    assert other.preferred == {cudnn._portable(key): "eng28_k2=4_k3=0"}
    with pytest.raises(ValueError, match="cudnn plan row"):
        plans.install(dict(tab, cudnn=[["fprop", "eng1"]]))
    with pytest.raises(ValueError, match="cudnn plans are not a list"):
        plans.install(dict(tab, cudnn="eng1"))

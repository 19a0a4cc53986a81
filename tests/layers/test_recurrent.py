"""LSTM, RNN and LSTMUnit: forward against hand-unrolled float64 references over several
timesteps with sequence starts (cont 0) inside the batch, with x_static and exposed state;
gradients of every input and param; Caffe's state carried between forward passes; Caffe's param
count, shapes and order; a small LRCN-like net from prototxt text; the numpy (device) backend;
and the errors."""
import numpy as np
import pytest

import cct as caffe
from cct import backend as backends
from cct.backend import gpu
from cct.blob import Blob
from cct.errors import LayerError
from cct.io.prototxt import net_from_text
from cct.layers import create_layer
from cct.net import Net
from cct.rng import set_random_seed
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

RNG = np.random.default_rng(7)

# T = 4 steps of N = 3 streams: stream 0 starts a sequence at t = 0 and again at t = 2, stream 1
# runs through, stream 2 starts at t = 0 and t = 3.
CONT = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 1], [1, 1, 0]], float)


def body(kind, num_output=3, expose=False):
    return (f'type: "{kind}" recurrent_param {{ num_output: {num_output} '
            f'weight_filler {{ type: "gaussian" std: 0.4 }} '
            f'bias_filler {{ type: "gaussian" std: 0.3 }}'
            + (' expose_hidden: true' if expose else '') + ' }')


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


# ---- references: one stream and one step at a time, in float64 --------------------------------
def ref_lstm(x, cont, w_xc, b_c, w_hc, w_s=None, xs=None, h0=None, c0=None):
    t_steps, n = cont.shape
    hd = w_hc.shape[1]
    h = np.zeros((n, hd)) if h0 is None else h0[0].astype(float).copy()
    c = np.zeros((n, hd)) if c0 is None else c0[0].astype(float).copy()
    out = np.zeros((t_steps, n, hd))
    for t in range(t_steps):
        for s in range(n):
            z = w_hc @ (cont[t, s] * h[s]) + w_xc @ x[t, s].ravel() + b_c
            if w_s is not None:
                z += w_s @ xs[s].ravel()
            i, f, o = sigmoid(z[:hd]), cont[t, s] * sigmoid(z[hd:2 * hd]), sigmoid(z[2 * hd:3 * hd])
            g = np.tanh(z[3 * hd:])
            c[s] = f * c[s] + i * g
            h[s] = o * np.tanh(c[s])
        out[t] = h
    return out, h[None], c[None]


def ref_rnn(x, cont, w_xh, b_h, w_hh, w_ho, b_o, w_s=None, xs=None, h0=None):
    t_steps, n = cont.shape
    hd = w_hh.shape[1]
    h = np.zeros((n, hd)) if h0 is None else h0[0].astype(float).copy()
    out = np.zeros((t_steps, n, hd))
    for t in range(t_steps):
        for s in range(n):
            z = w_hh @ (cont[t, s] * h[s]) + w_xh @ x[t, s].ravel() + b_h
            if w_s is not None:
                z += w_s @ xs[s].ravel()
            h[s] = np.tanh(z)
            out[t, s] = np.tanh(w_ho @ h[s] + b_o)
    return out, h[None]


def reference(kind, layer, bottom, static, expose):
    """The reference outputs for ``layer``'s params and bottoms: (sequence, final states)."""
    p = [b.data.astype(float) for b in layer.blobs]
    x, cont = bottom[0].data, bottom[1].data
    xs = bottom[2].data if static else None
    first = 2 + static
    if kind == "LSTM":
        w_s = p[2] if static else None
        h0, c0 = (bottom[first].data, bottom[first + 1].data) if expose else (None, None)
        out, h, c = ref_lstm(x, cont, p[0], p[1], p[-1], w_s, xs, h0, c0)
        return out, [h, c]
    w_s = p[2] if static else None
    h0 = bottom[first].data if expose else None
    out, h = ref_rnn(x, cont, p[0], p[1], *p[-3:], w_s, xs, h0)
    return out, [h]


def bottoms(kind, n=3, t_steps=4, static=False, expose=False, cont=CONT, hd=3):
    arrays = [RNG.standard_normal((t_steps, n, 2, 2)), cont]
    if static:
        arrays.append(RNG.standard_normal((n, 3)))
    if expose:
        arrays += [RNG.standard_normal((1, n, hd)) for _ in range(2 if kind == "LSTM" else 1)]
    return arrays


def num_tops(kind, expose):
    return 1 + (0 if not expose else 2 if kind == "LSTM" else 1)


# ---- forward against the references ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static,expose", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_forward_matches_unrolled_reference(kind, static, expose):
    arrays = bottoms(kind, static=static, expose=expose)
    layer, bottom, top = build_layer(body(kind, expose=expose), arrays,
                                     num_tops=num_tops(kind, expose))
    run_forward(layer, bottom, top)
    out, states = reference(kind, layer, bottom, static, expose)
    assert top[0].shape == (4, 3, 3)
    np.testing.assert_allclose(top[0].data, out, rtol=1e-12, atol=1e-13)
    if expose:
        for t, s in zip(top[1:], states):
            assert t.shape == (1, 3, 3)
            np.testing.assert_allclose(t.data, s, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_cont_zero_restarts_the_sequence(kind):
    """A stream restarted by cont 0 at t = 2 gives, from t = 2 on, what the same inputs give as
    a fresh sequence."""
    arrays = bottoms(kind)
    layer, bottom, top = build_layer(body(kind), arrays)
    run_forward(layer, bottom, top)
    tail = [arrays[0][2:], arrays[1][2:]]
    layer2, bottom2, top2 = build_layer(body(kind), tail)
    run_forward(layer2, bottom2, top2)
    np.testing.assert_allclose(top[0].data[2:, 0], top2[0].data[:, 0], rtol=1e-13)
    assert not np.allclose(top[0].data[2:, 1], top2[0].data[:, 1])


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_float32_close_to_reference(kind):
    arrays = [a.astype(np.float32) for a in bottoms(kind, static=True)]
    layer, bottom, top = build_layer(body(kind), arrays, dtype=np.float32)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32
    out, _ = reference(kind, layer, bottom, True, False)
    np.testing.assert_allclose(top[0].data, out, rtol=1e-5, atol=1e-6)


# ---- Caffe's state carried between forward passes ----------------------------------------------
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_one_step_at_a_time_carries_the_state(kind):
    """Caffe's TestForward: a T = 3 pass equals three T = 1 passes of the same layer params;
    with cont 0 at every step only the first step agrees."""
    cont = np.array([[0, 0], [1, 1], [1, 1]], float)
    arrays = [RNG.standard_normal((3, 2, 3)), cont]
    full, fb, ft = build_layer(body(kind, 4), arrays)
    run_forward(full, fb, ft)
    step, sb, st = build_layer(body(kind, 4), [arrays[0][:1], cont[:1]])
    for a, b in zip(full.blobs, step.blobs):
        np.testing.assert_array_equal(a.data, b.data)
    for t in range(3):
        sb[0].data[...] = arrays[0][t:t + 1]
        sb[1].data[...] = cont[t:t + 1]
        run_forward(step, sb, st)
        np.testing.assert_allclose(st[0].data[0], ft[0].data[t], rtol=1e-12, atol=1e-14)
    step.reset()
    for t in range(3):
        sb[0].data[...] = arrays[0][t:t + 1]
        sb[1].data[...] = 0
        run_forward(step, sb, st)
        assert np.allclose(st[0].data[0], ft[0].data[t]) == (t == 0)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_exposed_state_chains_passes(kind):
    """With expose_hidden, feeding h_T (c_T) of one pass to the next equals one long pass, and
    nothing is carried inside the layer."""
    cont = np.array([[0, 1], [1, 1], [1, 0], [1, 1]], float)
    x = RNG.standard_normal((4, 2, 2))
    nstate = 2 if kind == "LSTM" else 1
    zeros = [np.zeros((1, 2, 3))] * nstate
    full, fb, ft = build_layer(body(kind, expose=True), [x, cont] + zeros, 1 + nstate)
    run_forward(full, fb, ft)
    half, hb, ht = build_layer(body(kind, expose=True), [x[:2], cont[:2]] + zeros, 1 + nstate)
    run_forward(half, hb, ht)
    first = ht[0].data.copy()
    hb[0].data[...] = x[2:]
    hb[1].data[...] = cont[2:]
    for j in range(nstate):
        hb[2 + j].data[...] = ht[1 + j].data
    run_forward(half, hb, ht)
    np.testing.assert_allclose(np.concatenate([first, ht[0].data]), ft[0].data, rtol=1e-12)
    for j in range(nstate):
        np.testing.assert_allclose(ht[1 + j].data, ft[1 + j].data, rtol=1e-12)


# ---- gradients ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static,expose", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_gradient(kind, static, expose):
    """Every bottom but cont and every param; with exposed state, through h_0 (c_0) and from
    the diffs of h_T (c_T) too. Without it cont starts every stream at t = 0, so the state
    carried from the previous pass does not enter."""
    arrays = bottoms(kind, n=2, t_steps=3, static=static, expose=expose, hd=2,
                     cont=np.array([[0, 0], [1, 0], [1, 1]], float))
    if expose:
        arrays[1] = np.array([[1, 0], [0, 1], [1, 1]], float)
    layer, bottom, top = build_layer(body(kind, 2, expose), arrays, num_tops(kind, expose))
    check_gradient(layer, bottom, top, check_bottom=[i for i in range(len(bottom)) if i != 1])


@pytest.mark.parametrize("cont", [[0, 0, 0], [1, 0, 1]])
def test_lstm_unit_gradient(cont):
    """Caffe's TestLSTMUnitGradient and TestLSTMUnitGradientNonZeroCont."""
    arrays = [RNG.uniform(-1, 1, (1, 3, 4)), RNG.uniform(-1, 1, (1, 3, 16)),
              np.array([cont], float)]
    layer, bottom, top = build_layer('type: "LSTMUnit"', arrays, num_tops=2)
    check_gradient(layer, bottom, top, check_bottom=[0, 1])


def test_lstm_unit_forward_matches_one_lstm_step():
    c_prev = RNG.standard_normal((1, 3, 2))
    x = RNG.standard_normal((1, 3, 8))
    cont = np.array([[1, 0, 1]], float)
    layer, bottom, top = build_layer('type: "LSTMUnit"', [c_prev, x, cont], num_tops=2)
    run_forward(layer, bottom, top)
    hd = 2
    for s in range(3):
        z = x[0, s]
        i, f = sigmoid(z[:hd]), cont[0, s] * sigmoid(z[hd:2 * hd])
        o, g = sigmoid(z[2 * hd:3 * hd]), np.tanh(z[3 * hd:])
        c = f * c_prev[0, s] + i * g
        np.testing.assert_allclose(top[0].data[0, s], c, rtol=1e-13)
        np.testing.assert_allclose(top[1].data[0, s], o * np.tanh(c), rtol=1e-13)
    np.testing.assert_array_equal(bottom[1].data, x)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_param_diffs_accumulate_and_bottom_diffs_are_overwritten(kind):
    arrays = bottoms(kind, static=True)
    layer, bottom, top = build_layer(body(kind), arrays)
    run_forward(layer, bottom, top)
    top[0].diff[...] = RNG.standard_normal(top[0].shape)
    pd = [True, False, True]
    layer.backward(top, pd, bottom)
    once = [p.diff.copy() for p in layer.blobs]
    dx = [bottom[0].diff.copy(), bottom[2].diff.copy()]
    layer.backward(top, pd, bottom)
    for p, d in zip(layer.blobs, once):
        np.testing.assert_allclose(p.diff, 2 * d)
    np.testing.assert_allclose(bottom[0].diff, dx[0])
    np.testing.assert_allclose(bottom[2].diff, dx[1])
    layer.param_propagate_down = [False] * len(layer.blobs)
    layer.backward(top, pd, bottom)
    for p, d in zip(layer.blobs, once):
        np.testing.assert_allclose(p.diff, 2 * d)


@pytest.mark.parametrize("kind", ["LSTM", "RNN", "LSTMUnit"])
def test_no_gradient_to_cont(kind):
    """Caffe refuses it (CHECK in Backward) and leaves cont out of force_backward."""
    if kind == "LSTMUnit":
        arrays = [np.zeros((1, 2, 1)), np.zeros((1, 2, 4)), np.ones((1, 2))]
        layer, bottom, top = build_layer('type: "LSTMUnit"', arrays, num_tops=2)
        cont = 2
    else:
        layer, bottom, top = build_layer(body(kind), [np.zeros((2, 2, 1)), np.ones((2, 2))])
        cont = 1
    assert not layer.allow_force_backward(cont) and layer.allow_force_backward(0)
    run_forward(layer, bottom, top)
    with pytest.raises(LayerError, match=rf"cannot backpropagate to bottom\[{cont}\] \(the "
                                         rf"sequence continuation indicators\)"):
        layer.backward(top, [True] * len(bottom), bottom)


# ---- params: Caffe's count, shapes, order, fillers ---------------------------------------------
@pytest.mark.parametrize("kind,static,shapes", [
    ("LSTM", False, [(20, 6), (20,), (20, 5)]),
    ("LSTM", True, [(20, 6), (20,), (20, 12), (20, 5)]),
    ("RNN", False, [(5, 6), (5,), (5, 5), (5, 5), (5,)]),
    ("RNN", True, [(5, 6), (5,), (5, 12), (5, 5), (5, 5), (5,)]),
])
def test_params_are_caffes(kind, static, shapes):
    """Caffe's unrolled-net order: W_xc, b_c, [W_xc_static], W_hc for LSTM; W_xh, b_h,
    [W_xh_static], W_hh, W_ho, b_o for RNN (K = x.count(2) = 6, S = x_static.count(1) = 12)."""
    arrays = [np.zeros((2, 3, 2, 3)), np.ones((2, 3))]
    if static:
        arrays.append(np.zeros((3, 3, 4)))
    text = (f'type: "{kind}" recurrent_param {{ num_output: 5 '
            f'weight_filler {{ type: "constant" value: 2 }} '
            f'bias_filler {{ type: "constant" value: -1 }} }}')
    layer, bottom, top = build_layer(text, arrays)
    assert [b.shape for b in layer.blobs] == shapes
    for b in layer.blobs:
        assert np.all(b.data == (-1 if b.num_axes == 1 else 2))
    assert top[0].shape == (2, 3, 5)


def test_prototxt_blobs_are_used_and_checked():
    data = " ".join(f"data: {v}" for v in range(4))
    blobs = (f'blobs {{ shape {{ dim: 4 dim: 1 }} {data} }} '
             f'blobs {{ shape {{ dim: 4 }} data: 0 data: 0 data: 0 data: 0 }} '
             f'blobs {{ shape {{ dim: 4 dim: 1 }} data: 1 data: 1 data: 1 data: 1 }}')
    text = 'type: "LSTM" recurrent_param { num_output: 1 } ' + blobs
    layer, bottom, top = build_layer(text, [np.ones((1, 1, 1)), np.zeros((1, 1))])
    np.testing.assert_array_equal(layer.blobs[0].data[:, 0], [0, 1, 2, 3])
    bad = text.replace("dim: 4 dim: 1 } data: 1", "dim: 4 dim: 2 } data: 1 data: 1 data: 1 "
                                                  "data: 1 data: 1")
    with pytest.raises(LayerError, match=r"param 2 \(W_hc\) has shape \(4, 2\).*expected "
                                         r"\(4, 1\)"):
        build_layer(bad, [np.ones((1, 1, 1)), np.zeros((1, 1))])
    with pytest.raises(LayerError, match=r"has 3 param blob\(s\).*expected 4: W_xc, b_c, "
                                         r"W_xc_static, W_hc"):
        build_layer(text, [np.ones((1, 1, 1)), np.zeros((1, 1)), np.ones((1, 2))])


# ---- a net from prototxt -----------------------------------------------------------------------
LRCN = '''
name: "lrcn_small"
layer { name: "data" type: "Input" top: "frames" top: "cont" top: "label" top: "clip"
  input_param { shape { dim: 6 dim: 2 dim: 5 dim: 5 } shape { dim: 3 dim: 2 }
                shape { dim: 3 dim: 2 } shape { dim: 2 dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "frames" top: "conv1"
  convolution_param { num_output: 3 kernel_size: 3 stride: 2
                      weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "fc6" type: "InnerProduct" bottom: "conv1" top: "fc6"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "reshape" type: "Reshape" bottom: "fc6" top: "fc6_seq"
  reshape_param { shape { dim: 3 dim: 2 dim: 6 } } }
layer { name: "lstm1" type: "LSTM" bottom: "fc6_seq" bottom: "cont" bottom: "clip"
  top: "lstm1"
  recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.3 max: 0.3 }
                    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "fc8" type: "InnerProduct" bottom: "lstm1" top: "fc8"
  inner_product_param { num_output: 4 axis: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss"
  softmax_param { axis: 2 } }
'''


def test_lrcn_like_net_runs_forward_backward_and_saves_caffes_params(tmp_path):
    net = Net(net_from_text(LRCN), phase=caffe.TRAIN, dtype=np.float64)
    assert [p.data.shape for p in net.params["lstm1"]] == [(20, 6), (20,), (20, 4), (20, 5)]
    net.blobs["frames"].data[...] = RNG.standard_normal((6, 2, 5, 5))
    net.blobs["cont"].data[...] = [[0, 0], [1, 1], [0, 1]]
    net.blobs["label"].data[...] = [[0, 1], [2, 3], [1, 1]]
    net.blobs["clip"].data[...] = RNG.standard_normal((2, 4))
    loss = net.forward()["loss"]
    assert np.isfinite(loss) and net.blobs["lstm1"].shape == (3, 2, 5)
    lstm = net.layers[net.layer_names.index("lstm1")]
    out, _, _ = ref_lstm(net.blobs["fc6_seq"].data, net.blobs["cont"].data,
                         *(p.data for p in net.params["lstm1"][:2]), net.params["lstm1"][3].data,
                         net.params["lstm1"][2].data, net.blobs["clip"].data)
    np.testing.assert_allclose(net.blobs["lstm1"].data, out, rtol=1e-12)
    assert lstm.type == "LSTM"
    net.backward()
    for p in net.params["lstm1"]:
        assert np.abs(p.diff).sum() > 0
    assert np.abs(net.params["conv1"][0].diff).sum() > 0
    path = str(tmp_path / "lrcn.caffemodel")
    net.save(path)
    other = Net(net_from_text(LRCN), phase=caffe.TEST, dtype=np.float64)
    other.copy_from(path)
    for a, b in zip(net.params["lstm1"], other.params["lstm1"]):
        # a caffemodel holds float values, as Caffe writes them
        np.testing.assert_array_equal(a.data.astype(np.float32), b.data)


# ---- the numpy (device) backend ----------------------------------------------------------------
def on_backend(name, text, arrays, ntops):
    be = backends.get(name)
    layer = create_layer(make_layer_param(text), be, np.float64)
    bottom = []
    for a in arrays:
        b = Blob(a.shape, np.float64, be.xp)
        b.data[...] = be.xp.asarray(a)
        bottom.append(b)
    top = [Blob((), np.float64, be.xp) for _ in range(ntops)]
    set_random_seed(1701)
    layer.setup(bottom, top)
    return layer, bottom, top


GPU_OK, GPU_REASON = gpu.available()


@pytest.mark.parametrize("device", [
    "numpy", pytest.param("gpu", marks=pytest.mark.skipif(not GPU_OK,
                                                          reason=f"no usable GPU: {GPU_REASON}"))])
@pytest.mark.parametrize("kind,static,expose", [("LSTM", True, True), ("RNN", True, True),
                                                ("LSTM", False, False)])
def test_device_backend_matches_cpu(device, kind, static, expose):
    """The array-generic code path (the numpy backend stands in for a GPU without one)."""
    arrays = bottoms(kind, static=static, expose=expose)
    pd = [True, False] + [True] * (len(arrays) - 2)
    results = []
    for name in ("cpu", device):
        layer, bottom, top = on_backend(name, body(kind, expose=expose), arrays,
                                        num_tops(kind, expose))
        layer.reshape(bottom, top)
        layer.forward(bottom, top)
        for t in top:
            t.diff[...] = 0.5
        layer.backward(top, pd, bottom)
        results.append([np.array(t.cpu_data()) for t in top]
                       + [np.array(b.cpu_diff()) for b, p in zip(bottom, pd) if p]
                       + [np.array(p.cpu_diff()) for p in layer.blobs])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


# ---- errors ------------------------------------------------------------------------------------
X, C = np.zeros((2, 3, 4)), np.ones((2, 3))


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("text,arrays,ntops,match", [
    ('type: "{k}" recurrent_param { }', [X, C], 1, "num_output must be given and positive"),
    (body("{k}"), [X, np.ones((2, 2))], 1,
     r"bottom\[1\] \(cont\) has shape \(2, 2\), expected \(T, N\) = \(2, 3\)"),
    (body("{k}"), [X, np.ones((6,))], 1, r"bottom\[1\] \(cont\) has shape \(6,\)"),
    (body("{k}"), [np.zeros((2, 3)), C], 1, "at least 3 axes"),
    (body("{k}"), [X, C, np.zeros((2, 4))], 1, r"x_static\) has shape \(2, 4\), expected N = 3"),
    (body("{k}"), [X, C, np.zeros((3,))], 1, r"x_static\) must have at least 2 axes"),
    (body("{k}", expose=True), [X, C], 2, "takes at least"),
    (body("{k}", expose=True), [X, C, np.zeros((1, 3, 2)), np.zeros((1, 3, 2))], 3,
     r"bottom\[2\] \(h_0\) has shape \(1, 3, 2\), expected \(1, N, num_output\) = \(1, 3, 3\)"),
    (body("{k}"), [X, C], 2, "takes exactly 1 top"),
])
def test_bad_setup_names_the_layer(kind, text, arrays, ntops, match):
    if kind == "RNN" and ntops == 3:
        ntops, arrays = 2, arrays[:3]
    with pytest.raises(LayerError, match=match) as err:
        build_layer(text.replace("{k}", kind), arrays, num_tops=ntops)
    assert f"{kind} layer 'under_test'" in str(err.value)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_timesteps_are_fixed_streams_may_change(kind):
    layer, bottom, top = build_layer(body(kind), [X, C])
    bottom[0].reshape(2, 5, 4)
    bottom[1].reshape(2, 5)
    layer.reshape(bottom, top)
    assert top[0].shape == (2, 5, 3)
    bottom[0].reshape(3, 5, 4)
    bottom[1].reshape(3, 5)
    with pytest.raises(LayerError, match=r"has 3 timesteps, but the layer was set up for T = 2"):
        layer.reshape(bottom, top)
    bottom[0].reshape(2, 5, 2)
    bottom[1].reshape(2, 5)
    with pytest.raises(LayerError, match=r"has 2 values per step and stream.*made for 4"):
        layer.reshape(bottom, top)


def test_in_place_is_refused():
    b, c = Blob((2, 3, 3), np.float64), Blob((2, 3), np.float64)
    layer = create_layer(make_layer_param(body("LSTM")), backends.get("cpu"), np.float64)
    with pytest.raises(LayerError, match="cannot run in place"):
        layer.setup([b, c], [b])


@pytest.mark.parametrize("arrays,match", [
    ([np.zeros((2, 3, 2)), np.zeros((1, 3, 8)), np.ones((1, 3))], r"c_prev\) must have shape"),
    ([np.zeros((1, 3, 2)), np.zeros((1, 3, 6)), np.ones((1, 3))],
     r"has shape \(1, 3, 6\), expected \(1, N, 4 H\) = \(1, 3, 8\)"),
    ([np.zeros((1, 3, 2)), np.zeros((1, 3, 8)), np.ones((3,))],
     r"bottom\[2\] \(cont\) has shape \(3,\), expected \(1, N\) = \(1, 3\)"),
])
def test_lstm_unit_bad_shapes(arrays, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer('type: "LSTMUnit"', arrays, num_tops=2)
    assert "LSTMUnit layer 'under_test'" in str(err.value)


def test_registered():
    assert {"LSTM", "LSTMUnit", "RNN"} <= set(caffe.layer_type_list())

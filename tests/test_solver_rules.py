"""The update pipeline and the lr policies against closed forms (Caffe's
test_gradient_based_solver.cpp): a least-squares net (InnerProduct + EuclideanLoss) whose
gradient is known, every solver type, weight decay L2/L1, lr_mult/decay_mult, iter_size,
shared params, clip_gradients, multistep current_step, and snapshot/restore equality."""
import math
import re

import numpy as np
import pytest
from google.protobuf import text_format

from cct import glog
from cct.errors import CCTError
from cct.proto import caffe_pb2
from cct.io.solverstate import read_solver_state
from cct.solver import Solver
from cct.solver_rules import RULES, Schedule, SolverUpdate, UpdatePipeline, learning_rate

N, D = 4, 3


@pytest.fixture(autouse=True)
def _info_logging():
    """Some tests read the INFO lines; other tests may have silenced them (init_log)."""
    level = glog.logger.level
    glog.set_quiet(False)
    yield
    glog.logger.setLevel(level)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def ls_net(n=N, lr=(1, 1), decay=(1, 1), data_layer=None) -> str:
    """InnerProduct(1 output) + EuclideanLoss on Input tops ``data`` (n x D), ``targets``."""
    data = data_layer or (f'layer {{ name: "input" type: "Input" top: "data" top: "targets" '
                          f'input_param {{ shape {{ dim: {n} dim: {D} }} '
                          f'shape {{ dim: {n} dim: 1 }} }} }}')
    return f"""
      name: "least_squares"
      {data}
      layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param {{ lr_mult: {lr[0]} decay_mult: {decay[0]} }}
        param {{ lr_mult: {lr[1]} decay_mult: {decay[1]} }}
        inner_product_param {{ num_output: 1 weight_filler {{ type: "gaussian" std: 1 }}
                               bias_filler {{ type: "gaussian" std: 1 }} }} }}
      layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "targets" top: "loss" }}
    """


def solver_param(net_text: str, **fields) -> caffe_pb2.SolverParameter:
    p = caffe_pb2.SolverParameter()
    text_format.Parse(net_text, p.net_param)
    defaults = dict(base_lr=0.1, lr_policy="fixed", max_iter=10, display=0, random_seed=7,
                    snapshot_after_train=False)
    defaults.update(fields)
    for k, v in defaults.items():
        if isinstance(v, (list, tuple)):
            getattr(p, k).extend(v)
        else:
            setattr(p, k, v)
    return p


def make_solver(net_text=None, dtype=np.float64, **fields) -> Solver:
    return Solver(solver_param(net_text or ls_net(), **fields), "<test solver>", dtype=dtype)


def batches(k, n=N, seed=0):
    r = np.random.RandomState(seed)
    return [(r.randn(n, D), r.randn(n, 1)) for _ in range(k)]


def feed(solver, x, t):
    solver.net.blobs["data"].data[...] = x
    solver.net.blobs["targets"].data[...] = t


def wb(solver):
    ip = solver.net.params["ip"]
    return ip[0].data.reshape(-1).astype(np.float64), float(ip[1].data.reshape(-1)[0])


def grads(w, b, x, t):
    """Gradient of EuclideanLoss = ||x w + b - t||^2 / (2 n)."""
    r = x @ w + b - t[:, 0]
    return x.T @ r / len(x), r.sum() / len(x)


class Reference:
    """Caffe's documented update rules in float64, written as formulas (no shared code with
    cct.solver_rules)."""

    def __init__(self, p: caffe_pb2.SolverParameter, w, b, lr_mult=(1, 1), decay_mult=(1, 1)):
        self.p = p
        self.theta = [np.array(w, np.float64), np.array([b], np.float64)]
        self.lr_mult, self.decay_mult = lr_mult, decay_mult
        self.h = [np.zeros_like(t) for t in self.theta]
        self.s = [np.zeros_like(t) for t in self.theta]
        self.it = 0

    def step(self, g_list, rate=None):
        p = self.p
        rate = p.base_lr if rate is None else rate
        m, m2, delta, rd = p.momentum, p.momentum2, p.delta, p.rms_decay
        for i, (theta, g) in enumerate(zip(self.theta, g_list)):
            g = np.array(g, np.float64).reshape(theta.shape)
            decay = p.weight_decay * self.decay_mult[i]
            g = g + decay * (theta if p.regularization_type == "L2" else np.sign(theta))
            lr = rate * self.lr_mult[i]
            h, s = self.h[i], self.s[i]
            if p.type == "SGD":
                h = m * h + lr * g
                upd = h
            elif p.type == "Nesterov":
                h_new = m * h + lr * g
                upd = (1 + m) * h_new - m * h
                h = h_new
            elif p.type == "AdaGrad":
                h = h + g ** 2
                upd = lr * g / (np.sqrt(h) + delta)
            elif p.type == "RMSProp":
                h = rd * h + (1 - rd) * g ** 2
                upd = lr * g / (np.sqrt(h) + delta)
            elif p.type == "AdaDelta":
                h = m * h + (1 - m) * g ** 2
                val = g * np.sqrt((s + delta) / (h + delta))
                s = m * s + (1 - m) * val ** 2
                upd = lr * val
            elif p.type == "Adam":
                t = self.it + 1
                h = m * h + (1 - m) * g
                s = m2 * s + (1 - m2) * g ** 2
                upd = lr * math.sqrt(1 - m2 ** t) / (1 - m ** t) * h / (np.sqrt(s) + delta)
            self.h[i], self.s[i] = h, s
            self.theta[i] = theta - upd
        self.it += 1


RULE_SETTINGS = {
    "SGD": dict(momentum=0.9),
    "Nesterov": dict(momentum=0.9),
    "AdaGrad": dict(delta=1e-6),
    "RMSProp": dict(rms_decay=0.95, delta=1e-6),
    "AdaDelta": dict(momentum=0.95, delta=1e-6, base_lr=1.0),
    "Adam": dict(momentum=0.9, momentum2=0.999, delta=1e-8, base_lr=0.01),
}


def test_every_caffe_solver_type_is_a_row_of_the_table():
    assert set(RULES) == set(RULE_SETTINGS)
    assert {t: RULES[t].history_sets for t in RULES} == {
        "SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}


# ------------------------------------------------------------------------------------------------
# closed-form updates
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("decay", [(0.0, "L2"), (0.1, "L2"), (0.1, "L1")],
                         ids=["nodecay", "L2", "L1"])
@pytest.mark.parametrize("kind", sorted(RULE_SETTINGS))
def test_update_matches_closed_form(kind, decay):
    wd, reg = decay
    s = make_solver(type=kind, weight_decay=wd, regularization_type=reg, **RULE_SETTINGS[kind])
    w, b = wb(s)
    ref = Reference(s.param, w, b)
    for x, t in batches(4):
        feed(s, x, t)
        ref.step(grads(ref.theta[0], ref.theta[1][0], x, t))
        s.step(1)
        w, b = wb(s)
        np.testing.assert_allclose(w, ref.theta[0], rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(b, ref.theta[1][0], rtol=1e-11, atol=1e-13)
    assert s.iter == 4
    # The history is Caffe's: set 1 for every param, then (AdaDelta, Adam) set 2.
    n = len(s.net.learnable_params)
    np.testing.assert_allclose(s.history[0].reshape(-1), ref.h[0], rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(s.history[1].reshape(-1), ref.h[1], rtol=1e-11, atol=1e-14)
    if RULES[kind].history_sets == 2:
        assert len(s.history) == 2 * n
        np.testing.assert_allclose(s.history[n].reshape(-1), ref.s[0], rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(s.history[n + 1].reshape(-1), ref.s[1], rtol=1e-11,
                                   atol=1e-14)
    else:
        assert len(s.history) == n


def test_lr_mult_and_decay_mult_per_param():
    net = ls_net(lr=(1, 2), decay=(1, 0))
    s = make_solver(net, type="SGD", momentum=0.9, weight_decay=0.05)
    assert s.net.params_lr == [1, 2] and s.net.params_weight_decay == [1, 0]
    w, b = wb(s)
    ref = Reference(s.param, w, b, lr_mult=(1, 2), decay_mult=(1, 0))
    for x, t in batches(3, seed=1):
        feed(s, x, t)
        ref.step(grads(ref.theta[0], ref.theta[1][0], x, t))
        s.step(1)
    w, b = wb(s)
    np.testing.assert_allclose(w, ref.theta[0], rtol=1e-12)
    np.testing.assert_allclose(b, ref.theta[1][0], rtol=1e-12)


def test_lr_mult_zero_freezes_a_param():
    s = make_solver(ls_net(lr=(0, 1)), type="SGD", momentum=0.9, weight_decay=0.1)
    w0, b0 = wb(s)
    for x, t in batches(2):
        feed(s, x, t)
        s.step(1)
    w, b = wb(s)
    np.testing.assert_array_equal(w, w0)
    assert b != b0


def test_float32_solver_matches_the_reference_to_float_rounding():
    s = make_solver(dtype=np.float32, type="Adam", **RULE_SETTINGS["Adam"], weight_decay=0.01)
    w, b = wb(s)
    ref = Reference(s.param, w, b)
    for x, t in batches(3):
        x, t = x.astype(np.float32), t.astype(np.float32)
        feed(s, x, t)
        ref.step(grads(ref.theta[0], ref.theta[1][0], x.astype(np.float64), t))
        s.step(1)
    assert s.net.params["ip"][0].data.dtype == np.float32
    assert s.history[0].dtype == np.float32
    np.testing.assert_allclose(wb(s)[0], ref.theta[0], rtol=2e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# iter_size: a data layer serving consecutive chunks of one batch
# ------------------------------------------------------------------------------------------------
CHUNKS = {}


class ChunkData:
    """Python data layer: each forward serves the next chunk of CHUNKS[param_str], cycling."""

    def setup(self, bottom, top):
        self.x, self.t, self.size = CHUNKS[self.param_str]
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.size, D)
        top[1].reshape(self.size, 1)

    def forward(self, bottom, top):
        top[0].data[...] = self.x[self.pos:self.pos + self.size]
        top[1].data[...] = self.t[self.pos:self.pos + self.size]
        self.pos = (self.pos + self.size) % len(self.x)

    def backward(self, top, propagate_down, bottom):
        pass

    def data_state(self):
        return {"pos": self.pos}

    def load_data_state(self, d):
        self.pos = d["pos"]


def chunk_net(key, x, t, size):
    CHUNKS[key] = (x, t, size)
    layer = (f'layer {{ name: "input" type: "Python" top: "data" top: "targets" '
             f'python_param {{ module: "{__name__}" layer: "ChunkData" param_str: "{key}" }} }}')
    return ls_net(data_layer=layer)


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_iter_size_accumulates_and_normalises(kind):
    x, t = batches(1, n=8, seed=3)[0]
    whole = make_solver(chunk_net("whole", x, t, 8), type=kind, weight_decay=0.01,
                        **RULE_SETTINGS[kind])
    accum = make_solver(chunk_net("halves", x, t, 4), type=kind, weight_decay=0.01,
                        iter_size=2, **RULE_SETTINGS[kind])
    w, b = wb(whole)
    accum.net.params["ip"][0].data[...] = whole.net.params["ip"][0].data
    accum.net.params["ip"][1].data[...] = whole.net.params["ip"][1].data
    ref = Reference(whole.param, w, b)
    for _ in range(3):
        ref.step(grads(ref.theta[0], ref.theta[1][0], x, t))
        whole.step(1)
        accum.step(1)
        np.testing.assert_allclose(wb(accum)[0], ref.theta[0], rtol=1e-11)
        np.testing.assert_allclose(wb(whole)[0], ref.theta[0], rtol=1e-11)
        np.testing.assert_allclose(wb(accum)[1], ref.theta[1][0], rtol=1e-11)


def test_clip_gradients_caps_the_global_norm(capsys):
    x, t = batches(1, seed=4)[0]
    clip = 0.05
    s = make_solver(type="SGD", clip_gradients=clip)
    w, b = wb(s)
    feed(s, x, t)
    gw, gb = grads(w, b, x, t)
    norm = math.sqrt(gw @ gw + gb * gb)
    assert norm > clip
    s.step(1)
    w1, b1 = wb(s)
    scale = s.param.clip_gradients / norm   # the float32 value the field holds
    lr = s.param.base_lr
    np.testing.assert_allclose(w1, w - lr * scale * gw, rtol=1e-12)
    np.testing.assert_allclose(b1, b - lr * scale * gb, rtol=1e-12)
    err = capsys.readouterr().err
    assert re.search(r"sgd_solver\.cpp:99\] Gradient clipping: scaling down gradients "
                     r"\(L2 norm [\d.]+ > 0\.05\) by scale factor [\d.e-]+", err)
    # A norm below the threshold is left alone.
    s2 = make_solver(type="SGD", clip_gradients=1e6)
    w, b = wb(s2)
    feed(s2, x, t)
    s2.step(1)
    np.testing.assert_allclose(wb(s2)[0], w - lr * grads(w, b, x, t)[0], rtol=1e-12)


def test_clip_gradients_applies_before_iter_size_normalisation():
    """Caffe's ApplyUpdate clips first, then normalizes: the clipped norm is that of the sum
    over the iter_size passes."""
    x, t = batches(1, n=8, seed=5)[0]
    clip = 0.05
    s = make_solver(chunk_net("clip_halves", x, t, 4), type="SGD", iter_size=2,
                    clip_gradients=clip)
    w, b = wb(s)
    gw, gb = grads(w, b, x, t)
    summed = 2 * math.sqrt(gw @ gw + gb * gb)   # norm of the un-normalised sum
    s.step(1)
    lr, clip = s.param.base_lr, s.param.clip_gradients
    np.testing.assert_allclose(wb(s)[0], w - lr * (clip / summed) * gw, rtol=1e-11)


def test_shared_params_get_the_summed_gradient():
    net = f"""
      name: "shared"
      layer {{ name: "input" type: "Input" top: "data" top: "data2" top: "targets"
        input_param {{ shape {{ dim: {N} dim: {D} }} shape {{ dim: {N} dim: {D} }}
                       shape {{ dim: {N} dim: 1 }} }} }}
      layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "a"
        param {{ name: "w" }} param {{ name: "b" lr_mult: 2 }}
        inner_product_param {{ num_output: 1 weight_filler {{ type: "gaussian" }}
                               bias_filler {{ type: "gaussian" }} }} }}
      layer {{ name: "ip_b" type: "InnerProduct" bottom: "data2" top: "b"
        param {{ name: "w" }} param {{ name: "b" }}
        inner_product_param {{ num_output: 1 }} }}
      layer {{ name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "y" }}
      layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "targets" top: "loss" }}
    """
    s = make_solver(net, type="SGD", momentum=0.5, weight_decay=0.01)
    assert len(s.net.learnable_params) == 2
    assert s.net.params_lr == [1, 2]
    w, b = wb(s)
    ref = Reference(s.param, w, b, lr_mult=(1, 2))
    r = np.random.RandomState(6)
    for _ in range(3):
        x1, x2, t = r.randn(N, D), r.randn(N, D), r.randn(N, 1)
        s.net.blobs["data"].data[...] = x1
        s.net.blobs["data2"].data[...] = x2
        s.net.blobs["targets"].data[...] = t
        th_w, th_b = ref.theta[0], ref.theta[1][0]
        res = (x1 + x2) @ th_w + 2 * th_b - t[:, 0]
        ref.step([(x1 + x2).T @ res / N, 2 * res.sum() / N])
        s.step(1)
        np.testing.assert_allclose(wb(s)[0], ref.theta[0], rtol=1e-11)
        np.testing.assert_allclose(wb(s)[1], ref.theta[1][0], rtol=1e-11)
    np.testing.assert_array_equal(s.net.params["ip_b"][0].data, s.net.params["ip"][0].data)


# ------------------------------------------------------------------------------------------------
# learning-rate policies
# ------------------------------------------------------------------------------------------------
def _policy(**fields) -> caffe_pb2.SolverParameter:
    p = caffe_pb2.SolverParameter(base_lr=0.1, max_iter=100)
    for k, v in fields.items():
        if isinstance(v, list):
            getattr(p, k).extend(v)
        else:
            setattr(p, k, v)
    return p


def _f(x):
    """The float32 value a SolverParameter float field holds."""
    return float(np.float32(x))


@pytest.mark.parametrize("fields,formula", [
    (dict(lr_policy="fixed"), lambda it: _f(0.1)),
    (dict(lr_policy="step", gamma=0.5, stepsize=3), lambda it: _f(0.1) * 0.5 ** (it // 3)),
    (dict(lr_policy="exp", gamma=0.9), lambda it: _f(0.1) * _f(0.9) ** it),
    (dict(lr_policy="inv", gamma=0.01, power=0.75),
     lambda it: _f(0.1) * (1 + _f(0.01) * it) ** -0.75),
    (dict(lr_policy="poly", power=2.0), lambda it: _f(0.1) * (1 - it / 100) ** 2),
    (dict(lr_policy="sigmoid", gamma=0.5, stepsize=5),
     lambda it: _f(0.1) / (1 + math.exp(-0.5 * (it - 5)))),
], ids=["fixed", "step", "exp", "inv", "poly", "sigmoid"])
def test_lr_policy_formulas(fields, formula):
    p = _policy(**fields)
    for it in (0, 1, 2, 3, 7, 10, 50, 99):
        rate, _ = learning_rate(p, it, 0, np.float64)
        assert rate == pytest.approx(formula(it), rel=1e-12), it
        rate32, _ = learning_rate(p, it, 0, np.float32)
        assert isinstance(rate32, np.float32)
        assert rate32 == pytest.approx(formula(it), rel=1e-5)


@pytest.mark.parametrize("fields, it, rate", [
    (dict(lr_policy="inv", gamma=0.0001, power=-2147483648), 2 ** 31 - 1, math.inf),
    (dict(lr_policy="exp", gamma=1e30), 100, math.inf),
    (dict(lr_policy="poly", power=0.5, max_iter=10), 20, math.nan),   # past max_iter
    (dict(lr_policy="sigmoid", gamma=100, stepsize=10 ** 6), 0, 0.0),
])
def test_lr_policies_overflow_as_caffes_pow_and_exp_do(fields, it, rate):
    """Caffe's C pow/exp give inf or NaN where Python's math.pow/exp raised OverflowError or
    ValueError (a training with such a rate then stops as diverged)."""
    got, _ = learning_rate(_policy(**fields), it, 0)
    assert got == rate or (math.isnan(rate) and math.isnan(got))


def test_step_policy_tracks_current_step():
    p = _policy(lr_policy="step", gamma=0.1, stepsize=10)
    assert learning_rate(p, 25, 0)[1] == 2


def test_inv_policy_prints_caffe_lenet_rates():
    """The lr values in Caffe's lenet_train.log (inv, gamma 1e-4, power 0.75, base_lr 0.01)."""
    p = _policy(lr_policy="inv", base_lr=0.01, gamma=0.0001, power=0.75)
    logged = {0: "0.01", 100: "0.00992565", 500: "0.00964069", 1000: "0.00931012",
              1500: "0.00900485", 1900: "0.00877687"}
    for it, text in logged.items():
        assert "%g" % learning_rate(p, it, 0)[0] == text


def test_multistep_advances_current_step_once_per_stepvalue(capsys):
    p = _policy(lr_policy="multistep", gamma=0.5, stepvalue=[2, 4, 5])
    step, rates, steps = 0, [], []
    for it in range(7):
        rate, step = learning_rate(p, it, step, np.float64)
        rates.append(rate)
        steps.append(step)
    assert steps == [0, 0, 1, 1, 2, 3, 3]
    assert rates == pytest.approx([_f(0.1) * 0.5 ** k for k in steps], rel=1e-12)
    err = capsys.readouterr().err
    assert "sgd_solver.cpp:50] MultiStep Status: Iteration 2, step = 1" in err
    assert "MultiStep Status: Iteration 5, step = 3" in err


def test_multistep_current_step_is_saved_and_restored(tmp_path):
    kw = dict(type="SGD", momentum=0.9, lr_policy="multistep", gamma=0.1, stepvalue=[1, 2],
              snapshot_prefix=str(tmp_path / "ms"), dtype=np.float32)
    s = make_solver(**kw)
    for x, t in batches(3):
        feed(s, x, t)
        s.step(1)
    assert s.current_step == 2
    s.snapshot()
    state = read_solver_state(str(tmp_path / "ms_iter_3.solverstate"))
    assert state["current_step"] == 2 and state["iter"] == 3
    r = make_solver(**kw)
    r.restore(str(tmp_path / "ms_iter_3.solverstate"))
    assert r.current_step == 2 and r.iter == 3


POLICIES = [dict(lr_policy="fixed"), dict(lr_policy="step", gamma=0.5, stepsize=3),
            dict(lr_policy="exp", gamma=0.9), dict(lr_policy="inv", gamma=0.01, power=0.75),
            dict(lr_policy="multistep", gamma=0.5, stepvalue=[2, 4, 4, 9]),
            dict(lr_policy="poly", power=2.0, max_iter=30),
            dict(lr_policy="sigmoid", gamma=0.5, stepsize=5)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fields", POLICIES, ids=[p["lr_policy"] for p in POLICIES])
def test_schedule_is_learning_rate_at_every_iteration(fields, dtype):
    """A Schedule gives learning_rate's rate and current_step at every iteration, the step
    passed back in as the solver does (multistep's repeated stepvalue included), and is a
    value: the param it was built from may change afterwards."""
    p = _policy(**fields)
    schedule = Schedule(p, dtype)
    p.base_lr, p.gamma = 7.0, 0.25
    want_p = _policy(**fields)
    step = want_step = 0
    for it in range(31):
        rate, step = schedule(it, step)
        want, want_step = learning_rate(want_p, it, want_step, dtype)
        assert type(rate) is type(want) and rate.tobytes() == want.tobytes(), it
        assert step == want_step, it
    assert schedule.lr_policy == fields["lr_policy"] and schedule.base_lr == _f(0.1)


def test_schedule_with_base_lr_scales_only_the_base():
    schedule = Schedule(_policy(lr_policy="step", gamma=0.5, stepsize=3))
    other = schedule.with_base_lr(0.3)
    assert schedule.base_lr == _f(0.1) and other.base_lr == _f(0.3)
    for it in range(10):
        assert other(it)[0] == learning_rate(
            _policy(lr_policy="step", gamma=0.5, stepsize=3, base_lr=0.3), it, 0)[0]


def test_set_schedule_trains_as_a_solver_built_with_that_base_lr():
    """The optimizer's way to change the rate: the schedule, and the param that says it."""
    tuned = make_solver(type="SGD", momentum=0.9, lr_policy="inv", gamma=0.01, power=0.75)
    tuned.set_schedule(tuned.schedule.with_base_lr(0.05))
    assert tuned.param.base_lr == _f(0.05) and tuned.param.lr_policy == "inv"
    built = make_solver(type="SGD", momentum=0.9, lr_policy="inv", gamma=0.01, power=0.75,
                        base_lr=0.05)
    for x, t in batches(4):
        for s in (tuned, built):
            feed(s, x, t)
            s.step(1)
    for a, b in zip(tuned.net.learnable_params + tuned.history,
                    built.net.learnable_params + built.history):
        a = getattr(a, "data", a)
        assert a.tobytes() == getattr(b, "data", b).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", sorted(RULES))
def test_solver_update_reproduces_apply_update_to_the_bit(kind, dtype):
    """A SolverUpdate and a Schedule of one's own, over a solver's params, are the solver's
    own step (Solver.apply_update) byte for byte: weights, history and current_step, for
    every solver type, with L1 decay, lr_mult/decay_mult, iter_size, clipping and a
    multistep rate."""
    fields = dict(RULE_SETTINGS[kind], type=kind, weight_decay=5e-3, regularization_type="L1",
                  clip_gradients=0.5, iter_size=2, lr_policy="multistep", gamma=0.5,
                  stepvalue=[1, 3])
    net = ls_net(lr=(1, 2), decay=(1, 0))
    stepped, manual = make_solver(net, dtype, **fields), make_solver(net, dtype, **fields)
    update = SolverUpdate(RULES[kind], manual.param)
    state = update.init(manual.params)
    schedule, step = Schedule(manual.param, dtype), 0
    for it, (x, t) in enumerate(batches(5)):
        feed(stepped, x, t)
        stepped.step(1)
        feed(manual, x, t)
        manual.begin_iteration()
        manual.compute_gradients()
        rate, step = schedule(it, step)
        update.apply(state, manual.params, rate, it)
        manual.end_iteration()
    for a, b in zip(stepped.net.learnable_params, manual.net.learnable_params):
        assert a.data.tobytes() == b.data.tobytes()
    assert len(state) == len(stepped.history) == RULES[kind].history_sets * 2
    for a, b in zip(stepped.history, state):
        assert a.tobytes() == b.tobytes()
    assert step == stepped.current_step == 2


def test_solver_update_momentum_and_only_act_as_the_pipelines():
    """``momentum`` replaces the param's for one call, ``only`` leaves the other params and
    their history alone; UpdatePipeline (one set, its own history) is the same update."""
    runs = []
    for use_pipeline in (False, True):
        s = make_solver(type="SGD", momentum=0.9)
        feed(s, *batches(1)[0])
        s.begin_iteration()
        s.compute_gradients()
        before = [np.array(p.data) for p in s.net.learnable_params]
        if use_pipeline:
            pipeline = UpdatePipeline(s.rule, s.param, s.params)
            pipeline.apply(0.1, 0, 0.5, None, [1])
            history = pipeline.history
        else:
            history = s.update.init(s.params)
            s.update.apply(history, s.params, 0.1, 0, momentum=0.5, only=[1])
        w, b = s.net.learnable_params
        assert w.data.tobytes() == before[0].tobytes() and not history[0].any()
        assert b.data.tobytes() != before[1].tobytes() and history[1].any()
        runs.append([w.data, b.data] + list(history))
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("fields,message", [
    (dict(lr_policy="bogus"), "unknown lr_policy \"bogus\""),
    (dict(lr_policy=""), "lr_policy is not set"),
    (dict(lr_policy="step", stepsize=0), "needs a positive stepsize"),
    (dict(lr_policy="inv", gamma=-1.0), "needs gamma >= 0"),
    (dict(lr_policy="poly", max_iter=0), "max_iter"),
    (dict(regularization_type="L3"), "Unknown regularization type"),
    (dict(type="AdaGrad", momentum=0.9), "Momentum cannot be used with AdaGrad"),
    (dict(type="RMSProp", rms_decay=1.5), "rms_decay should lie between 0 and 1"),
    (dict(type="Adamm"), "Unknown solver type: \"Adamm\""),
])
def test_bad_settings_are_clear_errors(fields, message):
    with pytest.raises(CCTError, match=re.escape(message)):
        make_solver(**fields)


# ------------------------------------------------------------------------------------------------
# snapshot / restore equality
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,fmt", [(k, "BINARYPROTO") for k in sorted(RULE_SETTINGS)]
                         + [("Adam", "HDF5"), ("SGD", "HDF5")])
def test_snapshot_restore_continues_exactly(tmp_path, kind, fmt):
    data = batches(6, seed=8)
    kw = dict(type=kind, weight_decay=0.01, snapshot_prefix=str(tmp_path / "snap"),
              snapshot_format=getattr(caffe_pb2.SolverParameter, fmt), dtype=np.float32,
              lr_policy="inv", gamma=0.1, power=0.75, **RULE_SETTINGS[kind])
    straight = make_solver(**kw)
    w0 = [p.data.copy() for p in straight.net.learnable_params]
    for x, t in data:
        feed(straight, x, t)
        straight.step(1)

    first = make_solver(**kw)
    for p, w in zip(first.net.learnable_params, w0):
        p.data[...] = w
    for x, t in data[:3]:
        feed(first, x, t)
        first.step(1)
    model = first.snapshot()
    ext = ".solverstate.h5" if fmt == "HDF5" else ".solverstate"
    assert model == str(tmp_path / ("snap_iter_3.caffemodel" + (".h5" if fmt == "HDF5" else "")))

    resumed = make_solver(**dict(kw, random_seed=99))   # other initial weights
    resumed.restore(str(tmp_path / ("snap_iter_3" + ext)))
    assert resumed.iter == 3
    for x, t in data[3:]:
        feed(resumed, x, t)
        resumed.step(1)
    for a, b in zip(straight.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    for a, b in zip(straight.history, resumed.history):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------
# fused kernels (C++ SGD, numba for the others) against the steps one by one
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decay", [0.0, 5e-4])
@pytest.mark.parametrize("kind", sorted(RULES))
def test_fused_kernels_equal_the_steps_one_by_one_to_the_bit(kind, decay, dtype):
    """The CPU backend's kernel for each rule against the array kernels' steps one by one (the
    GPU's code, here on NumPy), over several steps on odd shapes with lr_mult and decay_mult,
    byte for byte; a weight of inf stays inf without NaN when there is no decay."""
    from cct.backend import get as get_backend
    from cct.backend.array_kernels import ArrayKernels
    from cct.params import ParamSet, StoreBlob

    rule = RULES[kind]
    p = caffe_pb2.SolverParameter(type=kind, weight_decay=decay, delta=1e-6,
                                  momentum=0.0 if kind in ("AdaGrad", "RMSProp") else 0.9)
    rs = np.random.RandomState(3)
    shapes = [(7, 3, 5), (13,), (1,)]
    start = [rs.randn(*s).astype(dtype) for s in shapes]
    if decay == 0:
        start[2][0] = np.inf
    runs = []
    for backend in (get_backend("cpu"), ArrayKernels(np)):
        params = ParamSet([StoreBlob(w.copy()) for w in start], [1.0, 2.0, 0.5],
                          [1.0, 0.0, 2.0], backend)
        pipeline = UpdatePipeline(rule, p, params)
        grads = np.random.RandomState(4)
        for it in range(4):
            for b in params.blobs:
                b.diff[...] = grads.randn(*b.shape)
            pipeline.apply(0.01, it)
        runs.append([b.data for b in params.blobs] + [b.diff for b in params.blobs]
                    + pipeline.history)
    for fused, steps in zip(*runs):
        assert fused.tobytes() == steps.tobytes(), (fused, steps)

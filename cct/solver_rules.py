"""Caffe's parameter update (``sgd_solver.cpp`` and the other ``*_solver.cpp`` files): the
learning-rate policies and one update pipeline whose last stage is a row of a table of rules.

Per iteration, with ``rate`` from the lr policy (``SGDSolver::ApplyUpdate``)::

    clip      if clip_gradients >= 0 and ||g|| > clip_gradients (L2 norm over ALL params):
                  g *= clip_gradients / ||g||
    then, per learnable param i:
    normalize g /= iter_size                                   (iter_size != 1 only)
    regularize g += local_decay * w        (L2)   or   g += local_decay * sign(w)   (L1)
              local_decay = weight_decay * decay_mult_i
    rule      g <- update value from g and the rule's history, local_rate = rate * lr_mult_i
    and finally, for every param:   w -= g                     (Net::Update)

Caffe clips before it normalizes (the order above), so ``clip_gradients`` bounds the norm of
the gradient summed over the ``iter_size`` passes. The rules (prototxt defaults: momentum 0,
momentum2 0.999, delta 1e-8, rms_decay 0.99), h = history set 1, s = set 2::

    SGD       h = momentum h + local_rate g;               g = h
    Nesterov  h' = momentum h + local_rate g;               g = (1 + momentum) h' - momentum h
    AdaGrad   h += g^2;                                     g = local_rate g / (sqrt(h) + delta)
    RMSProp   h = rms_decay h + (1 - rms_decay) g^2;        g = local_rate g / (sqrt(h) + delta)
    AdaDelta  h = momentum h + (1 - momentum) g^2;
              g = g sqrt((s + delta) / (h + delta));  s = momentum s + (1 - momentum) g^2;
              g = local_rate g
    Adam      h = b1 h + (1 - b1) g;  s = b2 s + (1 - b2) g^2   (b1 = momentum, b2 = momentum2)
              g = local_rate sqrt(1 - b2^t) / (1 - b1^t) h / (sqrt(s) + delta),  t = iter + 1

The history is laid out as in Caffe's ``.solverstate``: one blob per learnable param in net
order (set 1), then, for AdaDelta and Adam, one more per param (set 2). Arithmetic is done in
the params' dtype (float32 like Caffe), in place, with the same rounding steps as Caffe's BLAS
calls (``axpby`` = scale then add). A rule may also name a fused backend kernel that does regularize, rule and
``w -= g`` in one pass over memory with the same steps (SGD: ``sgd_update``).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .errors import CCTError, close_matches
from .glog import info
from .proto import caffe_pb2


def _g(x) -> str:
    return "%g" % float(x)


# ------------------------------------------------------------------------------------------------
# Learning-rate policies (SGDSolver::GetLearningRate)
# ------------------------------------------------------------------------------------------------
# Each policy maps (param, iter, current_step, dtype) to (rate, current_step). The scalar types
# follow Caffe's C++: Dtype (float) where Caffe computes in Dtype, double where it calls ``pow``
# or ``exp`` (which take and return double there), cast back to Dtype at the end.

def _pow(base: float, exp: float) -> float:
    """C's ``pow``, which Caffe calls: inf where the result overflows, NaN where it has no real
    value (poly past max_iter: a negative base to a fractional power); math.pow raises there."""
    try:
        return math.pow(base, exp)
    except (OverflowError, ValueError):
        with np.errstate(all="ignore"):
            return float(np.power(np.float64(base), np.float64(exp)))


def _exp(x: float) -> float:
    """C's ``exp``: inf where the result overflows (math.exp raises)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _lr_fixed(p, it, step, dt):
    return dt(p.base_lr), step


def _lr_step(p, it, step, dt):
    step = it // p.stepsize
    return dt(float(dt(p.base_lr)) * _pow(float(dt(p.gamma)), step)), step


def _lr_exp(p, it, step, dt):
    return dt(float(dt(p.base_lr)) * _pow(float(dt(p.gamma)), it)), step


def _lr_inv(p, it, step, dt):
    base = dt(1) + dt(p.gamma) * dt(it)
    return dt(float(dt(p.base_lr)) * _pow(float(base), -float(dt(p.power)))), step


def _lr_multistep(p, it, step, dt):
    if step < len(p.stepvalue) and it >= p.stepvalue[step]:
        step += 1
        info("sgd_solver.cpp:50", f"MultiStep Status: Iteration {it}, step = {step}")
    return dt(float(dt(p.base_lr)) * _pow(float(dt(p.gamma)), step)), step


def _lr_poly(p, it, step, dt):
    frac = dt(1) - dt(it) / dt(p.max_iter)
    return dt(float(dt(p.base_lr)) * _pow(float(frac), float(dt(p.power)))), step


def _lr_sigmoid(p, it, step, dt):
    z = -float(dt(p.gamma)) * float(dt(it) - dt(p.stepsize))
    return dt(float(dt(p.base_lr)) * (1.0 / (1.0 + _exp(z)))), step


LR_POLICIES: Dict[str, Callable] = {
    "fixed": _lr_fixed, "step": _lr_step, "exp": _lr_exp, "inv": _lr_inv,
    "multistep": _lr_multistep, "poly": _lr_poly, "sigmoid": _lr_sigmoid,
}


def learning_rate(param: caffe_pb2.SolverParameter, iter_: int, current_step: int,
                  dtype=np.float32) -> Tuple[np.floating, int]:
    """Caffe's GetLearningRate at iteration ``iter_``: returns (rate, new current_step).

    fixed: base_lr; step: base_lr gamma^floor(iter/stepsize); exp: base_lr gamma^iter;
    inv: base_lr (1 + gamma iter)^-power; multistep: base_lr gamma^current_step, where
    current_step advances by one when iter reaches the next stepvalue; poly:
    base_lr (1 - iter/max_iter)^power; sigmoid: base_lr / (1 + exp(-gamma (iter - stepsize))).
    """
    return LR_POLICIES[param.lr_policy](param, iter_, current_step, np.dtype(dtype).type)


def check_lr_policy(param: caffe_pb2.SolverParameter, source: str) -> None:
    """The checks Caffe makes (CHECK_GT/CHECK_GE in GetLearningRate), made up front."""
    policy = param.lr_policy
    if policy not in LR_POLICIES:
        what = (f"unknown lr_policy \"{policy}\"" if policy else "lr_policy is not set")
        raise CCTError(f"{source}: {what}; use one of "
                       f"{', '.join(LR_POLICIES)}.{close_matches(policy, LR_POLICIES)}")
    if policy in ("step", "sigmoid") and param.stepsize <= 0:
        raise CCTError(f"{source}: lr_policy \"{policy}\" needs a positive stepsize, got "
                       f"{param.stepsize}.")
    if policy in ("step", "exp", "inv", "multistep", "sigmoid") and param.gamma < 0:
        raise CCTError(f"{source}: lr_policy \"{policy}\" needs gamma >= 0, got "
                       f"{_g(param.gamma)}.")
    if policy == "poly" and param.max_iter <= 0:
        raise CCTError(f"{source}: lr_policy \"poly\" decays to zero at max_iter, which must be "
                       f"positive (got {param.max_iter}).")


# ------------------------------------------------------------------------------------------------
# Update rules: the last stage of the pipeline, one row each
# ------------------------------------------------------------------------------------------------
class Hyper(NamedTuple):
    """Scalars of one rule call, in the params' dtype."""
    local_rate: np.floating
    momentum: np.floating
    momentum2: np.floating
    delta: np.floating
    rms_decay: np.floating
    t: int                          # iter + 1, the step number (Adam's bias correction)


def _sgd(xp, g, h, s, tmp, k: Hyper) -> None:
    g *= k.local_rate
    h *= k.momentum
    h += g
    g[...] = h


def _sgd_fused(backend, w, g, h, k: Hyper, local_decay) -> None:
    backend.sgd_update(w, g, h, k.local_rate, k.momentum, local_decay)


def _nesterov(xp, g, h, s, tmp, k: Hyper) -> None:
    tmp[0][...] = h
    g *= k.local_rate
    h *= k.momentum
    h += g
    tmp[0] *= -k.momentum
    xp.multiply(h, 1 + k.momentum, out=g)
    g += tmp[0]


def _adagrad(xp, g, h, s, tmp, k: Hyper) -> None:
    u = tmp[0]
    xp.multiply(g, g, out=u)
    h += u
    xp.sqrt(h, out=u)
    u += k.delta
    xp.divide(g, u, out=g)
    g *= k.local_rate


def _rmsprop(xp, g, h, s, tmp, k: Hyper) -> None:
    u = tmp[0]
    xp.multiply(g, g, out=u)
    h *= k.rms_decay
    u *= 1 - k.rms_decay
    h += u
    xp.sqrt(h, out=u)
    u += k.delta
    xp.divide(g, u, out=g)
    g *= k.local_rate


def _adadelta(xp, g, h, s, tmp, k: Hyper) -> None:
    u, t = tmp
    xp.multiply(g, g, out=u)
    h *= k.momentum
    u *= 1 - k.momentum
    h += u
    xp.add(s, k.delta, out=u)
    xp.add(h, k.delta, out=t)
    xp.divide(u, t, out=u)
    xp.sqrt(u, out=u)
    g *= u
    xp.multiply(g, g, out=u)
    s *= k.momentum
    u *= 1 - k.momentum
    s += u
    g *= k.local_rate


def _adam(xp, g, h, s, tmp, k: Hyper) -> None:
    t = tmp[0]
    b1, b2 = k.momentum, k.momentum2
    # std::pow(float, int) is computed in double in Caffe, then the factor is cast to Dtype.
    correction = type(b1)(math.sqrt(1.0 - math.pow(float(b2), k.t))
                          / (1.0 - math.pow(float(b1), k.t)))
    h *= b1
    xp.multiply(g, 1 - b1, out=t)
    h += t
    xp.multiply(g, g, out=t)
    s *= b2
    t *= 1 - b2
    s += t
    xp.sqrt(s, out=t)
    t += k.delta
    xp.divide(h, t, out=t)
    xp.multiply(t, k.local_rate * correction, out=g)


def _no_momentum(name: str) -> Callable:
    def check(p: caffe_pb2.SolverParameter) -> Optional[str]:
        if p.momentum != 0:
            return (f"Momentum cannot be used with {name} (momentum: {_g(p.momentum)}); "
                    f"remove it or use type \"SGD\" / \"Nesterov\".")
        return None
    return check


def _check_rmsprop(p: caffe_pb2.SolverParameter) -> Optional[str]:
    msg = _no_momentum("RMSProp")(p)
    if msg is None and not 0 <= p.rms_decay < 1:
        msg = f"rms_decay should lie between 0 and 1 (got {_g(p.rms_decay)})."
    return msg


class UpdateRule(NamedTuple):
    """One row of the rule table."""
    type: str               # Caffe's solver type string (SolverParameter.type)
    history_sets: int       # history blobs per learnable param (1 or 2)
    scratch: int            # temporary arrays per param (Caffe's update_ / temp_)
    compute: Callable       # (xp, g, h, s, tmp, Hyper) -> None; leaves the update in g
    check: Optional[Callable] = None   # param -> error message or None (sanity check)
    # (backend, w, g, h, Hyper, local_decay) -> None: L2 regularization, the rule and
    # w -= update in one backend kernel, leaving the update in g (the same numbers as the
    # stages one by one); used when regularization_type is L2.
    fused: Optional[Callable] = None


RULES: Dict[str, UpdateRule] = {r.type: r for r in (
    UpdateRule("SGD", 1, 1, _sgd, fused=_sgd_fused),
    UpdateRule("Nesterov", 1, 1, _nesterov),
    UpdateRule("AdaGrad", 1, 1, _adagrad, _no_momentum("AdaGrad")),
    UpdateRule("RMSProp", 1, 1, _rmsprop, _check_rmsprop),
    UpdateRule("AdaDelta", 2, 2, _adadelta),
    UpdateRule("Adam", 2, 1, _adam),
)}


def get_rule(type_name: str, source: str = "<solver>") -> UpdateRule:
    try:
        return RULES[type_name]
    except KeyError:
        raise CCTError(f"{source}: Unknown solver type: \"{type_name}\" (known types: "
                       f"{', '.join(sorted(RULES))}).{close_matches(type_name, RULES)}") from None


def check_solver_param(param: caffe_pb2.SolverParameter, rule: UpdateRule, source: str) -> None:
    """Refuse, with a clear message, settings Caffe would die on at its first update."""
    check_lr_policy(param, source)
    if param.regularization_type not in ("L1", "L2"):
        raise CCTError(f"{source}: Unknown regularization type: \"{param.regularization_type}\";"
                       f" use \"L2\" (weight decay on w) or \"L1\" (on sign(w)).")
    if rule.check is not None:
        msg = rule.check(param)
        if msg:
            raise CCTError(f"{source}: {msg}")


# ------------------------------------------------------------------------------------------------
# The pipeline
# ------------------------------------------------------------------------------------------------
class UpdatePipeline:
    """History and scratch of one solver over a :class:`~cct.params.ParamSet`, and
    :meth:`apply` (ApplyUpdate after the rate). The learning rate and the momentum come with
    each call: a schedule, a tuner or a staleness estimate may change them between updates."""

    def __init__(self, rule: UpdateRule, param: caffe_pb2.SolverParameter, params):
        self.rule = rule
        self.param = param
        self.params = params
        self.history: List = []   # Caffe's history_: set 1 for every param, then set 2
        for _ in range(rule.history_sets):
            self.history.extend(b.xp.zeros(b.shape, b.dtype) for b in params.blobs)
        self.scratch: List = [None] * len(params)   # allocated at first use

    def _scratch(self, i: int, blob) -> List:
        if self.scratch[i] is None:
            self.scratch[i] = [blob.xp.empty(blob.shape, blob.dtype)
                               for _ in range(max(self.rule.scratch, 1))]
        return self.scratch[i]

    def clip_gradients(self, blobs) -> None:
        clip = self.param.clip_gradients
        if clip < 0:
            return
        if not blobs:
            return
        dt = blobs[0].dtype.type
        sumsq = dt(0)
        for b in blobs:
            d = b.diff.reshape(-1)
            sumsq += dt(d @ d)
        norm = dt(np.sqrt(sumsq))
        if norm > dt(clip):
            scale = dt(clip) / norm
            info("sgd_solver.cpp:99", f"Gradient clipping: scaling down gradients (L2 norm "
                 f"{_g(norm)} > {_g(dt(clip))}) by scale factor {_g(scale)}")
            for b in blobs:
                b.diff *= scale

    def apply(self, rate, iter_: int, momentum: Optional[float] = None, params=None,
              only: Optional[Sequence[int]] = None) -> None:
        """Clip, then per param normalize, regularize and compute the update value, then
        ``w -= update`` for every param. ``iter_`` is the count of updates done so far;
        ``momentum`` replaces the SolverParameter's (negative values allowed); ``params``, a
        ParamSet of the same shapes and multipliers, replaces the pipeline's own for this
        call (a parameter store's weights with a group's gradients, uncopied); ``only`` names
        the params to update (by position; the others are left alone, and the clipping norm is
        theirs alone: Omnivore's FC layers updated apart from the conv layers)."""
        p = self.param
        params = self.params if params is None else params
        momentum = p.momentum if momentum is None else momentum
        n = len(params)
        chosen = range(n) if only is None else sorted(set(only))
        self.clip_gradients([params.blobs[i] for i in chosen])
        fused = self.rule.fused if p.regularization_type == "L2" else None
        staged = []
        for i in chosen:
            blob = params.blobs[i]
            xp = blob.xp
            dt = blob.dtype.type
            g = blob.diff
            if p.iter_size != 1:
                g *= dt(1) / dt(p.iter_size)
            local_decay = dt(p.weight_decay) * dt(params.decay_mult[i])
            k = Hyper(local_rate=dt(rate) * dt(params.lr_mult[i]), momentum=dt(momentum),
                      momentum2=dt(p.momentum2), delta=dt(p.delta), rms_decay=dt(p.rms_decay),
                      t=iter_ + 1)
            if fused is not None:
                fused(params.backend, blob.data, g, self.history[i], k, local_decay)
                continue
            tmp = self._scratch(i, blob)
            if local_decay:
                if p.regularization_type == "L2":
                    xp.multiply(blob.data, local_decay, out=tmp[0])
                else:
                    xp.sign(blob.data, out=tmp[0])
                    tmp[0] *= local_decay
                g += tmp[0]
            s = self.history[n + i] if self.rule.history_sets > 1 else None
            self.rule.compute(xp, g, self.history[i], s, tmp, k)
            staged.append(blob)
        for blob in staged:
            blob.data[...] -= blob.diff

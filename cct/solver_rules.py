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
calls (``axpby`` = scale then add). Each rule is a backend kernel (its row names it) that
regularizes, applies the rule and does ``w -= g`` for one param: on the CPU in one fused pass
over memory (SGD in C++, the others in numba: cct/backend/jit.py), elsewhere as the steps one
by one (cct/backend/array_kernels.py), the same numbers to the bit.

The update is optax's shape, the schedule apart from it: a :class:`Schedule` gives the rate at
an iteration (Caffe's GetLearningRate); a :class:`SolverUpdate` is ``init(params) -> state``
(the history) and ``apply(state, params, rate, iter)`` (ApplyUpdate after the rate). A driver
with many parameter sets keeps one state per set and calls the same update on each.
"""
from __future__ import annotations

import functools
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


#: The SolverParameter fields an lr policy reads.
SCHEDULE_FIELDS = ("lr_policy", "base_lr", "gamma", "power", "stepsize", "stepvalue", "max_iter")


class Schedule:
    """An lr policy as a function of the iteration: ``schedule(iter, current_step)`` is
    :func:`learning_rate` (Caffe's GetLearningRate) on the policy fields of the
    SolverParameter it was built from, copied then, so that a schedule is a value nobody
    changes behind the solver's back (optax's schedules are functions of the step count).

    ``current_step`` is Caffe's: the multistep policy's count of stepvalues passed, advanced
    by at most one per call and saved in the solverstate; the caller keeps it (the solver,
    beside ``iter``) and passes it back. Other policies return it unchanged, except ``step``,
    which sets it to ``iter // stepsize`` as Caffe does. A tuner changes the rate by building
    another schedule (:meth:`with_base_lr`) and giving it to the solver."""

    def __init__(self, param: caffe_pb2.SolverParameter, dtype=np.float32):
        self.param = caffe_pb2.SolverParameter()
        copy_schedule_fields(param, self.param)
        self.dtype = np.dtype(dtype)

    def __call__(self, iter_: int, current_step: int = 0) -> Tuple[np.floating, int]:
        """(rate at iteration ``iter_``, new current_step)."""
        return learning_rate(self.param, iter_, current_step, self.dtype)

    @property
    def base_lr(self) -> float:
        return self.param.base_lr

    @property
    def lr_policy(self) -> str:
        return self.param.lr_policy

    def with_base_lr(self, base_lr: float) -> "Schedule":
        """The same policy from another base_lr (stored as the prototxt's float, as if the
        solver file had said it)."""
        out = Schedule(self.param, self.dtype)
        out.param.base_lr = base_lr
        return out

    def __repr__(self) -> str:
        return f"Schedule({self.lr_policy!r}, base_lr={_g(self.base_lr)})"


def copy_schedule_fields(src: caffe_pb2.SolverParameter, dst: caffe_pb2.SolverParameter) -> None:
    """The policy fields of ``src`` into ``dst``, unset where ``src`` leaves them unset (so a
    solver's param printed afterwards shows only what was given)."""
    for name in SCHEDULE_FIELDS:
        if name == "stepvalue":
            del dst.stepvalue[:]
            dst.stepvalue.extend(src.stepvalue)
        elif src.HasField(name):
            setattr(dst, name, getattr(src, name))
        else:
            dst.ClearField(name)


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


def _adam_step(k: Hyper):
    """local_rate x Adam's bias correction sqrt(1 - b2^t) / (1 - b1^t). std::pow(float, int)
    is computed in double in Caffe, then the factor is cast to Dtype."""
    b1, b2 = k.momentum, k.momentum2
    correction = type(b1)(math.sqrt(1.0 - math.pow(float(b2), k.t))
                          / (1.0 - math.pow(float(b1), k.t)))
    return k.local_rate * correction


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
    """One row of the rule table: the backend kernel that applies the rule to one param
    (regularization, the rule, ``w -= update``; the update value left in the diff) as
    ``kernel(w, g, history set 1[, set 2], *scalars(Hyper), local_decay)``."""
    type: str               # Caffe's solver type string (SolverParameter.type)
    history_sets: int       # history blobs per learnable param (1 or 2)
    kernel: str
    scalars: Callable       # Hyper -> the kernel's scalars, in the params' dtype
    check: Optional[Callable] = None   # param -> error message or None (sanity check)
    # The kernel can leave the diff zero instead of the update value (clear_diff=True): the
    # next iteration's ClearParamDiffs, on the CPU in the update's own pass over memory.
    clears_diff: bool = False


RULES: Dict[str, UpdateRule] = {r.type: r for r in (
    UpdateRule("SGD", 1, "sgd_update", lambda k: (k.local_rate, k.momentum), clears_diff=True),
    UpdateRule("Nesterov", 1, "nesterov_update",
               lambda k: (k.local_rate, k.momentum, 1 + k.momentum)),
    UpdateRule("AdaGrad", 1, "adagrad_update", lambda k: (k.local_rate, k.delta),
               _no_momentum("AdaGrad")),
    UpdateRule("RMSProp", 1, "rmsprop_update",
               lambda k: (k.local_rate, k.rms_decay, k.delta, 1 - k.rms_decay), _check_rmsprop),
    UpdateRule("AdaDelta", 2, "adadelta_update",
               lambda k: (k.local_rate, k.momentum, k.delta, 1 - k.momentum)),
    UpdateRule("Adam", 2, "adam_update",
               lambda k: (k.momentum, k.momentum2, k.delta, 1 - k.momentum, 1 - k.momentum2,
                          _adam_step(k))),
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
# The update
# ------------------------------------------------------------------------------------------------
class SolverUpdate:
    """What one Caffe solver type does to a parameter set once the rate is known
    (SGDSolver::ApplyUpdate after GetLearningRate: clip, normalize, regularize, the rule,
    ``w -= update``), in optax's shape: :meth:`init` makes the state, :meth:`apply` takes it.
    Named after the solver, not an optimizer: it is Caffe's update for ``param.type``, with
    the settings of ``param`` (momentum, clip_gradients, weight_decay, ... read at each call,
    so a change to the param shows in the next update).

    The state is Caffe's history, a list of arrays in the solverstate's order; the rate, the
    iteration and the momentum come with each call, so one update serves the solver's own
    parameter set and any other of the same shapes (a model replica, a store's shard)."""

    def __init__(self, rule: UpdateRule, param: caffe_pb2.SolverParameter):
        self.rule = rule
        self.param = param

    def init(self, params) -> List:
        """Zero history for ``params`` (a ParamSet), on its backend: set 1 for every param,
        then set 2 (Caffe's history_)."""
        history: List = []
        for _ in range(self.rule.history_sets):
            history.extend(b.xp.zeros(b.shape, b.dtype) for b in params.blobs)
        return history

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

    def apply(self, state: List, params, rate, iter_: int, momentum: Optional[float] = None,
              only: Optional[Sequence[int]] = None, clear_diffs: bool = False) -> bool:
        """Clip, then per param normalize, regularize and compute the update value, then
        ``w -= update`` for every param, in place: the weights, the diffs (left holding the
        update value) and ``state`` (the history from :meth:`init` for these params).
        ``iter_`` is the count of updates done so far; ``momentum`` replaces the
        SolverParameter's (negative values allowed); ``only`` names the params to update (by
        position; the others are left alone, and the clipping norm is theirs alone:
        Omnivore's FC layers updated apart from the conv layers).

        ``clear_diffs`` asks for every diff to be left zero instead (the next iteration's
        ClearParamDiffs, for a caller that knows nothing reads the update values first): done
        where the rule's kernel takes ``clear_diff`` (SGD's: on the CPU in its own pass over
        memory), for every param; returns whether it was (else the diffs hold the update
        values as above)."""
        p = self.param
        momentum = p.momentum if momentum is None else momentum
        n = len(params)
        chosen = range(n) if only is None else sorted(set(only))
        self.clip_gradients([params.blobs[i] for i in chosen])
        kernel = getattr(params.backend, self.rule.kernel)
        clear = clear_diffs and self.rule.clears_diff and only is None
        if clear:
            kernel = functools.partial(kernel, clear_diff=True)
        for i in chosen:
            blob = params.blobs[i]
            dt = blob.dtype.type
            g = blob.diff
            if p.iter_size != 1:
                g *= dt(1) / dt(p.iter_size)
            local_decay = dt(p.weight_decay) * dt(params.decay_mult[i])
            if local_decay and p.regularization_type == "L1":
                g += blob.xp.sign(blob.data) * local_decay
                local_decay = dt(0)          # the kernel regularizes L2 only
            k = Hyper(local_rate=dt(rate) * dt(params.lr_mult[i]), momentum=dt(momentum),
                      momentum2=dt(p.momentum2), delta=dt(p.delta), rms_decay=dt(p.rms_decay),
                      t=iter_ + 1)
            kernel(blob.data, g, *state[i::n], *self.rule.scalars(k), local_decay)
        return clear


class UpdatePipeline:
    """A :class:`SolverUpdate` bound to one parameter set and its history (``.history``), for
    callers that update one set only (a store shard, a benchmark): ``apply(rate, iter)``."""

    def __init__(self, rule: UpdateRule, param: caffe_pb2.SolverParameter, params):
        self.update = SolverUpdate(rule, param)
        self.rule = rule
        self.param = param
        self.params = params
        self.history: List = self.update.init(params)

    def clip_gradients(self, blobs) -> None:
        self.update.clip_gradients(blobs)

    def apply(self, rate, iter_: int, momentum: Optional[float] = None, params=None,
              only: Optional[Sequence[int]] = None) -> None:
        """:meth:`SolverUpdate.apply` on this history; ``params``, a ParamSet of the same
        shapes and multipliers, replaces the bound one for this call (a parameter store's
        weights with a group's gradients, uncopied)."""
        self.update.apply(self.history, self.params if params is None else params, rate,
                          iter_, momentum, only)

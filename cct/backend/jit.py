"""CPU kernels compiled by numba: the solver rules other than SGD, fused.

Each kernel does what sgd_solver.cpp and its siblings do in several passes over memory (L2
Regularize, ComputeUpdateValue with its temporaries, Blob::Update) in one pass, element by
element, with the same float operations in the same order: the results are the staged NumPy
path's to the bit (numba neither contracts a*b+c into an FMA nor reorders without
``fastmath``; ``error_model="numpy"`` lets a division vectorize instead of checking for a
zero divisor). Measured in bench/bench_update_rules.py against the staged NumPy expressions
(bench/RESULTS.md). SGD stays in C++ (``_C.sgd_update``), which measured as fast.

Arguments: the flat (``reshape(-1)``) data, diff and history arrays of one param, then the
rule's scalars in the arrays' dtype, then ``local_decay`` (0: no regularization term, so that
an inf or NaN weight does not turn its update into NaN where Caffe's would not). The update
value is left in diff, as Caffe leaves it. Compiled on first use (about a second per rule and
dtype), cached on disk beside this module or in numba's user-wide cache.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_jit = njit(nogil=True, cache=True, error_model="numpy")


@_jit
def nesterov(w, g, h, local_rate, momentum, one_plus_momentum, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        old = h[i]
        hi = h[i] * momentum + gi * local_rate
        h[i] = hi
        u = hi * one_plus_momentum + old * -momentum
        g[i] = u
        w[i] -= u


@_jit
def adagrad(w, g, h, local_rate, delta, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] + gi * gi
        h[i] = hi
        u = gi / (np.sqrt(hi) + delta) * local_rate
        g[i] = u
        w[i] -= u


@_jit
def rmsprop(w, g, h, local_rate, rms_decay, delta, one_minus_decay, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] * rms_decay + gi * gi * one_minus_decay
        h[i] = hi
        u = gi / (np.sqrt(hi) + delta) * local_rate
        g[i] = u
        w[i] -= u


@_jit
def adadelta(w, g, h, s, local_rate, momentum, delta, one_minus_momentum, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] * momentum + gi * gi * one_minus_momentum
        h[i] = hi
        gi = gi * np.sqrt((s[i] + delta) / (hi + delta))
        s[i] = s[i] * momentum + gi * gi * one_minus_momentum
        u = gi * local_rate
        g[i] = u
        w[i] -= u


@_jit
def adam(w, g, m, v, beta1, beta2, delta, one_minus_beta1, one_minus_beta2, step,
         local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        mi = m[i] * beta1 + gi * one_minus_beta1
        vi = v[i] * beta2 + gi * gi * one_minus_beta2
        m[i] = mi
        v[i] = vi
        u = mi / (np.sqrt(vi) + delta) * step
        g[i] = u
        w[i] -= u

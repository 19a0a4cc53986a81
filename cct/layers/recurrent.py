"""Recurrent layers: LSTM and RNN over whole sequences, and LSTMUnit, one LSTM timestep
(Caffe's recurrent_layer.cpp, lstm_layer.cpp, lstm_unit_layer.cpp, rnn_layer.cpp).

LSTM and RNN take, in Caffe's order, the bottoms ``x`` (T x N x ...: T timesteps of N
independent streams, at least 3 axes), ``cont`` (T x N, the sequence continuation indicators),
an optional ``x_static`` (N x ...: one input per stream, seen at every timestep) and, with
``recurrent_param.expose_hidden``, the initial state ``h_0`` (and ``c_0`` for LSTM), each
1 x N x num_output. Their tops are the output sequence (T x N x num_output) and, with
``expose_hidden``, the final state ``h_T`` (and ``c_T``), 1 x N x num_output each.
``cont_t = 0`` begins a new sequence at step t: the state carried into step t is multiplied by
``cont_t``. Without ``expose_hidden`` the state carries over from one forward pass to the next
(Caffe copies the last pass's h_T, c_T into h_0, c_0), starting from zeros; :meth:`reset`
zeroes it (Caffe's ``RecurrentLayer::Reset``); no gradient crosses passes. T is fixed when the
layer is set up; N may change (the carried state then restarts from zeros). Defaults:
num_output must be given, fillers constant 0, expose_hidden false.

Caffe builds each LSTM or RNN layer as a hidden net unrolled over T steps (InnerProduct, Scale,
Eltwise, LSTMUnit or TanH layers per step, params shared between steps by name). cct computes
the same functions directly: one GEMM applies the input weights to all T steps at once, then a
loop over t does the recurrent GEMM and the element-wise step, and the backward pass runs the
loop in reverse. A layer here does math and holds no Net (the Blob/Net/Layer separation), and
the T copies of every layer and intermediate blob would cost memory and per-layer overhead for
nothing. The params are the unrolled net's own params, in its order and with its shapes, so a
Caffe caffemodel's weights load into cct and save back unchanged (H = num_output,
K = x.count(2), S = x_static.count(1)):

* LSTM: W_xc (4H x K), b_c (4H), [W_xc_static (4H x S)], W_hc (4H x H);
* RNN: W_xh (H x K), b_h (H), [W_xh_static (H x S)], W_hh (H x H), W_ho (H x H), b_o (H).

Where cct differs from Caffe:

* Exposed state is differentiated. Caffe's unrolled net shares only the data of the h_0/c_0
  bottoms and h_T/c_T tops, so it writes no gradient into h_0/c_0 and drops the diff of
  h_T/c_T; cct backpropagates through them (the true gradient, as cct's neuron layers compute
  the true gradient where Caffe does not). With nothing consuming h_T/c_T the param and x
  gradients are Caffe's.
* For a cont value other than 0 and 1 Caffe's LSTMUnit differentiates its forget gate
  f = cont sigmoid(f') as f (1 - f); cct uses d f / d f' = cont sigmoid(f') (1 - sigmoid(f')).
  For binary cont the two agree.
* Caffe fills every timestep's copy of W_hc (W_hh, W_ho, b_o) before sharing them; cct fills
  each param once, in param order (the values never match Caffe's RNG anyway).
* Params given in the prototxt (``blobs`` inside ``layer { }``) are used; Caffe discards them.
* ``recurrent_param.debug_info`` is accepted and does nothing: there is no unrolled net whose
  blobs it would print.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..blob import Blob
from ..filler import fill
from .base import Layer, register


# --------------------------------------------------------------------------------------------
# Kernels: array-generic (xp), shared by LSTM and LSTMUnit
# --------------------------------------------------------------------------------------------
def _sigmoid(xp, x):
    """Overflow-free ``1 / (1 + exp(-x))``."""
    return 0.5 * xp.tanh(0.5 * x) + 0.5


def lstm_unit_forward(xp, c_prev, gates, cont, c, h, tanh_c) -> None:
    """One LSTM step for N streams (Caffe's LSTMUnit forward).

    ``gates`` (N x 4H) holds the pre-activations (i', f', o', g') and is overwritten by
    (sigmoid i', sigmoid f', sigmoid o', tanh g'), which the backward pass reads; ``cont`` (N)
    scales the forget gate; ``c``, ``h``, ``tanh_c`` (N x H) are written."""
    hd = c.shape[-1]
    gates[:, :3 * hd] = _sigmoid(xp, gates[:, :3 * hd])
    gates[:, 3 * hd:] = xp.tanh(gates[:, 3 * hd:])
    i, sf, o, g = (gates[:, k * hd:(k + 1) * hd] for k in range(4))
    c[...] = cont[:, None] * sf * c_prev + i * g
    tanh_c[...] = xp.tanh(c)
    h[...] = o * tanh_c


def lstm_unit_backward(xp, dc, dh, c_prev, cont, acts, tanh_c, dgates):
    """Gradients of :func:`lstm_unit_forward`: writes d loss / d (i', f', o', g') into
    ``dgates`` (N x 4H) and returns d loss / d c_prev, given the diffs ``dc`` and ``dh`` of c
    and h and the saved ``acts`` and ``tanh_c``."""
    hd = c_prev.shape[-1]
    i, sf, o, g = (acts[:, k * hd:(k + 1) * hd] for k in range(4))
    keep = cont[:, None]
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    dgates[:, :hd] = dc_total * g * i * (1 - i)
    dgates[:, hd:2 * hd] = dc_total * c_prev * keep * sf * (1 - sf)
    dgates[:, 2 * hd:3 * hd] = dh * tanh_c * o * (1 - o)
    dgates[:, 3 * hd:] = dc_total * i * (1 - g * g)
    return dc_total * keep * sf


# --------------------------------------------------------------------------------------------
# LSTMUnit
# --------------------------------------------------------------------------------------------
@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM timestep. Bottoms: c_prev (1 x N x H), the gate inputs x (1 x N x 4H, in the
    order i', f', o', g'), cont (1 x N); tops: c and h (1 x N x H each)::

        i = sigmoid(i')   f = cont sigmoid(f')   o = sigmoid(o')   g = tanh(g')
        c = f c_prev + i g
        h = o tanh(c)

    No params. There is no gradient with respect to cont."""

    exact_num_bottom_blobs = 3
    exact_num_top_blobs = 2

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        if any(t is b for t in top for b in bottom):
            raise self.error("cannot run in place (a top is also a bottom): the backward pass "
                             "reads c_prev and the gate inputs; give each top its own name.")

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        c_prev, x, cont = bottom
        if c_prev.num_axes != 3 or c_prev.shape[0] != 1:
            raise self.error(f"bottom[0] (c_prev) must have shape (1, N, H), got "
                             f"{c_prev.shape}.")
        n, hd = c_prev.shape[1:]
        if x.shape != (1, n, 4 * hd):
            raise self.error(f"bottom[1] (the gate inputs) has shape {x.shape}, expected "
                             f"(1, N, 4 H) = {(1, n, 4 * hd)} for bottom[0] (c_prev) of shape "
                             f"{c_prev.shape}: i', f', o', g' for every stream.")
        if cont.shape != (1, n):
            raise self.error(f"bottom[2] (cont) has shape {cont.shape}, expected (1, N) = "
                             f"{(1, n)}: one continuation indicator per stream.")
        top[0].reshape(c_prev.shape)
        top[1].reshape(c_prev.shape)

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        xp = self.xp
        self._acts = bottom[1].data[0].copy()
        self._tanh_c = xp.empty_like(bottom[0].data[0])
        lstm_unit_forward(xp, bottom[0].data[0], self._acts, bottom[2].data[0],
                          top[0].data[0], top[1].data[0], self._tanh_c)

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        if propagate_down[2]:
            raise self.error("cannot backpropagate to bottom[2] (the sequence continuation "
                             "indicators); set propagate_down: false for it.")
        if not (propagate_down[0] or propagate_down[1]):
            return
        dgates = self.xp.empty_like(self._acts)
        dc_prev = lstm_unit_backward(self.xp, top[0].diff[0], top[1].diff[0],
                                     bottom[0].data[0], bottom[2].data[0], self._acts,
                                     self._tanh_c, dgates)
        if propagate_down[0]:
            bottom[0].diff[0] = dc_prev
        if propagate_down[1]:
            bottom[1].diff[0] = dgates


# --------------------------------------------------------------------------------------------
# LSTM and RNN
# --------------------------------------------------------------------------------------------
class RecurrentLayer(Layer):
    """What LSTM and RNN share (Caffe's RecurrentLayer): bottoms, tops and their checks, the
    carried state, and the input transform W_x x_t + b (+ W_static x_static) applied to all
    timesteps in one GEMM. A subclass names its ``states``, lists its params
    (:meth:`param_specs`), and runs the time loop."""

    #: The recurrent state blobs, in Caffe's order for exposed bottoms and tops.
    states: Tuple[str, ...] = ("h",)
    #: Rows of the input transform per num_output (4 for the LSTM's four gates).
    gates_per_output: int = 1

    def __init__(self, layer_param, backend, dtype=np.float32):
        super().__init__(layer_param, backend, dtype)
        exposed = len(self.states) if layer_param.recurrent_param.expose_hidden else 0
        self.min_bottom_blobs = 2 + exposed
        self.max_bottom_blobs = 3 + exposed
        self.exact_num_top_blobs = 1 + exposed
        self._carried: Optional[List] = None

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    # -- params --------------------------------------------------------------------------------
    def param_specs(self) -> List[Tuple[str, Tuple[int, ...], bool]]:
        """(Caffe's param name, shape, is a bias) of every param, in Caffe's order."""
        raise NotImplementedError

    def _input_specs(self, names: Sequence[str]) -> List[Tuple[str, Tuple[int, ...], bool]]:
        g = self.gates_per_output * self.num_output
        specs = [(names[0], (g, self.k), False), (names[1], (g,), True)]
        if self.static_input:
            specs.append((names[2], (g, self.s), False))
        return specs

    def _param(self, name: str) -> Blob:
        return self.blobs[self.param_index[name]]

    def _learns(self, name: str) -> bool:
        return self.param_propagate_down[self.param_index[name]]

    # -- setup ---------------------------------------------------------------------------------
    def _check_x(self, x: Blob) -> None:
        if x.num_axes < 3:
            raise self.error(f"bottom[0] (x) must have at least 3 axes (T timesteps, N streams, "
                             f"features...), got shape {x.shape}; reshape it to (T, N, 1) for "
                             f"one feature per step.")

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        rp = self.layer_param.recurrent_param
        (self.num_output,) = self.int_params("recurrent_param.num_output", rp.num_output)
        if self.num_output <= 0:
            raise self.error("recurrent_param.num_output must be given and positive (the size "
                             "of the hidden state).")
        if any(t is b for t in top for b in bottom):
            raise self.error("cannot run in place (a top is also a bottom): every output step "
                             "reads the whole input sequence; give each top its own name.")
        self.expose_hidden = rp.expose_hidden
        self.static_input = len(bottom) > 2 + (len(self.states) if self.expose_hidden else 0)
        x = bottom[0]
        self._check_x(x)
        self.t = x.shape[0]
        self.k = x.count_range(2)
        if self.static_input:
            xs = bottom[2]
            if xs.num_axes < 2:
                raise self.error(f"bottom[2] (x_static) must have at least 2 axes (N streams, "
                                 f"features...), got shape {xs.shape}.")
            self.s = xs.count_range(1)
        specs = self.param_specs()
        self.param_index = {name: i for i, (name, _, _) in enumerate(specs)}
        if self.blobs:
            self._check_given_params(specs)
            return
        for name, shape, is_bias in specs:
            blob = self.new_blob(shape)
            fill(blob.data, rp.bias_filler if is_bias else rp.weight_filler,
                 f"{self.type} layer '{self.name}': {name}: ")
            self.blobs.append(blob)

    def _check_given_params(self, specs) -> None:
        names = ", ".join(name for name, _, _ in specs)
        if len(self.blobs) != len(specs):
            raise self.error(f"has {len(self.blobs)} param blob(s) in the prototxt, expected "
                             f"{len(specs)}: {names}.")
        for i, ((name, shape, _), blob) in enumerate(zip(specs, self.blobs)):
            if blob.shape != shape:
                raise self.error(f"param {i} ({name}) has shape {blob.shape} in the prototxt, "
                                 f"expected {shape}.")

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        x, cont = bottom[0], bottom[1]
        self._check_x(x)
        if x.shape[0] != self.t:
            raise self.error(f"bottom[0] (x) has {x.shape[0]} timesteps, but the layer was set "
                             f"up for T = {self.t}: as in Caffe the number of timesteps is "
                             f"fixed at setup; build the net again for another T.")
        n = x.shape[1]
        if x.count_range(2) != self.k:
            raise self.error(f"bottom[0] (x) of shape {x.shape} has {x.count_range(2)} values "
                             f"per step and stream, the weights W_x were made for {self.k}.")
        if cont.shape != (self.t, n):
            raise self.error(f"bottom[1] (cont) has shape {cont.shape}, expected (T, N) = "
                             f"{(self.t, n)} to match bottom[0] (x) of shape {x.shape}: one "
                             f"continuation indicator per timestep and stream.")
        if self.static_input:
            xs = bottom[2]
            if xs.num_axes < 2 or xs.shape[0] != n or xs.count_range(1) != self.s:
                raise self.error(f"bottom[2] (x_static) has shape {xs.shape}, expected N = {n} "
                                 f"streams of {self.s} values (x has shape {x.shape}).")
        self.n = n
        state_shape = (1, n, self.num_output)
        if self.expose_hidden:
            first = 2 + self.static_input
            for j, name in enumerate(self.states):
                b = bottom[first + j]
                if b.shape != state_shape:
                    raise self.error(f"bottom[{first + j}] ({name}_0) has shape {b.shape}, "
                                     f"expected (1, N, num_output) = {state_shape}.")
            for j in range(len(self.states)):
                top[1 + j].reshape(state_shape)
        elif self._carried is None or self._carried[0].shape != state_shape:
            self.reset()
        top[0].reshape((self.t, n, self.num_output))

    def reset(self) -> None:
        """Zero the state carried from one forward pass to the next (Caffe's Reset)."""
        if hasattr(self, "n"):
            shape = (1, self.n, self.num_output)
            self._carried = [self.xp.zeros(shape, self.dtype) for _ in self.states]

    # -- shared passes -------------------------------------------------------------------------
    def initial_state(self, bottom: List[Blob]) -> List:
        """The state entering step 1, each N x H: the exposed bottoms or the carried state."""
        if self.expose_hidden:
            first = 2 + self.static_input
            return [bottom[first + j].data[0].copy() for j in range(len(self.states))]
        return [s[0] for s in self._carried]

    def final_state(self, top: List[Blob], state: Sequence) -> None:
        """Hand the state after step T to the exposed tops, or keep it for the next pass."""
        if self.expose_hidden:
            for j, s in enumerate(state):
                top[1 + j].data[0] = s
        else:
            self._carried = [s[None].copy() for s in state]

    def final_state_diffs(self, top: List[Blob]) -> List:
        """d loss / d state after step T, each N x H: the exposed tops' diffs, else zeros."""
        if self.expose_hidden:
            return [top[1 + j].diff[0].copy() for j in range(len(self.states))]
        return [self.xp.zeros((self.n, self.num_output), self.dtype) for _ in self.states]

    def initial_state_diffs(self, propagate_down: List[bool], bottom: List[Blob],
                            diffs: Sequence) -> None:
        if self.expose_hidden:
            first = 2 + self.static_input
            for j, d in enumerate(diffs):
                if propagate_down[first + j]:
                    bottom[first + j].diff[0] = d

    def input_forward(self, bottom: List[Blob], names: Sequence[str]):
        """(W_x x_t + b for every t as T x N x G, W_static x_static as N x G or None)."""
        g = self.gates_per_output * self.num_output
        x2 = bottom[0].data.reshape(self.t * self.n, self.k)
        gx = self.xp.empty((self.t * self.n, g), self.dtype)
        gx[...] = self._param(names[1]).data
        self.backend.matmul(x2, self._param(names[0]).data.T, out=gx, accumulate=True)
        static = None
        if self.static_input:
            xs2 = bottom[2].data.reshape(self.n, self.s)
            static = self.backend.matmul(xs2, self._param(names[2]).data.T)
        return gx.reshape(self.t, self.n, g), static

    def input_backward(self, dpre, propagate_down: List[bool], bottom: List[Blob],
                       names: Sequence[str]) -> None:
        """Backward of :meth:`input_forward`, given d loss / d pre-activation (T x N x G)."""
        d2 = dpre.reshape(self.t * self.n, -1)
        w_x = self._param(names[0])
        if self._learns(names[0]):
            x2 = bottom[0].data.reshape(self.t * self.n, self.k)
            self.backend.matmul(d2.T, x2, out=w_x.diff, accumulate=True)
        if self._learns(names[1]):
            self.backend.bias_backward(d2, out=self._param(names[1]).diff, accumulate=True)
        if propagate_down[0]:
            self.backend.matmul(d2, w_x.data, out=bottom[0].diff.reshape(self.t * self.n,
                                                                          self.k))
        if self.static_input:
            w_s = self._param(names[2])
            ds = dpre.sum(axis=0)
            if self._learns(names[2]):
                xs2 = bottom[2].data.reshape(self.n, self.s)
                self.backend.matmul(ds.T, xs2, out=w_s.diff, accumulate=True)
            if propagate_down[2]:
                self.backend.matmul(ds, w_s.data, out=bottom[2].diff.reshape(self.n, self.s))

    def check_no_cont_gradient(self, propagate_down: List[bool]) -> None:
        if propagate_down[1]:
            raise self.error("cannot backpropagate to bottom[1] (the sequence continuation "
                             "indicators); set propagate_down: false for it.")


@register("LSTM")
class LSTMLayer(RecurrentLayer):
    """Long short-term memory (Caffe's LSTM, after Zaremba and Sutskever's "Learning to
    execute"), without peephole connections. With H = num_output, for t = 1..T::

        h'_{t-1} = cont_t h_{t-1}
        (i', f', o', g') = W_hc h'_{t-1} + W_xc x_t + b_c [+ W_xc_static x_static]
        i = sigmoid(i')   f = cont_t sigmoid(f')   o = sigmoid(o')   g = tanh(g')
        c_t = f c_{t-1} + i g
        h_t = o tanh(c_t)

    The top is h_1..h_T (T x N x H); the gate rows of W_xc, b_c, W_hc are ordered i, f, o, g.
    Params: W_xc (4H x K), b_c (4H), [W_xc_static (4H x S)], W_hc (4H x H)."""

    states = ("h", "c")
    gates_per_output = 4
    _INPUT = ("W_xc", "b_c", "W_xc_static")

    def param_specs(self):
        hd = self.num_output
        return self._input_specs(self._INPUT) + [("W_hc", (4 * hd, hd), False)]

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        xp, t_steps, n, hd = self.xp, self.t, self.n, self.num_output
        w_hc = self._param("W_hc").data
        gx, static = self.input_forward(bottom, self._INPUT)
        h_prev, c_prev = self.initial_state(bottom)
        self._c0 = c_prev.copy()
        cont = bottom[1].data
        h = top[0].data
        self._h_conted = xp.empty((t_steps, n, hd), self.dtype)
        self._acts = xp.empty((t_steps, n, 4 * hd), self.dtype)
        self._c = xp.empty((t_steps, n, hd), self.dtype)
        self._tanh_c = xp.empty((t_steps, n, hd), self.dtype)
        for t in range(t_steps):
            xp.multiply(cont[t][:, None], h_prev, out=self._h_conted[t])
            gates = self._acts[t]
            # Summed in the order of Caffe's Eltwise: W_hc h', then W_xc x_t + b_c, then static.
            self.backend.matmul(self._h_conted[t], w_hc.T, out=gates)
            gates += gx[t]
            if static is not None:
                gates += static
            lstm_unit_forward(xp, c_prev, gates, cont[t], self._c[t], h[t], self._tanh_c[t])
            h_prev, c_prev = h[t], self._c[t]
        self.final_state(top, (h_prev, c_prev))

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        self.check_no_cont_gradient(propagate_down)
        xp, t_steps, n, hd = self.xp, self.t, self.n, self.num_output
        w_hc = self._param("W_hc").data
        cont = bottom[1].data
        dh_top = top[0].diff
        dh_next, dc_next = self.final_state_diffs(top)
        dpre = xp.empty((t_steps, n, 4 * hd), self.dtype)
        for t in range(t_steps - 1, -1, -1):
            c_prev = self._c[t - 1] if t else self._c0
            dc_next = lstm_unit_backward(xp, dc_next, dh_top[t] + dh_next, c_prev, cont[t],
                                         self._acts[t], self._tanh_c[t], dpre[t])
            dh_next = self.backend.matmul(dpre[t], w_hc) * cont[t][:, None]
        if self._learns("W_hc"):
            self.backend.matmul(dpre.reshape(t_steps * n, 4 * hd).T,
                                self._h_conted.reshape(t_steps * n, hd),
                                out=self._param("W_hc").diff, accumulate=True)
        self.input_backward(dpre, propagate_down, bottom, self._INPUT)
        self.initial_state_diffs(propagate_down, bottom, (dh_next, dc_next))


@register("RNN")
class RNNLayer(RecurrentLayer):
    """Simple recurrent network (Caffe's RNN), with H = num_output, for t = 1..T::

        h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static])
        o_t = tanh(W_ho h_t + b_o)

    The top is o_1..o_T (T x N x H). Params: W_xh (H x K), b_h (H), [W_xh_static (H x S)],
    W_hh (H x H), W_ho (H x H), b_o (H)."""

    states = ("h",)
    _INPUT = ("W_xh", "b_h", "W_xh_static")

    def param_specs(self):
        hd = self.num_output
        return self._input_specs(self._INPUT) + [
            ("W_hh", (hd, hd), False), ("W_ho", (hd, hd), False), ("b_o", (hd,), True)]

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        xp, t_steps, n, hd = self.xp, self.t, self.n, self.num_output
        w_hh = self._param("W_hh").data
        gx, static = self.input_forward(bottom, self._INPUT)
        (h_prev,) = self.initial_state(bottom)
        cont = bottom[1].data
        self._h_conted = xp.empty((t_steps, n, hd), self.dtype)
        self._h = xp.empty((t_steps, n, hd), self.dtype)
        for t in range(t_steps):
            xp.multiply(cont[t][:, None], h_prev, out=self._h_conted[t])
            pre = self._h[t]
            # Summed in the order of Caffe's Eltwise: W_hh h', then W_xh x_t + b_h, then static.
            self.backend.matmul(self._h_conted[t], w_hh.T, out=pre)
            pre += gx[t]
            if static is not None:
                pre += static
            xp.tanh(pre, out=pre)
            h_prev = pre
        # The top may be rewritten in place by the next layer; backward reads this copy.
        self._o = xp.empty((t_steps * n, hd), self.dtype)
        self._o[...] = self._param("b_o").data
        self.backend.matmul(self._h.reshape(t_steps * n, hd), self._param("W_ho").data.T,
                            out=self._o, accumulate=True)
        xp.tanh(self._o, out=self._o)
        top[0].data[...] = self._o.reshape(t_steps, n, hd)
        self.final_state(top, (h_prev,))

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        self.check_no_cont_gradient(propagate_down)
        xp, t_steps, n, hd = self.xp, self.t, self.n, self.num_output
        w_hh, w_ho = self._param("W_hh").data, self._param("W_ho").data
        cont = bottom[1].data
        h2 = self._h.reshape(t_steps * n, hd)
        do = top[0].diff.reshape(t_steps * n, hd) * (1 - self._o * self._o)
        if self._learns("W_ho"):
            self.backend.matmul(do.T, h2, out=self._param("W_ho").diff, accumulate=True)
        if self._learns("b_o"):
            self.backend.bias_backward(do, out=self._param("b_o").diff, accumulate=True)
        dh_out = self.backend.matmul(do, w_ho).reshape(t_steps, n, hd)
        (dh_next,) = self.final_state_diffs(top)
        dpre = xp.empty((t_steps, n, hd), self.dtype)
        for t in range(t_steps - 1, -1, -1):
            ht = self._h[t]
            dpre[t] = (dh_out[t] + dh_next) * (1 - ht * ht)
            dh_next = self.backend.matmul(dpre[t], w_hh) * cont[t][:, None]
        if self._learns("W_hh"):
            self.backend.matmul(dpre.reshape(t_steps * n, hd).T,
                                self._h_conted.reshape(t_steps * n, hd),
                                out=self._param("W_hh").diff, accumulate=True)
        self.input_backward(dpre, propagate_down, bottom, self._INPUT)
        self.initial_state_diffs(propagate_down, bottom, (dh_next,))

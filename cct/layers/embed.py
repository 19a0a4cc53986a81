"""Embed: a table lookup, the inner product of one-hot vectors given by their hot index
(Caffe's ``embed_layer.cpp``)."""
from __future__ import annotations

from ..filler import fill
from .base import Layer, register


@register("Embed")
class EmbedLayer(Layer):
    """top[..., :] = W[bottom[...], :] (+ b), with W of shape (input_dim, num_output) -- the
    transpose of InnerProduct's layout -- and b of shape (num_output,).

    The bottom holds integer indices in [0, input_dim) stored as floats; the top has the
    bottom's shape plus a last axis of num_output. ``bias_term`` defaults to true;
    ``weight_filler`` and ``bias_filler`` default to constant 0.

    Gradients: d W[k] += sum of the top diffs of the positions whose index is k; d b += sum of
    all top diffs. The indices get no gradient: Caffe refuses to backpropagate to them.
    """

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.embed_param
        self.num_output = int(p.num_output)
        self.input_dim = int(p.input_dim)
        if self.num_output <= 0:
            raise self.error(f"num_output must be positive, got {self.num_output}.")
        if self.input_dim <= 0:
            raise self.error(f"input_dim must be positive, got {self.input_dim}.")
        self.bias_term = p.bias_term
        weight_shape, bias_shape = (self.input_dim, self.num_output), (self.num_output,)
        if self.blobs:
            self.check_param_shapes([weight_shape] + ([bias_shape] if self.bias_term else []))
            return
        where = f"{self.type} layer '{self.name}': "
        self.blobs.append(self.new_blob(weight_shape))
        fill(self.blobs[0].data, p.weight_filler, where)
        if self.bias_term:
            self.blobs.append(self.new_blob(bias_shape))
            fill(self.blobs[1].data, p.bias_filler, where)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.num_output,))

    def _indices(self, bottom):
        """The bottom as integer indices, checked to be whole numbers in [0, input_dim)."""
        xp = self.xp
        x = bottom[0].data.reshape(-1)
        idx = x.astype(xp.int64)
        bad = (idx != x) | (idx < 0) | (idx >= self.input_dim)
        if bool(bad.any()):
            k = int(xp.argmax(bad))
            raise self.error(f"bottom element {k} is {float(x[k])!r}; indices must be whole "
                             f"numbers in [0, input_dim) = [0, {self.input_dim}).")
        return idx

    def forward(self, bottom, top):
        out = self.blobs[0].data[self._indices(bottom)]
        if self.bias_term:
            out += self.blobs[1].data
        top[0].data[...] = out.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot backpropagate to its bottom (the indices); set "
                             "propagate_down: false for it (or do not use force_backward).")
        top_diff = top[0].diff.reshape(-1, self.num_output)
        if self.param_propagate_down[0]:
            self.xp.add.at(self.blobs[0].diff, self._indices(bottom), top_diff)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff[...] += top_diff.sum(axis=0)

"""Layers that move data without arithmetic: Concat, Slice, Split, Flatten, Reshape, Crop, Tile,
Silence (Caffe's ``concat_layer.cpp``, ``slice_layer.cpp``, ``split_layer.cpp`` ...).

Flatten, Reshape and Split tops share the bottom's data as Caffe's ``ShareData`` does (no copy);
the sharing is renewed on every reshape and forward, so a bottom reallocated by a reshape is
followed. Diffs are copied into the bottom in backward instead of shared, so that every blob
keeps a diff of its own that the net and the gradient checker may clear independently.
"""
from __future__ import annotations

from typing import List, Sequence

from ..blob import Blob
from .base import Layer, register


def canonical_axis(layer: Layer, blob: Blob, axis: int, field: str = "axis") -> int:
    """Caffe's ``Blob::CanonicalAxisIndex``: accept -num_axes <= axis < num_axes, as a layer
    error naming the field and the bottom shape otherwise."""
    n = blob.num_axes
    if not -n <= axis < n:
        valid = f"[{-n}, {n - 1}]" if n else "none (the blob is a scalar)"
        raise layer.error(f"{field} {axis} is out of range for a bottom of shape {blob.shape} "
                          f"({n} axes); valid values: {valid}.")
    return axis + n if axis < 0 else axis


def _legacy_or_axis(layer: Layer, param, legacy: str, blob: Blob) -> int:
    """The axis of Concat/Slice: the legacy ``concat_dim``/``slice_dim`` (no negative values)
    or ``axis``."""
    if param.HasField(legacy):
        axis = int(getattr(param, legacy))
        if axis >= blob.num_axes:
            raise layer.error(f"{legacy} {axis} is out of range for a bottom of shape "
                              f"{blob.shape}; it must satisfy 0 <= {legacy} < {blob.num_axes}.")
        return axis
    return canonical_axis(layer, blob, param.axis)


def _check_not_in_place(layer: Layer, bottom: List[Blob], top: List[Blob]) -> None:
    for i, t in enumerate(top):
        if t is bottom[0]:
            raise layer.error(f"does not allow in-place computation (top[{i}] is bottom[0]); "
                              f"give the top its own name.")


@register("Concat")
class ConcatLayer(Layer):
    """top = the bottoms joined along ``axis`` (default 1; legacy ``concat_dim``).

    All bottoms must have the same number of axes and agree on every axis but ``axis``.
    Backward hands each bottom its slice of the top diff.
    """

    min_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("give either axis or concat_dim, not both.")

    def reshape(self, bottom, top):
        b0 = bottom[0]
        self.axis = _legacy_or_axis(self, self.layer_param.concat_param, "concat_dim", b0)
        top_shape = list(b0.shape)
        for i, b in enumerate(bottom[1:], start=1):
            if b.num_axes != b0.num_axes or any(
                    b.shape[j] != b0.shape[j] for j in range(b0.num_axes) if j != self.axis):
                raise self.error(
                    f"bottom[{i}] has shape {b.shape} but bottom[0] has shape {b0.shape}; all "
                    f"bottoms must have the same number of axes and the same shape except on "
                    f"the concat axis {self.axis}.")
            top_shape[self.axis] += b.shape[self.axis]
        top[0].reshape(top_shape)

    def forward(self, bottom, top):
        self.backend.concat_forward([b.data for b in bottom], self.axis, out=top[0].data)

    def takes_relu_backward(self) -> bool:
        return True   # the backend's concat_backward, as it copies each bottom's share

    def backward(self, top, propagate_down, bottom, relu=None):
        """``relu``: Layer.takes_relu_backward's."""
        self.backend.concat_backward(
            top[0].diff, self.axis, [b.shape[self.axis] for b in bottom],
            [b.diff if down else None for b, down in zip(bottom, propagate_down)], relu=relu)


@register("Slice")
class SliceLayer(Layer):
    """Cut the bottom along ``axis`` (default 1; legacy ``slice_dim``) into the tops.

    With ``slice_point`` (one fewer than the tops, strictly increasing) top i spans
    [slice_point[i-1], slice_point[i]); without, the axis is split into equal parts.
    """

    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("give either axis or slice_dim, not both.")
        self.slice_points = [int(s) for s in p.slice_point]

    def reshape(self, bottom, top):
        b = bottom[0]
        self.axis = _legacy_or_axis(self, self.layer_param.slice_param, "slice_dim", b)
        size = b.shape[self.axis]
        n = len(top)
        if self.slice_points:
            if len(self.slice_points) != n - 1:
                raise self.error(f"{len(self.slice_points)} slice_point value(s) for {n} tops; "
                                 f"give one fewer slice_point than tops.")
            if n > size:
                raise self.error(f"{n} tops cannot slice axis {self.axis} of size {size} "
                                 f"(bottom shape {b.shape}).")
            bounds = [0] + self.slice_points + [size]
            for lo, hi in zip(bounds, bounds[1:]):
                if hi <= lo:
                    raise self.error(
                        f"slice_point {self.slice_points} must be strictly increasing, above 0 "
                        f"and below {size}, the size of axis {self.axis} of the bottom of "
                        f"shape {b.shape}.")
        else:
            if size % n:
                raise self.error(f"the number of tops ({n}) must evenly divide the slice axis "
                                 f"{self.axis} of size {size} (bottom shape {b.shape}); or "
                                 f"give slice_point.")
            bounds = [k * (size // n) for k in range(n + 1)]
        self.counts = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
        for t, count in zip(top, self.counts):
            shape = list(b.shape)
            shape[self.axis] = count
            t.reshape(shape)

    # Slice is Concat run backwards: its forward is Concat's backward, and the reverse.
    def forward(self, bottom, top):
        self.backend.concat_backward(bottom[0].data, self.axis, self.counts,
                                     [t.data for t in top])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.concat_forward([t.diff for t in top], self.axis, out=bottom[0].diff)


@register("Split")
class SplitLayer(Layer):
    """Every top shares the bottom's data; backward sums the top diffs into the bottom diff,
    top 0 + top 1 + ... in order (the net inserts Split where one blob feeds several layers)."""

    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def reshape(self, bottom, top):
        _check_not_in_place(self, bottom, top)
        for t in top:
            t.reshape_like(bottom[0])
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        for t in top:
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        diff = bottom[0].diff
        if len(top) == 1:
            diff[...] = top[0].diff
            return
        # Caffe's caffe_add of the first two, then caffe_axpy(1) of each further top: the
        # backend's Eltwise SUM with every coefficient 1, one threaded pass on the CPU.
        self.backend.eltwise_sum([t.diff for t in top], [1] * len(top), out=diff)


class _ViewLayer(Layer):
    """Top = the bottom's data under another shape, shared; backward copies the diff back."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def top_shape(self, bottom: Blob) -> Sequence[int]:
        raise NotImplementedError

    def reshape(self, bottom, top):
        _check_not_in_place(self, bottom, top)
        shape = list(self.top_shape(bottom[0]))
        top[0].reshape(shape)
        top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        top[0].share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)


@register("Flatten")
class FlattenLayer(_ViewLayer):
    """Collapse axes ``axis`` (default 1) through ``end_axis`` (default -1, inclusive) into one:
    (N, C, H, W) -> (N, C*H*W) with the defaults."""

    def top_shape(self, bottom):
        p = self.layer_param.flatten_param
        start = canonical_axis(self, bottom, p.axis, "axis")
        end = canonical_axis(self, bottom, p.end_axis, "end_axis")
        # end_axis = axis - 1 is accepted, as by Caffe: it inserts an axis of size 1.
        if end + 1 < start:
            raise self.error(f"end_axis {p.end_axis} comes before axis {p.axis} for a bottom of "
                             f"shape {bottom.shape}.")
        shape = bottom.shape
        return shape[:start] + (bottom.count_range(start, end + 1),) + shape[end + 1:]


@register("Reshape")
class ReshapeLayer(_ViewLayer):
    """Replace axes [axis, axis + num_axes) of the bottom (defaults 0 and -1: all axes) by
    ``shape``: a dim 0 copies the bottom's dim at the same position, a single -1 is inferred
    so that the count is unchanged."""

    def layer_setup(self, bottom, top):
        dims = [int(d) for d in self.layer_param.reshape_param.shape.dim]
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(f"new shape {dims} contains multiple -1 dims; at most a single "
                             f"(1) value of -1 may be specified.")
        if any(d < -1 for d in dims):
            raise self.error(f"new shape {dims} has a dim below -1; dims must be positive, 0 "
                             f"(copy the bottom's dim) or -1 (infer).")
        self.inferred_axis = inferred[0] if inferred else -1
        self.constant_count = 1
        for d in dims:
            if d > 0:
                self.constant_count *= d
        self.dims = dims

    def top_shape(self, bottom):
        p = self.layer_param.reshape_param
        n = bottom.num_axes
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} is out of range for a bottom of shape "
                             f"{bottom.shape} ({n} axes).")
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= 0, or -1 for all; got {p.num_axes}.")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(f"end_axis = axis + num_axes = {start} + {p.num_axes} is out of "
                             f"range for a bottom of shape {bottom.shape}.")
        shape = list(bottom.shape[:start]) + list(self.dims) + list(bottom.shape[end:])
        for i in self.copy_axes:
            if start + i >= n:
                raise self.error(f"new shape {self.dims} contains a 0 at position {i}, but "
                                 f"there is no bottom axis {start + i} to copy (bottom shape "
                                 f"{bottom.shape}).")
            shape[start + i] = bottom.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = (self.constant_count * bottom.count_range(0, start)
                        * bottom.count_range(end))
            for i in self.copy_axes:
                explicit *= shape[start + i]
            if explicit == 0 or bottom.count % explicit:
                raise self.error(f"bottom count ({bottom.count}) must be divisible by the "
                                 f"product of the specified dimensions ({explicit}); bottom "
                                 f"shape {bottom.shape}, new shape {self.dims}.")
            shape[start + self.inferred_axis] = bottom.count // explicit
        count = 1
        for d in shape:
            count *= d
        if count != bottom.count:
            raise self.error(f"output count must match input count: shape {self.dims} turns "
                             f"the bottom of shape {bottom.shape} ({bottom.count} elements) "
                             f"into {tuple(shape)} ({count} elements).")
        return shape


@register("Crop")
class CropLayer(Layer):
    """top = bottom[0][..., o_a : o_a + s_a, ...] for every axis a >= ``axis`` (default 2),
    where s_a is bottom[1]'s size on that axis and o_a the ``offset`` (none: 0; one value: the
    same for every cropped axis; else one per cropped axis). bottom[1] only gives the size and
    receives a zero gradient."""

    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.crop_param
        start = canonical_axis(self, bottom[0], p.axis)
        n = bottom[0].num_axes
        if len(p.offset) > 1 and start + len(p.offset) != n:
            raise self.error(f"{len(p.offset)} offset values for axes {start}..{n - 1} of a "
                             f"bottom of shape {bottom[0].shape}; give one offset, or one per "
                             f"axis from axis {start} on ({n - start}).")

    def reshape(self, bottom, top):
        p = self.layer_param.crop_param
        b, ref = bottom
        start = canonical_axis(self, b, p.axis)
        if ref.num_axes < b.num_axes:
            raise self.error(f"the reference bottom[1] of shape {ref.shape} has fewer axes than "
                             f"bottom[0] of shape {b.shape}.")
        offsets = list(p.offset)
        shape = list(b.shape)
        self.slices = []
        for i in range(b.num_axes):
            off = 0
            if i >= start:
                shape[i] = ref.shape[i]
                if len(offsets) == 1:
                    off = int(offsets[0])
                elif offsets:
                    off = int(offsets[i - start])
                if b.shape[i] - off < ref.shape[i]:
                    raise self.error(
                        f"the crop for axis {i} is out of bounds: size {ref.shape[i]} (from "
                        f"bottom[1] of shape {ref.shape}) at offset {off} does not fit in "
                        f"bottom[0] of shape {b.shape}.")
            self.slices.append(slice(off, off + shape[i]))
        self.slices = tuple(self.slices)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.slices]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            diff = bottom[0].diff
            diff[...] = 0
            diff[self.slices] = top[0].diff
        if propagate_down[1]:
            bottom[1].diff[...] = 0


@register("Tile")
class TileLayer(Layer):
    """Repeat the block of axes [axis, end) ``tiles`` times along ``axis`` (default 1):
    top viewed as (outer, tiles, inner) holds the bottom's (outer, inner) in every tile,
    like numpy.tile. Backward sums the tiles."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.tile_param
        if not p.HasField("tiles"):
            raise self.error("tile_param.tiles (the number of copies) must be given.")
        if p.tiles <= 0:
            raise self.error(f"tiles must be positive, got {p.tiles}.")
        self.tiles = int(p.tiles)

    def reshape(self, bottom, top):
        b = bottom[0]
        self.axis = canonical_axis(self, b, self.layer_param.tile_param.axis)
        shape = list(b.shape)
        shape[self.axis] *= self.tiles
        self.outer = b.count_range(0, self.axis)
        self.inner = b.count_range(self.axis)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        src = bottom[0].data.reshape(self.outer, 1, self.inner)
        top[0].data.reshape(self.outer, self.tiles, self.inner)[...] = src

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        tiled = top[0].diff.reshape(self.outer, self.tiles, self.inner)
        diff = bottom[0].diff.reshape(self.outer, self.inner)
        # Tile by tile, in Caffe's summation order.
        diff[...] = tiled[:, 0]
        for t in range(1, self.tiles):
            diff += tiled[:, t]


@register("Silence")
class SilenceLayer(Layer):
    """Consumes any number of bottoms and produces nothing (keeps them from being net outputs).
    Backward writes zero diffs where asked."""

    min_bottom_blobs = 1
    exact_num_top_blobs = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0

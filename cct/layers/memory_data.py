"""MemoryData (Caffe's ``memory_data_layer.cpp``): batches from arrays handed over by the user,
``net.set_input_arrays(data, labels)`` in pycaffe."""
from __future__ import annotations

import numpy as np

from ..data_transformer import DataTransformer
from ..glog import warning
from .base import Layer, register


@register("MemoryData")
class MemoryDataLayer(Layer):
    """Serves ``memory_data_param.batch_size`` rows per forward from the arrays given to
    :meth:`reset` (N x channels x height x width float32 data, N labels, N a multiple of the
    batch size), wrapping around at the end. As in Caffe the arrays are used as they are, with
    no transformation, and after a forward the label top is batch x 1 x 1 x 1."""

    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.memory_data_param
        self.batch_size, self.channels = p.batch_size, p.channels
        self.height, self.width = p.height, p.width
        if min(self.batch_size, self.channels, self.height, self.width) <= 0:
            raise self.error(f"batch_size, channels, height and width must be specified and "
                             f"positive in memory_data_param (got {self.batch_size}, "
                             f"{self.channels}, {self.height}, {self.width})")
        # Caffe's BaseDataLayer builds the transformer (and reads a mean file) even here.
        DataTransformer(self.layer_param.transform_param, self.phase,
                        f"{self.type} layer '{self.name}'")
        top[0].reshape((self.batch_size, self.channels, self.height, self.width))
        top[1].reshape((self.batch_size,))
        self.data = self.labels = None
        self.n = self.pos = 0
        self.records = 0

    def reset(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Serve ``data`` and ``labels`` from the start (Caffe's Reset, with pycaffe's checks:
        C-contiguous 4-D float32 data of this layer's channels/height/width, as many labels as
        rows (a 1-D array or N x 1 x 1 x 1), N a multiple of batch_size)."""
        data = np.asarray(data) if not isinstance(data, np.ndarray) else data
        labels = np.asarray(labels) if not isinstance(labels, np.ndarray) else labels
        fix = "pass np.ascontiguousarray(x, dtype=np.float32)"
        if data.ndim != 4:
            raise self.error(f"the data array must be 4-d (N x C x H x W), got shape "
                             f"{data.shape}")
        if data.dtype != np.float32:
            raise self.error(f"the data array must be float32, got {data.dtype}; {fix}")
        if not data.flags.c_contiguous:
            raise self.error(f"the data array must be C contiguous; {fix}")
        expected = (self.channels, self.height, self.width)
        if data.shape[1:] != expected:
            raise self.error(f"the data array has rows of shape {data.shape[1:]}, the layer "
                             f"expects channels x height x width = {expected}")
        if labels.ndim == 1:
            labels = labels[:, None, None, None]
        if labels.ndim != 4 or labels.shape[1:] != (1, 1, 1):
            raise self.error(f"the labels must be N or N x 1 x 1 x 1, got shape {labels.shape}")
        if labels.dtype != np.float32:
            raise self.error(f"the labels array must be float32, got {labels.dtype}; {fix}")
        if labels.shape[0] != data.shape[0]:
            raise self.error(f"data and labels must have the same first dimension "
                             f"({data.shape[0]} vs {labels.shape[0]})")
        if data.shape[0] == 0 or data.shape[0] % self.batch_size:
            raise self.error(f"the arrays hold {data.shape[0]} rows, which is not a positive "
                             f"multiple of batch_size {self.batch_size}")
        if self.layer_param.HasField("transform_param"):
            warning("memory_data_layer.cpp:90",
                    f"{self.type} does not transform array data on Reset()")
        self.data, self.labels = data, labels.reshape(-1)
        self.n, self.pos = data.shape[0], 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        if self.data is None:
            raise self.error("no data yet: call net.set_input_arrays(data, labels) (or the "
                             "layer's reset) before forward")
        b = self.batch_size
        top[0].reshape((b, self.channels, self.height, self.width))
        top[1].reshape((b, 1, 1, 1))
        top[0].data[...] = self.xp.asarray(self.data[self.pos:self.pos + b])
        top[1].data[...] = self.xp.asarray(self.labels[self.pos:self.pos + b].reshape(b, 1, 1, 1))
        self.pos = (self.pos + b) % self.n
        self.records += b

    def data_state(self) -> dict:
        return {"type": self.type, "records": self.records, "position": self.pos}

    def load_data_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("type") != self.type:
            raise self.error("cannot resume from a data state not saved by a MemoryData layer")
        self.pos = int(state["position"]) % self.n if self.n else 0
        self.records = int(state["records"])

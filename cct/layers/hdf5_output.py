"""HDF5Output (Caffe's hdf5_output_layer.cpp): writes its two bottoms to an HDF5 file."""
from __future__ import annotations

from typing import List

import numpy as np

from ..errors import CCTError
from ..glog import info
from ..io.atomic import atomic_write
from .base import Layer, register

DATA_DATASET = "data"
LABEL_DATASET = "label"


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Saves bottom[0] as dataset "data" and bottom[1] as dataset "label" of the HDF5 file
    ``hdf5_output_param.file_name``; no tops, no gradient.

    As in Caffe, set-up creates the file (empty; an existing one is replaced) and a forward
    pass writes the two bottoms with the layer's dtype, each reshaped to Caffe's legacy 4 axes
    (num, channels, height, width), e.g. (N, D) is saved as (N, D, 1, 1). Both bottoms need the
    same num. Caffe writes one forward pass per file: a second pass finds the datasets there and
    fails, and so it does here. Every write goes through a temporary file renamed into place,
    so the file is never seen half-written."""

    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 0

    def layer_setup(self, bottom, top) -> None:
        self.file_name = self.layer_param.hdf5_output_param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name (the HDF5 file to write) must be "
                             "given.")
        self.saved = False
        self._write({})

    def _write(self, datasets) -> None:
        import h5py

        def write(tmp: str) -> None:
            with h5py.File(tmp, "w") as f:
                for name, array in datasets.items():
                    f.create_dataset(name, data=array)

        try:
            atomic_write(self.file_name, write)
        except CCTError as e:
            raise self.error(f"failed to write HDF5 file: {e}") from None

    def _legacy_4d(self, blob, which: str) -> np.ndarray:
        if blob.num_axes > 4:
            raise self.error(f"bottom[{which}] has shape {blob.shape}; Caffe saves it with its "
                             f"legacy 4-axis shape (num, channels, height, width), so it can "
                             f"have at most 4 axes. Reshape or flatten it first.")
        shape = (blob.num, blob.channels, blob.height, blob.width)
        return np.array(blob.cpu_data(), dtype=self.dtype).reshape(shape)

    def reshape(self, bottom, top) -> None:
        """Nothing to shape: the layer has no tops (the bottoms are checked when written)."""

    def forward(self, bottom, top) -> None:
        data, label = bottom
        if data.num != label.num:
            raise self.error(f"data blob and label blob must have the same batch size: "
                             f"bottom[0] has shape {data.shape}, bottom[1] {label.shape}.")
        if self.saved:
            raise self.error(f"'{self.file_name}' already holds the datasets \"data\" and "
                             f"\"label\" of an earlier forward pass; like Caffe's, this layer "
                             f"writes one batch per file (run one forward pass per net, or "
                             f"build the net anew for the next batch).")
        arrays = {DATA_DATASET: self._legacy_4d(data, "0"),
                  LABEL_DATASET: self._legacy_4d(label, "1")}
        info("hdf5_output_layer.cpp:33", f"Saving HDF5 file {self.file_name}")
        self._write(arrays)
        self.saved = True
        info("hdf5_output_layer.cpp:38", f"Successfully saved {data.num} rows")

    def backward(self, top, propagate_down: List[bool], bottom) -> None:
        """No gradient: the layer is a sink, as in Caffe (whose Backward does nothing)."""

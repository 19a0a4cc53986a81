"""Database-backed data layers: Data (LMDB of Datums)."""
from __future__ import annotations

import numpy as np

from ..data_transformer import DataTransformer, datum_to_array
from ..io.db import open_db
from ..proto import caffe_pb2
from .base import Layer, register


@register("Data")
class DataLayer(Layer):
    """Reads ``batch_size`` Datums per forward from ``data_param.source`` in key order, wrapping
    around at the end; top 0 = transformed images, top 1 (optional) = labels."""

    exact_num_bottom_blobs = 0
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.data_param
        if not p.source:
            raise self.error("data_param.source is empty; name the database folder")
        if p.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        self.batch_size = p.batch_size
        try:
            self.cursor = open_db(p.source, p.backend)
        except Exception as e:
            raise self.error(str(e)) from None
        skip = int(self.rng_skip(p.rand_skip))
        for _ in range(skip):
            self.cursor.next()
        self.transformer = DataTransformer(self.layer_param.transform_param, self.phase,
                                           f"Data layer '{self.name}'")
        first = caffe_pb2.Datum.FromString(self.cursor.value())
        self.example_shape = datum_to_array(first).shape
        self.top_shape = (self.batch_size,) + self.transformer.output_shape(*self.example_shape)

    @staticmethod
    def rng_skip(rand_skip: int) -> int:
        from ..rng import get_rng
        return get_rng().integers(0, rand_skip) if rand_skip else 0

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape)
        if len(top) > 1:
            top[1].reshape((self.batch_size,))

    def forward(self, bottom, top):
        images = np.empty((self.batch_size,) + self.example_shape, np.float32)
        labels = np.empty(self.batch_size, np.float32)
        for i in range(self.batch_size):  # one record per iteration: I/O, not arithmetic
            datum = caffe_pb2.Datum.FromString(self.cursor.value())
            arr = datum_to_array(datum)
            if arr.shape != self.example_shape:
                raise self.error(f"record {self.cursor.key()!r} has shape {arr.shape}, the "
                                 f"first record had {self.example_shape}; all records must "
                                 f"agree (use crop_size or resize when converting)")
            images[i] = arr
            labels[i] = datum.label
            self.cursor.next()
        top[0].data[...] = self.transformer.transform(images)
        if len(top) > 1:
            top[1].data[...] = labels

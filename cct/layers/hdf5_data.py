"""HDF5Data (Caffe's ``hdf5_data_layer.cpp``): rows of HDF5 datasets named by the layer's tops.

``hdf5_data_param.source`` is a text file listing .h5 files (whitespace-separated, paths as
written, relative to the working directory). Each file holds one dataset per top, named like
the top, all with the same number of rows (axis 0); a top's shape is ``batch_size`` followed by
its dataset's other axes. Forward copies the next ``batch_size`` rows, moving on to the next
file when one is used up and back to the first after the last. With ``shuffle`` the file order
is shuffled at setup and at each pass, and the row order each time a file is (re)loaded, as
Caffe does (cct draws from a generator seeded by the process RNG, so ``random_seed`` makes it
repeatable; Caffe uses ``std::random_shuffle``). Float and integer datasets are read as float.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..data_transformer import copy_rng_state
from ..glog import info
from ..io.weights import H5_ERRORS
from ..rng import get_rng
from .base import Layer, register

_logged_classes: set = set()


def _log_class_once(kind: str) -> None:
    """Caffe's hdf5_load_nd_dataset logs the datatype class once per process (LOG_FIRST_N)."""
    if kind not in _logged_classes:
        _logged_classes.add(kind)
        src = "hdf5.cpp:32" if kind == "H5T_FLOAT" else "hdf5.cpp:35"
        info(src, f"Datatype class: {kind}")


@register("HDF5Data")
class HDF5DataLayer(Layer):
    """Rows of HDF5 datasets, ``batch_size`` per forward (see the module doc)."""

    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.hdf5_data_param
        if self.layer_param.HasField("transform_param"):
            raise self.error("HDF5Data does not transform data; remove transform_param (scale "
                             "or subtract the mean when writing the .h5 files)")
        if p.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive")
        if not p.source:
            raise self.error("hdf5_data_param.source is empty; name the text file listing the "
                             ".h5 files")
        self.batch_size = p.batch_size
        self.names = list(self.layer_param.top)
        info("hdf5_data_layer.cpp:80", f"Loading list of HDF5 filenames from: {p.source}")
        self.files = self._read_list(p.source)
        info("hdf5_data_layer.cpp:94", f"Number of HDF5 files: {len(self.files)}")
        self.rng = (np.random.default_rng(int(get_rng().integers(0, 2 ** 32)))
                    if p.shuffle else None)
        self.file_order = (self.rng.permutation(len(self.files)) if self.rng is not None
                           else np.arange(len(self.files)))
        self.file_index = 0
        self.records = 0
        self.loaded: Optional[int] = None   # the file id whose datasets self.arrays holds
        self._load(self.file_order[0])
        self.example_shapes = [a.shape[1:] for a in self.arrays]
        for t, shape in zip(top, self.example_shapes):
            t.reshape((self.batch_size,) + shape)

    def _read_list(self, source: str) -> List[Tuple[str, int]]:
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise self.error(f"cannot open the HDF5 file list '{source}': "
                             f"{e.strerror or e}") from None
        files = [(name, lineno) for lineno, line in enumerate(text.splitlines(), 1)
                 for name in line.split()]
        if not files:
            raise self.error(f"'{source}' lists no HDF5 files; give one .h5 path per line")
        return files

    def _load(self, file_id: int, reread: bool = True) -> None:
        """Read every top's dataset of one file (Caffe's LoadHDF5FileData), then draw the row
        order; the generator state before that draw is kept for data_state. Without
        ``reread`` a file already in memory is not read again (a restored data position in
        the same file: the optimizer's probes restore it at every branch, and CIFAR10-quick's
        training file took 21 ms a read)."""
        if reread or self.loaded != file_id:
            self._read(file_id)
        self.row_state = copy_rng_state(self.rng.bit_generator.state) if self.rng else None
        self.row_order = (self.rng.permutation(self.arrays[0].shape[0]) if self.rng is not None
                          else np.arange(self.arrays[0].shape[0]))
        self.row = 0

    def _read(self, file_id: int) -> None:
        import h5py
        path, lineno = self.files[file_id]
        where = (f"HDF5 file '{path}' (line {lineno} of "
                 f"'{self.layer_param.hdf5_data_param.source}')")
        arrays = []
        try:
            with h5py.File(path, "r") as f:
                for name in self.names:
                    ds = f.get(name)
                    if not isinstance(ds, h5py.Dataset):
                        held = ", ".join(k for k in f if isinstance(f.get(k), h5py.Dataset))
                        raise self.error(f"{where} has no dataset '{name}' (the layer's tops "
                                         f"name the datasets); it holds: {held or 'none'}")
                    if ds.dtype.kind == "f":
                        _log_class_once("H5T_FLOAT")
                    elif ds.dtype.kind in "iu":
                        _log_class_once("H5T_INTEGER")
                    else:
                        raise self.error(f"{where}: dataset '{name}' has type {ds.dtype}; "
                                         f"HDF5Data reads float or integer datasets")
                    if ds.ndim < 1:
                        raise self.error(f"{where}: dataset '{name}' is a scalar; it needs a "
                                         f"row axis")
                    arrays.append(np.asarray(ds, dtype=np.float32))
        except FileNotFoundError:
            raise self.error(f"{where} does not exist") from None
        except H5_ERRORS as e:
            raise self.error(f"{where} cannot be read as HDF5: it is damaged or not an HDF5 "
                             f"file ({type(e).__name__}: {e})") from None
        rows = arrays[0].shape[0]
        for name, a in zip(self.names[1:], arrays[1:]):
            if a.shape[0] != rows:
                raise self.error(f"{where}: dataset '{name}' has {a.shape[0]} rows but "
                                 f"'{self.names[0]}' has {rows}; every dataset of a file "
                                 f"needs the same number of rows")
        if rows == 0:
            raise self.error(f"{where}: the datasets hold no rows")
        if hasattr(self, "example_shapes"):
            for name, a, shape in zip(self.names, arrays, self.example_shapes):
                if a.shape[1:] != shape:
                    raise self.error(f"{where}: dataset '{name}' has rows of shape "
                                     f"{a.shape[1:]}, but the first file's have {shape}")
        self.arrays = arrays
        self.loaded = file_id

    def _next_file(self) -> None:
        """The current file is used up: load the next (reshuffling the files after the last);
        with a single file, only reshuffle its rows."""
        if len(self.files) > 1:
            self.file_index += 1
            if self.file_index == len(self.files):
                self.file_index = 0
                if self.rng is not None:
                    self.file_order = self.rng.permutation(len(self.files))
            self._load(self.file_order[self.file_index])
        else:
            self.row = 0
            if self.rng is not None:
                self.row_state = copy_rng_state(self.rng.bit_generator.state)
                self.row_order = self.rng.permutation(self.arrays[0].shape[0])

    def reshape(self, bottom, top):
        for t, shape in zip(top, self.example_shapes):
            t.reshape((self.batch_size,) + shape)

    def forward(self, bottom, top):
        filled = 0
        while filled < self.batch_size:  # one slice per file boundary, not per row
            take = min(self.batch_size - filled, self.arrays[0].shape[0] - self.row)
            rows = self.row_order[self.row:self.row + take]
            for t, a in zip(top, self.arrays):
                t.data[filled:filled + take] = self.xp.asarray(a[rows])
            filled += take
            self.row += take
            if self.row == self.arrays[0].shape[0]:
                self._next_file()
        self.records += self.batch_size

    # -- exact resume -------------------------------------------------------------------------
    def data_state(self) -> dict:
        return {"type": self.type, "records": self.records,
                "file_order": [int(i) for i in self.file_order],
                "file_index": self.file_index, "row": self.row, "row_rng": self.row_state}

    def load_data_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("type") != self.type:
            raise self.error("cannot resume from a data state not saved by an HDF5Data layer")
        order = [int(i) for i in state["file_order"]]
        if sorted(order) != list(range(len(self.files))):
            raise self.error(f"the data state lists {len(order)} files; "
                             f"'{self.layer_param.hdf5_data_param.source}' lists "
                             f"{len(self.files)}")
        self.file_order = np.array(order)
        self.file_index = int(state["file_index"])
        if self.rng is not None and state.get("row_rng") is not None:
            self.rng.bit_generator.state = copy_rng_state(state["row_rng"])
        self._load(self.file_order[self.file_index], reread=False)
        self.row = int(state["row"])
        self.records = int(state["records"])

"""Prefetching data layers (Caffe's ``base_data_layer.cpp``) and the Data layer on LMDB or
LevelDB (``data_layer.cpp``).

A prefetching layer reads and transforms its batches in a background thread into a queue of at
most ``data_param.prefetch`` (default 4) ready batches; ``forward`` only takes the next one, so
compute does not wait on data unless reading is slower than the net. One thread fills the queue
in order, so the batches are the same as without prefetching. An error in the thread (a corrupt
record, a missing image) reaches the ``forward`` that would have used the batch, as a CCTError.

``data_state()`` says where the *net* is in the data (records consumed so far and the
transformer's RNG position after the last batch forward returned, not the prefetcher's, which
runs ahead); ``load_data_state(d)`` restarts the thread from there, so a restored layer yields
exactly the batches the uninterrupted run would have. ``close()`` stops the thread and closes the
database; it also happens when the layer is garbage-collected.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
from google.protobuf.message import DecodeError

from ..data_transformer import DataTransformer, decode_datum
from ..errors import CCTError, LayerError
from ..glog import info, logger
from ..io.db import open_db
from ..proto import caffe_pb2
from ..rng import get_rng
from .base import Layer, register


class Batch:
    """One prefetched batch: data (N, C, H, W) float32, labels (N,) float32 or None, and the
    reader's state just after it (what ``data_state`` reports once forward has returned it)."""

    __slots__ = ("data", "labels", "state")

    def __init__(self, data: np.ndarray, labels: Optional[np.ndarray], state: dict):
        self.data, self.labels, self.state = data, labels, state


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: CCTError):
        self.error = error


class Prefetcher:
    """Calls ``produce()`` in a daemon thread, keeping up to ``depth`` results in a FIFO queue.

    ``wait_seconds`` accumulates the time :meth:`get` spent blocked on an empty queue,
    ``produce_seconds`` the time spent producing (reading + decoding + transforming) and
    ``produced`` the number of items made: whether the consumer waits on data is the ratio of
    the first two.
    """

    def __init__(self, produce: Callable[[], Any], depth: int, name: str, where: str):
        self._produce = produce
        self._depth = depth
        self._name = name
        self._where = where
        self.wait_seconds = 0.0
        self.produce_seconds = 0.0
        self.produced = 0
        self._failure: Optional[_Failure] = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._queue: "queue.Queue" = queue.Queue(maxsize=self._depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._queue, self._stop),
                                        name=self._name, daemon=True)
        self._thread.start()

    def _run(self, q: "queue.Queue", stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                item = self._produce()
            except CCTError as e:
                item = _Failure(e)
            except Exception as e:  # a bug, not a user error: keep the cause for the traceback
                err = CCTError(f"{self._where}: the prefetch thread failed: "
                               f"{type(e).__name__}: {e}")
                err.__cause__ = e
                item = _Failure(err)
            self.produce_seconds += time.perf_counter() - t0
            self.produced += 1
            q.put(item)
            if isinstance(item, _Failure):
                return

    def get(self) -> Any:
        """The next item in order; blocks while the thread is still producing it."""
        if self._failure is not None:
            raise self._failure.error
        if self._closed:
            raise LayerError(f"{self._where}: the layer was closed; build the net again to "
                             f"read more data")
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise LayerError(f"{self._where}: the prefetch thread stopped") from None
        self.wait_seconds += time.perf_counter() - t0
        if isinstance(item, _Failure):
            self._failure = item
            raise item.error
        return item

    def _halt(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            self._drain()  # frees a producer blocked on a full queue
            self._thread.join(timeout=0.05)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def restart(self, between: Callable[[], None]) -> None:
        """Stop the thread, drop what it prefetched, run ``between()`` (e.g. reposition the
        reader), and start again; if ``between`` fails, later gets raise its error."""
        if self._closed:
            raise LayerError(f"{self._where}: the layer was closed")
        self._halt()
        self._failure = None
        try:
            between()
        except CCTError as e:
            self._failure = _Failure(e)
            raise
        self._start()

    @property
    def closed(self) -> bool:
        return self._closed

    def stop(self) -> None:
        self._closed = True
        self._halt()


class BasePrefetchingDataLayer(Layer):
    """Base of Data and ImageData: builds the DataTransformer, lets the subclass build its reader
    (:meth:`make_reader`), then prefetches ``reader.load_batch()`` in a thread.

    A reader has ``load_batch() -> Batch``, ``state() -> dict``, ``restore(dict)`` (only called
    while the thread is stopped) and ``close()``.
    """

    exact_num_bottom_blobs = 0
    min_top_blobs = 1
    max_top_blobs = 2
    #: Keys a saved data state must hold (beyond ``type``).
    state_keys = ("records", "position")

    def layer_setup(self, bottom, top):
        self.output_labels = len(top) > 1
        self.transformer = DataTransformer(self.layer_param.transform_param, self.phase,
                                           f"{self.type} layer '{self.name}'")
        self.transformer.init_rand()
        depth = self.layer_param.data_param.prefetch
        if depth < 1:
            self.release_source()
            raise self.error("data_param.prefetch must be at least 1 (the number of batches "
                             "read ahead; Caffe's default is 4)")
        self.reader = self.make_reader(top)
        self._consumed = self.reader.state()
        self.prefetcher = Prefetcher(self.reader.load_batch, depth,
                                     f"cct-prefetch-{self.name}", f"{self.type} layer "
                                     f"'{self.name}'")
        weakref.finalize(self, _shutdown, self.prefetcher, self.reader)

    def make_reader(self, top):
        raise NotImplementedError

    def release_source(self) -> None:
        """Close what the constructor opened, when setup fails before a reader owns it."""

    def reshape(self, bottom, top):
        """Shaped at setup and by each batch in forward (Caffe's BaseDataLayer::Reshape)."""

    def forward(self, bottom, top):
        batch = self.prefetcher.get()
        top[0].reshape(batch.data.shape)
        # one copy into the top, which on a GPU does not wait for the device (pinned memory)
        self.backend.to_device(batch.data, out=top[0].data)
        if self.output_labels:
            top[1].reshape(batch.labels.shape)
            self.backend.to_device(batch.labels, out=top[1].data)
        self._consumed = batch.state

    # -- exact resume -------------------------------------------------------------------------
    def data_state(self) -> dict:
        """Where the net is in the data: a small JSON-compatible dict for snapshots."""
        return dict(self._consumed, type=self.type)

    def load_data_state(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`data_state` of a layer on the same source)."""
        if not isinstance(state, dict) or state.get("type") != self.type:
            raise self.error(f"cannot resume from a data state saved by "
                             f"{state.get('type') if isinstance(state, dict) else state!r}; "
                             f"it must come from a {self.type} layer")
        missing = [k for k in self.state_keys if k not in state]
        if missing:
            raise self.error(f"the data state lacks {', '.join(missing)}; it was not written "
                             f"by cct's {self.type} layer")

        def reposition():
            self.reader.restore(state)
            self._consumed = self.reader.state()

        self.prefetcher.restart(reposition)

    @property
    def wait_seconds(self) -> float:
        """Seconds forward() spent waiting for the prefetch thread."""
        return self.prefetcher.wait_seconds

    @property
    def load_seconds(self) -> float:
        """Seconds the prefetch thread spent reading, decoding and transforming batches."""
        return self.prefetcher.produce_seconds

    def close(self) -> None:
        _shutdown(self.prefetcher, self.reader)


def _shutdown(prefetcher: Prefetcher, reader) -> None:
    if not prefetcher.closed:
        prefetcher.stop()
        reader.close()


# ------------------------------------------------------------------------------------------------
# Data: Datums from LMDB / LevelDB
# ------------------------------------------------------------------------------------------------
class DatumReader:
    """Reads batches of Datums in key order from a cursor, wrapping around at the end."""

    def __init__(self, layer: "DataLayer", cursor, position: int):
        self.cursor = cursor
        self.where = f"Data layer '{layer.name}'"
        self.source = layer.layer_param.data_param.source
        self.batch_size = layer.batch_size
        self.transformer = layer.transformer
        self.color = layer.color
        self.output_labels = layer.output_labels
        self.position = position  # index of the cursor's record in key order
        # Records read since setup; a batch's state carries the count after it, which is what
        # the net has consumed once forward has returned that batch.
        self.records = 0

    def next(self) -> None:
        try:
            self.cursor.next()
            self.position += 1
            if not self.cursor.valid:
                info("data_layer.cpp:73", "Restarting data prefetching from start.")
                self.cursor.seek_to_first()
                self.position = 0
        except CCTError as e:  # a damaged database
            raise CCTError(f"{self.where}: {e}") from None

    def read(self) -> Tuple[np.ndarray, int]:
        """The current record as (C, H, W), with its label; errors name the key (looked up
        only then, not for every record)."""
        try:
            datum = caffe_pb2.Datum.FromString(self.cursor.value())
            if not datum.encoded:
                self.transformer.warn_unencoded_force()
            return decode_datum(datum, self.color), datum.label
        except DecodeError as e:
            raise CCTError(f"{self.where}: record {self.cursor.key()!r} of '{self.source}' is "
                           f"not a Datum (corrupt database?): {e}") from None
        except CCTError as e:
            raise CCTError(f"{self.where}: record {self.cursor.key()!r} of '{self.source}': "
                           f"{e}") from None

    def load_batch(self) -> Batch:
        examples: List[np.ndarray] = []
        labels = np.empty(self.batch_size, np.float32)
        crop = self.transformer.param.crop_size
        first_key = None
        for i in range(self.batch_size):  # one record per step: I/O, not arithmetic
            arr, labels[i] = self.read()
            if i == 0:
                first_key = self.cursor.key()
            elif arr.shape != examples[0].shape and not (crop and arr.shape[0] ==
                                                         examples[0].shape[0]):
                raise CCTError(f"{self.where}: record {self.cursor.key()!r} of '{self.source}' "
                               f"has shape {arr.shape}, but {first_key!r}, the first of its "
                               f"batch, has {examples[0].shape}; records of a batch must agree "
                               f"(or be cropped to one size with crop_size)")
            examples.append(arr)
            self.next()
        try:
            data = self.transformer.transform(examples)
        except CCTError as e:
            raise CCTError(f"{e} (batch starting at record {first_key!r})") from None
        self.records += self.batch_size
        return Batch(data, labels if self.output_labels else None, self.state())

    def state(self) -> dict:
        return {"records": self.records, "position": self.position,
                "key": self.cursor.key().hex(), "transform_rng": self.transformer.rng_state()}

    def restore(self, state: dict) -> None:
        position = int(state["position"])
        key = bytes.fromhex(state["key"]) if state.get("key") else None
        if key is None or not self.cursor.seek(key):
            self.cursor.seek_to_first()
            for _ in range(position):  # the database changed: walk to the same index
                self.cursor.next()
                if not self.cursor.valid:
                    raise CCTError(f"{self.where}: cannot resume at record {position} of "
                                   f"'{self.source}': the database holds fewer records")
        self.position = position
        self.records = int(state["records"])
        self.transformer.set_rng_state(state.get("transform_rng"))

    def close(self) -> None:
        self.cursor.close()


@register("Data")
class DataLayer(BasePrefetchingDataLayer):
    """Reads ``data_param.batch_size`` Datums per forward from ``data_param.source`` (LMDB or
    LevelDB, per ``backend``; Caffe's default is LEVELDB) in key order, wrapping around at the
    end; top 0 = transformed images, top 1 (optional) = labels.

    Raw Datums give uint8 ``data`` or ``float_data``; encoded ones (JPEG/PNG...) are decoded as
    stored, or in colour with ``data_param.force_encoded_color`` or ``transform_param
    .force_color``, or in grey with ``force_gray``. Each batch takes its shape from its first
    record, so batches may differ in size. ``rand_skip`` skips a random number of records in
    [0, rand_skip) once at setup, as Caffe's early DataLayer did (BVLC master ignores it).
    """

    def __init__(self, layer_param, backend, dtype=np.float32):
        super().__init__(layer_param, backend, dtype)
        p = layer_param.data_param
        if not p.source:
            raise self.error("data_param.source is empty; name the database folder")
        # Caffe opens the database in the constructor, before "Creating Layer".
        try:
            self.cursor = open_db(p.source, p.backend)
        except CCTError as e:
            raise self.error(str(e)) from None

    @property
    def num_records(self):
        """The records in the database (LMDB counts them; LevelDB would need a scan: None),
        an epoch's worth for the optimizer's re-tunes."""
        try:
            return len(self.cursor)
        except TypeError:
            return None

    def make_reader(self, top):
        try:
            return self._make_reader(top)
        except CCTError:
            self.release_source()
            raise

    def release_source(self) -> None:
        self.cursor.close()

    def _make_reader(self, top):
        p = self.layer_param.data_param
        if p.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        self.batch_size = p.batch_size
        self.color = self.transformer.color_mode(p.force_encoded_color)
        skip = int(get_rng().integers(0, p.rand_skip)) if p.rand_skip else 0
        if p.rand_skip:
            logger.info(f"Skipping first {skip} data points.")
        reader = DatumReader(self, self.cursor, 0)
        for _ in range(skip):
            reader.next()
        first, _ = reader.read()
        shape = (self.batch_size,) + self.transformer.output_shape(*first.shape)
        top[0].reshape(shape)
        info("data_layer.cpp:45", "output data size: " + ",".join(str(d) for d in shape))
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        return reader


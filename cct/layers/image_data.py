"""Image-file data layers: ImageData (Caffe's ``image_data_layer.cpp``), and WindowData, which
cct refuses with a clear message."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from ..data_transformer import copy_rng_state, read_image
from ..errors import CCTError
from ..glog import info
from ..rng import get_rng
from .base import Layer, register
from .data import Batch, BasePrefetchingDataLayer


def read_image_list(path: str, where: str) -> List[Tuple[str, int, int]]:
    """``(file, label, line number)`` for each line ``file label`` of an ImageData list; the
    label follows the last space (or tab), so file names may hold spaces, as in Caffe. Blank
    lines are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise CCTError(f"{where}: cannot open the image list '{path}': "
                       f"{e.strerror or e}") from None
    lines = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.rsplit(maxsplit=1)
        if not fields:
            continue
        try:
            if len(fields) != 2:
                raise ValueError
            lines.append((fields[0], int(fields[1]), lineno))
        except ValueError:
            raise CCTError(f"{where}: line {lineno} of '{path}' is {line!r}; expected "
                           f"'<image file> <integer label>'") from None
    if not lines:
        raise CCTError(f"{where}: the image list '{path}' names no images")
    return lines


class ImageListReader:
    """Reads batches of images in list order (or a fresh random order each pass when
    shuffling), wrapping around at the end."""

    def __init__(self, layer: "ImageDataLayer", lines, order_rng, position: int):
        p = layer.layer_param.image_data_param
        self.where = f"ImageData layer '{layer.name}'"
        self.list_path = p.source
        self.root = p.root_folder
        self.size = (p.new_height, p.new_width)
        self.is_color = p.is_color
        self.batch_size = p.batch_size
        self.transformer = layer.transformer
        self.output_labels = layer.output_labels
        self.lines = lines
        self.order_rng = order_rng
        self.order_state = None
        self.order = np.arange(len(lines))
        if order_rng is not None:
            self._shuffle()
        self.position = position
        self.records = 0

    def _shuffle(self) -> None:
        """A new random order for the next pass (Caffe's ShuffleImages). The generator state
        before the draw is kept, so a saved state can redraw the same order."""
        self.order_state = copy_rng_state(self.order_rng.bit_generator.state)
        self.order = self.order_rng.permutation(len(self.lines))

    def read(self) -> Tuple[np.ndarray, int]:
        name, label, lineno = self.lines[self.order[self.position]]
        try:
            img = read_image(self.root + name, self.size[0], self.size[1], self.is_color)
        except CCTError as e:
            raise CCTError(f"{self.where}: {e} (line {lineno} of '{self.list_path}')") from None
        return img, label

    def next(self) -> None:
        self.position += 1
        if self.position >= len(self.lines):
            self.position = 0
            if self.order_rng is not None:
                self._shuffle()

    def load_batch(self) -> Batch:
        examples = []
        labels = np.empty(self.batch_size, np.float32)
        crop = self.transformer.param.crop_size
        for i in range(self.batch_size):  # one image file per step: I/O, not arithmetic
            img, labels[i] = self.read()
            if i and img.shape != examples[0].shape and not (
                    crop and img.shape[0] == examples[0].shape[0]):
                name, _, lineno = self.lines[self.order[self.position]]
                raise CCTError(f"{self.where}: image '{self.root + name}' (line {lineno} of "
                               f"'{self.list_path}') is {img.shape[1]} x {img.shape[2]} x "
                               f"{img.shape[0]} channels, but the first image of its batch is "
                               f"{examples[0].shape[1]} x {examples[0].shape[2]} x "
                               f"{examples[0].shape[0]}; set new_height/new_width or crop_size")
            examples.append(img)
            self.next()
        data = self.transformer.transform(examples)
        self.records += self.batch_size
        return Batch(data, labels if self.output_labels else None, self.state())

    def state(self) -> dict:
        return {"records": self.records, "position": self.position,
                "order_rng": self.order_state, "transform_rng": self.transformer.rng_state()}

    def restore(self, state: dict) -> None:
        position = int(state["position"])
        if not 0 <= position < len(self.lines):
            raise CCTError(f"{self.where}: cannot resume at image {position} of "
                           f"'{self.list_path}', which lists {len(self.lines)}")
        if self.order_rng is not None and state.get("order_rng") is not None:
            self.order_rng.bit_generator.state = copy_rng_state(state["order_rng"])
            self._shuffle()
        self.position = position
        self.records = int(state["records"])
        self.transformer.set_rng_state(state.get("transform_rng"))

    def close(self) -> None:
        pass


@register("ImageData")
class ImageDataLayer(BasePrefetchingDataLayer):
    """Reads images named by ``image_data_param.source``, a text file of ``path label`` lines
    (paths relative to ``root_folder``, which is prepended as is), ``batch_size`` per forward;
    top 0 = transformed images (BGR or grey, C x H x W), top 1 = labels.

    ``new_height``/``new_width`` (both or neither) resize each image as ``cv::resize``
    INTER_LINEAR; ``is_color: false`` reads grey; ``shuffle`` draws a new random order at setup
    and at each pass (from a generator seeded by the process RNG); ``rand_skip`` starts at a
    random line in [0, rand_skip). Prefetched like Data.
    """

    exact_num_top_blobs = 2
    min_top_blobs = max_top_blobs = -1

    def make_reader(self, top):
        p = self.layer_param.image_data_param
        if (p.new_height > 0) != (p.new_width > 0):
            raise self.error(f"new_height ({p.new_height}) and new_width ({p.new_width}) must "
                             f"be set together (or both left 0)")
        if p.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        if not p.source:
            raise self.error("image_data_param.source is empty; name the image list file")
        info("image_data_layer.cpp:38", f"Opening file {p.source}")
        lines = read_image_list(p.source, f"{self.type} layer '{self.name}'")
        order_rng = None
        if p.shuffle:
            info("image_data_layer.cpp:51", "Shuffling data")
            order_rng = np.random.default_rng(int(get_rng().integers(0, 2 ** 32)))
        info("image_data_layer.cpp:56", f"A total of {len(lines)} images.")
        skip = 0
        if p.rand_skip:
            skip = int(get_rng().integers(0, p.rand_skip))
            info("image_data_layer.cpp:63", f"Skipping first {skip} data points.")
            if skip >= len(lines):
                raise self.error(f"rand_skip drew {skip} but '{p.source}' lists only "
                                 f"{len(lines)} images; lower rand_skip")
        reader = ImageListReader(self, lines, order_rng, skip)
        first, _ = reader.read()
        shape = (p.batch_size,) + self.transformer.output_shape(*first.shape)
        top[0].reshape(shape)
        info("image_data_layer.cpp:83", "output data size: " + ",".join(str(d) for d in shape))
        top[1].reshape((p.batch_size,))
        return reader


@register("WindowData")
class WindowDataLayer(Layer):
    """Caffe's R-CNN window sampler. Not supported: it raises a clear error at setup."""

    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 2

    def layer_setup(self, bottom, top):
        source = self.layer_param.window_data_param.source
        raise self.error(f"WindowData is not supported by cct; convert the windows "
                         f"(source '{source}') to an LMDB of cropped Datums or to an "
                         f"ImageData list of cropped images")

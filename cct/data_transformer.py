"""Caffe's DataTransformer: crop, mirror, mean subtraction and scaling of a batch of Datums.

top = (datum - mean) * scale, where mean is the mean file's value at the same (uncropped)
position or the per-channel mean_value; crop offsets are random in TRAIN and centred in TEST,
mirroring (flip along width) happens with probability 1/2 in TRAIN when ``mirror`` is set.
"""
from __future__ import annotations

import io

import numpy as np

from .errors import CCTError
from .proto import caffe_pb2
from .rng import get_rng


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """The Datum's pixels as a float32 (C, H, W) array (encoded images decoded with Pillow)."""
    if datum.encoded:
        from PIL import Image
        img = np.asarray(Image.open(io.BytesIO(datum.data)))
        if img.ndim == 2:
            img = img[None]
        else:
            img = img[:, :, ::-1].transpose(2, 0, 1)  # RGB -> Caffe's BGR, HWC -> CHW
        return img.astype(np.float32)
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        return np.frombuffer(datum.data, np.uint8).reshape(shape).astype(np.float32)
    return np.asarray(datum.float_data, np.float32).reshape(shape)


class DataTransformer:
    def __init__(self, param: caffe_pb2.TransformationParameter, phase: int, where: str):
        self.param = param
        self.phase = phase
        self.mean = None
        if param.mean_file and len(param.mean_value):
            raise CCTError(f"{where}: transform_param gives both mean_file and mean_value; "
                           f"give one")
        if param.mean_file:
            from .io.weights import blob_from_proto
            bp = caffe_pb2.BlobProto()
            try:
                with open(param.mean_file, "rb") as f:
                    bp.ParseFromString(f.read())
            except OSError as e:
                raise CCTError(f"{where}: cannot read mean_file '{param.mean_file}': "
                               f"{e.strerror}") from None
            mean = blob_from_proto(bp)
            self.mean = mean.reshape(mean.shape[-3:])
        elif len(param.mean_value):
            self.mean = np.asarray(param.mean_value, np.float32).reshape(-1, 1, 1)

    def output_shape(self, c: int, h: int, w: int) -> tuple:
        crop = self.param.crop_size
        return (c, crop, crop) if crop else (c, h, w)

    def transform(self, images: np.ndarray) -> np.ndarray:
        """images: (N, C, H, W) float32; returns the transformed batch."""
        n, c, h, w = images.shape
        crop = self.param.crop_size
        if self.mean is not None:
            if self.mean.shape[0] not in (1, c):
                raise CCTError(f"mean has {self.mean.shape[0]} channels, the data has {c}")
            images = images - self.mean
        train = self.phase == caffe_pb2.TRAIN
        rng = get_rng()
        if crop:
            if crop > h or crop > w:
                raise CCTError(f"crop_size {crop} is larger than the data ({h}x{w})")
            if train:
                hs = rng.integers(0, h - crop + 1, n)
                ws = rng.integers(0, w - crop + 1, n)
                out = np.empty((n, c, crop, crop), np.float32)
                for i in range(n):  # one slice per image, not per element
                    out[i] = images[i, :, hs[i]:hs[i] + crop, ws[i]:ws[i] + crop]
                images = out
            else:
                hs, ws = (h - crop) // 2, (w - crop) // 2
                images = images[:, :, hs:hs + crop, ws:ws + crop]
        if self.param.mirror and train:
            flip = rng.integers(0, 2, n).astype(bool)
            images = np.where(flip[:, None, None, None], images[..., ::-1], images)
        if self.param.scale != 1:
            images = images * np.float32(self.param.scale)
        return np.ascontiguousarray(images, np.float32)

"""Caffe's DataTransformer (``data_transformer.cpp``) and the image reading it relies on
(``util/io.cpp``: ``ReadImageToCVMat``, ``DecodeDatumToCVMat``), with OpenCV's behaviour
reproduced on Pillow and NumPy.

For one example of C x H x W values x (uint8 pixels or Datum ``float_data``)::

    top[c, h, w] = (x[c, h_off + h, w_off + w'] - mean) * scale,   w' = w or (W' - 1 - w)

where ``mean`` is the mean file's value at the same *uncropped* position (``mean_file``, a
BlobProto of the data's C x H x W) or the channel's ``mean_value`` (one value for all channels,
or one per channel), ``scale`` defaults to 1. With ``crop_size`` the offsets are random in TRAIN
and centred ((H - crop) / 2, (W - crop) / 2) in TEST; ``mirror`` flips along the width with
probability 1/2 in *both* phases, exactly as Caffe (its TestMirrorTest checks that TEST
mirrors too). The random draws come from the transformer's own generator, seeded once from the
process RNG (Caffe's ``InitRand``), so a data layer's prefetch thread never touches the
process RNG and its position can be saved and restored.

Images are decoded as OpenCV 4/5 does (checked pixel for pixel against it): channels in B, G,
R(, A) order, JPEG EXIF orientation applied (except when decoding "as stored",
IMREAD_UNCHANGED), greyscale conversion with the same integer formulas (libpng's for PNG,
libjpeg's own luma for JPEG, cvtColor's otherwise), and ``new_height``/``new_width`` resizing
bit-exact with ``cv::resize`` INTER_LINEAR for 8-bit images (11-bit fixed-point weights,
half-pixel centres, exact 2x reductions averaged as INTER_AREA).
"""
from __future__ import annotations

import io
from typing import Optional, Sequence, Union

import numpy as np

from .errors import CCTError
from .glog import info, logger
from .io.blobproto import blob_from_proto
from .proto import caffe_pb2
from .rng import get_rng

# ------------------------------------------------------------------------------------------------
# Decoding (cv::imdecode / cv::imread)
# ------------------------------------------------------------------------------------------------
_PNG_GRAY = (9797, 19234, 3737)   # libpng png_set_rgb_to_gray(0.299, 0.587): 15-bit, truncated
_CV_GRAY = (4899, 9617, 1868)     # cv::cvtColor BGR2GRAY, 14-bit, rounded


def _rgb_to_gray(rgb: np.ndarray, image_format: str) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    if image_format == "PNG":
        return ((_PNG_GRAY[0] * r + _PNG_GRAY[1] * g + _PNG_GRAY[2] * b) >> 15).astype(np.uint8)
    return ((_CV_GRAY[0] * r + _CV_GRAY[1] * g + _CV_GRAY[2] * b + (1 << 13)) >> 14
            ).astype(np.uint8)


def _pil_to_array(img, color: Optional[bool]) -> np.ndarray:
    """(C, H, W) uint8 from a just-opened Pillow image, as ``cv::imdecode`` with IMREAD_COLOR
    (color True), IMREAD_GRAYSCALE (False) or IMREAD_UNCHANGED (None) returns it, channels
    BGR(A)."""
    from PIL import ImageOps

    fmt = img.format or ""
    if fmt == "JPEG" and color is False and img.mode in ("RGB", "YCbCr"):
        img.draft("L", None)  # libjpeg's greyscale output (the Y plane), as OpenCV asks for
    img.load()
    if fmt == "JPEG" and color is not None and img.getexif().get(0x0112, 1) != 1:
        img = ImageOps.exif_transpose(img)  # OpenCV applies it unless IMREAD_UNCHANGED
    mode = img.mode
    if mode not in ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr"):
        raise CCTError(f"{mode} images (e.g. 16-bit or floating point) are not supported; "
                       f"Caffe's data layers need 8-bit images")
    if mode == "1":
        img, mode = img.convert("L"), "L"
    elif mode in ("P", "PA"):
        mode = "RGBA" if mode == "PA" or "transparency" in img.info else "RGB"
        img = img.convert(mode)
    elif mode in ("CMYK", "YCbCr"):
        img, mode = img.convert("RGB"), "RGB"
    arr = np.asarray(img)
    if mode in ("L", "LA"):
        gray = arr if mode == "L" else arr[..., 0]
        if color is False or (color is None and mode == "L"):
            return gray[None]
        if color:
            return np.broadcast_to(gray, (3,) + gray.shape).copy()
        return np.stack([gray, gray, gray, arr[..., 1]])  # unchanged LA: BGRA
    if color is False:
        return _rgb_to_gray(arr, fmt)[None]
    if color or mode == "RGB":
        return np.ascontiguousarray(arr[..., 2::-1].transpose(2, 0, 1))
    return np.ascontiguousarray(arr[..., [2, 1, 0, 3]].transpose(2, 0, 1))


def decode_image(data: bytes, color: Optional[bool] = None) -> np.ndarray:
    """Image file bytes -> (C, H, W) uint8 (``cv::imdecode``); ``color`` None keeps the file's
    channels (Caffe's DecodeDatumToCVMatNative), True forces BGR, False greyscale."""
    from PIL import Image
    try:
        return _pil_to_array(Image.open(io.BytesIO(data)), color)
    except CCTError:
        raise
    except Exception as e:  # Pillow raises what damaged data triggers (its fuzzers expect any)
        raise CCTError(f"cannot decode the image ({len(data)} bytes): "
                       f"{image_error_reason(e, data)}") from None


def image_error_reason(e: Exception, data: bytes) -> str:
    """Pillow's reason for not decoding ``data``, without the repr of the in-memory file it
    names when it does not know the format ("cannot identify image file <_io.BytesIO ...>")."""
    from PIL import UnidentifiedImageError
    if isinstance(e, UnidentifiedImageError):
        return f"not an image Pillow can identify (the data start with {data[:8]!r})"
    return str(e)


def read_image(path: str, height: int = 0, width: int = 0, is_color: bool = True) -> np.ndarray:
    """Caffe's ``ReadImageToCVMat``: (C, H, W) uint8, resized to height x width when both are
    positive (``cv::resize`` INTER_LINEAR)."""
    from PIL import Image
    try:
        with Image.open(path) as img:
            arr = _pil_to_array(img, bool(is_color))
    except FileNotFoundError:
        raise CCTError(f"cannot read image '{path}': no such file") from None
    except CCTError:
        raise
    except Exception as e:  # Pillow raises what damaged data triggers (its fuzzers expect any)
        raise CCTError(f"cannot read image '{path}': {e}") from None
    if height > 0 and width > 0:
        arr = resize_linear(arr, height, width)
    return arr


# ------------------------------------------------------------------------------------------------
# cv::resize(INTER_LINEAR) for 8-bit images
# ------------------------------------------------------------------------------------------------
_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS


def _linear_taps(src: int, dst: int, clamp: bool):
    """Source indices and 11-bit weights of OpenCV's linear resize along one axis."""
    scale = 1.0 / (dst / src)
    f = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    i0 = np.floor(f).astype(np.int64)
    f = f - i0.astype(np.float32)
    if clamp:  # the x axis: edge positions take the edge pixel with full weight
        edge = (i0 < 0) | (i0 >= src - 1)
        f[edge] = 0
        i0 = np.clip(i0, 0, src - 1)
        i1 = np.minimum(i0 + 1, src - 1)
    else:      # the y axis: rows are clipped, weights kept
        i1 = np.clip(i0 + 1, 0, src - 1)
        i0 = np.clip(i0, 0, src - 1)
    w0 = np.rint((np.float32(1) - f) * np.float32(_COEF_SCALE)).astype(np.int32)
    w1 = np.rint(f * np.float32(_COEF_SCALE)).astype(np.int32)
    return i0, i1, w0, w1


def resize_linear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(src, dst, Size(width, height))`` (INTER_LINEAR) of a (C, H, W) uint8 image,
    with OpenCV's integer arithmetic: horizontal taps in 11-bit fixed point, then the vertical
    blend ``((S0 >> 4) * b0 >> 16) + ((S1 >> 4) * b1 >> 16) + 2 >> 2`` of its vector code
    (bit-exact with OpenCV 4/5 on x86). Exact halvings use INTER_AREA's rounded 2x2 mean, as
    OpenCV does."""
    c, h, w = img.shape
    if (h, w) == (height, width):
        return img.copy()
    sx, sy = 1.0 / (width / w), 1.0 / (height / h)
    if sx == 2.0 and sy == 2.0:
        s = img.astype(np.int32)
        return ((s[:, 0::2, 0::2] + s[:, 0::2, 1::2] + s[:, 1::2, 0::2] + s[:, 1::2, 1::2] + 2)
                >> 2).astype(np.uint8)
    x0, x1, a0, a1 = _linear_taps(w, width, clamp=True)
    y0, y1, b0, b1 = _linear_taps(h, height, clamp=False)
    src = img.astype(np.int32)
    rows = src[:, :, x0] * a0 + src[:, :, x1] * a1            # (C, H, width), scaled by 2^11
    s0, s1 = rows[:, y0, :], rows[:, y1, :]                   # (C, height, width)
    b0, b1 = b0[None, :, None], b1[None, :, None]
    out = ((((s0 >> 4) * b0) >> 16) + (((s1 >> 4) * b1) >> 16) + 2) >> 2
    return np.clip(out, 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------------
# Datums
# ------------------------------------------------------------------------------------------------
def decode_datum(datum: caffe_pb2.Datum, color: Optional[bool] = None) -> np.ndarray:
    """A Datum's values as (C, H, W): uint8 from ``data``, float32 from ``float_data``, or the
    decoded image of an encoded Datum (``color`` as for :func:`decode_image`)."""
    if datum.encoded:
        return decode_image(datum.data, color)
    shape = (datum.channels, datum.height, datum.width)
    count = datum.channels * datum.height * datum.width
    if datum.data:
        arr = np.frombuffer(datum.data, np.uint8)
        what = "bytes of data"
    else:
        arr = np.asarray(datum.float_data, np.float32)
        what = "float_data values"
    if count <= 0 or arr.size != count:
        raise CCTError(f"the Datum holds {arr.size} {what} for channels x height x width = "
                       f"{shape} ({count})")
    return arr.reshape(shape)


# ------------------------------------------------------------------------------------------------
# The transformer
# ------------------------------------------------------------------------------------------------
class DataTransformer:
    """Caffe's DataTransformer for one layer: mean, crop, mirror, scale (see the module doc)."""

    def __init__(self, param: caffe_pb2.TransformationParameter, phase: int, where: str):
        self.param = param
        self.phase = phase
        self.where = where
        self.mean: Optional[np.ndarray] = None
        self.mean_is_file = False
        self.rng: Optional[np.random.Generator] = None
        self._warned_force = False
        if param.force_color and param.force_gray:
            raise CCTError(f"{where}: transform_param sets both force_color and force_gray; "
                           f"set one")
        if param.HasField("mean_file") and len(param.mean_value):
            raise CCTError(f"{where}: transform_param gives both mean_file and mean_value; "
                           f"give one")
        if param.HasField("mean_file"):
            self.mean = self._load_mean(param.mean_file)
            self.mean_is_file = True
        elif len(param.mean_value):
            self.mean = np.asarray(param.mean_value, np.float32)

    def _load_mean(self, path: str) -> np.ndarray:
        info("data_transformer.cpp:25", f"Loading mean file from: {path}")
        bp = caffe_pb2.BlobProto()
        try:
            with open(path, "rb") as f:
                bp.ParseFromString(f.read())
            mean = blob_from_proto(bp).astype(np.float32)
        except OSError as e:
            raise CCTError(f"{self.where}: cannot read mean_file '{path}': {e.strerror}") from None
        except Exception as e:  # a truncated or foreign file
            raise CCTError(f"{self.where}: mean_file '{path}' is not a BlobProto (.binaryproto): "
                           f"{e}") from None
        if mean.ndim < 3 or int(np.prod(mean.shape[:-3])) != 1:
            raise CCTError(f"{self.where}: mean_file '{path}' holds a blob of shape "
                           f"{mean.shape}; expected 1 x C x H x W")
        return mean.reshape(mean.shape[-3:])

    # -- randomness --------------------------------------------------------------------------
    def init_rand(self) -> None:
        """Seed the transformer's generator from the process RNG when it draws anything
        (mirror, or crop in TRAIN), as Caffe's InitRand."""
        p = self.param
        if p.mirror or (self.phase == caffe_pb2.TRAIN and p.crop_size):
            self.rng = np.random.default_rng(int(get_rng().integers(0, 2 ** 32)))

    def rng_state(self) -> Optional[dict]:
        return None if self.rng is None else copy_rng_state(self.rng.bit_generator.state)

    def set_rng_state(self, state: Optional[dict]) -> None:
        if self.rng is not None and state is not None:
            self.rng.bit_generator.state = copy_rng_state(state)

    # -- shapes --------------------------------------------------------------------------------
    def color_mode(self, force_encoded_color: bool = False) -> Optional[bool]:
        """How encoded images are decoded: True colour, False grey, None as stored."""
        if self.param.force_color or force_encoded_color:
            return True
        if self.param.force_gray:
            return False
        return None

    def warn_unencoded_force(self) -> None:
        """Caffe logs an error for force_color/force_gray on a raw Datum (and ignores them)."""
        if (self.param.force_color or self.param.force_gray) and not self._warned_force:
            self._warned_force = True
            logger.error(f"{self.where}: force_color and force_gray only for encoded datum")

    def output_shape(self, c: int, h: int, w: int) -> tuple:
        """Caffe's InferBlobShape for one example."""
        crop = self.param.crop_size
        if crop and (crop > h or crop > w):
            raise CCTError(f"{self.where}: crop_size {crop} is larger than the data "
                           f"({h} x {w}); lower crop_size")
        return (c, crop, crop) if crop else (c, h, w)

    # -- the transform -------------------------------------------------------------------------
    def transform(self, images: Union[np.ndarray, Sequence[np.ndarray]]) -> np.ndarray:
        """Transform a batch: an (N, C, H, W) array or a list of (C, H, W) examples (all of one
        shape, or of several shapes when crop_size crops each to the same size). Returns
        float32 (N, C, h, w)."""
        n = len(images)
        p = self.param
        crop = p.crop_size
        train = self.phase == caffe_pb2.TRAIN
        c = images[0].shape[0]
        heights = np.array([im.shape[1] for im in images])
        widths = np.array([im.shape[2] for im in images])
        uniform = all(im.shape == images[0].shape for im in images)
        if not uniform and not crop:
            raise CCTError(f"{self.where}: examples of different shapes in one batch "
                           f"({images[0].shape} and others); give crop_size or resize them")
        self._check_mean(c, heights, widths)
        flips = (self.rng.integers(0, 2, n).astype(bool) if p.mirror
                 else np.zeros(n, bool))
        if crop:
            self.output_shape(c, int(heights.min()), int(widths.min()))
            if train:
                h_off = self.rng.integers(0, heights - crop + 1)
                w_off = self.rng.integers(0, widths - crop + 1)
            else:
                h_off, w_off = (heights - crop) // 2, (widths - crop) // 2
            out_h = out_w = crop
        else:
            h_off = w_off = np.zeros(n, np.int64)
            out_h, out_w = int(heights[0]), int(widths[0])
        if self.mean_is_file:
            mean = self.mean
        else:  # one value per channel (zero without a mean: x - 0 is x, to the bit)
            values = self.mean if self.mean is not None else np.zeros(1, np.float32)
            mean = np.ascontiguousarray(np.broadcast_to(values, (c,)), np.float32)
            mean = mean.reshape(c, 1, 1)
        from .backend import jit  # numba, imported at the first batch (not with cct)
        out = np.empty((n, c, out_h, out_w), np.float32)
        for i, im in enumerate(images):
            jit.transform_example(im, mean, not self.mean_is_file, int(h_off[i]),
                                  int(w_off[i]), bool(flips[i]), np.float32(p.scale), out[i])
        return out

    def _check_mean(self, c: int, heights: np.ndarray, widths: np.ndarray) -> None:
        if self.mean is None:
            return
        if self.mean_is_file:
            mc, mh, mw = self.mean.shape
            if mc != c or np.any(heights != mh) or np.any(widths != mw):
                raise CCTError(f"{self.where}: the mean file is {mc} x {mh} x {mw} but the data "
                               f"is {c} x {heights[0]} x {widths[0]}; the mean must have the "
                               f"data's uncropped shape")
        elif self.mean.size not in (1, c):
            raise CCTError(f"{self.where}: {self.mean.size} mean_value entries for data with "
                           f"{c} channels; give 1 mean_value or one per channel")


def copy_rng_state(state: dict) -> dict:
    """A deep copy of a NumPy bit generator's state (nested dicts of ints and strings)."""
    return {k: (copy_rng_state(v) if isinstance(v, dict) else v) for k, v in state.items()}


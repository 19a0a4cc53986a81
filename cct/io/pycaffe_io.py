"""pycaffe's ``caffe.io``: array <-> BlobProto/Datum conversion, image loading and resizing, the
input Transformer and the 10-crop oversampling, with pycaffe's semantics.

Images load through Pillow; values and shapes follow pycaffe's scikit-image path.
:func:`resize_image` calls scikit-image and SciPy, as pycaffe does, when they are installed,
and computes orders 0 and 1 with the same math when they are not.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..data_transformer import image_error_reason
from ..errors import CCTError
from ..proto import caffe_pb2

__all__ = ["Transformer", "load_image", "resize_image", "oversample", "array_to_datum",
           "datum_to_array", "blobproto_to_array", "array_to_blobproto",
           "arraylist_to_blobprotovector_str", "blobprotovector_str_to_arraylist", "caffe_pb2"]


class CaffeIOError(CCTError, ValueError):
    """A caffe.io call got an array, proto or setting it cannot use. A ValueError too, as most
    of pycaffe's own checks are."""


# -- proto / datum / ndarray conversion ------------------------------------------------------

def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or its diff with ``return_diff``) as a float64 array, shaped by the
    legacy num/channels/height/width when any of them is set and by ``shape.dim`` otherwise.
    Blobs stored in double_data/double_diff are read from there."""
    if return_diff:
        values = blob.diff if len(blob.diff) or not len(blob.double_diff) else blob.double_diff
    else:
        values = blob.data if len(blob.data) or not len(blob.double_data) else blob.double_data
    data = np.array(values, dtype=np.float64)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(blob.shape.dim)
    if data.size != int(np.prod(shape, dtype=np.int64)):
        raise CaffeIOError(f"blobproto_to_array: the blob holds {data.size} "
                           f"{'diff' if return_diff else 'data'} values, which do not fill its "
                           f"shape {shape}")
    return data.reshape(shape)


def array_to_blobproto(arr: np.ndarray, diff: Optional[np.ndarray] = None) -> caffe_pb2.BlobProto:
    """An N-d array (and optionally its diff, of the same shape) as a BlobProto with
    ``shape.dim`` set; values are stored as float."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(arr.shape)
    blob.data.extend(arr.astype(np.float64).ravel().tolist())
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != arr.shape:
            raise CaffeIOError(f"array_to_blobproto: diff has shape {diff.shape}, the data "
                               f"{arr.shape}; they must match")
        blob.diff.extend(diff.astype(np.float64).ravel().tolist())
    return blob


def arraylist_to_blobprotovector_str(arraylist: Iterable[np.ndarray]) -> bytes:
    """A list of arrays as a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(arr) for arr in arraylist])
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data: bytes) -> List[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr: np.ndarray, label: Optional[int] = None) -> caffe_pb2.Datum:
    """A C x H x W array as a Datum: uint8 arrays go to ``data`` as raw bytes, anything else to
    ``float_data``; ``label`` is set when given."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise CaffeIOError(f"Incorrect array shape: array_to_datum takes a C x H x W array, got "
                           f"shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(np.float64).ravel().tolist())
    if label is not None:
        datum.label = label
    return datum


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """A Datum's values as a C x H x W array: uint8 from ``data``, float64 from ``float_data``
    (the label stays in ``datum.label``). An encoded Datum (image file bytes, as written by
    ``convert_imageset --encoded``) is decoded to uint8 in Caffe's channel order, BGR for
    colour images."""
    if datum.encoded:
        return _decode_datum(datum)
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        arr = np.frombuffer(datum.data, dtype=np.uint8).copy()
    else:
        arr = np.array(datum.float_data, dtype=np.float64)
    if arr.size != datum.channels * datum.height * datum.width:
        raise CaffeIOError(f"datum_to_array: the Datum holds {arr.size} values, which do not "
                           f"fill its shape {shape} (channels x height x width)")
    return arr.reshape(shape)


def _decode_datum(datum: caffe_pb2.Datum) -> np.ndarray:
    image = _open_image(datum.data, f"the encoded Datum ({len(datum.data)} bytes)")
    # Caffe decodes with OpenCV: grey stays one channel, colour comes out BGR.
    if image.mode not in ("L", "RGB"):
        image = image.convert("L" if image.mode in ("1", "LA", "I", "I;16", "F") else "RGB")
    arr = np.asarray(image, dtype=np.uint8)
    if arr.ndim == 2:
        return arr[np.newaxis].copy()
    return arr[:, :, ::-1].transpose(2, 0, 1).copy()


# -- pre-processing -----------------------------------------------------------------------------

class Transformer:
    """Format images for a net's inputs, as pycaffe's ``caffe.io.Transformer``.

    ``inputs`` maps each input blob name to its shape (N, K, H, W). :meth:`preprocess` takes an
    H' x W' x K image and returns the K x H x W blob data::

        resize to H x W -> transpose -> channel swap -> * raw_scale -> - mean -> * input_scale

    each step only where it was set; :meth:`deprocess` undoes them in reverse order.
    """

    def __init__(self, inputs: Dict[str, Sequence[int]]):
        self.inputs = inputs
        self.transpose: Dict[str, Sequence[int]] = {}
        self.channel_swap: Dict[str, Sequence[int]] = {}
        self.raw_scale: Dict[str, float] = {}
        self.mean: Dict[str, np.ndarray] = {}
        self.input_scale: Dict[str, float] = {}

    def __check_input(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise CaffeIOError(f"{in_} is not one of the net inputs: {self.inputs}")

    def preprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """An H' x W' x K image as float32 K x H x W data for input ``in_`` (the input array
        is not modified)."""
        self.__check_input(in_)
        caffe_in = np.array(data, dtype=np.float32)
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        in_dims = tuple(self.inputs[in_][2:])
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        if raw_scale is not None:
            caffe_in *= raw_scale
        if mean is not None:
            caffe_in -= mean
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """Invert :meth:`preprocess` (all but the resize) on blob data; singleton axes are
        squeezed first, so a 1 x K x H x W blob gives an H x W x K image."""
        self.__check_input(in_)
        decaf_in = data.copy().squeeze()
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in /= input_scale
        if mean is not None:
            decaf_in += mean
        if raw_scale is not None:
            decaf_in /= raw_scale
        if channel_swap is not None:
            decaf_in = decaf_in[np.argsort(channel_swap), :, :]
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_: str, order: Sequence[int]) -> None:
        """The axis order taking the image to the blob: (2, 0, 1) for H x W x K -> K x H x W."""
        self.__check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise CaffeIOError(f"Transpose order needs to have the same number of dimensions as "
                               f"the input: got {tuple(order)} for input '{in_}' of shape "
                               f"{tuple(self.inputs[in_])}, expected "
                               f"{len(self.inputs[in_]) - 1} axes")
        self.transpose[in_] = order

    def set_channel_swap(self, in_: str, order: Sequence[int]) -> None:
        """The channel order taken after the transpose, e.g. (2, 1, 0) for RGB -> BGR."""
        self.__check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise CaffeIOError(f"Channel swap needs to have the same number of dimensions as "
                               f"the input channels: got {tuple(order)} for input '{in_}' with "
                               f"{self.inputs[in_][1]} channels")
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_: str, scale: float) -> None:
        """Scale applied before the mean subtraction, e.g. 255 for models trained on [0, 255]
        pixels given images in [0, 1]."""
        self.__check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_: str, mean: np.ndarray) -> None:
        """The mean subtracted after raw_scale: one value per channel (shape (K,)) or a whole
        K x H x W (or H x W) array. A whole mean of another height and width than the input is
        resized to it as Caffe does (BVLC/caffe#5719): scaled to [0, 1], resized with
        :func:`resize_image` and scaled back. A constant mean stays that constant (Caffe's
        scaling divides by zero there and gives NaN)."""
        self.__check_input(in_)
        mean = np.asarray(mean)
        ms = mean.shape
        in_shape = tuple(self.inputs[in_][1:])
        if mean.ndim == 1:
            if ms[0] != self.inputs[in_][1]:
                raise CaffeIOError(f"Mean channels incompatible with input: the mean has {ms[0]} "
                                   f"values, input '{in_}' has {self.inputs[in_][1]} channels")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            if len(ms) == 2:
                ms = (1,) + ms
            if len(ms) != 3:
                raise CaffeIOError(f"Mean shape invalid: {mean.shape}; give K values or a "
                                   f"K x H x W array")
            if ms != in_shape:
                if ms[0] != in_shape[0]:
                    raise CaffeIOError(f"Mean shape incompatible with input shape: the mean is "
                                       f"{mean.shape}, input '{in_}' needs {in_shape}; a mean "
                                       f"of another height and width is resized, but the "
                                       f"channels must match")
                mean = self._resized_mean(mean.reshape(ms), in_shape)
        self.mean[in_] = mean

    @staticmethod
    def _resized_mean(mean: np.ndarray, in_shape: Tuple[int, ...]) -> np.ndarray:
        m_min, m_max = mean.min(), mean.max()
        if not m_max > m_min:
            return np.full(in_shape, m_min, dtype=mean.dtype)
        normal_mean = (mean - m_min) / (m_max - m_min)
        resized = resize_image(normal_mean.transpose((1, 2, 0)), in_shape[1:])
        return resized.transpose((2, 0, 1)) * (m_max - m_min) + m_min

    def set_input_scale(self, in_: str, scale: float) -> None:
        """Scale applied last, after the mean subtraction."""
        self.__check_input(in_)
        self.input_scale[in_] = scale


# -- image IO -----------------------------------------------------------------------------------

# scikit-image's rgb2gray weights (ITU-R BT.709 luma), used by pycaffe's load_image(color=False).
_GRAY_WEIGHTS = np.array([0.2125, 0.7154, 0.0721])


def _open_image(source: Union[str, bytes], what: str):
    """An image file, or image file bytes, opened and loaded with Pillow."""
    import io

    try:
        from PIL import Image
    except ImportError:
        raise CCTError("reading images needs Pillow: pip install Pillow") from None
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        image.load()
    except FileNotFoundError:
        raise CaffeIOError(f"image file '{source}' does not exist") from None
    except OSError as e:
        reason = image_error_reason(e, source) if isinstance(source, bytes) else e
        raise CaffeIOError(f"cannot read {what} as an image: {reason}") from None
    return image


def _image_as_float(image) -> np.ndarray:
    """Pixels as float64 in [0, 1] (scikit-image's img_as_float): H x W or H x W x C."""
    mode = image.mode
    if mode == "P":
        image = image.convert("RGB")
    elif mode == "LA":
        image = image.convert("L")
    elif mode == "PA":
        image = image.convert("RGB")
    elif mode not in ("1", "L", "RGB", "RGBA", "I", "F") and not mode.startswith("I;16"):
        image = image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype == np.bool_:
        return arr.astype(np.float64)
    if arr.dtype.kind == "f":
        return arr.astype(np.float64)
    return arr.astype(np.float64) / np.iinfo(arr.dtype).max


def load_image(filename, color: bool = True) -> np.ndarray:
    """An image file as float32 in [0, 1]: H x W x 3 RGB with ``color`` (grey images are
    repeated to 3 channels), else H x W x 1 intensity (colour images converted with
    0.2125 R + 0.7154 G + 0.0721 B). Alpha channels are dropped."""
    img = _image_as_float(_open_image(filename, f"'{filename}'"))
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[:, :, :3]
    if not color and img.ndim == 3:
        img = img @ _GRAY_WEIGHTS
    img = img.astype(np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    return img


def _ndimage():
    """scipy.ndimage, or None where SciPy is not installed."""
    try:
        from scipy import ndimage
    except ImportError:
        return None
    return ndimage


def _take_or_zero(im: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    """``im`` indexed along ``axis``, with 0 for indices outside it."""
    n = im.shape[axis]
    pad = [(0, 0)] * im.ndim
    pad[axis] = (1, 1)
    return np.take(np.pad(im, pad), np.clip(index, -1, n) + 1, axis=axis)


def _zoom_axis(im: np.ndarray, axis: int, size: int, order: int, grid: bool) -> np.ndarray:
    """scipy.ndimage.zoom along one axis for order 0 or 1. ``grid`` (grid_mode=True,
    mode='grid-constant'): out[i] samples in[(i + 0.5) n / size - 0.5], zero outside the image;
    else (grid_mode=False): out[i] samples in[i (n - 1) / (size - 1)], never outside it."""
    n = im.shape[axis]
    i = np.arange(size, dtype=np.float64)
    if grid:
        src = (i + 0.5) * (n / size) - 0.5
    else:
        src = i * ((n - 1) / (size - 1)) if size > 1 else np.zeros(size)
        src = np.clip(src, 0, n - 1)
    if order == 0:  # ndimage rounds halves up
        return _take_or_zero(im, np.floor(src + 0.5).astype(np.intp), axis)
    i0 = np.floor(src).astype(np.intp)
    w = (src - i0).reshape((-1,) + (1,) * (im.ndim - axis - 1))
    return _take_or_zero(im, i0, axis) * (1 - w) + _take_or_zero(im, i0 + 1, axis) * w


def _gaussian_axis(im: np.ndarray, axis: int, sigma: float) -> np.ndarray:
    """scipy.ndimage.gaussian_filter1d(im, sigma, axis, mode='constant', truncate=4.0)."""
    radius = int(4.0 * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    kernel = np.exp(-0.5 / sigma ** 2 * x ** 2)
    kernel /= kernel.sum()
    n = im.shape[axis]
    pad = [(0, 0)] * im.ndim
    pad[axis] = (radius, radius)
    padded = np.pad(im, pad)
    return sum(w * np.take(padded, np.arange(j, j + n), axis=axis)
               for j, w in enumerate(kernel))


def _skimage_resize(im: np.ndarray, new_dims: Tuple[int, int], order: int) -> np.ndarray:
    """``skimage.transform.resize(im, new_dims, order=order, mode='constant')`` for an
    H x W x K image in [0, 1], as pycaffe calls it; scikit-image's own function when it is
    installed. Its steps (scikit-image 0.19 on):

    - when any axis shrinks, a Gaussian blur first: sigma = max(0, (H / H' - 1) / 2) per axis,
      zero outside the image (``anti_aliasing``);
    - spline interpolation at pixel centres, out[i] = in[(i + 0.5) H / H' - 0.5], where pixels
      outside the image are 0 (so upsampled edge pixels blend with 0);
    - clipped to the input's range.
    """
    try:
        from skimage.transform import resize
    except ImportError:
        pass
    else:
        return resize(im, new_dims, order=order, mode="constant")
    factors = np.array(im.shape[:2], dtype=np.float64) / np.array(new_dims)
    sigmas = np.maximum(0, (factors - 1) / 2) if np.any(factors > 1) else np.zeros(2)
    if order > 1:  # the spline prefilter is ndimage's
        ndimage = _ndimage()
        if ndimage is None:
            raise CCTError(f"resize_image with interp_order={order} needs SciPy or "
                           f"scikit-image (orders 0 and 1 do not): pip install scipy")
        filtered = (ndimage.gaussian_filter(im, tuple(sigmas) + (0,), mode="grid-constant")
                    if sigmas.any() else im)
        out = ndimage.zoom(filtered, tuple(1 / factors) + (1,), order=order,
                           mode="grid-constant", grid_mode=True)
    else:
        out = im.astype(np.float64)
        for axis in (0, 1):
            if sigmas[axis] > 1e-15:
                out = _gaussian_axis(out, axis, sigmas[axis])
        for axis in (0, 1):
            out = _zoom_axis(out, axis, new_dims[axis], order, grid=True)
        out = out.astype(im.dtype)
    return np.clip(out, im.min(), im.max())


def _ndimage_zoom(im: np.ndarray, new_dims: Tuple[int, int], order: int) -> np.ndarray:
    """``scipy.ndimage.zoom(im, (H' / H, W' / W, 1), order=order)``, as pycaffe calls it for
    images of other than 1 or 3 channels: corner aligned, out[i] = in[i (H - 1) / (H' - 1)]."""
    scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
    ndimage = _ndimage()
    if ndimage is not None:
        return ndimage.zoom(im, scale + (1,), order=order)
    if order > 1:
        raise CCTError(f"resize_image with interp_order={order} on a {im.shape[-1]}-channel "
                       f"image needs SciPy (orders 0 and 1 do not): pip install scipy")
    out = im
    for axis in (0, 1):
        out = _zoom_axis(out, axis, new_dims[axis], order, grid=False)
    return out


def resize_image(im: np.ndarray, new_dims: Sequence[int], interp_order: int = 1) -> np.ndarray:
    """Resize an H x W x K image to ``new_dims`` (height, width), as float32, as pycaffe does.

    K = 1 or 3: the image scaled to [0, 1], resized by scikit-image (:func:`_skimage_resize`:
    blurred first when shrinking, pixel-centre aligned, zero beyond the edges) and scaled back;
    a constant image gives the constant. Other K: ``scipy.ndimage.zoom``, corner aligned.
    ``interp_order`` 0 is nearest, 1 (default) linear, 2-5 splines. scikit-image and SciPy are
    called when installed; without them orders 0 and 1 are computed here with the same math.
    """
    im = np.asarray(im)
    if im.ndim != 3:
        raise CaffeIOError(f"resize_image takes an H x W x K image, got shape {im.shape}")
    new_dims = (int(new_dims[0]), int(new_dims[1]))
    if new_dims[0] < 1 or new_dims[1] < 1:
        raise CaffeIOError(f"resize_image: new_dims {new_dims} must be positive")
    order = int(interp_order)
    if not 0 <= order <= 5:
        raise CaffeIOError(f"resize_image: interp_order must be 0 to 5, got {interp_order}")
    if im.shape[-1] in (1, 3):
        im_min, im_max = im.min(), im.max()
        if not im_max > im_min:
            return np.full(new_dims + (im.shape[-1],), im_min, dtype=np.float32)
        im_std = (im - im_min) / (im_max - im_min)
        resized_im = _skimage_resize(im_std, new_dims, order) * (im_max - im_min) + im_min
    else:
        resized_im = _ndimage_zoom(im, new_dims, order)
    return resized_im.astype(np.float32)


def oversample(images: Sequence[np.ndarray], crop_dims: Sequence[int]) -> np.ndarray:
    """The 10 crops of each H x W x K image: the four corners and the centre, then the same
    five mirrored left-right; (10 N) x h x w x K float32 for ``crop_dims`` (h, w). Crop
    positions come from the first image's shape."""
    im_shape = np.array(images[0].shape)
    crop_dims = np.array(crop_dims)
    ch, cw = int(crop_dims[0]), int(crop_dims[1])
    if ch > im_shape[0] or cw > im_shape[1]:
        raise CaffeIOError(f"oversample: crop {ch} x {cw} is larger than the image "
                           f"{im_shape[0]} x {im_shape[1]}")
    corners = [(i, j) for i in (0, im_shape[0] - ch) for j in (0, im_shape[1] - cw)]
    # pycaffe stores the centre crop's float corners in an int array, which truncates them.
    center = (im_shape[:2] / 2.0 - crop_dims / 2.0).astype(int)
    starts = corners + [(int(center[0]), int(center[1]))]
    crops = np.empty((10 * len(images), ch, cw, im_shape[-1]), dtype=np.float32)
    for n, im in enumerate(images):
        base = 10 * n
        for k, (i, j) in enumerate(starts):
            crops[base + k] = im[i:i + ch, j:j + cw, :]
        crops[base + 5:base + 10] = crops[base:base + 5, :, ::-1, :]
    return crops

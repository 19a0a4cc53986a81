"""``cct convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME``: Caffe's tools/convert_imageset.

LISTFILE holds one image a line, ``path/in/rootfolder.jpg LABEL`` (the label is after the last
space, so file names may hold spaces). Each image becomes one Datum under the key
``%08d_<path>`` (its line number from 0, then the path as written), committed every 1000
records. Flags as Caffe's: ``--gray``, ``--shuffle``, ``--backend=lmdb``,
``--resize_width``/``--resize_height`` (both > 0 to resize), ``--check_size``, ``--encoded``,
``--encode_type=png|jpg|...``.

The Datum bytes are Caffe's: a decoded image is stored as ``channels, height, width, data``
(pixels in BGR channel order, channel by channel), ``label`` and ``encoded: false`` (Caffe's
CVMatToDatum sets the flag explicitly, so it is serialised); an encoded one as ``data`` (the
file's own bytes when no resize or re-encoding is needed), ``label`` and ``encoded: true``.
Images are read as OpenCV's ``imread`` reads them: colour as BGR, ``--gray`` with OpenCV's
conversions (a JPEG's luma plane, libpng's and ``cvtColor``'s fixed-point weights), resizing
with ``cv::resize``'s bilinear fixed-point arithmetic (INTER_AREA for an exact halving, as
OpenCV switches to it), EXIF orientation applied. Re-encoding (``--encode_type`` different from
a file's own format, or with a resize) goes through Pillow, whose PNG/JPEG encoders do not give
OpenCV's bytes; the decoded pixels are the same.

Where Caffe logs an error and skips a line whose image cannot be read, cct stops with an error
naming the line (and writes no database): a silently smaller database is a bug to find later.
"""
from __future__ import annotations

import io
import os
from typing import List, Optional, Tuple, Union

import numpy as np

from ..errors import CCTError
from ..flags import Flags
from ..glog import info, warning
from ..proto import caffe_pb2
from ..rng import get_rng
from . import format_int, log_error, open_lmdb_writer

TOOL = "convert_imageset"

IMREAD_COLOR = 1
IMREAD_GRAYSCALE = 0
IMREAD_UNCHANGED = -1

_RESIZE_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS
_RESIZE_SCALE = 1 << _RESIZE_BITS


# -- reading images as OpenCV does ----------------------------------------------------------------

def _to_8bit(image):
    """OpenCV reads deeper images at 8 bits by dropping the low byte (png_set_strip_16)."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(image, dtype=np.uint32) >> 8
        return Image.fromarray(arr.astype(np.uint8), "L")
    return image


def _gray_weights_png(rgb: np.ndarray) -> np.ndarray:
    """libpng's png_set_rgb_to_gray(0.299, 0.587), as OpenCV's PNG reader asks for it:
    15-bit weights 9797, 19234, 3737 (truncated from 0.299 and 0.587), the sum truncated."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((9797 * r + 19234 * g + 3737 * b) >> 15).astype(np.uint8)


def _gray_weights_cvt(rgb: np.ndarray) -> np.ndarray:
    """OpenCV's cvtColor(BGR2GRAY) for 8-bit images, 14-bit fixed point."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((4899 * r + 9617 * g + 1868 * b + (1 << 13)) >> 14).astype(np.uint8)


def imdecode(source: Union[str, bytes], flag: int = IMREAD_COLOR) -> Optional[np.ndarray]:
    """An image as OpenCV's ``imread``/``imdecode`` returns it: uint8, H x W (gray) or
    H x W x C in BGR(A) order; None when it cannot be read or decoded."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        fmt = image.format
        if flag == IMREAD_GRAYSCALE and fmt == "JPEG" and image.mode in ("RGB", "YCbCr", "L"):
            image.draft("L", image.size)  # libjpeg's grayscale output: the luma plane
        image.load()
        if not isinstance(source, bytes):
            image = ImageOps.exif_transpose(image)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError):
        return None
    image = _to_8bit(image)
    if flag == IMREAD_GRAYSCALE:
        if image.mode == "L":
            return np.asarray(image).copy()
        if image.mode == "1":
            return np.asarray(image.convert("L")).copy()
        rgb = np.asarray(image.convert("RGB"))
        return _gray_weights_png(rgb) if fmt == "PNG" else _gray_weights_cvt(rgb)
    if flag == IMREAD_UNCHANGED:
        if image.mode in ("L", "1"):
            return np.asarray(image.convert("L")).copy()
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P"
                                                  and "transparency" in image.info):
            return np.ascontiguousarray(np.asarray(image.convert("RGBA"))[:, :, [2, 1, 0, 3]])
        return np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])
    return np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])


def _linear_taps(src: int, dst: int, clamp_weights: bool):
    """Source indices and fixed-point weights of cv::resize's INTER_LINEAR along one axis.
    OpenCV clamps the weights at the borders along x but only the indices along y."""
    scale = src / dst
    f = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s).astype(np.float32)
    if clamp_weights:
        low, high = s < 0, s >= src - 1
        f[low | high] = 0
        s[low] = 0
        s[high] = src - 1
    w1 = np.rint(f * _RESIZE_SCALE).astype(np.int64)
    w0 = np.rint((np.float32(1) - f) * _RESIZE_SCALE).astype(np.int64)
    return np.clip(s, 0, src - 1), np.clip(s + 1, 0, src - 1), w0, w1


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(image, Size(width, height))`` (INTER_LINEAR) for uint8 images, bit-exact:
    a horizontal pass in 11-bit fixed point, then the vertical pass as OpenCV's vectorised
    kernel rounds it; an exact halving of both sides is OpenCV's 2x2 INTER_AREA average."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image.copy()
    x = image.astype(np.int64)
    if x.ndim == 2:
        x = x[:, :, None]
    if h == 2 * height and w == 2 * width and x.shape[2] != 2:
        out = (x[0::2, 0::2] + x[1::2, 0::2] + x[0::2, 1::2] + x[1::2, 1::2] + 2) >> 2
    else:
        x0, x1, a0, a1 = _linear_taps(w, width, True)
        y0, y1, b0, b1 = _linear_taps(h, height, False)
        rows = x[:, x0] * a0[None, :, None] + x[:, x1] * a1[None, :, None]
        top = ((rows[y0] >> 4) * b0[:, None, None]) >> 16
        bottom = ((rows[y1] >> 4) * b1[:, None, None]) >> 16
        out = (top + bottom + 2) >> 2
    out = np.clip(out, 0, 255).astype(np.uint8)
    return out[:, :, 0] if image.ndim == 2 else out


def read_image(path: str, height: int = 0, width: int = 0,
               is_color: bool = True) -> Optional[np.ndarray]:
    """Caffe's ReadImageToCVMat: read (colour BGR or gray), resize when both sides are > 0."""
    image = imdecode(path, IMREAD_COLOR if is_color else IMREAD_GRAYSCALE)
    if image is None:
        return None
    if height > 0 and width > 0:
        image = resize(image, height, width)
    return image


def image_to_datum(image: np.ndarray, datum: caffe_pb2.Datum) -> None:
    """Caffe's CVMatToDatum: shape, CHW pixel bytes, ``encoded: false`` (set explicitly)."""
    if image.ndim == 2:
        image = image[:, :, None]
    h, w, c = image.shape
    datum.channels = c
    datum.height = h
    datum.width = w
    datum.ClearField("data")
    datum.ClearField("float_data")
    datum.encoded = False
    datum.data = np.ascontiguousarray(image.transpose(2, 0, 1)).tobytes()


def decode_datum_native(datum: caffe_pb2.Datum) -> bool:
    """Caffe's DecodeDatumNative: an encoded Datum becomes a decoded one (channels as stored);
    returns whether it was encoded."""
    if not datum.encoded:
        return False
    image = imdecode(datum.data, IMREAD_UNCHANGED)
    if image is None:
        raise CCTError("Could not decode datum: its data are not an image OpenCV (or cct) can "
                       "read")
    label = datum.label
    image_to_datum(image, datum)
    datum.label = label
    return True


def _matches_extension(filename: str, encoding: str) -> bool:
    """Caffe's matchExt: the file's extension (lower case) is the encoding (jpeg counts as
    jpg)."""
    ext = filename.rsplit(".", 1)[-1].lower()
    encoding = encoding.lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def _encode(image: np.ndarray, encoding: str) -> bytes:
    from PIL import Image

    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "jpe": "JPEG", "png": "PNG", "bmp": "BMP",
           "tif": "TIFF", "tiff": "TIFF", "ppm": "PPM", "pgm": "PPM", "pbm": "PPM",
           "webp": "WEBP"}.get(encoding.lower())
    if fmt is None:
        raise CCTError(f"{TOOL}: cannot encode images as '{encoding}' (use png, jpg, bmp, tif, "
                       f"ppm or webp)")
    pil = Image.fromarray(image if image.ndim == 2 else image[:, :, ::-1])
    buf = io.BytesIO()
    pil.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def read_image_to_datum(path: str, label: int, height: int, width: int, is_color: bool,
                        encoding: str, datum: caffe_pb2.Datum) -> bool:
    """Caffe's ReadImageToDatum; False when the image cannot be read."""
    image = read_image(path, height, width, is_color)
    if image is None:
        return False
    if encoding:
        if not height and not width and _matches_extension(path, encoding):
            with open(path, "rb") as f:
                datum.data = f.read()
        else:
            datum.data = _encode(image, encoding)
        datum.label = label
        datum.encoded = True
        return True
    image_to_datum(image, datum)
    datum.label = label
    return True


# -- the tool ---------------------------------------------------------------------------------

def read_list(list_file: str) -> List[Tuple[str, int, int]]:
    """(file name, label, line number) per line: the label follows the last space. Blank
    lines stay in the list (they take a line id in Caffe too) with an empty name."""
    if not os.path.exists(list_file):
        raise CCTError(f"{TOOL}: list file '{list_file}' does not exist")
    if os.path.isdir(list_file):
        raise CCTError(f"{TOOL}: list file '{list_file}' is a directory, expected a text file "
                       f"of 'FILE LABEL' lines")
    lines = []
    with open(list_file, encoding="utf-8", errors="surrogateescape") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                lines.append(("", 0, number))
                continue
            name, sep, label = line.rpartition(" ")
            try:
                if not sep or not name:
                    raise ValueError
                lines.append((name, int(label), number))
            except ValueError:
                raise CCTError(f"{TOOL}: {list_file}:{number}: expected 'FILE LABEL' (a file "
                               f"name, a space, an integer label), got '{line}'") from None
    return lines


def _guess_encoding(filename: str) -> str:
    if "." not in filename:
        warning("convert_imageset.cpp:104", f"Failed to guess the encoding of '{filename}'")
        raise CCTError(f"{TOOL}: cannot guess the encoding of '{filename}' from its name (no "
                       f"extension); give --encode_type")
    return filename.rsplit(".", 1)[1].lower()


def convert(root: str, list_file: str, db_path: str, *, gray: bool = False,
            shuffle: bool = False, backend: str = "lmdb", resize_height: int = 0,
            resize_width: int = 0, check_size: bool = False, encoded: bool = False,
            encode_type: str = "") -> int:
    """Write the database; returns the number of records."""
    lines = read_list(list_file)
    if shuffle:
        info("convert_imageset.cpp:86", "Shuffling data")
        order = get_rng().permutation(len(lines))
        lines = [lines[i] for i in order]
    info("convert_imageset.cpp:89", f"A total of {len(lines)} images.")
    if encode_type and not encoded:
        info("convert_imageset.cpp:92", "encode_type specified, assuming encoded=true.")
    resize_height = max(0, resize_height)
    resize_width = max(0, resize_width)
    for name, _, number in lines:
        if name and not os.path.isfile(root + name):
            raise CCTError(f"{TOOL}: {list_file}:{number}: image '{root + name}' does not exist"
                           f" (file names are relative to ROOTFOLDER '{root}'; it needs its "
                           f"trailing '/')")
    count = 0
    data_size = None
    with open_lmdb_writer(TOOL, db_path, backend) as db:
        datum = caffe_pb2.Datum()
        for line_id, (name, label, number) in enumerate(lines):
            if not name:
                continue
            encoding = encode_type
            if encoded and not encoding:
                encoding = _guess_encoding(name)
            if not read_image_to_datum(root + name, label, resize_height, resize_width,
                                       not gray, encoding, datum):
                log_error("io.cpp:80", f"Could not open or find file {root + name}")
                raise CCTError(f"{TOOL}: {list_file}:{number}: cannot read image "
                               f"'{root + name}' (not an image file, or damaged)")
            if check_size:
                size = datum.channels * datum.height * datum.width
                if data_size is None:
                    data_size = size
                elif len(datum.data) != data_size:
                    raise CCTError(f"{TOOL}: {list_file}:{number}: Incorrect data field size "
                                   f"{len(datum.data)} of image '{root + name}' (the first "
                                   f"image has {data_size}; --check_size wants all images of "
                                   f"one size: resize them with --resize_height/--resize_width)")
            key = f"{format_int(line_id, 8)}_{name}"
            db.put(key.encode("utf-8", "surrogateescape"), datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                db.commit()
                info("convert_imageset.cpp:147", f"Processed {count} files.")
    if count % 1000 != 0:
        info("convert_imageset.cpp:153", f"Processed {count} files.")
    return count


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"backend": "lmdb", "resize_width": "0", "resize_height": "0",
                               "encode_type": ""},
                  booleans=("gray", "shuffle", "check_size", "encoded"),
                  positional=("ROOTFOLDER/", "LISTFILE", "DB_NAME"))
    root, list_file, db_path = flags.positional
    convert(root, list_file, db_path, gray=flags.bool("gray"), shuffle=flags.bool("shuffle"),
            backend=flags.get("backend"), resize_height=flags.int("resize_height"),
            resize_width=flags.int("resize_width"), check_size=flags.bool("check_size"),
            encoded=flags.bool("encoded"), encode_type=flags.get("encode_type"))
    return 0

"""pycaffe's ``caffe.Detector``: R-CNN style windowed detection, classifying crops of images
(optionally with surrounding context) warped to the net's input size."""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import numpy as np

from . import io as caffe_io
from .api import TEST, Net
from .classifier import configured_transformer
from .errors import CCTError


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``: the net in TEST phase with its weights.

    ``context_pad``: a border of that many pixels of the net's input is surrounding context
    (R-CNN feature extraction); where the context leaves the image it is filled with the mean.
    """

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None, context_pad=None, **kw):
        super().__init__(model_file, TEST, weights=pretrained_file, **kw)
        self.transformer = configured_transformer(self, mean, input_scale, raw_scale,
                                                  channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Iterable[Tuple[str, Sequence]]) -> List[dict]:
        """Classify each window (ymin, xmin, ymax, xmax) of each image file; returns one
        ``{'window', 'prediction', 'filename'}`` dict per window, in order."""
        images_windows = [(fname, list(windows)) for fname, windows in images_windows]
        window_inputs = []
        for image_fname, windows in images_windows:
            image = caffe_io.load_image(image_fname).astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(image, np.asarray(window)))
        if not window_inputs:
            return []
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(window_inputs), window_inputs[0].shape[2])
                            + self.blobs[in_].data.shape[2:], dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        detections = []
        ix = 0
        for image_fname, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix],
                                   "filename": image_fname})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames):
        """pycaffe runs the MATLAB selective_search_ijcv_with_python package here, which cct
        does not have."""
        raise CCTError("Detector.detect_selective_search: selective search is not available "
                       "in cct (pycaffe runs the MATLAB selective_search_ijcv_with_python "
                       "package); compute the windows with any proposal method and pass "
                       "[(filename, windows), ...] to detect_windows")

    def crop(self, im: np.ndarray, window: np.ndarray) -> np.ndarray:
        """The window (ymin, xmin, ymax, xmax) of an H x W x K image; with context_pad the
        window grown by the context, clipped to the image, resized and placed on the mean."""
        crop = im[int(window[0]):int(window[2]), int(window[1]):int(window[3])]
        if not self.context_pad:
            return crop
        box = np.asarray(window, dtype=np.float64)
        crop_size = self.blobs[self.inputs[0]].width  # assumes a square input
        scale = crop_size / (1. * crop_size - self.context_pad * 2)
        half_h = (box[2] - box[0] + 1) / 2.
        half_w = (box[3] - box[1] + 1) / 2.
        center = (box[0] + half_h, box[1] + half_w)
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        pad_y = int(round(max(0, -box[0]) * scale_h))  # context beyond the image
        pad_x = int(round(max(0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0., [im_h, im_w, im_h, im_w])
        clip_h = box[2] - box[0] + 1
        clip_w = box[3] - box[1] + 1
        if not (clip_h > 0 and clip_w > 0):
            raise CCTError(f"Detector.crop: window {list(window)} lies outside the "
                           f"{im_h} x {im_w} image")
        crop_h = min(int(round(clip_h * scale_h)), crop_size - pad_y)
        crop_w = min(int(round(clip_w * scale_w)), crop_size - pad_x)
        context_crop = im[int(box[0]):int(box[2]), int(box[1]):int(box[3])]
        context_crop = caffe_io.resize_image(context_crop, (crop_h, crop_w))
        crop = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        crop[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context_crop
        return crop

    def configure_crop(self, context_pad) -> None:
        """Set crop_dims (the input's H x W x K) and context_pad; with context, crop_mean is
        the mean in unprocessed image space (transposed back, channels unswapped, divided by
        raw_scale), or zeros without a mean."""
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inv_tpose = [tpose[t] for t in tpose]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inv_tpose]
        self.context_pad = context_pad
        if not self.context_pad:
            return
        channel_order = self.transformer.channel_swap.get(in_)
        raw_scale = self.transformer.raw_scale.get(in_)
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = np.array(mean, dtype=np.float64).transpose(inv_tpose)
        if channel_order is not None:
            channel_order_inverse = [list(channel_order).index(i)
                                     for i in range(crop_mean.shape[2])]
            crop_mean = crop_mean[:, :, channel_order_inverse]
        if raw_scale is not None:
            crop_mean /= raw_scale
        self.crop_mean = crop_mean

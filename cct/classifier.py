"""pycaffe's ``caffe.Classifier``: a Net that predicts class probabilities of images, scaling
them to ``image_dims`` and classifying the centre crop or the 10 oversampled crops."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import io as caffe_io
from .api import TEST, Net


def configured_transformer(net: Net, mean=None, input_scale=None, raw_scale=None,
                           channel_swap=None) -> caffe_io.Transformer:
    """A Transformer for the net's first input: H x W x K images to K x H x W, then the
    channel swap, raw scale, mean and input scale that are given."""
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None)``: the net in TEST phase with its weights.

    ``image_dims`` (height, width) is the size images are scaled to before cropping; by
    default the net's input size (so the crop is the whole image).
    """

    def __init__(self, model_file, pretrained_file, image_dims: Optional[Sequence[int]] = None,
                 mean=None, input_scale=None, raw_scale=None, channel_swap=None, **kw):
        super().__init__(model_file, TEST, weights=pretrained_file, **kw)
        self.transformer = configured_transformer(self, mean, input_scale, raw_scale,
                                                  channel_swap)
        self.crop_dims = np.array(self.blobs[self.inputs[0]].data.shape[2:])
        self.image_dims = self.crop_dims if image_dims is None or not len(image_dims) \
            else image_dims

    def predict(self, inputs: Sequence[np.ndarray], oversample: bool = True) -> np.ndarray:
        """N x C class probabilities (the net's first output) of N H x W x K images: each
        scaled to image_dims, then the mean over its 10 crops (``oversample``) or the centre
        crop's alone."""
        input_ = np.zeros((len(inputs), self.image_dims[0], self.image_dims[1],
                           inputs[0].shape[2]), dtype=np.float32)
        for ix, in_ in enumerate(inputs):
            input_[ix] = caffe_io.resize_image(in_, self.image_dims)
        if oversample:
            input_ = caffe_io.oversample(input_, self.crop_dims)
        else:
            center = np.array(self.image_dims) / 2.0
            crop = (np.tile(center, (1, 2))[0]
                    + np.concatenate([-self.crop_dims / 2.0, self.crop_dims / 2.0])).astype(int)
            input_ = input_[:, crop[0]:crop[2], crop[1]:crop[3], :]
        in_ = self.inputs[0]
        caffe_in = np.zeros(np.array(input_.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for ix, crop_in in enumerate(input_):
            caffe_in[ix] = self.transformer.preprocess(in_, crop_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions

"""Every registered layer type on every backend (Caffe's TYPED_TEST over devices, Chainer's
FunctionTestCase over backends).

Each type in ``cct.layers.base.LAYER_REGISTRY`` has at least one small case below: a prototxt
layer body, bottom values (labels in range for the loss layers), the tops it makes and which
bottoms take a gradient. The case runs forward and backward on the ``cpu`` backend (NumPy
arrays, the C++ kernels) and on each device backend: ``numpy`` (the GPU's array-generic
kernels on the device stand-in, which refuses whatever CuPy refuses) and ``gpu`` (CuPy on a
real GPU, skipped here when there is none), from the same inputs and the same random seed.
Tops, bottom diffs, param data and param diffs must agree, read through host views as pycaffe
reads them. A new layer type without a case fails :func:`test_every_registered_type_has_a_case`.

Layers that read files get small real inputs written in tmp_path by the helpers of their own
tests; a type cct refuses by design (WindowData) is asserted to refuse clearly on every
backend. Layers without a backward (data layers, Accuracy, ArgMax, ...) compare forward only.
Random layers draw on the host through ``cct.rng`` (Dropout's masks, the fillers, the data
transformer's crops and mirrors, HDF5Data's and ImageData's shuffles), so the same seed gives
the same values on every backend and they are compared exactly as the others.
"""
from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import h5py
import numpy as np
import pytest

from cct import backend as backends
from cct.backend import gpu
from cct.blob import Blob, DeviceBlob
from cct.errors import CCTError
from cct.io.blobproto import blob_to_proto
from cct.layers import create_layer
from cct.layers.base import LAYER_REGISTRY
from cct.proto import caffe_pb2
from cct.rng import set_random_seed
from tests.gradient_check import make_layer_param
from tests.layers.test_data import raw_datum, write_lmdb
from tests.layers.test_hdf5_data import two_files
from tests.layers.test_image_data import write_images
from tests.layers.test_python_layer import SOURCE as PYTHON_LAYER_SOURCE

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST
SEED = 1701
GPU_OK, GPU_REASON = gpu.available()
DEVICE_BACKENDS = ["numpy", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU_OK, reason=f"no usable GPU: {GPU_REASON}"))]
PY_MODULE = "cct_test_every_layer_user"  # not test_python_layer's module: both may be loaded

Bottom = Union[tuple, np.ndarray]  # a shape (standard normal values) or the values themselves


@dataclass
class Case:
    """One layer run: ``body`` is the prototxt layer body, or a function of a folder of the
    backend's own (for inputs and outputs on disk) giving it."""

    body: Union[str, Callable[[Path], str]]
    bottoms: Sequence[Bottom] = ()
    tops: int = 1
    phase: int = TEST
    #: bottoms that take a gradient (None: all; labels, indices and selectors take none)
    propagate: Optional[Sequence[bool]] = None
    #: False for layers without a backward pass: forward alone is compared
    backward: bool = True
    forwards: int = 1
    #: called with the set-up layer and its tops before the first forward (e.g. MemoryData's
    #: arrays)
    prepare: Optional[Callable] = None
    #: extra host values to compare, read after the run (e.g. a file the layer wrote)
    outputs: Optional[Callable[[object, Path], Dict[str, np.ndarray]]] = None
    #: a refusal expected on the run (a regular expression of its message)
    refuses: Optional[str] = None
    #: top[0] is bottom[0] (in-place computation)
    in_place: bool = False
    #: float64 everywhere: the backends then differ by rounding alone, and a layer that only
    #: ran in float32 would take dtype=np.float32 with rtol 1e-5
    dtype: type = np.float64
    rtol: float = 1e-9
    atol: float = 1e-12
    #: a real GPU draws this layer's random numbers on the device (Dropout's masks, as Caffe's
    #: cuRAND does): there its values are checked for what they must be, not against the CPU's
    device_draws: bool = False


def pos(shape, lo=0.2, hi=2.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, shape)


def labels(values):
    return np.asarray(values, np.float64)


def away_from(x, points, gap=0.05):
    """``x`` with values within ``gap`` of a kink moved off it: the backends' float rounding
    must not pick different sides of max(), |x|, clip or threshold."""
    x = np.array(x, np.float64)
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, gap, -gap)
    return x


def normal(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


# --------------------------------------------------------------------------------------------
# Inputs on disk
# --------------------------------------------------------------------------------------------
def lmdb_body(folder: Path) -> str:
    rng = np.random.default_rng(11)
    write_lmdb(folder / "db", [raw_datum(rng.integers(0, 256, (2, 6, 7), np.uint8), i % 3)
                               for i in range(5)])
    # TRAIN: random crops and mirrors, drawn by the transformer from the seeded RNG
    return (f'type: "Data" data_param {{ source: "{folder / "db"}" batch_size: 3 '
            f'backend: LMDB }} transform_param {{ crop_size: 4 mirror: true scale: 0.5 '
            f'mean_value: 10 mean_value: 20 }}')


def image_data_body(folder: Path) -> str:
    write_images(folder / "imgs", 3, size=(5, 6))
    listing = folder / "list.txt"
    listing.write_text("".join(f"img{i}.png {i + 4}\n" for i in range(3)))
    return (f'type: "ImageData" image_data_param {{ source: "{listing}" batch_size: 2 '
            f'root_folder: "{folder}/imgs/" shuffle: true new_height: 4 new_width: 3 }} '
            f'transform_param {{ mirror: true }}')


def hdf5_data_body(folder: Path) -> str:
    listing = two_files(folder)
    return (f'type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ '
            f'source: "{listing}" batch_size: 3 shuffle: true }}')


def hdf5_output_body(folder: Path) -> str:
    return f'type: "HDF5Output" hdf5_output_param {{ file_name: "{folder / "out.h5"}" }}'


def hdf5_written(layer, folder: Path) -> Dict[str, np.ndarray]:
    with h5py.File(folder / "out.h5", "r") as f:
        return {f"file/{k}": f[k][...] for k in f}


def fill_inputs(layer, top) -> None:
    """What a user does with an Input layer's tops: writes them from the host; forward must
    leave them as written."""
    for i, t in enumerate(top):
        t.host_view().data[...] = np.arange(t.count).reshape(t.shape) * (i + 0.5)


def infogain_body(folder: Path) -> str:
    path = folder / "infogain.binaryproto"
    h = np.random.default_rng(13).uniform(0, 2, (1, 1, 5, 5))
    path.write_bytes(blob_to_proto(h, caffe_pb2.BlobProto()).SerializeToString())
    return (f'type: "InfogainLoss" infogain_loss_param {{ source: "{path}" axis: 2 }} '
            f'loss_param {{ ignore_label: 1 normalization: FULL }}')


def memory_data_reset(layer, top) -> None:
    data = np.random.default_rng(12).standard_normal((4, 2, 3, 2)).astype(np.float32)
    layer.reset(data, np.arange(4, dtype=np.float32))


@pytest.fixture(scope="module", autouse=True)
def python_layer_module(tmp_path_factory):
    """test_python_layer's user layers (ScaleByParam: a learnable scalar times the bottom plus
    param_str), importable under a module name of this file's own."""
    folder = tmp_path_factory.mktemp("every_layer_py")
    (folder / f"{PY_MODULE}.py").write_text(textwrap.dedent(PYTHON_LAYER_SOURCE))
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))
    sys.modules.pop(PY_MODULE, None)


# --------------------------------------------------------------------------------------------
# The cases: every registered type (alphabetical), some with variants ("Type/variant") for
# code paths of their own (in place, no bias, other operations, ...)
# --------------------------------------------------------------------------------------------
X = (2, 3, 4, 5)          # a 4-axis bottom
V = (4, 5)                # a batch of vectors
CONST_LABELS = labels([1, 0, 4, 2])
G = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'

CASES: Dict[str, Case] = {
    "AbsVal": Case('type: "AbsVal"', [away_from(normal(X, 1), [0])]),
    "Accuracy": Case('type: "Accuracy" accuracy_param { top_k: 2 ignore_label: 2 }',
                     [V, CONST_LABELS], tops=2, backward=False),
    "ArgMax": Case('type: "ArgMax" argmax_param { out_max_val: true top_k: 2 }', [V],
                   backward=False),
    "ArgMax/top1": Case('type: "ArgMax"', [V], backward=False),
    "ArgMax/axis": Case('type: "ArgMax" argmax_param { top_k: 2 axis: 2 }', [X],
                        backward=False),
    "BNLL": Case('type: "BNLL"', [X]),
    "BatchNorm/train": Case('type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 }',
                            [(3, 4, 2, 2)], phase=TRAIN, forwards=2),
    "BatchNorm/global": Case('type: "BatchNorm" batch_norm_param { use_global_stats: true } '
                             'blobs { shape { dim: 3 } data: 0.5 data: -1 data: 2 } '
                             'blobs { shape { dim: 3 } data: 2 data: 1 data: 0.5 } '
                             'blobs { shape { dim: 1 } data: 2 }', [(2, 3, 2, 2)]),
    "BatchReindex": Case('type: "BatchReindex"', [(3, 2, 2), labels([2, 0, 2, 1])],
                         propagate=[True, False]),
    "Bias": Case(f'type: "Bias" bias_param {{ axis: 1 num_axes: 2 filler {{ type: "gaussian" }} '
                 f'}}', [X]),
    "Bias/in_place": Case('type: "Bias" bias_param { axis: 0 num_axes: -1 filler { '
                          'type: "gaussian" } }', [(2, 3)], in_place=True),
    "Bias/two": Case('type: "Bias" bias_param { axis: 1 }', [X, (3, 4)]),
    "Clip": Case('type: "Clip" clip_param { min: -0.5 max: 0.7 }',
                 [away_from(normal(X, 2), [-0.5, 0.7])]),
    "Concat": Case('type: "Concat" concat_param { axis: 1 }', [X, (2, 2, 4, 5)]),
    "ContrastiveLoss/legacy": Case('type: "ContrastiveLoss" contrastive_loss_param { '
                                   'margin: 3 legacy_version: true }',
                                   [(4, 5, 1, 1), (4, 5, 1, 1), labels([1, 0, 0, 1])],
                                   propagate=[True, True, False]),
    "ContrastiveLoss": Case('type: "ContrastiveLoss" contrastive_loss_param { margin: 2 }',
                            [V, V, labels([1, 0, 0, 1]).reshape(4, 1, 1, 1)],
                            propagate=[True, True, False]),
    "Convolution": Case(f'type: "Convolution" convolution_param {{ num_output: 4 kernel_size: 3 '
                        f'stride: 2 pad: 1 group: 1 {G} }}', [(2, 2, 6, 5)]),
    "Convolution/group": Case(f'type: "Convolution" convolution_param {{ num_output: 4 '
                              f'kernel_h: 2 kernel_w: 3 dilation: 2 group: 2 {G} }}',
                              [(2, 4, 7, 6)]),
    "Crop/one": Case('type: "Crop" crop_param { axis: 1 offset: 1 }',
                     [X, (2, 1, 3, 3)], propagate=[True, False]),
    "Crop": Case('type: "Crop" crop_param { axis: 2 offset: 1 offset: 2 }',
                 [X, (2, 3, 2, 2)], propagate=[True, False]),
    "Data": Case(lmdb_body, tops=2, phase=TRAIN, forwards=2, backward=False),
    "Convolution/two": Case('type: "Convolution" convolution_param { num_output: 2 '
                            'kernel_size: 1 bias_term: false weight_filler { type: "gaussian" '
                            '} }', [(2, 3, 4, 3), (2, 3, 4, 3)], tops=2),
    "Deconvolution/nobias": Case('type: "Deconvolution" convolution_param { num_output: 4 '
                                 'kernel_size: 2 stride: 1 group: 2 bias_term: false '
                                 'weight_filler { type: "gaussian" } }', [(2, 2, 3, 4)]),
    "Deconvolution": Case(f'type: "Deconvolution" convolution_param {{ num_output: 3 '
                          f'kernel_size: 3 stride: 2 pad: 1 {G} }}', [(2, 2, 4, 3)]),
    # The stand-in draws the mask from cct.rng as the CPU does (the same mask); a real GPU
    # draws it on the device, checked for what a mask must give (check_device_dropout).
    "Dropout": Case('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [X], phase=TRAIN,
                    device_draws=True),
    "Dropout/test": Case('type: "Dropout"', [X]),
    "DummyData": Case('type: "DummyData" dummy_data_param { shape { dim: 2 dim: 3 } '
                      'shape { dim: 4 } data_filler { type: "gaussian" std: 2 } '
                      'data_filler { type: "constant" value: 3 } }', tops=2, forwards=2,
                      backward=False),
    "ELU": Case('type: "ELU" elu_param { alpha: 0.5 }', [X]),
    "Eltwise": Case('type: "Eltwise" eltwise_param { operation: SUM coeff: 2 coeff: -0.5 }',
                    [X, X]),
    "Eltwise/prod": Case('type: "Eltwise" eltwise_param { operation: PROD }', [X, X, X]),
    "Eltwise/sum": Case('type: "Eltwise"', [X, X, X]),
    "Eltwise/prod_unstable": Case('type: "Eltwise" eltwise_param { operation: PROD '
                                  'stable_prod_grad: false }', [pos(X, seed=14), X]),
    "Eltwise/max": Case('type: "Eltwise" eltwise_param { operation: MAX }', [X, X]),
    "Embed": Case(f'type: "Embed" embed_param {{ num_output: 4 input_dim: 5 {G} }}',
                  [labels([[0, 3, 4], [3, 1, 3]])], propagate=[False]),
    "EuclideanLoss": Case('type: "EuclideanLoss"', [V, V]),
    "Exp/e": Case('type: "Exp" exp_param { shift: 0.3 }', [X]),
    "Exp": Case('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 0.1 }', [X]),
    "Filter": Case('type: "Filter"', [(4, 3), (4, 2, 2), labels([1, 0, 1, 1])], tops=2,
                   propagate=[True, True, False]),
    "Flatten": Case('type: "Flatten" flatten_param { axis: 1 end_axis: 2 }', [X]),
    "HDF5Data": Case(hdf5_data_body, tops=2, forwards=3, backward=False),
    "HDF5Output": Case(hdf5_output_body, [(2, 3, 2), (2, 4)], tops=0, backward=False,
                       outputs=hdf5_written),
    "HingeLoss/L1": Case('type: "HingeLoss"', [V, CONST_LABELS], propagate=[True, False]),
    "HingeLoss": Case('type: "HingeLoss" hinge_loss_param { norm: L2 }', [V, CONST_LABELS],
                      propagate=[True, False]),
    "Im2col": Case('type: "Im2col" convolution_param { kernel_size: 3 stride: 2 pad: 1 }',
                   [X]),
    "ImageData": Case(image_data_body, tops=2, phase=TRAIN, forwards=2, backward=False),
    "InfogainLoss": Case('type: "InfogainLoss"', [V, CONST_LABELS, pos((1, 1, 5, 5), seed=3)],
                         propagate=[True, False, False]),
    "InfogainLoss/source": Case(infogain_body, [(2, 3, 5), labels([[0, 1, 4], [1, 3, 2]])],
                                tops=2, propagate=[True, False]),
    "InnerProduct/nobias": Case('type: "InnerProduct" inner_product_param { num_output: 2 '
                                'bias_term: false weight_filler { type: "gaussian" } }', [V]),
    "InnerProduct": Case(f'type: "InnerProduct" inner_product_param {{ num_output: 3 {G} }}',
                         [X]),
    "InnerProduct/transpose": Case(f'type: "InnerProduct" inner_product_param {{ num_output: 3 '
                                   f'transpose: true axis: 2 {G} }}', [X]),
    "Input": Case('type: "Input" input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } }',
                  tops=2, backward=False, prepare=fill_inputs),
    "LRN": Case('type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 }', [X]),
    "LRN/within": Case('type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 '
                       'norm_region: WITHIN_CHANNEL }', [X]),
    "LSTM": Case(f'type: "LSTM" recurrent_param {{ num_output: 3 {G} }}',
                 [(3, 2, 4), labels([[0, 0], [1, 1], [1, 0]])], propagate=[True, False],
                 forwards=2),
    "LSTM/exposed": Case(f'type: "LSTM" recurrent_param {{ num_output: 3 expose_hidden: true '
                         f'{G} }}', [(3, 2, 4), labels([[1, 0], [1, 1], [0, 1]]), (2, 5),
                                     (1, 2, 3), (1, 2, 3)],
                         tops=3, propagate=[True, False, True, True, True]),
    "LSTMUnit": Case('type: "LSTMUnit"', [(1, 2, 3), (1, 2, 12), labels([[1, 0]])], tops=2,
                     propagate=[True, True, False]),
    "Log": Case('type: "Log" log_param { base: 10 scale: 2 shift: 0.5 }', [pos(X, seed=4)]),
    "MVN": Case('type: "MVN" mvn_param { across_channels: true }', [X]),
    "MVN/mean": Case('type: "MVN" mvn_param { normalize_variance: false }', [X]),
    "MemoryData": Case('type: "MemoryData" memory_data_param { batch_size: 2 channels: 2 '
                       'height: 3 width: 2 }', tops=2, forwards=3, backward=False,
                       prepare=memory_data_reset),
    "MultinomialLogisticLoss": Case('type: "MultinomialLogisticLoss"',
                                    [pos(V, 0.05, 1, seed=5), CONST_LABELS],
                                    propagate=[True, False]),
    "PReLU": Case('type: "PReLU" prelu_param { filler { type: "gaussian" } }',
                  [away_from(normal(X, 6), [0])]),
    "PReLU/shared": Case('type: "PReLU" prelu_param { channel_shared: true filler { '
                         'type: "constant" value: -0.3 } }', [away_from(normal(X, 15), [0])],
                         in_place=True),
    "Parameter": Case('type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } } '
                      'blobs { shape { dim: 2 dim: 3 } data: 1 data: -2 data: 3 data: 0.5 '
                      'data: 4 data: 7 }'),
    "Pooling/max": Case('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 '
                        'pad: 1 }', [(2, 2, 7, 6)], tops=2),
    "Pooling/ave": Case('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 }',
                        [(2, 2, 7, 6)]),
    # Caffe has STOCHASTIC pooling on the GPU only; cct has it nowhere and says so.
    "Pooling/stochastic": Case('type: "Pooling" pooling_param { pool: STOCHASTIC '
                               'kernel_size: 2 }', [X], phase=TRAIN,
                               refuses="STOCHASTIC pooling is not supported"),
    "Pooling/global": Case('type: "Pooling" pooling_param { pool: AVE global_pooling: true }',
                           [X]),
    "Power": Case('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }', [X]),
    "Power/const": Case('type: "Power" power_param { power: 0 }', [X]),
    "Power/linear": Case('type: "Power" power_param { scale: -2 shift: 0.5 }', [X]),
    "Power/cube": Case('type: "Power" power_param { power: 3 scale: 1.5 }', [pos(X, seed=16)]),
    "Power/root": Case('type: "Power" power_param { power: 0.5 scale: 2 shift: 0.5 }',
                       [pos(X, seed=7)]),
    "Python": Case(f'type: "Python" python_param {{ module: "{PY_MODULE}" '
                   f'layer: "ScaleByParam" param_str: "0.5" }}', [(2, 3)], phase=TRAIN),
    "RNN": Case(f'type: "RNN" recurrent_param {{ num_output: 3 {G} }}',
                [(3, 2, 4), labels([[0, 0], [1, 1], [1, 0]]), (2, 2)],
                propagate=[True, False, True], forwards=2),
    "ReLU": Case('type: "ReLU" relu_param { negative_slope: 0.1 }',
                 [away_from(normal(X, 8), [0])]),
    "ReLU/in_place": Case('type: "ReLU"', [away_from(normal(X, 17), [0])], in_place=True),
    "Reduction": Case('type: "Reduction" reduction_param { operation: SUMSQ axis: 1 coeff: 2 }',
                      [X]),
    "Reduction/asum": Case('type: "Reduction" reduction_param { operation: ASUM axis: 2 }',
                           [away_from(normal(X, 9), [0])]),
    "Reduction/mean": Case('type: "Reduction" reduction_param { operation: MEAN axis: 0 }',
                           [X]),
    "Reshape": Case('type: "Reshape" reshape_param { shape { dim: 0 dim: -1 dim: 2 } }', [X]),
    "SPP": Case('type: "SPP" spp_param { pyramid_height: 2 pool: MAX }', [(2, 2, 5, 6)]),
    "SPP/one": Case('type: "SPP" spp_param { pyramid_height: 1 }', [(2, 2, 5, 6)]),
    "SPP/ave": Case('type: "SPP" spp_param { pyramid_height: 3 pool: AVE }', [(2, 2, 9, 8)]),
    "Scale": Case(f'type: "Scale" scale_param {{ axis: 1 num_axes: 1 bias_term: true '
                  f'filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}', [X]),
    "Scale/in_place": Case('type: "Scale" scale_param { filler { type: "gaussian" } }', [X],
                           in_place=True),
    "Scale/two": Case('type: "Scale" scale_param { axis: 0 }', [X, (2, 3)]),
    "Sigmoid": Case('type: "Sigmoid"', [X]),
    "SigmoidCrossEntropyLoss": Case('type: "SigmoidCrossEntropyLoss" '
                                    'loss_param { ignore_label: -1 }',
                                    [V, labels(np.random.default_rng(10).integers(-1, 2, V))],
                                    propagate=[True, False]),
    "Silence": Case('type: "Silence"', [X, V], tops=0),
    "Slice/even": Case('type: "Slice" slice_param { axis: -1 }', [(2, 3, 6)], tops=3),
    "Slice": Case('type: "Slice" slice_param { axis: 1 slice_point: 1 slice_point: 3 }',
                  [(2, 5, 3)], tops=3),
    "Softmax": Case('type: "Softmax" softmax_param { axis: 2 }', [X]),
    "SoftmaxWithLoss/none": Case('type: "SoftmaxWithLoss" softmax_param { axis: 2 } '
                                 'loss_param { normalization: NONE }',
                                 [X, labels(np.random.default_rng(18).integers(0, 4, (2, 3, 5)))],
                                 propagate=[True, False]),
    "SoftmaxWithLoss": Case('type: "SoftmaxWithLoss" loss_param { ignore_label: 2 '
                            'normalization: VALID }', [X, labels(
                                np.random.default_rng(11).integers(0, 3, (2, 4, 5)))],
                            tops=2, propagate=[True, False]),
    "Split/one": Case('type: "Split"', [X]),
    "Split": Case('type: "Split"', [X], tops=3),
    "Swish": Case('type: "Swish" swish_param { beta: 1.5 }', [X]),
    "TanH": Case('type: "TanH"', [X]),
    # No backward, as in Caffe (NOT_IMPLEMENTED): a step function.
    "Threshold": Case('type: "Threshold" threshold_param { threshold: 0.2 }',
                      [away_from(normal(X, 12), [0.2])], backward=False),
    "Tile": Case('type: "Tile" tile_param { axis: 1 tiles: 3 }', [X]),
    # Refused by design on every backend, with advice on converting the windows.
    "WindowData": Case('type: "WindowData" window_data_param { source: "windows.txt" '
                       'batch_size: 2 }', tops=2,
                       refuses="WindowData is not supported by cct; convert the windows"),
}


def case_type(name: str) -> str:
    return name.split("/")[0]


# --------------------------------------------------------------------------------------------
# Running a case on one backend
# --------------------------------------------------------------------------------------------
def bottom_values(case: Case) -> List[np.ndarray]:
    rng = np.random.default_rng(SEED)
    return [rng.standard_normal(b) if isinstance(b, tuple) else np.asarray(b, np.float64)
            for b in case.bottoms]


def run_case(case: Case, backend_name: str, folder: Path) -> Dict[str, np.ndarray]:
    """Set up, forward (``case.forwards`` times) and backward on ``backend_name``; every value
    the run produced, as host (NumPy) copies read through host views."""
    backend = backends.get(backend_name)
    folder.mkdir(parents=True, exist_ok=True)
    body = case.body(folder) if callable(case.body) else case.body
    set_random_seed(SEED)
    layer = create_layer(make_layer_param(body, case.phase), backend, case.dtype)
    bottom = []
    for values in bottom_values(case):
        b = Blob(values.shape, case.dtype, backend.xp)
        b.host_view().data[...] = values
        bottom.append(b)
    top = [Blob((), case.dtype, backend.xp) for _ in range(case.tops)]
    if case.in_place:
        top[0] = bottom[0]
    out: Dict[str, np.ndarray] = {}
    try:
        layer.setup(bottom, top)
        if backend_name != "cpu":  # the device path really ran: device blobs throughout
            assert all(isinstance(b, DeviceBlob) for b in bottom + top + list(layer.blobs))
        if case.prepare is not None:
            case.prepare(layer, top)
        for k in range(case.forwards):
            set_random_seed(SEED + 1 + k)
            layer.reshape(bottom, top)
            layer.forward(bottom, top)
            for i, t in enumerate(top):
                out[f"forward{k}/top{i}"] = t.host_view().data.copy()
        for i, p in enumerate(layer.blobs):
            out[f"param{i}/data"] = p.host_view().data.copy()
        propagate = (list(case.propagate) if case.propagate is not None
                     else [True] * len(bottom))
        if case.backward:
            for b in bottom:  # stale values a layer forgetting to overwrite would keep
                b.host_view().diff[...] = 7.0
            rng = np.random.default_rng(SEED + 100)
            for t in top:
                t.host_view().diff[...] = rng.standard_normal(t.shape)
            layer.backward(top, propagate, bottom)
            for i, (b, down) in enumerate(zip(bottom, propagate)):
                if down:
                    out[f"bottom{i}/diff"] = b.host_view().diff.copy()
            for i, p in enumerate(layer.blobs):
                out[f"param{i}/diff"] = p.host_view().diff.copy()
        if case.outputs is not None:
            out.update(case.outputs(layer, folder))
    finally:
        close = getattr(layer, "close", None)
        if callable(close):
            close()
    return out


# --------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------
def check_device_dropout(got, x, scale):
    """Dropout with a mask drawn on the device: each element kept (x * scale, its gradient
    passed on) or dropped (0 both ways), some of each."""
    y, dx = got["forward0/top0"], got["bottom0/diff"]
    kept = y != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(y[kept], x[kept] * scale, rtol=1e-12)
    assert not dx[~kept].any() and dx[kept].all()


def test_every_registered_type_has_a_case():
    covered = {case_type(name) for name in CASES}
    assert covered == set(LAYER_REGISTRY), (
        f"types without a case: {sorted(set(LAYER_REGISTRY) - covered)}; cases of unknown "
        f"types: {sorted(covered - set(LAYER_REGISTRY))}")


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_agrees_with_the_cpu(name, backend, tmp_path):
    case = CASES[name]
    if case.refuses is not None:
        for b in ("cpu", backend):
            with pytest.raises(CCTError, match=case.refuses):
                run_case(case, b, tmp_path / b)
        return
    want = run_case(case, "cpu", tmp_path / "cpu")
    got = run_case(case, backend, tmp_path / backend)
    assert sorted(got) == sorted(want)
    if case.device_draws and backend == "gpu":
        # dropout_ratio is a float in the prototxt: 0.3 as float32, as the layer reads it
        check_device_dropout(got, bottom_values(case)[0], scale=1 / (1 - float(np.float32(0.3))))
        return
    assert want  # the run produced something to compare
    for key, value in want.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
        np.testing.assert_allclose(got[key], value, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{name} on {backend}: {key}")

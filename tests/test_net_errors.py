"""Bad nets give one clear CCTError naming the file/layer and what was expected, from the
Python API and from the CLI (exit status 1, no traceback)."""
import subprocess
import sys

import pytest

import cct as caffe
from cct.errors import CCTError

INPUT = '''layer { name: "in" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
'''


def build(tmp_path, body: str, phase=caffe.TEST):
    path = tmp_path / "net.prototxt"
    path.write_text(body)
    return caffe.Net(str(path), phase)


CASES = {
    "unknown_type": (INPUT + 'layer { name: "r" type: "Relu" bottom: "data" top: "r" }',
                     ["'r'", "unknown type 'Relu'", "'ReLU'"]),
    "missing_bottom": (INPUT + 'layer { name: "r" type: "ReLU" bottom: "dta" top: "r" }',
                       ["Unknown bottom blob 'dta'", "layer 'r'"]),
    "top_twice": (INPUT + 'layer { name: "a" type: "ReLU" bottom: "data" top: "x" }\n'
                  'layer { name: "b" type: "Sigmoid" bottom: "data" top: "x" }',
                  ["Top blob 'x' produced by multiple sources", "'b'"]),
    "include_and_exclude": (INPUT + 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" '
                            'include { phase: TEST } exclude { phase: TRAIN } }',
                            ["'r'", "both include and exclude"]),
    "shape_does_not_fit": (INPUT + 'layer { name: "pool" type: "Pooling" bottom: "data" '
                           'top: "p" pooling_param { kernel_size: 20 } }',
                           ["'pool'", "8"]),
    "concat_mismatch": (INPUT + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                        'pooling_param { kernel_size: 2 stride: 2 } }\n'
                        'layer { name: "cat" type: "Concat" bottom: "data" bottom: "p" '
                        'top: "c" }', ["'cat'", "(2, 3, 8, 8)", "(2, 3, 4, 4)"]),
    "syntax_error": (INPUT + 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" ',
                     ["net.prototxt:3"]),
    "unknown_field": (INPUT + 'layer { name: "r" type: "ReLU" botom: "data" top: "r" }',
                      ["net.prototxt:3", "botom"]),
}

# uint32 extremes Caffe refuses (Blob::Reshape's CHECK_LE(count, INT_MAX); the kernel geometry
# Caffe keeps in ints), which before reached NumPy's allocator or the C++ binding (TypeError).
INT_MAX_CASES = {
    "input_over_int_max": ('layer { name: "in" type: "Input" top: "data" '
                           'input_param { shape { dim: 70000 dim: 70000 } } }',
                           ["Input layer 'in'", "blob shape (70000, 70000) holds 4900000000 "
                            "values, more than Caffe's limit of INT_MAX = 2147483647"]),
    "zero_sized_over_int_max": ('layer { name: "in" type: "Input" top: "data" '
                                'input_param { shape { dim: 0 dim: 4294967296 } } }',
                                ["Input layer 'in'", "blob shape (0, 4294967296)"]),
    "num_output_over_int_max": (INPUT + 'layer { name: "ip" type: "InnerProduct" '
                                'bottom: "data" top: "ip" '
                                'inner_product_param { num_output: 4294967295 } }',
                                ["InnerProduct layer 'ip'", "blob shape (4294967295, 192)"]),
    "conv_stride": (INPUT + 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                    'convolution_param { num_output: 2 kernel_size: 3 stride: 4294967295 } }',
                    ["Convolution layer 'c': stride 4294967295 is larger than 2147483647 "
                     "(INT_MAX)"]),
    "conv_stride_h": (INPUT + 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                      'convolution_param { num_output: 2 kernel_size: 3 stride_h: 1 '
                      'stride_w: 2147483648 } }',
                      ["Convolution layer 'c': stride_h/stride_w 2147483648 is larger"]),
    "conv_pad": (INPUT + 'layer { name: "c" type: "Deconvolution" bottom: "data" top: "c" '
                 'convolution_param { num_output: 2 kernel_size: 3 pad: 4294967295 } }',
                 ["Deconvolution layer 'c': pad 4294967295 is larger"]),
    "conv_dilation": (INPUT + 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                      'convolution_param { num_output: 2 kernel_size: 3 dilation: 2147483648 '
                      '} }', ["Convolution layer 'c': dilation 2147483648 is larger"]),
    "pool_stride": (INPUT + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                    'pooling_param { pool: AVE kernel_size: 3 stride: 4294967295 } }',
                    ["Pooling layer 'p': stride 4294967295 is larger than 2147483647"]),
    "pool_kernel": (INPUT + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                    'pooling_param { kernel_h: 4294967295 kernel_w: 2 } }',
                    ["Pooling layer 'p': kernel_h/kernel_w 4294967295 is larger"]),
    # Within INT_MAX one by one, beyond it together: before, a ValueError from the C++ binding
    # (its int geometry overflowed and disagreed with the top's shape).
    "conv_padded_size": (INPUT + 'layer { name: "c" type: "Convolution" bottom: "data" '
                         'top: "c" convolution_param { num_output: 2 kernel_size: 3 '
                         'pad: 1073741824 stride: 2147483647 } }',
                         ["Convolution layer 'c': pad 1073741824 and dilation 1 give a padded "
                          "bottom of 2147483656"]),
    "pool_padded_size": (INPUT + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                         'pooling_param { kernel_size: 2147483647 pad: 2147483646 '
                         'stride: 2147483647 } }',
                         ["Pooling layer 'p': pad 2147483646 gives a padded bottom height of "
                          "4294967300"]),
    "lrn_size": (INPUT + 'layer { name: "n" type: "LRN" bottom: "data" top: "n" '
                 'lrn_param { local_size: 4294967295 } }',
                 ["LRN layer 'n': local_size 4294967295 is larger than 2147483647"]),
}


@pytest.mark.parametrize("case", sorted(INT_MAX_CASES))
def test_uint32_extremes_are_refused_as_caffe_does(case, tmp_path):
    body, needles = INT_MAX_CASES[case]
    with pytest.raises(CCTError) as e:
        build(tmp_path, body).forward()
    for needle in needles:
        assert needle in str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_error_is_clear(case, tmp_path):
    body, needles = CASES[case]
    with pytest.raises(CCTError) as e:
        build(tmp_path, body)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


@pytest.mark.parametrize("case", ["unknown_type", "syntax_error", "shape_does_not_fit"])
def test_cli_error_is_one_paragraph_without_traceback(case, tmp_path):
    body, needles = CASES[case]
    model = tmp_path / "net.prototxt"
    model.write_text(body)
    run = subprocess.run([sys.executable, "-m", "cct.cli", "time", "-model", str(model),
                          "-iterations", "1"], capture_output=True, text=True)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    error_lines = [l for l in run.stderr.splitlines() if l.startswith("cct: error:")]
    assert len(error_lines) == 1 and needles[0] in error_lines[0]


def test_cli_missing_weights_file(tmp_path):
    model = tmp_path / "net.prototxt"
    model.write_text(INPUT)
    run = subprocess.run([sys.executable, "-m", "cct.cli", "test", "--model=" + str(model),
                          "--weights", str(tmp_path / "none.caffemodel")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "none.caffemodel' does not exist" in run.stderr


def test_cli_unknown_flag_and_command():
    run = subprocess.run([sys.executable, "-m", "cct.cli", "time", "-modle", "x"],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "unknown flag -modle" in run.stderr
    run = subprocess.run([sys.executable, "-m", "cct.cli", "trian"], capture_output=True,
                         text=True)
    assert run.returncode == 1 and "unknown command 'trian'" in run.stderr

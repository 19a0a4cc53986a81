"""The net graph: NetState filtering, Splits, in-place layers, shared params, backward needs,
loss weights, and the pycaffe Net API."""
import numpy as np
import pytest

import cct as caffe
from cct import backend as backends
from cct.backend import cpu
from cct.errors import NetError
from cct.io.prototxt import net_from_text
from cct.net import Net, filter_net, insert_splits


def make(text: str, phase=caffe.TRAIN, **kw) -> Net:
    return Net(net_from_text(text), phase=phase, dtype=np.float64, **kw)


INPUT = '''layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
'''


# -- NetState filtering --------------------------------------------------------------------------
RULES = INPUT + '''
layer { name: "train_only" type: "ReLU" bottom: "data" top: "a" include { phase: TRAIN } }
layer { name: "test_only" type: "ReLU" bottom: "data" top: "a" include { phase: TEST } }
layer { name: "lvl" type: "Silence" bottom: "a" include { min_level: 1 max_level: 2 } }
layer { name: "stg" type: "Silence" bottom: "data" include { stage: "s1" stage: "s2" } }
layer { name: "notstg" type: "Silence" bottom: "label" exclude { stage: "s1" } }
'''


@pytest.mark.parametrize("phase,level,stages,want", [
    (caffe.TRAIN, 0, [], ["in", "train_only", "notstg"]),
    (caffe.TEST, 0, [], ["in", "test_only", "notstg"]),
    (caffe.TEST, 1, [], ["in", "test_only", "lvl", "notstg"]),
    (caffe.TEST, 3, [], ["in", "test_only", "notstg"]),
    (caffe.TEST, 0, ["s1"], ["in", "test_only"]),
    (caffe.TEST, 0, ["s1", "s2"], ["in", "test_only", "stg"]),
])
def test_netstate_filtering(phase, level, stages, want):
    param = net_from_text(RULES)
    param.state.phase = phase
    param.state.level = level
    param.state.stage.extend(stages)
    assert [l.name for l in filter_net(param).layer] == want


def test_include_and_exclude_together_is_an_error():
    with pytest.raises(NetError, match="both include and exclude"):
        make(INPUT + 'layer { name: "x" type: "ReLU" bottom: "data" top: "b" '
             'include { phase: TRAIN } exclude { stage: "a" } }')


# -- Splits and in-place -------------------------------------------------------------------------
FANOUT = INPUT + '''
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
'''


def test_splits_are_inserted_with_caffes_names():
    split = insert_splits(net_from_text(FANOUT))
    names = [l.name for l in split.layer]
    assert names == ["in", "label_in_1_split", "ip", "relu", "ip_relu_0_split", "loss", "acc"]
    assert list(split.layer[4].top) == ["ip_relu_0_split_0", "ip_relu_0_split_1"]
    assert list(split.layer[5].bottom) == ["ip_relu_0_split_0", "label_in_1_split_0"]


def test_split_sums_gradients_and_in_place_relu_shares_blob():
    net = make(FANOUT + 'layer { name: "loss2" type: "EuclideanLoss" bottom: "ip" '
               'bottom: "ip" top: "l2" }')
    assert net.top_vecs[net.layer_names_index["relu"]][0] is net.blobs["ip"]
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal((4, 3))
    net.blobs["label"].data[...] = [0, 1, 1, 0]
    net.forward_prefilled()
    net.backward_all()
    split_diffs = [net.blobs[n].diff for n in net.blob_names if n.startswith("ip_relu_0_split_")]
    relu_out = net.blobs["ip"].data
    # Through the in-place ReLU: the blob's diff is the gradient before the ReLU.
    want = sum(split_diffs) * (relu_out > 0)
    np.testing.assert_allclose(net.blobs["ip"].diff, want)


def test_loss_weight_on_a_split_top():
    net = make(INPUT + '''
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 } }
layer { name: "l" type: "EuclideanLoss" bottom: "ip" bottom: "ip" top: "l" loss_weight: 3 }
layer { name: "s" type: "Silence" bottom: "l" }
layer { name: "t" type: "Silence" bottom: "l" }''')
    assert net.layer_names[-3:] == ["l_l_0_split", "s", "t"]
    split = net.layers[net.layer_names_index["l_l_0_split"]]
    assert split.loss_weights == [3.0, 0.0, 0.0]  # the loss counts as a consumer (Caffe)
    # The split's first top carries the loss; the consumers read the others.
    assert net.bottom_names["s"] == ["l_l_0_split_1"] and net.bottom_names["t"] == ["l_l_0_split_2"]
    # Caffe clears the loss layer's own loss_weight here, and LossLayer then gives it the
    # default 1 again: the reported loss counts l once more. cct reproduces Caffe's numbers.
    assert net.layers[net.layer_names_index["l"]].loss_weights == [1.0]


# -- Shared params, lr_mult / decay_mult -----------------------------------------------------
SHARED = INPUT + '''
layer { name: "a" type: "InnerProduct" bottom: "data" top: "a"
  param { name: "w" lr_mult: 2 } param { name: "b" decay_mult: 0 }
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
layer { name: "b" type: "InnerProduct" bottom: "data" top: "b"
  param { name: "w" } param { name: "b" }
  inner_product_param { num_output: 3 } }
layer { name: "s" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
layer { name: "loss" type: "EuclideanLoss" bottom: "s" bottom: "data" top: "loss"
  propagate_down: true propagate_down: false }
'''


def test_shared_params_are_one_blob_and_sum_gradients():
    net = make(SHARED.replace('bottom: "data" top: "loss"', 'bottom: "t" top: "loss"')
               .replace(INPUT, INPUT + 'layer { name: "t" type: "Input" top: "t" '
                        'input_param { shape { dim: 4 dim: 3 } } }\n'))
    a, b = net.params["a"], net.params["b"]
    assert a[0].data is not None and np.shares_memory(a[0].data, b[0].data)
    assert len(net.learnable_params) == 2
    assert net.params_lr == [2.0, 1.0] and net.params_weight_decay == [1.0, 0.0]
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal((4, 3))
    net.blobs["t"].data[...] = rng.standard_normal((4, 3))
    net.forward_prefilled()
    net.clear_param_diffs()
    net.backward_all()
    # Both layers compute the same function, so the shared weight gets twice one layer's grad.
    s_diff = net.blobs["s"].diff
    one = s_diff.T @ net.blobs["data"].data
    np.testing.assert_allclose(a[0].diff, 2 * one)


def test_shared_param_shape_mismatch_is_an_error():
    text = SHARED.replace('inner_product_param { num_output: 3 } }',
                          'inner_product_param { num_output: 4 } }')
    with pytest.raises(NetError, match="Cannot share param 'w'"):
        make(text)


def test_mismatched_shared_lr_mult_is_an_error():
    with pytest.raises(NetError, match="mismatched lr_mult"):
        make(SHARED.replace('param { name: "w" } param { name: "b" }',
                            'param { name: "w" lr_mult: 3 } param { name: "b" }'))


# -- backward needs ----------------------------------------------------------------------------
def test_which_layers_need_backward():
    net = make(FANOUT)
    need = dict(zip(net.layer_names, net.layer_need_backward))
    assert need == {"in": False, "label_in_1_split": False, "ip": True, "relu": True,
                    "ip_relu_0_split": True, "loss": True, "acc": False}
    assert net.bottom_need_backward[net.layer_names_index["loss"]] == [True, False]


def test_lr_mult_zero_everywhere_means_no_backward():
    net = make(FANOUT.replace('inner_product_param', 'param { lr_mult: 0 } param { lr_mult: 0 }'
                              ' inner_product_param'))
    assert not any(net.layer_need_backward)


def test_force_backward_reaches_the_inputs():
    net = make("force_backward: true\n" + FANOUT)
    ip = net.layer_names_index["ip"]
    assert net.bottom_need_backward[ip] == [True]
    net.blobs["data"].data[...] = 1.0
    # Positive weights: with the filler's, both ReLUs were shut one time in four (whatever
    # the generator's state when the test ran) and no gradient reached the data.
    net.params["ip"][0].data[...] = [[0.5] * 3, [0.25] * 3]
    net.forward_prefilled()
    net.backward_all()
    assert np.abs(net.blobs["data"].diff).sum() > 0


def test_outputs_are_sorted_like_caffes_set():
    net = make(FANOUT)
    assert net.outputs == ["acc", "loss"]
    assert net.inputs == ["data", "label"]


# -- pycaffe API -------------------------------------------------------------------------------
def test_pycaffe_forward_backward_with_start_end_and_kwargs():
    net = make(FANOUT)
    x = np.random.default_rng(2).standard_normal((4, 3))
    out = net.forward(data=x, label=np.array([0, 1, 0, 1]))
    assert set(out) == {"acc", "loss"}
    np.testing.assert_array_equal(net.blobs["data"].data, x)
    ip_before = net.blobs["ip"].data.copy()
    out = net.forward(start="ip", end="relu")
    assert set(out) == {"ip"}
    np.testing.assert_array_equal(net.blobs["ip"].data, ip_before)
    grads = net.backward(start="relu", end="ip", ip=np.ones((4, 2)))
    assert set(grads) == {"data"}
    assert net.top_names["loss"] == ["loss"]
    assert net.bottom_names["loss"] == ["ip_relu_0_split_0", "label_in_1_split_0"]
    assert list(net.params) == ["ip"] and [b.shape for b in net.params["ip"]] == [(2, 3), (2,)]
    assert [l.type for l in net.layers][:2] == ["Input", "Split"]


def test_reshape_input_and_propagate():
    net = make(FANOUT)
    net.blobs["data"].reshape(7, 3)
    net.blobs["label"].reshape(7)
    net.reshape()
    assert net.blobs["ip"].shape == (7, 2)
    net.forward()


def test_old_constructor_form_and_layer_type_list(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text(FANOUT)
    net = Net(net_from_text(FANOUT), phase=caffe.TEST)
    net.save(str(tmp_path / "w.caffemodel"))
    old = caffe.Net(str(path), str(tmp_path / "w.caffemodel"), caffe.TEST)
    new = caffe.Net(str(path), caffe.TEST, weights=str(tmp_path / "w.caffemodel"))
    np.testing.assert_array_equal(old.params["ip"][0].data, new.params["ip"][0].data)
    np.testing.assert_array_equal(old.params["ip"][0].data, net.params["ip"][0].data)
    types = caffe.layer_type_list()
    assert "Convolution" in types and "Python" in types and types == sorted(types)


def test_legacy_net_level_inputs():
    net = make('input: "data" input_dim: 2 input_dim: 3 input_dim: 4 input_dim: 5\n'
               'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }')
    assert net.inputs == ["data"] and net.blobs["r"].shape == (2, 3, 4, 5)


def test_set_mode_gpu_without_a_gpu_backend_warns_once_and_runs_on_cpu(capfd):
    caffe.set_mode_cpu()
    caffe.set_mode_gpu()
    caffe.set_mode_gpu()
    err = capfd.readouterr().err
    assert err.count("no GPU backend") == 1 and "Traceback" not in err
    assert caffe.get_solver_mode() == "cpu"
    make(FANOUT).forward()
    caffe.set_mode_cpu()


# -- memory ---------------------------------------------------------------------------------------
def test_building_a_net_needs_little_more_than_its_parameter_bytes():
    """Params take their data alone while the net is built: diffs come when first used and
    fillers draw a block at a time (it used to be 4x: data, diff and a float64 draw)."""
    import tracemalloc

    param = net_from_text('''
      layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4096 } } }
      layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2048 weight_filler { type: "gaussian" std: 0.01 }
                              bias_filler { type: "uniform" } } }''')
    tracemalloc.start()
    try:
        net = Net(param, phase=caffe.TRAIN)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    param_bytes = sum(b.data.nbytes for blobs in net.params.values() for b in blobs)
    assert param_bytes == (2048 * 4096 + 2048) * 4
    assert peak < 2.5 * param_bytes, f"peak {peak / param_bytes:.2f}x the parameter bytes"


# -- what the scheduler, the driver and the optimizer ask of a net -------------------------------
SOURCES = '''
layer { name: "d" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 1 }
                     data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 1 weight_filler { type: "gaussian" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def test_source_layers_and_their_tops():
    net = make(SOURCES)
    assert net.source_layers() == [0]
    tops = net.source_tops()
    assert list(tops) == ["data", "label"]
    # The net's own blobs, not pycaffe's host views.
    assert tops["data"] is net.blobs_list[net.blob_names_index["data"]]


def test_next_batch_runs_the_data_layers_alone():
    net = make(SOURCES)
    net.forward_prefilled()
    ip = net.blobs["ip"].data.copy()
    before = net.source_tops()["data"].data.copy()
    net.blobs["ip"].data[...] = 7
    net.next_batch()
    assert not np.array_equal(net.source_tops()["data"].data, before)  # a gaussian refill
    np.testing.assert_array_equal(net.blobs["ip"].data, np.full_like(ip, 7))


def test_replica_param_turns_the_data_layers_into_inputs_of_another_batch():
    net = make(SOURCES)
    param = net.replica_param(2)
    assert param.layer[0].type == "Input" and list(param.layer[0].top) == ["data", "label"]
    assert [list(s.dim) for s in param.layer[0].input_param.shape] == [[2, 3], [2, 1]]
    assert net.param.layer[0].type == "DummyData"        # the net's own is left alone
    replica = Net(param, dtype=np.float64)
    assert replica.inputs == ["data", "label"] and replica.blobs["data"].shape == (2, 3)
    assert [b.shape for b in replica.learnable_params] == [b.shape for b in net.learnable_params]


def test_param_table_has_one_row_per_learnable_param():
    net = make(SOURCES)
    assert [tuple(r) for r in net.param_table()] == [(0, 1.0, 1.0, ()), (1, 2.0, 0.0, ())]
    shared = make(SHARED)
    # "a" owns w and b (params 0, 1); "b" shares them (params 2, 3): two rows.
    assert [tuple(r) for r in shared.param_table()] == [(0, 2.0, 1.0, (2,)), (1, 1.0, 0.0, (3,))]
    # "b" shares w alone: its own bias (param 3) is the third learnable param.
    own_bias = make(SHARED.replace('param { name: "w" } param { name: "b" }',
                                   'param { name: "w" } param { lr_mult: 3 }'))
    assert [r.net_id for r in own_bias.param_table()] == [0, 1, 3]
    assert [r.lr_mult for r in own_bias.param_table()] == [2.0, 1.0, 3.0]
    assert [r.sharers for r in own_bias.param_table()] == [(2,), (), ()]


def test_the_wiring_by_layer_and_by_name():
    """Caffe's accessors, which the tools, the export and the diff sharing read the net by."""
    net = make(INPUT + '''
layer { name: "relu" type: "ReLU" bottom: "data" top: "data" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "data" bottom: "label" top: "loss" }''')
    data, label, loss = (net.blob_by_name(n) for n in ("data", "label", "loss"))
    assert net.layer_id("relu") == 1 and net.layer_id("absent") is None
    assert net.bottom_blobs(1) == [data] and net.top_blobs(1) == [data]   # in place
    assert net.bottom_ids(2) == [0, 1] and net.top_ids(2) == [2]
    assert net.input_ids() == [0, 1] and net.input_blobs() == [data, label]
    assert net.output_ids() == [2] and net.output_blobs() == [loss]
    assert net.has_blob("label") and not net.has_blob("absent")
    with pytest.raises(NetError, match="no blob named 'absent'"):
        net.blob_by_name("absent")
    net.top_ids(2).append(9)                   # the lists are copies: the wiring is the net's
    assert net.top_ids(2) == [2]


def test_pycaffes_facade_is_pycaffes():
    """net.py defines none of pycaffe's facade (cct/pycaffe.py attaches it, as pycaffe.py does
    to _caffe's Net), and a net a solver or a replica builds has it all the same."""
    import ast
    import inspect
    import cct.net
    import cct.pycaffe
    tree = ast.parse(inspect.getsource(cct.net))
    core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Net")
    defined = {n.name for n in core.body if isinstance(n, ast.FunctionDef)}
    facade = {"blobs", "params", "layer_dict", "inputs", "outputs", "top_names",
              "bottom_names", "forward", "backward", "set_input_arrays", "copy_from", "save",
              "save_hdf5", "load_hdf5", "share_with", "forward_all", "forward_backward_all"}
    assert defined & facade == set()
    assert all(getattr(Net, name) is not None for name in facade)
    assert Net.forward is cct.pycaffe._Net_forward


# -- a Convolution applying the in-place ReLU after it (Net._find_relu_fusions) ------------------
CONV_RELU = '''layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 3 dim: 2 dim: 7 dim: 7 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
                      weight_filler { type: "gaussian" std: 0.5 }
                      bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param { num_output: 5 kernel_size: 3 stride: 2 bias_term: false
                      weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "ip" type: "InnerProduct" bottom: "conv2" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def conv_relu_net(text=CONV_RELU, dtype=np.float32, minus_inf=True, **kw):
    caffe.set_random_seed(5)
    net = Net(net_from_text(text), phase=caffe.TRAIN, dtype=dtype, **kw)
    rng = np.random.default_rng(6)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    if minus_inf:
        net.blobs["data"].data[0, 0, 3, 3] = -np.inf  # NaN through the ReLU, as in Caffe
    net.blobs["label"].data[...] = [0, 2, 1]
    return net


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_conv_applies_the_in_place_relu_after_it_with_the_layers_bits(dtype):
    """The net runs each Convolution's in-place ReLU (slope 0) inside the convolution's forward
    (no pass of its own over the top); every blob, the loss and every gradient have the bits of
    the layers run one at a time."""
    fused = conv_relu_net(dtype=dtype)
    assert [fused.layer_names[i] for i, f in enumerate(fused._relu_fused) if f] == ["conv1",
                                                                                    "conv2"]
    plain = conv_relu_net(dtype=dtype)
    for i in range(len(plain.layers)):
        plain.forward_from_to(i, i)  # a layer at a time: nothing fused
    loss = fused.forward_backward()
    plain.backward_all()
    assert np.isnan(fused.blobs["conv1"].data).any()
    for name in fused.blobs:
        for what in ("data", "diff"):
            got, want = getattr(fused.blobs[name], what), getattr(plain.blobs[name], what)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            ok = ~np.isnan(want)
            assert got[ok].tobytes() == want[ok].tobytes(), (name, what)
    assert np.isnan(loss) == np.isnan(plain.blobs["loss"].data[()])


def test_a_forward_that_stops_at_the_conv_leaves_its_top_before_the_relu():
    """pycaffe's forward(end=...) and forward(start=...) run what they name: a forward ending at
    the convolution leaves its top as the convolution wrote it, and one starting at the ReLU
    runs it."""
    net = conv_relu_net()
    net.forward(end="conv1")
    conv = net.blobs["conv1"].data.copy()
    assert (conv < 0).any()
    net.forward(start="relu1", end="relu1")
    np.testing.assert_array_equal(net.blobs["conv1"].data, cpu.relu_forward(conv, 0.0))


@pytest.mark.parametrize("change, why", [
    (('top: "conv1" }\nlayer { name: "conv2"', 'top: "r1" }\nlayer { name: "conv2"'),
     "a ReLU out of place: the conv's top must keep its values"),
    (('top: "conv1" }\nlayer { name: "conv2"',
      'top: "conv1" relu_param { negative_slope: 0.1 } }\nlayer { name: "conv2"'),
     "a leaky ReLU"),
    (('top: "conv1" }\nlayer { name: "conv2"',
      'top: "conv1" relu_param { negative_slope: -0.0 } }\nlayer { name: "conv2"'),
     "a slope of -0 (it makes +0 of -0)"),
    (('type: "Convolution" bottom: "data"', 'type: "Deconvolution" bottom: "data"'),
     "a Deconvolution"),
])
def test_what_is_not_fused(change, why):
    old, new = change
    assert CONV_RELU.count(old) == 1
    text = CONV_RELU.replace(old, new)
    if "r1" in new:
        text = text.replace('bottom: "conv1" top: "conv2"', 'bottom: "r1" top: "conv2"')
    net = conv_relu_net(text)
    assert not net._relu_fused[net.layer_names.index("conv1")], why
    assert net._relu_fused[net.layer_names.index("conv2")]
    net.forward_backward()  # and it runs


def test_on_the_stand_in_device_the_pair_runs_its_two_kernels_with_their_bits():
    """A device backend's conv_forward_relu is its convolution then its ReLU (array_kernels):
    the pair fused has the bits of the two layers there too."""
    fused = conv_relu_net(backend="numpy", minus_inf=False)
    plain = conv_relu_net(backend="numpy", minus_inf=False)
    assert fused._relu_fused[fused.layer_names.index("conv1")]
    fused.forward_prefilled()
    for i in range(len(plain.layers)):
        plain.forward_from_to(i, i)
    for name in ("conv1", "conv2", "ip"):
        got, want = (backends.host(n.blobs[name].data) for n in (fused, plain))
        np.testing.assert_array_equal(got, want)


# -- 1x1 Convolutions reading one Split, their backward run as one (Net._find_sibling_fusions) --
INCEPTION = """layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 6 dim: 9 dim: 9 } shape { dim: 4 } } }
layer { name: "stem" type: "Convolution" bottom: "data" top: "stem"
  convolution_param { num_output: 12 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "stem_relu" type: "ReLU" bottom: "stem" top: "stem" }
layer { name: "a" type: "Convolution" bottom: "stem" top: "a"
  convolution_param { num_output: 5 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "a_relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "b" type: "Convolution" bottom: "stem" top: "b"
  convolution_param { num_output: 7 kernel_size: 1 bias_term: false
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "b_relu" type: "ReLU" bottom: "b" top: "b" }
layer { name: "b3" type: "Convolution" bottom: "b" top: "b3"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "c" type: "Convolution" bottom: "stem" top: "c"
  convolution_param { num_output: 3 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "pool" type: "Pooling" bottom: "stem" top: "pool"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b3" bottom: "c" bottom: "pool"
  top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def inception_net(text=INCEPTION, dtype=np.float32, **kw):
    caffe.set_random_seed(5)
    net = Net(net_from_text(text), phase=caffe.TRAIN, dtype=dtype, **kw)
    rng = np.random.default_rng(6)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = [0, 2, 1, 1]
    return net


def siblings(net):
    return [[net.layer_names[j] for j in g.layers] for g in net._sibling_groups]


def layer_at_a_time(net):
    net.forward_prefilled()
    net.backward_from_to(len(net.layers) - 1, 0)  # what pycaffe's backward() runs


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_sibling_1x1_convolutions_run_their_backward_as_one(dtype, tol):
    """Training's backward (backward_all) runs the 1x1 convolutions that read one Split as
    one stacked convolution: the forward keeps its bits, and every gradient is the layers'
    own up to rounding (the bottom diffs' sum is added in another order), run after run the
    same bits. The Split adds only the diffs still written: the others' stale values (NaN
    here) never reach a gradient."""
    fused, plain = inception_net(dtype=dtype), inception_net(dtype=dtype)
    assert siblings(fused) == [["a", "b", "c"]]
    split = fused.layer_names[fused._sibling_groups[0].split]
    for t in fused.top_vecs[fused._sibling_groups[0].split]:
        t.diff[...] = np.nan
    fused.forward_backward()
    layer_at_a_time(plain)
    for name in fused.blobs:
        assert fused.blobs[name].data.tobytes() == plain.blobs[name].data.tobytes(), name
    for name in ("data", "stem"):
        got, want = fused.blobs[name].diff, plain.blobs[name].diff
        assert np.isfinite(got).all(), (name, split)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    for name in fused.params:
        for got, want in zip(fused.params[name], plain.params[name]):
            np.testing.assert_allclose(got.diff, want.diff, rtol=0,
                                       atol=tol * np.abs(want.diff).max() + 1e-30)
    again = inception_net(dtype=dtype)
    again.forward_backward()
    for name in fused.params:
        for a, b in zip(fused.params[name], again.params[name]):
            assert a.diff.tobytes() == b.diff.tobytes(), name


def test_sibling_gradients_add_into_the_param_diffs_and_keep_what_does_not_learn():
    """Param diffs are added into, as each layer's backward does (iter_size, shared params):
    two passes without clearing give twice one pass; a sibling whose weights do not learn
    (lr_mult 0) keeps its diff, the others' still come from the stacked GEMM."""
    text = INCEPTION.replace('top: "b"\n  convolution_param {', 'top: "b"\n  param { lr_mult: 0 }\n'
                             '  convolution_param {')
    assert text != INCEPTION
    fused, plain = inception_net(text), inception_net(text)
    assert siblings(fused) == [["a", "b", "c"]]
    assert not fused.layers[fused.layer_names.index("b")].param_propagate_down[0]
    fused.forward_backward()
    fused.forward_backward()
    layer_at_a_time(plain)
    layer_at_a_time(plain)
    np.testing.assert_array_equal(fused.params["b"][0].diff, 0)
    for name in ("a", "c", "stem"):
        for got, want in zip(fused.params[name], plain.params[name]):
            np.testing.assert_allclose(got.diff, want.diff, rtol=0,
                                       atol=1e-6 * np.abs(want.diff).max())


@pytest.mark.parametrize("change, why", [
    (('num_output: 3 kernel_size: 1', 'num_output: 3 kernel_size: 1 stride: 2'), "a stride"),
    (('num_output: 3 kernel_size: 1', 'num_output: 3 kernel_size: 1 pad: 1'), "a pad"),
    (('num_output: 3 kernel_size: 1', 'num_output: 3 kernel_size: 1 group: 3'), "groups"),
    (('num_output: 3 kernel_size: 1', 'num_output: 3 kernel_size: 1 engine: CAFFE'),
     "another engine"),
    (('type: "Convolution" bottom: "stem" top: "c"',
      'type: "Deconvolution" bottom: "stem" top: "c"'), "a Deconvolution"),
])
def test_what_is_not_stacked_with_its_siblings(change, why):
    old, new = change
    assert INCEPTION.count(old) == 1, old
    # c's top (another size under a stride or a pad) leaves the Concat for a loss of its own
    text = INCEPTION.replace(old, new).replace('bottom: "c" bottom: "pool"', 'bottom: "pool"')
    text += ('layer { name: "ipc" type: "InnerProduct" bottom: "c" top: "ipc" '
             'inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }'
             '\nlayer { name: "lossc" type: "SoftmaxWithLoss" bottom: "ipc" bottom: "label" '
             'top: "lossc" }\n')
    net = inception_net(text)
    assert siblings(net) == [["a", "b"]], why
    net.forward_backward()  # and it runs


def test_siblings_run_alone_for_pycaffe_for_callbacks_and_off_the_cpu():
    """pycaffe's backward (a layer at a time: every blob diff as Caffe leaves it), a net with
    after_backward callbacks (which would see a sibling's diffs before they are written), and
    a device backend run each layer's own backward: the bits of the layers one at a time."""
    plain = inception_net()
    layer_at_a_time(plain)
    watched = inception_net()
    seen = []
    watched.after_backward.append(seen.append)
    watched.forward_backward()
    assert len(seen) == sum(watched.layer_need_backward)
    for name in plain.params:
        for a, b in zip(watched.params[name], plain.params[name]):
            assert a.diff.tobytes() == b.diff.tobytes(), name
    assert siblings(inception_net(backend="numpy")) == []
    single = inception_net(
        INCEPTION.replace("num_output: 7 kernel_size: 1", "num_output: 7 kernel_size: 3 pad: 1")
        .replace("num_output: 3 kernel_size: 1", "num_output: 3 kernel_size: 3 pad: 1"))
    assert siblings(single) == []  # one 1x1 convolution of the Split: nothing to stack


# -- a layer running the backward of the ReLUs in place on its bottoms ------------------------
# (Net._find_relu_backward_fusions): a and b are fused (slopes 0 and 0.1); c's slope is negative
# (its backward reads a copy of its bottom), d's blob is last written by a TanH, e's ReLU
# is not in place: none of those three
_BRANCH = """layer {{ name: "{n}" type: "Convolution" bottom: "stem" top: "{n}"
  convolution_param {{ num_output: {o} kernel_size: 3 pad: 1
    weight_filler {{ type: "gaussian" std: 0.3 }} bias_filler {{ type: "gaussian" std: 0.1 }} }} }}
"""
CONCAT_RELUS = ("""layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 6 dim: 9 dim: 9 } shape { dim: 4 } } }
layer { name: "stem" type: "Convolution" bottom: "data" top: "stem"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
""" + "".join(_BRANCH.format(n=n, o=o) for n, o in zip("abcde", (5, 4, 3, 2, 3))) + """
layer { name: "a_relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "b_relu" type: "ReLU" bottom: "b" top: "b" relu_param { negative_slope: 0.1 } }
layer { name: "c_relu" type: "ReLU" bottom: "c" top: "c" relu_param { negative_slope: -0.5 } }
layer { name: "d_relu" type: "ReLU" bottom: "d" top: "d" }
layer { name: "d_tanh" type: "TanH" bottom: "d" top: "d" }
layer { name: "e_relu" type: "ReLU" bottom: "e" top: "e_out" }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" bottom: "c" bottom: "d"
  bottom: "e_out" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
""")


def relu_fusions(net):
    return [(net.layer_names[c], {k: net.layer_names[j] for k, j in relus.items()})
            for c, relus in net._relu_backward_fusions]


def check_relu_backward_fusions(text, fusions, relus, own, dtype=np.float32):
    """Training's backward on the net ``text`` finds ``fusions``; of the ReLUs ``relus``, only
    ``own`` run their own backward; every blob's data and diff and every param diff has the
    bits of the layers run one at a time."""
    fused, plain = (inception_net(text, dtype=dtype) for _ in range(2))
    assert relu_fusions(fused) == fusions
    ran = []
    for name in relus:
        layer = fused.layers[fused.layer_names.index(name)]
        layer.backward = (lambda f, n: lambda *a, **k: (ran.append(n), f(*a, **k)))(
            layer.backward, name)
    fused.forward_backward()
    assert sorted(ran) == own
    layer_at_a_time(plain)
    for name in fused.blobs:
        for what in ("data", "diff"):
            got, want = (getattr(n.blobs[name], what) for n in (fused, plain))
            assert got.tobytes() == want.tobytes(), (name, what)
    for name in fused.params:
        for got, want in zip(fused.params[name], plain.params[name]):
            assert got.diff.tobytes() == want.diff.tobytes(), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_concat_runs_the_backward_of_the_relus_in_place_on_its_bottoms(dtype):
    """Training's backward (backward_all) runs a_relu's and b_relu's backward inside cat's
    (theirs do not run): every blob's data and diff and every param diff keep the bits of
    the layers one at a time."""
    check_relu_backward_fusions(CONCAT_RELUS, [("cat", {0: "a_relu", 1: "b_relu"})],
                                ("a_relu", "b_relu", "c_relu", "d_relu"), ["c_relu", "d_relu"],
                                dtype)


def test_concat_runs_its_relus_only_for_training_on_the_cpu_with_both_in_the_pass():
    """pycaffe's backward (a layer at a time), a net with after_backward callbacks, a device
    backend, a ReLU that needs no backward, and a Concat bottom that wants none: each ReLU
    runs its own backward, with the same bits."""
    watched = inception_net(CONCAT_RELUS)
    seen = []
    watched.after_backward.append(seen.append)
    watched.forward_backward()
    assert len(seen) == sum(watched.layer_need_backward)
    assert relu_fusions(inception_net(CONCAT_RELUS, backend="numpy")) == []
    net = inception_net(CONCAT_RELUS)
    assert net._active_relu_backward_fusions(len(net.layers) - 1, net.layer_names.index("cat")) == {}
    a_relu = net.layer_names.index("a_relu")
    net.bottom_need_backward[net.layer_names.index("cat")][0] = False
    roles = net._active_relu_backward_fusions(len(net.layers) - 1, 0)
    assert a_relu not in roles and roles[net.layer_names.index("cat")] == (
        "relu", {1: net.layer_names.index("b_relu")})


POOL_RELUS = """layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 6 dim: 11 dim: 11 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 5 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" relu_param { negative_slope: 0.1 } }
layer { name: "norm2" type: "LRN" bottom: "conv2" top: "norm2"
  lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 } }
layer { name: "conv3" type: "Convolution" bottom: "norm2" top: "conv3"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool3" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_max_pooling_and_lrn_run_the_backward_of_the_relu_in_place_on_their_bottom():
    """CaffeNet's conv -> ReLU -> MAX pool and AlexNet's conv -> ReLU -> LRN: the ReLU's
    backward runs inside the pooling's (plane by plane) and the LRN's (as each diff is stored),
    theirs do not run, and every blob and param diff has the bits of the layers one at a
    time; an AVE pooling's ReLU runs its own."""
    check_relu_backward_fusions(POOL_RELUS, [("pool1", {0: "relu1"}), ("norm2", {0: "relu2"})],
                                ("relu1", "relu2", "relu3"), ["relu3"])

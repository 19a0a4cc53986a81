"""The hybrid scheduler on CPU devices: a batch split across devices gives the update of the
whole batch on one device; the split follows measured throughput; a lost device is survived,
or ends in a clear error and a usable snapshot."""
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
from google.protobuf import text_format

from cct.devices import (CPUDevice, DeviceError, StandInDevice, available_cores,
                         parse_devices)
from cct.errors import CCTError
from cct.install import install_hint
from cct.proto import caffe_pb2
from cct.api import Solver
from cct.backend import plans
from cct.scheduler import (HybridScheduler, batch_seconds, choose_devices, proportional_split,
                           rule_split)

BATCH = 16

NET = """
name: "tiny"
layer {{ name: "data" type: "HDF5Data" top: "data" top: "label" top: "target"
        hdf5_data_param {{ source: "{list}" batch_size: {batch} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 group: 1
                            weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
{middle}
layer {{ name: "pool" type: "Pooling" bottom: "{pool_in}" top: "pool"
        pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
layer {{ name: "relu" type: "ReLU" bottom: "pool" top: "pool" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param {{ num_output: 5 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
        loss_param {{ normalization: {norm} }} }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "pool" top: "ip2"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "l2" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "l2"
        loss_weight: 0.5 }}
layer {{ name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }}
"""

BN = """layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "bn" }"""


@pytest.fixture
def data_list(tmp_path):
    rs = np.random.RandomState(0)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["data"] = rs.randn(64, 2, 10, 10).astype(np.float32)
        f["label"] = rs.randint(0, 5, 64).astype(np.float32)
        f["target"] = rs.randn(64, 3).astype(np.float32)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'd.h5'}\n")
    return tmp_path / "list.txt"


def solver_param(data_list, tmp_path, norm="VALID", batch_norm=False, **fields):
    p = caffe_pb2.SolverParameter()
    text_format.Merge('base_lr: 0.05 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed" '
                      'max_iter: 6 display: 1 random_seed: 7', p)
    p.snapshot_prefix = str(tmp_path / "snap")
    for k, v in fields.items():
        setattr(p, k, v)
    net = NET.format(list=data_list, batch=BATCH, norm=norm,
                     middle=BN if batch_norm else "", pool_in="bn" if batch_norm else "conv")
    p.net_param.CopyFrom(text_format.Parse(net, caffe_pb2.NetParameter()))
    return p


def one_core_devices(count=2):
    cores = available_cores()
    return [CPUDevice([cores[i % len(cores)]]) for i in range(count)]


def params_of(solver):
    return [p.data.copy() for p in solver.net.learnable_params]


def assert_same_params(a, b, rtol=2e-5):
    for pa, pb in zip(a, b):
        np.testing.assert_allclose(pb, pa, rtol=rtol, atol=rtol * np.abs(pa).max())


def train(param, devices=None, split=None, iters=6):
    if split is None:
        solver = Solver(param, devices=devices)
    else:
        solver = Solver(param)
        if isinstance(devices, str):
            devices = parse_devices(devices)
        solver.set_gradient_source(HybridScheduler(solver.net, devices, split=split))
    try:
        solver.step(iters)
        return params_of(solver), [h.copy() for h in solver.history], solver.gradient_source
    finally:
        solver.close()


# -- splitting arithmetic ---------------------------------------------------------------------
def test_proportional_split_follows_speeds_and_sums_to_the_batch():
    assert proportional_split(256, [1.0, 1.0]) == [128, 128]
    assert proportional_split(100, [3.0, 1.0]) == [75, 25]
    split = proportional_split(97, [5.0, 3.0, 1.0])
    assert sum(split) == 97 and split[0] > split[1] > split[2] > 0
    assert proportional_split(10, [1.0, 0.0, 1.0]) == [5, 0, 5]
    assert proportional_split(3, [1000.0, 1.0]) == [2, 1]  # a device that takes part gets one
    with pytest.raises(ValueError):
        proportional_split(10, [0.0, 0.0])


def test_choose_devices_leaves_out_a_device_that_does_not_pay():
    # An H100-like device next to a slow CPU whose gradients cost the host 0.5 s a batch.
    split, why = choose_devices(256, [2000.0, 20.0], [0.01, 0.5])
    assert split == [256, 0] and "left out device(s) 1" in why
    # Two equal devices with cheap synchronisation both take half.
    split, why = choose_devices(256, [20.0, 20.0], [0.01, 0.01])
    assert split == [128, 128] and "left out" not in why
    # Whatever is chosen is never predicted slower than the fastest device alone.
    for speeds, over in [([50.0, 10.0, 1.0], [0.1, 0.2, 0.3]), ([5.0, 5.0], [1.0, 1.0])]:
        split, _ = choose_devices(64, speeds, over)
        alone = batch_seconds([64] + [0] * (len(speeds) - 1), speeds, over)
        assert batch_seconds(split, speeds, over) <= alone


def test_deterministic_modes_split_is_a_rule_of_the_devices():
    cores = available_cores()
    two = [CPUDevice([cores[0]]), CPUDevice([cores[-1]])]
    assert rule_split(64, two)[0] == [32, 32]
    wide = CPUDevice([cores[0]])
    wide.cores = (0, 1, 2)            # three cores' worth: the rule reads the count only
    split, why = rule_split(64, [wide, two[0]])
    assert split == [48, 16] and "in proportion to each CPU group's cores" in why
    split, why = rule_split(64, [two[0], StandInDevice(), two[1]])
    assert split == [0, 64, 0] and "none to the CPU groups" in why
    assert "nothing timed" in why


def test_deterministic_mode_splits_by_rule_and_repeats_to_the_bit(data_list, tmp_path, capsys):
    """--deterministic: no probe, no rebalancing (a slow device keeps its share), and two runs
    give the same params to the bit, as the measured split (which follows the machine's
    load) cannot promise."""
    param = solver_param(data_list, tmp_path, max_iter=30)
    whole, _, _ = train(param, iters=30)
    cores = available_cores()
    plans.set_deterministic(True)
    try:
        runs = []
        for _ in range(2):
            capsys.readouterr()
            devices = [CPUDevice([cores[0]]), SlowCPU([cores[-1]], delay=0.002)]
            runs.append(train(param, devices, iters=30))
            text = capsys.readouterr().err
            assert "alone (slice of" not in text and "rebalanced" not in text
            assert "Hybrid split of 16 (first split): cpu:" in text
            assert "deterministic mode's rule, nothing timed" in text
            assert [r.n for r in runs[-1][2].replicas] == [8, 8]
    finally:
        plans.set_deterministic(False)
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert_same_params(whole, runs[0][0], rtol=5e-5)


# -- the update --------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["VALID", "BATCH_SIZE", "NONE"])
def test_split_batch_update_equals_whole_batch_update(data_list, tmp_path, norm):
    """Two CPU devices with an uneven fixed split (5 + 11) and iter_size 2: the params and
    momentum history after 6 iterations equal one device's on the whole batch."""
    param = solver_param(data_list, tmp_path, norm=norm, iter_size=2)
    whole, whole_history, _ = train(param)
    split, split_history, _ = train(param, one_core_devices(), split=[5, 11])
    assert_same_params(whole, split)
    assert_same_params(whole_history, split_history)


def test_measured_split_gives_the_same_update_and_logs_it(data_list, tmp_path, capsys):
    param = solver_param(data_list, tmp_path)
    whole, _, _ = train(param)
    capsys.readouterr()
    split, _, scheduler = train(param, "cpu:1,cpu:1" if len(available_cores()) > 1
                                else one_core_devices())
    assert_same_params(whole, split)
    text = capsys.readouterr().err
    assert "alone (slice of 8, 2 timed iterations)" in text
    assert "Hybrid split of 16 (first split)" in text and "in proportion to measured" in text
    assert sum(r.n for r in scheduler.replicas) == BATCH


def test_train_outputs_are_the_whole_batch_values(data_list, tmp_path):
    """What the solver displays (loss, accuracy) is the whole batch's, not one slice's."""
    param = solver_param(data_list, tmp_path)
    whole = Solver(param)
    hybrid = Solver(param)
    try:
        loss_whole = whole.net.forward_backward()
        hybrid.set_gradient_source(HybridScheduler(hybrid.net, one_core_devices(), split=[7, 9]))
        loss_split = hybrid.gradient_source.compute_gradients()
        np.testing.assert_allclose(loss_split, loss_whole, rtol=1e-5)
        for name in ("acc", "loss", "l2"):
            np.testing.assert_allclose(hybrid.net.blobs[name].data, whole.net.blobs[name].data,
                                       rtol=1e-5)
    finally:
        whole.close()
        hybrid.close()


def test_batch_norm_statistics_come_back_from_the_first_device(data_list, tmp_path):
    param = solver_param(data_list, tmp_path, batch_norm=True, snapshot=3)
    _, _, scheduler = train(param, one_core_devices(), split=[8, 8], iters=3)
    bn = scheduler.master.layer_dict["bn"]
    first_bn = scheduler.replicas[0].net.layer_dict["bn"]
    for a, b in zip(bn.blobs, first_bn.blobs):
        np.testing.assert_array_equal(a.data, b.data)
    assert float(bn.blobs[2].data[0]) > 0  # the moving-average factor was accumulated
    # The snapshot at iteration 3 carries the first device's running averages.
    reloaded = Solver(param)
    try:
        reloaded.net.copy_from(str(tmp_path / "snap_iter_3.caffemodel"))
        for a, b in zip(reloaded.net.layer_dict["bn"].blobs, bn.blobs):
            np.testing.assert_array_equal(a.data, b.data)
    finally:
        reloaded.close()


# -- failures ----------------------------------------------------------------------------------
class FailingCPU(CPUDevice):
    """A CPU device that dies in its ``fail_at``-th training slice, as a lost GPU would."""

    def __init__(self, cores, fail_at):
        super().__init__(cores)
        self.fail_at, self.slices = fail_at, 0

    def submit(self, fn, *args):
        if getattr(fn, "__name__", "") == "_run_replica":
            self.slices += 1
            if self.slices >= self.fail_at:
                def lost(*_):
                    raise RuntimeError("device lost (simulated)")
                fn = lost
        return super().submit(fn, *args)


def test_a_lost_device_is_dropped_and_training_continues_exactly(data_list, tmp_path, capsys):
    param = solver_param(data_list, tmp_path)
    whole, _, _ = train(param)
    cores = available_cores()
    devices = [CPUDevice([cores[0]]), FailingCPU([cores[-1]], fail_at=3)]
    capsys.readouterr()
    split, _, scheduler = train(param, devices, split=[8, 8])
    assert_same_params(whole, split)  # the failed batch was redone on the other device
    text = capsys.readouterr().err
    assert "failed: RuntimeError: device lost (simulated)" in text
    assert "lost; redoing the batch on" in text
    assert [r.device.name for r in scheduler.replicas] == [devices[0].name]


def test_losing_every_device_stops_with_a_message_and_a_usable_snapshot(data_list, tmp_path):
    param = solver_param(data_list, tmp_path)
    cores = available_cores()
    devices = [FailingCPU([cores[0]], fail_at=4), FailingCPU([cores[-1]], fail_at=4)]
    solver = Solver(param, devices=devices)
    try:
        with pytest.raises(DeviceError, match="every device of the hybrid scheduler failed"):
            solver.step(6)
        assert solver.iter == 3
        kept = params_of(solver)
    finally:
        solver.close()
    state = tmp_path / "snap_iter_3.solverstate"
    assert state.is_file() and (tmp_path / "snap_iter_3.caffemodel").is_file()
    resumed = Solver(param)
    try:
        resumed.restore(str(state))
        assert resumed.iter == 3
        assert_same_params(kept, params_of(resumed), rtol=0)
    finally:
        resumed.close()


def test_a_user_error_in_a_slice_is_not_a_device_failure(data_list, tmp_path):
    """A label out of range is the data's fault: it is reported as such, no device dropped."""
    with h5py.File(data_list.parent / "d.h5", "r+") as f:
        f["label"][3] = 9
    param = solver_param(data_list, tmp_path)
    solver = Solver(param, devices=one_core_devices())
    try:
        with pytest.raises(CCTError, match=r"label 9 is out of range.*\(on device cpu:\d, a "
                           r"slice of 8 of the batch's 16 items\)"):
            solver.step(1)
        assert len(solver.gradient_source.replicas) == 2
    finally:
        solver.close()


def test_a_net_that_cannot_take_part_of_the_batch_says_so(data_list, tmp_path):
    param = solver_param(data_list, tmp_path)
    # A Reshape that names the batch size cannot run on a slice of it.
    layer = param.net_param.layer.add()
    text_format.Merge('name: "fixed" type: "Reshape" bottom: "ip2" top: "fixed" '
                      'reshape_param { shape { dim: 16 dim: 3 } }', layer)
    with pytest.raises(DeviceError, match=r"net 'tiny' cannot be split across devices: its "
                       r"replica for 8 of the batch's 16 items on cpu:\d fails to build "
                       r"\(.*'fixed'.*\)\. Every layer must work on part of the batch"):
        Solver(param, devices=one_core_devices())


# -- spelling ------------------------------------------------------------------------------------
def test_device_lists_are_checked():
    cores = available_cores()
    assert [d.name for d in parse_devices("cpu", cores=[0, 1])] == ["cpu:0-1"]
    assert [d.name for d in parse_devices("cpu:1,cpu:1", cores=[0, 1])] == ["cpu:0", "cpu:1"]
    with pytest.raises(DeviceError, match="only 1 of this process's 2 core"):
        parse_devices("cpu:1,cpu:2", cores=[0, 1])
    with pytest.raises(DeviceError, match="cannot be combined"):
        parse_devices("cpu,cpu:1", cores=[0, 1])
    with pytest.raises(DeviceError, match="unknown device 'tpu0'"):
        parse_devices("cpu,tpu0", cores=cores)
    with pytest.raises(DeviceError, match="empty device list"):
        parse_devices(" , ", cores=cores)


def test_gpu_device_without_cupy_says_what_to_install():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    with pytest.raises(DeviceError, match="CuPy is not installed.*" + re.escape(install_hint("gpu"))):
        parse_devices("cpu,gpu0")


def test_cli_train_on_two_devices(data_list, tmp_path):
    param = solver_param(data_list, tmp_path, max_iter=4, snapshot=4)
    (tmp_path / "solver.prototxt").write_text(text_format.MessageToString(param))
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          "--devices=cpu:1,cpu:1" if len(available_cores()) > 1 else
                          "--devices=cpu:1"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Training on" in run.stderr and "Optimization Done." in run.stderr
    if len(available_cores()) > 1:
        assert "Hybrid split of 16" in run.stderr
    assert (tmp_path / "snap_iter_4.caffemodel").is_file()
    bad = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          "--devices=cpu:1,quantum"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].startswith("cct: error: unknown device 'quantum'")
    assert "Traceback" not in bad.stderr


class SeparateMemoryDevice(CPUDevice):
    """A device with memory of its own, as a GPU has: its replica runs on the ``numpy``
    backend (the array-generic GPU kernels on the CuPy-rules stand-in, blobs as DeviceBlobs),
    and params and gradients move by copies, through the backend. Exercises the scheduler's
    GPU path without a GPU (pinned to a core, unlike the ``standin`` device)."""

    backend = "numpy"
    host_memory = False


def test_a_device_with_its_own_memory_gives_the_same_update(data_list, tmp_path):
    param = solver_param(data_list, tmp_path, iter_size=2)
    whole, whole_history, _ = train(param)
    cores = available_cores()
    devices = [CPUDevice([cores[0]]), SeparateMemoryDevice([cores[-1]])]
    split, split_history, scheduler = train(param, devices, split=[6, 10])
    assert_same_params(whole, split)
    assert_same_params(whole_history, split_history)
    gpu_like = scheduler.replicas[1].net
    assert gpu_like.backend.name == "numpy"
    # Its params are copies, not the master's arrays, and hold the values of the last update
    # sent (the update after it is not sent until the next batch).
    for rp, mp in zip(gpu_like.learnable_params, scheduler.master.learnable_params):
        assert gpu_like.backend.is_device(rp.data) and not gpu_like.backend.is_device(mp.data)


class SlowCPU(CPUDevice):
    """A CPU device that takes ``delay`` seconds more per image of its training slices (a
    slower device, or one that another job starts sharing after the first split)."""

    def __init__(self, cores, delay):
        super().__init__(cores)
        self.delay = delay

    def submit(self, fn, *args):
        if getattr(fn, "__name__", "") == "_run_replica":
            replica, inner = args[0], fn

            def slowed(*a):
                result = inner(*a)
                import time
                time.sleep(self.delay * replica.n)
                return result[0], result[1] + self.delay * replica.n
            fn = slowed
        return super().submit(fn, *args)


def test_the_split_follows_speeds_that_drift(data_list, tmp_path, capsys):
    """The probe sees two equal devices; then one slows down by 10 ms an image: within a few
    rebalancing rounds it gets a small share, and the update is still the whole batch's."""
    param = solver_param(data_list, tmp_path, max_iter=30)
    whole, _, _ = train(param, iters=30)
    cores = available_cores()
    devices = [CPUDevice([cores[0]]), SlowCPU([cores[-1]], delay=0.01)]
    capsys.readouterr()
    split, _, scheduler = train(param, devices, iters=30)
    assert_same_params(whole, split, rtol=5e-5)
    fast, slow = (r.n for r in scheduler.replicas)
    assert fast + slow == BATCH and fast >= 4 * slow, (fast, slow)
    assert "Hybrid split of 16 (rebalanced: predicted" in capsys.readouterr().err


class DeadOnArrival(CPUDevice):
    """A device that fails from its first job on (the probe)."""

    def submit(self, fn, *args):
        if getattr(fn, "__name__", "") in ("timed", "_run_replica"):
            def lost(*_):
                raise RuntimeError("no such device (simulated)")
            fn = lost
        return super().submit(fn, *args)


def test_a_device_lost_while_probing_is_left_out(data_list, tmp_path, capsys):
    param = solver_param(data_list, tmp_path)
    whole, _, _ = train(param)
    cores = available_cores()
    capsys.readouterr()
    split, _, scheduler = train(param, [DeadOnArrival([cores[0]]), CPUDevice([cores[-1]])])
    assert_same_params(whole, split)
    assert [r.n for r in scheduler.replicas] == [BATCH]
    assert "Device cpu:0 failed: RuntimeError: no such device" in capsys.readouterr().err


def test_a_shared_weight_with_its_own_bias_gives_the_same_update(data_list, tmp_path):
    """ip3 shares ip's weight but learns its own bias (lr_mult 3): the params the solver
    updates are positions 0-7 and 9 of the net's params, not the learnable numbering (which
    once made the replicas treat ip3's bias as frozen and copy their stale one back)."""
    param = solver_param(data_list, tmp_path, iter_size=2)
    net = param.net_param
    ip = next(lp for lp in net.layer if lp.name == "ip")
    ip.param.add().name = "w"
    ip.param.add()
    extra = text_format.Parse(
        'layer { name: "ip3" type: "InnerProduct" bottom: "pool" top: "ip3" '
        'param { name: "w" } param { lr_mult: 3 } '
        'inner_product_param { num_output: 5 bias_filler { type: "constant" value: 0.5 } } } '
        'layer { name: "loss3" type: "SoftmaxWithLoss" bottom: "ip3" bottom: "label" '
        'top: "loss3" }', caffe_pb2.NetParameter())
    net.layer.extend(extra.layer)
    whole, whole_history, _ = train(param)
    cores = available_cores()
    devices = [CPUDevice([cores[0]]), SeparateMemoryDevice([cores[-1]])]
    split, split_history, _ = train(param, devices, split=[6, 10])
    assert_same_params(whole, split)
    assert_same_params(whole_history, split_history)


# -- a replica with memory of its own: its copies overlap its passes (issue 30) ---------------
def _cpu_replica_beside_the_device_master(data_list, tmp_path, split=(8, 8)):
    """The layout ``cct train --devices=cpu,standin`` makes: the master (weights, update, the
    gradients' sum) on the stand-in device, whose replica shares its arrays; the CPU replica
    receives its slice and the weights and sends its gradients back."""
    from cct.scheduler import master_place
    devices, backend = master_place([CPUDevice(available_cores()[:1]), StandInDevice()], "cpu")
    solver = Solver(solver_param(data_list, tmp_path, display=0), backend=backend)
    scheduler = HybridScheduler(solver.net, devices, split=list(split))
    solver.set_gradient_source(scheduler)
    cpu = scheduler.replicas[0]
    assert cpu.copies is not None and scheduler.replicas[1].copies is None
    return solver, scheduler, cpu


def _layer(net, name):
    return net.layer_names.index(name)


def test_a_replicas_gradients_leave_while_the_layers_below_compute(data_list, tmp_path):
    """ip's and ip2's gradients are shipped as soon as their layers' backward has run, before
    the convolution's backward (the bottom of the net) starts."""
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path)
    try:
        solver.step(1)
        events = []
        net, copies = cpu.net, cpu.copies
        ship = copies._ship
        copies._ship = lambda ks: (events.append(("ship", tuple(ks))), ship(ks))
        net.after_backward.append(lambda i: events.append(("backward", i)))
        solver.step(1)
        k_of = {id(p): k for k, p in enumerate(net.learnable_params)}
        ip_weight = k_of[id(net.layers[_layer(net, "ip")].blobs[0])]
        conv_weight = k_of[id(net.layers[_layer(net, "conv")].blobs[0])]
        shipped_ip = next(n for n, e in enumerate(events) if e[0] == "ship" and ip_weight in e[1])
        conv_done = events.index(("backward", _layer(net, "conv")))
        assert shipped_ip < conv_done, events
        # the conv's own gradient goes when its backward is done, and every one goes once
        shipped = [k for e in events if e[0] == "ship" for k in e[1]]
        assert conv_weight in shipped and sorted(shipped) == sorted(copies.grads)
    finally:
        solver.close()


def test_a_replicas_layer_waits_only_for_its_own_weights(data_list, tmp_path):
    """The convolution runs while ip's weights are still on their way; ip waits for them."""
    import time as _time
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path)
    try:
        solver.step(1)
        events = []
        net, copies = cpu.net, cpu.copies
        ip_weight = net.layers[_layer(net, "ip")].blobs[0]
        down = copies._down

        def slow_down(dst, src, mark):
            if dst is ip_weight.data:
                _time.sleep(0.2)
                down(dst, src, mark)
                events.append(("arrived", "ip"))
            else:
                down(dst, src, mark)
        copies._down = slow_down
        net.before_forward.append(lambda i: events.append(("forward", net.layer_names[i])))
        solver.step(1)
        arrived = events.index(("arrived", "ip"))
        assert events.index(("forward", "conv")) < arrived < events.index(("forward", "ip"))
        assert cpu.copies.waited > 0.1          # the wait is counted as the copies' cost
        assert cpu.overhead > 0
    finally:
        solver.close()


def test_a_replica_with_its_own_memory_gets_each_weight_and_sends_each_gradient_once(
        data_list, tmp_path):
    """Per iteration: the CPU replica's slice and every updated weight to it, every gradient
    back, each once; nothing for the replica sharing the master's memory."""
    from collections import Counter

    from cct.backend import npdevice
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path)
    try:
        solver.step(1)
        with npdevice.copies.counting() as copies:
            solver.step(1)
        sizes = Counter(int(np.prod(p.shape)) * 4 for p in solver.net.learnable_params)
        out = Counter(n for d, n in copies.sizes if d == "to_host" and n in sizes)
        back = Counter(n for d, n in copies.sizes if d == "to_device" and n in sizes)
        assert out == sizes and back == sizes, copies.sizes
    finally:
        solver.close()


def test_a_failed_copy_loses_the_replica_not_the_run(data_list, tmp_path, capsys):
    """A copy that fails (the bus, the device) drops that replica as a lost device: the batch
    is redone on the others and training goes on; nothing waits forever."""
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path)
    try:
        solver.step(1)

        def broken(dst, src, mark):
            raise RuntimeError("copy engine lost")
        cpu.copies._down = broken
        solver.step(2)
        assert solver.iter == 3 and [r.device.name for r in scheduler.replicas] == ["standin"]
        assert "copy engine lost" in capsys.readouterr().err
    finally:
        solver.close()


def test_the_split_update_is_the_same_with_the_master_on_the_device(data_list, tmp_path):
    """The pipelined copies change when values move, not which: the same update as the whole
    batch on one device."""
    param = solver_param(data_list, tmp_path, iter_size=2)
    whole, whole_history, _ = train(param)
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path,
                                                                   split=(10, 6))
    try:
        solver.param.iter_size = 2
        solver.step(6)
        got = [np.asarray(p.data.get()) if hasattr(p.data, "get") else p.data
               for p in solver.net.learnable_params]
    finally:
        solver.close()
    assert_same_params(whole, got)


def test_a_device_with_the_whole_batch_runs_as_the_one_device_path(data_list, tmp_path):  # noqa: F811
    """The split gives the device sharing the master's memory every image: between the
    iterations that measure (every rebalance_every-th), it runs as the plain device path does,
    nothing read back to the host (no iteration waits for a GPU), and gives its numbers."""
    from cct.backend import npdevice
    param = solver_param(data_list, tmp_path, display=0)
    plain = Solver(param, backend="numpy")
    try:
        plain.step(7)
        want = [np.array(p.data.get()) for p in plain.net.learnable_params]
        want_loss = float(plain.smoothed_loss)
    finally:
        plain.close()
    solver, scheduler, cpu = _cpu_replica_beside_the_device_master(data_list, tmp_path,
                                                                   split=(0, 16))
    try:
        scheduler.rebalance_every = 5
        solver.step(1)                     # iteration 0 measures
        with npdevice.copies.counting() as copies:
            solver.start_steps()
            for _ in range(4):             # 1-4: alone, nothing back to the host
                solver.begin_iteration()
                solver.record_loss(solver.compute_gradients())
                solver.apply_update()
                solver.end_iteration()
            assert copies.to_host == 0, copies.sizes
        solver.step(2)                     # 5 measures again, 6 alone
        got = [np.array(p.data.get()) for p in solver.net.learnable_params]
        assert scheduler.iterations == 7
    finally:
        solver.close()
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert want_loss == pytest.approx(float(solver.smoothed_loss), rel=1e-5)


def test_overlapping_holders_of_the_blas_count_give_it_back_in_any_order():
    """A scheduler for the next place is built before the last one closes: the count is the
    smallest any live holder asks for, and the one from before them all once they are gone
    (each giving back "the count it replaced" left 1 behind when the older closed first)."""
    from cct.devices import BlasThreads
    from cct.native import _C
    base = _C.blas_num_threads()
    wide = BlasThreads([CPUDevice([0, 1]), CPUDevice([0, 1])])
    narrow = BlasThreads([CPUDevice([0]), CPUDevice([1])])
    assert _C.blas_num_threads() == 1
    wide.release()
    assert _C.blas_num_threads() == 1                 # narrow still runs
    narrow.release()
    narrow.release()                                  # twice: nothing
    assert _C.blas_num_threads() == base
    assert BlasThreads([StandInDevice()]).held is False   # no CPU device: nothing to hold
    assert _C.blas_num_threads() == base

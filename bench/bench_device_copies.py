"""Host<->device copies per training iteration, by strategy, counted by the CuPy-rules stand-in
(cct/backend/standin.py): what each way of training with a device moves across the bus, in
bytes and as a multiple of the model's size. A GPU moves the same arrays (the copies are made
by the same code through the same backend functions), so these counts are a GPU run's, and
their cost there is bytes / the bus's bandwidth (PCIe 5 x16: ~50 GB/s).

    python bench/bench_device_copies.py                 # LeNet b64, 20 iterations each
    python bench/bench_device_copies.py --iters 50

Configurations: ``-gpu 0`` (the solver's nets on the device), the hybrid split
``--devices=cpu:1,standin`` (as ``cct train`` runs it: the master on the device, the split
measured, which may leave a slow device out; and with the split fixed, the master on the host
as before, or on the device), and ``--strategy=async`` with its one group on the device, the
parameter store on the host or (as ``cct train`` places it now) on the device. (Hogbatch's
device group copies as the async group does, per update of its own; how many updates are its
depends on timing.)
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # after the installed cct

from google.protobuf import text_format  # noqa: E402

from cct.api import Solver  # noqa: E402
from cct.backend import npdevice  # noqa: E402
from cct.devices import CPUDevice, StandInDevice, available_cores  # noqa: E402
from cct.driver import Driver  # noqa: E402
from cct.glog import set_quiet  # noqa: E402
from cct.io.prototxt import read_net_text  # noqa: E402
from cct.proto import caffe_pb2  # noqa: E402
from cct.scheduler import HybridScheduler  # noqa: E402

LENET = HERE.parent / "examples" / "mnist" / "lenet_train_test.prototxt"


def lenet(batch: int) -> caffe_pb2.NetParameter:
    """LeNet's TRAIN net with its Data layer a DummyData of the same tops (no database)."""
    net = read_net_text(str(LENET))
    layers = [lp for lp in net.layer if not (lp.type == "Data" and lp.include
                                              and lp.include[0].phase == caffe_pb2.TEST)]
    del net.layer[:]
    for lp in layers:
        if lp.type == "Data":
            dummy = caffe_pb2.LayerParameter()
            text_format.Merge(f'''name: "mnist" type: "DummyData" top: "data" top: "label"
                dummy_data_param {{ shape {{ dim: {batch} dim: 1 dim: 28 dim: 28 }}
                                    shape {{ dim: {batch} }}
                                    data_filler {{ type: "gaussian" std: 1 }}
                                    data_filler {{ type: "constant" value: 3 }} }}''', dummy)
            lp = dummy
        net.layer.add().CopyFrom(lp)
    return net


def solver_param(batch: int) -> caffe_pb2.SolverParameter:
    p = caffe_pb2.SolverParameter()
    text_format.Merge('base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" '
                      'max_iter: 100000 display: 0 random_seed: 1', p)
    p.net_param.CopyFrom(lenet(batch))
    return p


def count(param, iters: int, backend="cpu", devices=None, split=None,
          **driver) -> npdevice.Copies:
    """The copies of ``iters`` iterations after two: the solver's nets on ``backend``, its
    gradient source over ``devices`` (with ``split`` fixed, else measured), or a driver's
    strategy (``driver``: its arguments) with its groups on ``devices``."""
    solver = Solver(param, backend=backend,
                    devices=None if split or driver else devices)
    if split:
        solver.set_gradient_source(HybridScheduler(solver.net, devices, split=split))
    runner = Driver(solver, devices=devices, **driver) if driver else None
    step = (runner or solver).step
    try:
        step(2)                       # index arrays, buffers, the split's probes
        with npdevice.copies.counting() as copies:
            step(iters)
        return copies
    finally:
        if runner is not None:
            runner.close()
        solver.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    set_quiet(True)
    param = solver_param(args.batch)
    probe = Solver(param)
    model = sum(int(np.prod(b.shape)) * 4 for b in probe.net.learnable_params)
    probe.close()
    core = available_cores()[:1]
    runs = [
        ("-gpu 0 (nets on the device)", dict(backend="numpy")),
        ("hybrid cpu:1,standin, measured", dict(devices=[CPUDevice(core), StandInDevice()])),
        ("hybrid, master on the host, all on the device",
         dict(devices=[CPUDevice(core), StandInDevice()], split=[0, args.batch])),
        ("hybrid, master on the host, half on the device",
         dict(devices=[CPUDevice(core), StandInDevice()],
              split=[args.batch // 2, args.batch // 2])),
        ("hybrid, master on the device, all on it",
         dict(backend="numpy", devices=[CPUDevice(core), StandInDevice()],
              split=[0, args.batch])),
        ("hybrid, master on the device, half on it",
         dict(backend="numpy", devices=[CPUDevice(core), StandInDevice()],
              split=[args.batch // 2, args.batch // 2])),
        ("async, 1 group on the device", dict(strategy="async", groups=None,
                                              devices=[StandInDevice()])),
        ("async, store and its group on the device",
         dict(backend="numpy", strategy="async", groups=None, devices=[StandInDevice()])),
    ]
    print(f"LeNet b{args.batch}: model {model:,} bytes; per iteration (update), "
          f"{args.iters} iterations, counted by the stand-in")
    print(f"{'configuration':46s} {'to device':>12s} {'x model':>8s} {'to host':>12s} "
          f"{'x model':>8s} {'copies':>7s}")
    for label, kw in runs:
        c = count(param, args.iters, **kw)
        down, up = c.bytes_to_device / args.iters, c.bytes_to_host / args.iters
        print(f"{label:46s} {down:12,.0f} {down / model:8.2f} {up:12,.0f} {up / model:8.2f} "
              f"{(c.to_device + c.to_host) / args.iters:7.1f}")


if __name__ == "__main__":
    main()

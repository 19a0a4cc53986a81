"""The hybrid scheduler on CPU devices: two 1-core devices, alone and together, against one
2-core device, on the same nets (issue 5's bench (a)).

    python bench/bench_hybrid.py                              # CaffeNet b256, CIFAR10-quick b100
    python bench/bench_hybrid.py --nets cifar10_quick --iters 5

For each net, each in a subprocess of its own: ``cpu@A`` and ``cpu@B`` (one core each, through
the scheduler with that device alone), ``cpu`` (one device of both cores, the plain net), and
the hybrid ``cpu@A,cpu@B`` (the scheduler splitting every batch across both). Full training
iterations on synthetic data (forward, backward, gradient gathering, SGD update), median
images/s. Printed: each configuration, the sum of the two 1-core devices alone, and the
hybrid's ratio to that sum (target >= 0.9) and to the fastest single device (target >= 1).
The nets are built as bench/bench_train.py builds them (zoo prototxt, Input layers).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))   # after the installed cct (see bench_train.py)

from bench_train import (NETS, default_zoo, machine, sgd_update, synthetic_net,  # noqa: E402
                         timed_iterations)
from worker import run_worker  # noqa: E402

DEFAULT_NETS = "caffenet_b256,cifar10_quick"


def run(net_name: str, devices: str, zoo: str, warmup: int, iters: int) -> dict:
    from cct.devices import parse_devices
    from cct.scheduler import HybridScheduler

    rel, batch = NETS[net_name]
    net = synthetic_net(pathlib.Path(zoo) / rel, batch)
    scheduler = None
    if devices != "cpu":   # "cpu" (every core, one device) is the plain net
        scheduler = HybridScheduler(net, parse_devices(devices))
    update = sgd_update(net)

    def step():
        net.clear_param_diffs()
        (scheduler.forward_backward if scheduler else net.forward_backward)()
        update()

    times = timed_iterations(step, warmup, iters)
    split = [r.n for r in scheduler.replicas] if scheduler else [batch]
    if scheduler:
        scheduler.close()
    return {"img_s": batch / statistics.median(times), "split": split}


def spawn(net: str, devices: str, args) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", devices,
           "--nets", net, "--zoo", args.zoo, "--iters", str(args.iters), "--warmup",
           str(args.warmup)]
    return run_worker(cmd, f"{net} on {devices}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=DEFAULT_NETS, help=f"comma list of {', '.join(NETS)}")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per configuration")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed iterations first (the scheduler's probe runs in the first)")
    ap.add_argument("--zoo", default=str(default_zoo()), help="the caffe-zoo folder")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run(args.nets, args.worker, args.zoo, args.warmup,
                                         args.iters)))
        return
    from cct.devices import available_cores
    cores = available_cores()
    if len(cores) < 2:
        raise SystemExit("bench: the hybrid bench needs 2 cores")
    a, b = cores[0], cores[1]
    print(f"# {machine()}")
    print(f"# {args.iters} timed iterations after {args.warmup} warm-up, median")
    print(f"{'net':<16} {'cpu:' + str(a):>9} {'cpu:' + str(b):>9} {'sum 1-core':>10} "
          f"{'cpu:2 one':>9} {'hybrid':>9} {'split':>9} {'/sum':>6} {'/best':>6}")
    for net in args.nets.split(","):
        one_a = spawn(net, f"cpu@{a}", args)["img_s"]
        one_b = spawn(net, f"cpu@{b}", args)["img_s"]
        both = spawn(net, "cpu", args)["img_s"]
        hybrid = spawn(net, f"cpu@{a},cpu@{b}", args)
        total = one_a + one_b
        best = max(one_a, one_b, both)
        print(f"{net:<16} {one_a:9.2f} {one_b:9.2f} {total:10.2f} {both:9.2f} "
              f"{hybrid['img_s']:9.2f} {'/'.join(map(str, hybrid['split'])):>9} "
              f"{hybrid['img_s'] / total:6.2f} {hybrid['img_s'] / best:6.2f}", flush=True)


if __name__ == "__main__":
    main()

"""cct on a GPU: the GPU alone, the CPU+GPU hybrid, and PyTorch on the same GPU with the same
nets (issue 5's bench (b)). Needs CuPy (`pip install '.[gpu]'`) and, for the PyTorch column, a
CUDA build of PyTorch; without a usable GPU it says why and exits.

    python bench/bench_gpu.py                                   # CaffeNet b256, AlexNet b256, GoogLeNet b64
    python bench/bench_gpu.py --nets caffenet --iters 10 --tf32 both

Full training iterations on synthetic data (forward, backward, SGD update with momentum and
weight decay), median images/s after warm-up. fp32 with TF32 off on both frameworks
(``CUPY_TF32=0``, ``torch.backends.*.allow_tf32 = False``); ``--tf32 on``/``both`` adds runs
with TF32 allowed on both. Each configuration runs in a subprocess of its own. The nets are
built as bench/bench_train.py builds them (zoo prototxt, Input layers); PyTorch's net is the
same one layer for layer (bench_train.torch_model).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))   # after the installed cct (see bench_train.py)

from bench_train import (default_zoo, sgd_update, synthetic_net,  # noqa: E402
                         torch_training_step)

NETS = {
    "caffenet": ("models/bvlc_reference_caffenet/train_val.prototxt", 256),
    "alexnet": ("models/bvlc_alexnet/train_val.prototxt", 256),
    "googlenet": ("models/bvlc_googlenet/train_val.prototxt", 64),
}


def _timed(step, sync, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_cct(net_name: str, devices: str, zoo: str, warmup: int, iters: int) -> dict:
    from cct.backend import gpu
    from cct.devices import parse_devices
    from cct.scheduler import HybridScheduler

    rel, batch = NETS[net_name]
    device_list = parse_devices(devices)
    hybrid = len(device_list) > 1
    if not hybrid:
        gpu.use_device(device_list[0].index)
    net = synthetic_net(pathlib.Path(zoo) / rel, batch, backend="cpu" if hybrid else "gpu")
    scheduler = HybridScheduler(net, device_list) if hybrid else None
    update = sgd_update(net)

    def step():
        net.clear_param_diffs()
        (scheduler.forward_backward if scheduler else net.forward_backward)()
        update()

    seconds = _timed(step, gpu.synchronize, warmup, iters)
    split = [r.n for r in scheduler.replicas] if scheduler else [batch]
    return {"img_s": batch / seconds, "split": split}


def run_torch(net_name: str, zoo: str, warmup: int, iters: int, tf32: bool) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    rel, batch = NETS[net_name]
    step = torch_training_step(pathlib.Path(zoo) / rel, batch, device="cuda")
    seconds = _timed(step, torch.cuda.synchronize, warmup, iters)
    return {"img_s": batch / seconds, "version": torch.__version__}


def spawn(args, *worker: str, tf32: bool = False) -> dict:
    env = dict(os.environ, CUPY_TF32="1" if tf32 else "0")
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", *worker,
           "--zoo", args.zoo, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--tf32", "on" if tf32 else "off"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join(proc.stderr.splitlines()[-6:])
    return {"error": f"exit {proc.returncode}: {tail}"}


def _fmt(r: dict) -> str:
    return f"{r['img_s']:9.1f}" if "img_s" in r else f"{'failed':>9}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS), help=f"comma list of {', '.join(NETS)}")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tf32", choices=["off", "on", "both"], default="off")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, net, *rest = args.worker
        if kind == "cct":
            result = run_cct(net, rest[0], args.zoo, args.warmup, args.iters)
        else:
            result = run_torch(net, args.zoo, args.warmup, args.iters, args.tf32 == "on")
        print("RESULT " + json.dumps(result))
        return
    from cct.backend import gpu
    ok, reason = gpu.available()
    if not ok:
        raise SystemExit(f"bench_gpu: no usable GPU: {reason}")
    d = gpu.describe(args.gpu)
    print(f"# {d['name']} ({d['total_memory'] / 2**30:.0f} GiB, compute {d['compute_capability']}"
          f", SGEMM {d['sgemm_gflops']:.0f} GFLOP/s measured)")
    print(f"# {args.iters} timed iterations after {args.warmup} warm-up, median images/s")
    print(f"{'net':<10} {'tf32':<5} {'cct gpu':>9} {'cpu+gpu':>9} {'split':>9} {'torch':>9} "
          f"{'cct/torch':>9}")
    for tf32 in {"off": [False], "on": [True], "both": [False, True]}[args.tf32]:
        for net in args.nets.split(","):
            alone = spawn(args, "cct", net, f"gpu{args.gpu}", tf32=tf32)
            hybrid = spawn(args, "cct", net, f"cpu,gpu{args.gpu}", tf32=tf32)
            torch_r = spawn(args, "torch", net, tf32=tf32)
            ratio = (f"{alone['img_s'] / torch_r['img_s']:9.2f}"
                     if "img_s" in alone and "img_s" in torch_r else f"{'-':>9}")
            split = "/".join(map(str, hybrid.get("split", []))) or "-"
            print(f"{net:<10} {'on' if tf32 else 'off':<5} {_fmt(alone)} {_fmt(hybrid)} "
                  f"{split:>9} {_fmt(torch_r)} {ratio}", flush=True)
            for name, r in (("cct gpu", alone), ("cpu+gpu", hybrid), ("torch", torch_r)):
                if "error" in r:
                    print(f"#   {name} failed: {r['error']}")


if __name__ == "__main__":
    main()

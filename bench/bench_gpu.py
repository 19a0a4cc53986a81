"""cct on a GPU against PyTorch on the same GPU, the six nets of bench/bench_train.py: cct's
GPU path (cuDNN convolutions where the frontend is installed), the same nets with engine: CAFFE
(the lowering path), optionally the CPU+GPU hybrid, and PyTorch eager (cuDNN benchmark mode).
Needs CuPy (`pip install '.[gpu-cuda13]'`, which brings the cudnn frontend) and, for the
PyTorch column, a CUDA build of PyTorch; without a usable GPU it says why and exits.

    python bench/bench_gpu.py                                # fp32, TF32 off on both
    python bench/bench_gpu.py --nets caffenet_b256 --iters 10 --tf32 both --hybrid
    python bench/bench_gpu.py --precisions float32,bf16,fp16 # against PyTorch's autocast

Full training iterations on synthetic data (forward, backward, SGD update with momentum and
weight decay), median images/s after warm-up. fp32 with TF32 off on both frameworks
(``CUPY_TF32=0``, ``torch.backends.*.allow_tf32 = False``); ``--tf32 on``/``both`` adds runs
with TF32 allowed on both (cct: ``-precision tf32``). ``--precisions`` adds bf16 and fp16
rows: cct's ``-precision`` (tensor-core GEMMs and convolutions, float32 storage; fp16 with
its loss scale) against PyTorch's autocast to the same type (fp16 with its GradScaler).
Each configuration runs in a subprocess of its own. Peak memory:
what CuPy's pool holds after the run (it keeps what it took) against PyTorch's
max_memory_reserved. "of peak": the net's training FLOPs per second over the GPU's GEMM rate
in the row's precision measured by `cct device_query` (cct.backend.gpu.describe: float32
through CuPy, TF32/bf16/fp16 through cct's cuBLAS handle on the tensor cores).
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

from bench_train import (NETS, default_zoo, sgd_update, synthetic_net,  # noqa: E402
                         torch_training_step, training_flops_per_image)


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


def _replayed(net, update, warmup: int, iters: int, batch: int) -> dict:
    """The same iteration as ``cct train`` runs it on a GPU by default: the layers after the
    data layers replayed as a CUDA graph (cct/graphed.py: captured after its warm-up,
    checked against an eager pass): {"graph_img_s": ...}, or {"graph_error": why it stayed
    eager}."""
    from cct.graphed import WARMUP, GraphedSource

    source = GraphedSource(net)

    def step():
        net.clear_param_diffs()
        source.compute_gradients()
        update()
    seconds = _timed(step, net.backend.synchronize, warmup + WARMUP + 1, iters)
    if source.graph is None:
        return {"graph_error": source.refused}
    return {"graph_img_s": batch / seconds}


def run_cct(net_name: str, devices: str, zoo: str, warmup: int, iters: int,
            engine: str = "", graphs: bool = False, precision: str = "float32") -> dict:
    """cct's iteration on ``devices`` (a GPU, a CPU+GPU split; the stand-in device too, which
    is how CI runs this without a GPU), its GEMMs and convolutions in ``precision``."""
    from cct.backend import get, gpu
    from cct.devices import parse_devices
    from cct.scheduler import HybridScheduler, master_place
    from cct.solver.loss_scale import LossScale

    rel, batch = NETS[net_name]
    # The nets where cct train puts them: the master (weights, update) on the GPU, the
    # scheduler splitting each batch over the devices when there are several.
    device_list, backend = master_place(parse_devices(devices), "cpu")
    hybrid = device_list is not None
    if backend != "cpu":
        get(backend).set_precision(precision)
    net = synthetic_net(pathlib.Path(zoo) / rel, batch, backend=backend, engine=engine)
    flops = training_flops_per_image(net)   # before the scheduler takes the batch apart
    if not hybrid:
        from cct.blob_memory import share_blob_diffs
        share_blob_diffs(net)   # as cct train lays a lone train net's diffs out (less memory)
    scheduler = HybridScheduler(net, device_list) if hybrid else None
    # fp16 as the solver trains it: backward from a scaled loss, unscaled before the update
    scale = LossScale(net) if precision == "fp16" and not hybrid else None
    sgd = sgd_update(net)

    def update():
        if scale is None or scale.unscale(0):
            sgd()

    def step():
        net.clear_param_diffs()
        if scheduler:
            scheduler.forward_backward()
        else:
            net.forward_backward(defer=True)   # as the solver runs it: the loss stays there
        update()

    try:
        seconds = _timed(step, net.backend.synchronize, warmup, iters)
        split = [r.n for r in scheduler.replicas] if scheduler else [batch]
        # What each replica's copies cost: one after the other (measured at the first split),
        # and what was left of them while they overlapped its passes (its last iteration's
        # wait)
        copies = [{"device": r.device.name, "n": r.n, "serial_ms": 1e3 * r.serial_copies,
                   "waited_ms": 1e3 * r.copies.waited}
                  for r in scheduler.replicas if r.copies is not None] if scheduler else []
    finally:
        if scheduler:
            # gives back the process's BLAS thread count it set for its CPU devices: a later
            # run in this process (a test) must plan and round with the count it had
            scheduler.close()
    cudnn = getattr(gpu, "convolutions", None)
    graph = {} if hybrid or not graphs else _replayed(net, update, warmup, iters, batch)
    pool = {"pool_mb": gpu.cupy.get_default_memory_pool().total_bytes() / 2**20} \
        if gpu.cupy is not None else {}
    return {"img_s": batch / seconds, "split": split, "copies": copies, **graph, **pool,
            "flops": flops, "skipped": scale.skips_total if scale else 0,
            "cudnn_graphs": len(cudnn.table) if cudnn is not None else 0,
            "cudnn_refused": len(cudnn.refused()) if cudnn is not None else 0}


def run_torch(net_name: str, zoo: str, warmup: int, iters: int, tf32: bool,
              precision: str = "float32") -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    rel, batch = NETS[net_name]
    step = torch_training_step(pathlib.Path(zoo) / rel, batch, device="cuda",
                               bf16=precision == "bf16", fp16=precision == "fp16")
    seconds = _timed(step, torch.cuda.synchronize, warmup, iters)
    return {"img_s": batch / seconds, "version": torch.__version__,
            "pool_mb": torch.cuda.max_memory_reserved() / 2**20}


def spawn(args, *worker: str, tf32: bool = False, precision: str = "float32") -> dict:
    env = dict(os.environ, CUPY_TF32="1" if tf32 else "0")
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", *worker,
           "--zoo", args.zoo, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--tf32", "on" if tf32 else "off", "--precisions", precision] + (
               ["--graph"] if args.graph else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join(proc.stderr.splitlines()[-6:])
    return {"error": f"exit {proc.returncode}: {tail}"}


def _fmt(r: dict, key: str = "img_s", width: int = 9) -> str:
    return f"{r[key]:{width}.1f}" if key in r else f"{'-':>{width}}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS), help=f"comma list of {', '.join(NETS)}")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tf32", choices=["off", "on", "both"], default="off")
    ap.add_argument("--precisions", default="float32",
                    help="comma list of float32, bf16, fp16: rows against PyTorch's autocast")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--hybrid", action="store_true", help="add the CPU+GPU hybrid column")
    ap.add_argument("--no-caffe-engine", action="store_true",
                    help="leave out the engine: CAFFE (lowering) column")
    ap.add_argument("--graph", action="store_true",
                    help="add a column: the iteration captured as a CUDA graph and replayed")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per configuration")
    ap.add_argument("--json", default="", help="write the rows here too")
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, net, *rest = args.worker
        # TF32 is a precision of cct's own (its GEMMs are on a cuBLAS handle of its own)
        precision = "tf32" if args.tf32 == "on" and args.precisions == "float32" \
            else args.precisions
        if kind == "cct":
            result = run_cct(net, rest[0], args.zoo, args.warmup, args.iters,
                             rest[1] if len(rest) > 1 else "", args.graph, precision)
        else:
            result = run_torch(net, args.zoo, args.warmup, args.iters, args.tf32 == "on",
                               args.precisions)
        print("RESULT " + json.dumps(result))
        return
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = set(precisions) - {"float32", "bf16", "fp16"}
    if unknown:
        ap.error(f"--precisions: {', '.join(sorted(unknown))}: float32, bf16 or fp16 (TF32: "
                 f"--tf32)")
    from cct.backend import cudnn, gpu
    ok, reason = gpu.available()
    if not ok:
        raise SystemExit(f"bench_gpu: no usable GPU: {reason}")
    d = gpu.describe(args.gpu)
    print(f"# {d['name']} ({d['total_memory'] / 2**30:.0f} GiB, compute {d['compute_capability']}"
          f", GEMM GFLOP/s measured: " + ", ".join(f"{p} {g:.0f}" for p, g in
                                                    d["gemm_gflops"].items())
          + f"); {cudnn.available()[1]}")
    print(f"# {args.iters} timed iterations after {args.warmup} warm-up, median images/s; "
          "MiB: peak memory held (CuPy's pool / PyTorch's reserved)")
    print(f"{'net':<14} {'prec':<7} {'cct gpu':>9} {'graph':>9} {'CAFFE':>9} {'cpu+gpu':>9} "
          f"{'split':>9} {'torch':>9} {'cct/torch':>9} {'of peak':>7} {'cct MiB':>8} "
          f"{'torch MiB':>9}")
    rows = []
    configs = [(tf32, "float32") for tf32 in
               {"off": [False], "on": [True], "both": [False, True]}[args.tf32]
               if "float32" in precisions] + [(False, p) for p in precisions if p != "float32"]
    for tf32, prec in configs:
        label = "tf32" if tf32 else prec
        for net in args.nets.split(","):
            kw = dict(tf32=tf32, precision=prec)
            alone = spawn(args, "cct", net, f"gpu{args.gpu}", **kw)
            caffe = ({} if args.no_caffe_engine else
                     spawn(args, "cct", net, f"gpu{args.gpu}", "CAFFE", **kw))
            hybrid = spawn(args, "cct", net, f"cpu,gpu{args.gpu}", **kw) \
                if args.hybrid else {}
            torch_r = spawn(args, "torch", net, **kw)
            ratio = (f"{alone['img_s'] / torch_r['img_s']:9.2f}"
                     if "img_s" in alone and "img_s" in torch_r else f"{'-':>9}")
            # the share of the GEMM peak of the precision the row runs in
            peak = d["gemm_gflops"][label] * 1e9
            share = (f"{alone['img_s'] * alone['flops'] / peak:7.0%}"
                     if "img_s" in alone else f"{'-':>7}")
            split = "/".join(map(str, hybrid.get("split", []))) or "-"
            print(f"{net:<14} {label:<7} {_fmt(alone)} "
                  f"{_fmt(alone, 'graph_img_s')} {_fmt(caffe)} "
                  f"{_fmt(hybrid)} {split:>9} {_fmt(torch_r)} {ratio} {share} "
                  f"{_fmt(alone, 'pool_mb', 8)} {_fmt(torch_r, 'pool_mb', 9)}", flush=True)
            rows.append({"net": net, "tf32": tf32, "precision": prec, "cct": alone,
                         "caffe_engine": caffe,
                         "hybrid": hybrid, "torch": torch_r})
            for name, r in (("cct gpu", alone), ("CAFFE", caffe), ("cpu+gpu", hybrid),
                            ("torch", torch_r)):
                if "error" in r:
                    print(f"#   {name} failed: {r['error']}")
            for c in hybrid.get("copies", []):
                print(f"#   cpu+gpu: {c['device']} ({c['n']} images) copies {c['serial_ms']:.3g} "
                      f"ms one after the other, {c['waited_ms']:.3g} ms left unhidden when "
                      f"overlapping its passes")
            if "graph_error" in alone:
                print(f"#   graph not captured: {alone['graph_error']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"gpu": d, "cudnn": cudnn.available()[1], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

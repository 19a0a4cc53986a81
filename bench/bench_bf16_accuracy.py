"""Reduced precision against float32 at equal iterations (issue 16, item 4 on the CPU; issue
29, item 4 on a GPU): LeNet on mnist10k with Caffe's solver, and CIFAR10-quick on
bench_strategies' learnable synthetic images, each trained once in float32 and once in each
reduced precision, from the same seed; printed: each run's held-out accuracy and loss, the gap
to float32 in points (the target: within 0.3), and the times.

    python bench/bench_bf16_accuracy.py                  # LeNet 2,000 and CIFAR10-quick 2,000
    python bench/bench_bf16_accuracy.py --quick          # 200 iterations each: checks it works
    python bench/bench_bf16_accuracy.py --work lenet3x3 --deterministic  # bf16 Winograd products
    python bench/bench_bf16_accuracy.py --device gpu     # tf32, bf16, fp16 on GPU 0
    python bench/bench_bf16_accuracy.py --device standin # the same on the stand-in device

On a device the precisions are the tensor cores' (cct/backend/reduced.py; fp16 with its loss
scale). The stand-in device rounds its GEMMs' operands exactly as tensor cores do
(convolutions lowered to GEMMs there), so its accuracies are the numerics a GPU's cuBLAS
path gets without a GPU; its times are NumPy's and measure nothing.

On a CPU without bf16 units cct would train float32 (and say so): there the bf16 runs ask for
MKL's emulation, the same numerics, so the accuracy is what a CPU with AMX or AVX512-BF16
gets; their times are then no measure of bf16's speed (bench_train.py --precision bf16 is, on
such a CPU). Each bf16 row names the engine that ran (precision.py races them).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import List, Optional

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct; the repository gives only
# the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import default_data_dir, mnist_lmdbs  # noqa: E402
from bench.bench_momentum import solver_param as lenet_solver  # noqa: E402
from bench.bench_strategies import cifar_h5, cifar_solver, evaluate  # noqa: E402
from bench.bench_train import default_zoo  # noqa: E402
from bench.worker import cpu_model, run_worker  # noqa: E402
from cct.install import install_hint  # noqa: E402

WORKS = ("lenet", "cifar10_quick")
# lenet3x3: LeNet with conv2 a 3x3 layer (pad 1, the same top size), whose 20 -> 50 channels
# the races may put on Winograd F(2x2, 3x3), the one layout whose products bf16 may take
# (csrc/conv_winograd.cpp); LeNet's and CIFAR10-quick's layers are all 5x5. Asked for by name.
EXTRA_WORKS = ("lenet3x3",)
PRECISIONS = {"cpu": ("float32", "bf16"), "gpu": ("float32", "tf32", "bf16", "fp16")}
PRECISIONS["standin"] = PRECISIONS["gpu"]
BACKEND = {"cpu": "cpu", "gpu": "gpu", "standin": "numpy"}
FULL, QUICK = 2000, 200
GAP_POINTS = 0.3


def solver_for(job: dict):
    if job["work"] in ("lenet", "lenet3x3"):
        train, test = mnist_lmdbs(pathlib.Path(job["data"]))
        param = lenet_solver(train, test, 0.01, job["iters"])
        if job["work"] == "lenet3x3":
            (conv2,) = [lp for lp in param.net_param.layer if lp.name == "conv2"]
            conv2.convolution_param.kernel_size[:] = [3]
            conv2.convolution_param.pad[:] = [1]
    else:
        train, test = cifar_h5(pathlib.Path(job["data"]) / "cifar")
        param = cifar_solver(pathlib.Path(job["zoo"]), train, test, job["iters"])
    param.display = 0
    param.random_seed = 1701
    return param


def run_one(job: dict) -> dict:
    from cct import _C, glog
    from cct.api import Solver
    from cct.proto import caffe_pb2
    glog.set_quiet(True)
    from cct.backend import get, plans
    param = solver_for(job)
    device = job.get("device", "cpu")
    backend = BACKEND[device]
    if device == "gpu":
        get("gpu").use_device(0)
    if job["precision"] == "bf16" and device == "cpu":
        os.environ["CCT_BF16"] = "emulate"
    param.precision = caffe_pb2.SolverParameter.Precision.Value(job["precision"].upper())
    if job.get("deterministic"):
        plans.set_deterministic(True)
    solver = Solver(param, source=f"{job['work']} solver", backend=backend)
    try:
        applied = (_C.bf16_gemm_enabled() == (job["precision"] == "bf16") if device == "cpu"
                   else get(backend).precision() == job["precision"])
        assert applied, "precision not applied"
        t0 = time.perf_counter()
        solver.step(job["iters"])
        seconds = time.perf_counter() - t0
        accuracy, loss = evaluate(solver, None)
    finally:
        solver.close()
    batched = plans.table().get("gemm_batch", []) if device == "cpu" else []
    return {**job, "accuracy": accuracy, "loss": loss, "seconds": seconds,
            # the batched GEMMs (Winograd F(2x2, 3x3)'s, the pointwise layout's) run in bf16,
            # on the chosen engine or on one raced shape by shape
            "bf16_batches": sum(r[-1] in (plans.BF16_ITEMS_CHOICE, *plans.BF16_ENGINE_CHOICES)
                                for r in batched),
            "batches": len(batched),
            "native": device != "cpu" or bool(_C.cpu_has_bf16_units()),
            "engine": _C.bf16_engine() if device == "cpu" else backend,
            "loss_scale": solver.loss_scale.scale if solver.loss_scale else None,
            "skipped": solver.loss_scale.skips_total if solver.loss_scale else 0}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK} iterations per run")
    ap.add_argument("--iters", type=int, default=0, help=f"iterations per run ({FULL})")
    ap.add_argument("--work", default=",".join(WORKS),
                    help=f"from {', '.join(WORKS + EXTRA_WORKS)}")
    ap.add_argument("--device", choices=sorted(BACKEND), default="cpu")
    ap.add_argument("--precisions", default="", help="a comma-separated subset of the "
                    "device's (reduced ones compared with float32, which always runs)")
    ap.add_argument("--zoo", default=str(default_zoo()), help="the caffe-zoo folder")
    ap.add_argument("--data", default=str(default_data_dir().parent / "bench_data"),
                    help="where the LMDBs and synthetic images are made once")
    ap.add_argument("--deterministic", action="store_true",
                    help="plans by rule, not by the races (as cct train --deterministic): bf16 "
                    "then takes every batched GEMM it may, Winograd F(2x2, 3x3)'s products "
                    "among them, where the races may keep them float32")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_one(json.loads(args.worker))))
        return 0
    from cct.backend import precision
    if args.device == "cpu" and not precision.has_engine():
        ap.error(f"no bf16 GEMM engine: {install_hint('bf16')} (Intel MKL), or a CPU with "
                 "AVX512-BF16 for cct's own")
    names = [p.strip() for p in args.precisions.split(",") if p.strip()] or \
        list(PRECISIONS[args.device])
    unknown = set(names) - set(PRECISIONS[args.device])
    if unknown:
        ap.error(f"--precisions: {', '.join(sorted(unknown))} not among the {args.device}'s "
                 f"{', '.join(PRECISIONS[args.device])}")
    names = ["float32"] + [p for p in names if p != "float32"]
    iters = args.iters or (QUICK if args.quick else FULL)
    works = [w.strip() for w in args.work.split(",") if w.strip()]
    unknown = set(works) - set(WORKS + EXTRA_WORKS)
    if unknown:
        ap.error(f"--work: {', '.join(sorted(unknown))} not among "
                 f"{', '.join(WORKS + EXTRA_WORKS)}")
    where = {"cpu": f"CPU: {cpu_model()}", "standin": "the stand-in device (NumPy, tensor-core "
             "rounding emulated)", "gpu": "GPU 0"}[args.device]
    print(f"{where}; {iters} iterations per run, seed 1701")
    print(f"{'net':<15}{'precision':>10}{'accuracy':>10}{'loss':>9}{'seconds':>9}")
    failed = False
    for work in works:
        runs = {}
        for name in names:
            job = {"work": work, "precision": name, "iters": iters, "data": args.data,
                   "zoo": args.zoo, "device": args.device,
                   "deterministic": args.deterministic}
            runs[name] = run_worker([sys.executable, str(pathlib.Path(__file__).resolve()),
                                     "--worker", json.dumps(job)], f"{work} in {name}")
            r = runs[name]
            label = name if name == "float32" or r["native"] else f"{name} (emu)"
            extra = (f"  engine {r['engine']}, {r['bf16_batches']} of {r['batches']} batched "
                     f"GEMM plans in bf16" if name == "bf16" and args.device == "cpu" else "")
            if r.get("loss_scale"):
                extra += f"  loss scale {r['loss_scale']:g}, {r['skipped']} updates skipped"
            print(f"{work:<15}{label:>10}{r['accuracy']:>10.4f}{r['loss']:>9.4f}"
                  f"{r['seconds']:>9.1f}{extra}", flush=True)
        for name in names[1:]:
            gap = 100 * (runs[name]["accuracy"] - runs["float32"]["accuracy"])
            ok = gap >= -GAP_POINTS
            failed |= not ok
            print(f"{work:<15}{'gap':>10}{gap:>+9.2f} points ({name} - float32; target >= "
                  f"-{GAP_POINTS}: {'met' if ok else 'MISSED'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The driver's strategies against each other on the same work (issues 10 and 30): sync, async,
hogbatch, adaptive-hogbatch and sma, to a target, on two real 1-core devices, on the
simulated engine with devices of speeds 1:8, and on the machine's own devices (a GPU and the
CPU's cores).

    python bench/bench_strategies.py                         # both workloads, both settings
    python bench/bench_strategies.py --work lenet --setting simulated --cap 3000
    python bench/bench_strategies.py --setting devices --devices=cpu,gpu0   # CPU + GPU

Workloads:
* ``lenet``: examples/mnist/lenet_solver.prototxt's settings (base_lr 0.01, inv policy, seed
  1701) on mnist10k; target: test accuracy on the 2,000 held-out digits >= ``--target``
  (0.98), also read off the same curves for 0.975.
* ``cifar10_quick``: the zoo's cifar10_quick_train_test.prototxt (base_lr 0.001, fixed) on
  synthetic 3x32x32 images that can be learned: ten class templates plus unit noise (5,000
  for training, 1,000 held out, written to HDF5 once); target: held-out loss <= ``--loss``.

Settings:
* ``real``: two 1-core CPU devices (threads engine). sync splits each batch of 64 (100 for
  CIFAR) across both (the hybrid scheduler); async gives each group the whole batch;
  hogbatch 16 and 64 (25 and 100); adaptive-hogbatch starts there; sma runs two learners of
  half the batch.
* ``simulated``: the simulated engine with device speeds 1 and 8 records per virtual second
  (kernel plans fixed, one thread: iterations repeat exactly). sync's virtual time is that of
  an ideal split (batch / 9 per iteration); hogbatch gives the slow device 1/8 of the fast
  one's batch; adaptive-hogbatch starts both at the full batch and finds that itself; sma
  runs one learner per device on half the batch each (a round waits for the slow one).
* ``devices``: ``--devices`` (default ``cpu,gpu0``: the CPU's cores and a GPU), wall time.
  ``alone`` trains on the fastest device by itself (``--alone``, default the last one named:
  the GPU), the solver's nets on it (no copies); sync is the hybrid split of each batch across
  all of them, by measured speed; async, hogbatch, adaptive-hogbatch and sma run one group
  (learner) per device, the parameter store on the device with memory of its own (as
  ``cct train`` places it); hogbatch gives a CPU group a quarter of the batch and a device
  group the whole batch (CPU+GPU Hogbatch's small and large batches), adaptive-hogbatch starts
  there; sma gives each learner the batch over the learner count. ``--devices=cpu:1,standin``
  runs the same on a machine without a GPU (the stand-in device: NumPy behind the device
  interface), to check the bench, not to measure.

Printed per workload and setting: per strategy, iterations (updates), epochs (records read /
training-set size) and seconds (virtual seconds when simulated) to each target, and each
group's share of the updates (the hybrid sync's: each device's share of the batch); the ratios
of epochs and seconds to the base's (``alone`` with devices, else sync). The test passes are not timed.
Written: ``--json`` with every curve and a PNG of accuracy (loss) against epochs and seconds.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import sys
import time
from typing import List, Optional

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct (a source checkout lacks the
# compiled _C after a non-editable install); the repository gives only the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import cpu_model, default_data_dir, mnist_lmdbs  # noqa: E402
from bench.bench_momentum import solver_param as lenet_solver  # noqa: E402
from bench.worker import one_thread_env, run_worker  # noqa: E402

STRATEGIES = ("sync", "async", "hogbatch", "adaptive-hogbatch", "sma")
SETTINGS = ("real", "simulated")          # the default; "devices" is asked for by name
WORKS = ("lenet", "cifar10_quick")
MNIST_TRAIN = 10000 - 2000          # mnist10k: 8,000 training digits, 2,000 held out
CIFAR_TRAIN, CIFAR_TEST = 5000, 1000


def device_kw(strategy: str, names: List[str], batch: int) -> dict:
    """The Driver arguments of a strategy on the machine's devices ``names`` (one group or
    learner per device; see the module doc); {} for alone and sync (the solver's own)."""
    if strategy in ("alone", "sync"):
        return {}
    kw = {"strategy": strategy, "groups": None, "devices": ",".join(names),
          "engine": "threads"}
    on_cpu = [n.split(":")[0].split("@")[0] == "cpu" for n in names]
    if strategy in ("hogbatch", "adaptive-hogbatch"):
        kw["batch_sizes"] = [max(1, batch // 4) if c else batch for c in on_cpu]
    elif strategy == "sma":
        kw.update(learners=len(names), batch_sizes=[batch // len(names)] * len(names))
    return kw


def strategy_kw(strategy: str, setting: str, batch: int) -> dict:
    """The Driver arguments of a strategy in a setting (see the module doc)."""
    if strategy == "sync":
        return {}
    kw = {"strategy": strategy}
    if setting == "simulated":
        kw.update(engine="simulated", simulate_speeds=[1.0, 8.0])
        small = max(1, batch // 8)
    else:
        kw.update(engine="threads")
        small = batch // 4
    if strategy == "async":
        kw.update(groups=2)
    elif strategy == "hogbatch":
        kw.update(groups=2, batch_sizes=[small, batch])
    elif strategy == "adaptive-hogbatch":
        kw.update(groups=2, batch_sizes=[batch if setting == "simulated" else small, batch])
    else:
        kw.update(learners=2, batch_sizes=[batch // 2, batch // 2])
    return kw


# -- the synthetic CIFAR set ------------------------------------------------------------------
def cifar_h5(data_dir: pathlib.Path) -> tuple:
    """(train list, test list) of HDF5 files: class template (fixed, seed 0) + N(0, 1)
    noise, labels uniform; written once."""
    import h5py
    import numpy as np
    out = []
    for name, n, seed in (("train", CIFAR_TRAIN, 1), ("test", CIFAR_TEST, 2)):
        path = data_dir / f"synthetic_cifar_{name}.h5"
        listing = data_dir / f"synthetic_cifar_{name}.txt"
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            templates = np.random.default_rng(0).standard_normal((10, 3, 32, 32))
            rng = np.random.default_rng(seed)
            labels = rng.integers(0, 10, n)
            data = templates[labels] + rng.standard_normal((n, 3, 32, 32))
            part = path.with_suffix(f".part{os.getpid()}")
            with h5py.File(part, "w") as f:
                f["data"] = data.astype(np.float32)
                f["label"] = labels.astype(np.float32)
            os.replace(part, path)
        listing.write_text(f"{path}\n")
        out.append(str(listing))
    return out[0], out[1]


def cifar_solver(zoo: pathlib.Path, train: str, test: str, cap: int):
    from cct.io.prototxt import read_net_text
    from cct.proto import caffe_pb2
    net = read_net_text(str(zoo / "examples/cifar10/cifar10_quick_train_test.prototxt"))
    for lp in net.layer:
        if lp.type == "Data":
            is_train = any(r.phase == caffe_pb2.TRAIN for r in lp.include)
            batch = lp.data_param.batch_size
            lp.type = "HDF5Data"
            lp.ClearField("data_param")
            lp.ClearField("transform_param")
            lp.hdf5_data_param.source = train if is_train else test
            lp.hdf5_data_param.batch_size = batch
    param = caffe_pb2.SolverParameter()
    param.net_param.CopyFrom(net)
    param.base_lr, param.momentum, param.weight_decay = 0.001, 0.9, 0.004
    param.lr_policy = "fixed"
    param.random_seed = 1701
    param.max_iter = cap
    param.test_iter.append(CIFAR_TEST // 100)
    param.test_interval = 1 << 30
    param.test_initialization = False
    param.snapshot_after_train = False
    return param


def evaluate(solver, driver) -> tuple:
    """(accuracy, loss) over the held-out set, with the solver's current (central) weights."""
    if driver is not None:
        driver.pull_statistics()
    net = solver.test_nets[0]
    net.share_trained_layers_with(solver.net)
    n = solver.param.test_iter[0]
    acc = loss = 0.0
    names = net.blob_names
    acc_name = "accuracy" if "accuracy" in names else None
    for _ in range(n):
        net.forward_prefilled()
        acc += float(net.blobs[acc_name].data) if acc_name else 0.0
        loss += float(net.blobs["loss"].data)
    return acc / n, loss / n


# -- one run, in a process of its own ---------------------------------------------------------
def run_one(job: dict) -> dict:
    from cct.backend import cpu, plans
    from cct.errors import CCTError
    simulated = job["setting"] == "simulated"
    if simulated:
        cpu.set_num_threads(1)
        plans.set_deterministic(True)
    if job["work"] == "lenet":
        train, test = mnist_lmdbs(pathlib.Path(job["data_dir"]))
        param = lenet_solver(train, test, 0.01, job["cap"])
        batch, train_size = 64, MNIST_TRAIN
    else:
        train, test = cifar_h5(pathlib.Path(job["data_dir"]))
        param = cifar_solver(pathlib.Path(job["zoo"]), train, test, job["cap"])
        batch, train_size = 100, CIFAR_TRAIN
    solver, driver, kw = _build(job, param, batch)
    step = driver.step if driver else solver.step
    trained = 0.0
    curve = []
    diverged = None
    try:
        while solver.iter < job["cap"]:
            t0 = time.perf_counter()
            try:
                step(min(job["every"], job["cap"] - solver.iter))
            except CCTError as e:      # the solver's NaN stop: a result, reported as such
                if "loss is" not in str(e):
                    raise
                diverged = solver.iter
                break
            trained += time.perf_counter() - t0
            acc, loss = evaluate(solver, driver)
            if not math.isfinite(loss):
                break
            if driver is None:
                records = solver.iter * batch
                virtual = records / 9.0
            else:
                records = sum(driver.feeder.records.values())
                if simulated:
                    virtual = (driver.engine.now() if job["strategy"] != "sma"
                               else driver.sma.seconds)
            curve.append({"iter": solver.iter, "epochs": records / train_size,
                          "seconds": virtual if simulated else trained,
                          "accuracy": acc, "loss": loss})
            if job["work"] == "lenet" and acc >= job["target"] - 1e-9:
                break
            if job["work"] != "lenet" and loss <= job["loss"]:
                break
        updates = {}
        if driver is not None and driver.balance is not None:
            updates = {str(k): v for k, v in driver.balance.updates.items()}
        elif driver is None and getattr(solver.gradient_source, "split", None):
            # the hybrid sync's shares: each device's images of the last batch
            updates = {str(k): v for k, v in enumerate(solver.gradient_source.split)}
        return {**{k: job[k] for k in ("work", "setting", "strategy", "cap", "every")},
                "kw": {k: v for k, v in kw.items()}, "curve": curve, "updates": updates,
                "diverged": diverged,
                "batches": [g.batch for g in driver.groups] if driver else [batch]}
    finally:
        if driver:
            driver.close()
        solver.close()


def _build(job: dict, param, batch: int):
    """(solver, driver or None, the driver's arguments) of a job."""
    from cct.api import Solver
    from cct.driver import Driver
    from cct.scheduler import master_place
    if job["setting"] != "devices":
        kw = strategy_kw(job["strategy"], job["setting"], batch)
        devices = "cpu:1,cpu:1" if job["setting"] == "real" and not kw else None
        solver = Solver(param, devices=devices)
        return solver, (Driver(solver, **kw) if kw else None), kw
    names = [n.strip() for n in job["devices"].split(",") if n.strip()]
    kw = device_kw(job["strategy"], names, batch)
    if job["strategy"] == "alone":
        return Solver(param, devices=job["alone"] or names[-1]), None, kw
    if not kw:
        return Solver(param, devices=",".join(names)), None, kw
    # The store where cct train puts it: on the device with memory of its own.
    _, backend = master_place(kw["devices"], "cpu")
    solver = Solver(param, backend=backend)
    return solver, Driver(solver, **kw), kw


def first(curve: List[dict], done) -> Optional[dict]:
    return next((p for p in curve if done(p)), None)


def spawn(job: dict) -> dict:
    # One thread for the 1-core devices and the simulated engine; the machine's devices use
    # their cores as cct train would.
    env = None if job["setting"] == "devices" else one_thread_env()
    return run_worker([sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                       json.dumps(job)], f"{job['work']} {job['setting']} {job['strategy']}",
                      env)


def gpu_names() -> str:
    """The GPUs CuPy sees, by name (for the header: RESULTS names every device measured)."""
    try:
        import cupy
        return ", ".join(cupy.cuda.runtime.getDeviceProperties(i)["name"].decode()
                         for i in range(cupy.cuda.runtime.getDeviceCount())) or "no GPU"
    except Exception as e:  # no CuPy, no driver: the header says so
        return f"no GPU ({type(e).__name__})"


def report(runs: List[dict], args) -> List[str]:
    lines = []
    for work in args.work:
        targets = ([("acc", args.target), ("acc", 0.975)] if work == "lenet"
                   else [("loss", args.loss)])
        for setting in args.setting:
            rows = [r for r in runs if r["work"] == work and r["setting"] == setting]
            if not rows:
                continue
            unit = "virtual s" if setting == "simulated" else "s"
            for kind, value in targets:
                what = (f"test accuracy >= {value}" if kind == "acc"
                        else f"held-out loss <= {value}")
                lines.append(f"\n{work}, {setting}: to {what}")
                ref = next((r for r in rows if r["strategy"] == "alone"),
                           next((r for r in rows if r["strategy"] == "sync"), None))
                name = ref["strategy"] if ref else "sync"
                lines.append(f"| strategy | iterations | epochs | {unit} | epochs / {name}'s | "
                             f"{unit} / {name}'s | update shares | final batches |")
                lines.append("|---|---|---|---|---|---|---|---|")

                def hit(p, kind=kind, value=value):
                    return (p["accuracy"] >= value - 1e-9 if kind == "acc"
                            else p["loss"] <= value)
                base = first(ref["curve"], hit) if ref else None
                for r in rows:
                    p = first(r["curve"], hit)
                    total = sum(r["updates"].values())
                    shares = ("/".join(f"{100 * v / total:.0f}%" for _, v in
                                       sorted(r["updates"].items())) if total else "-")
                    if p is None:
                        cells = [f"diverged at {r['diverged']}" if r.get("diverged") is not None
                                 else f">{r['cap']}", "-", "-", "-", "-"]
                    else:
                        ratio = f"{p['epochs'] / base['epochs']:.2f}" if base else "-"
                        faster = (f"{p['seconds'] / base['seconds']:.2f}"
                                  if base and base["seconds"] else "-")
                        cells = [str(p["iter"]), f"{p['epochs']:.2f}", f"{p['seconds']:.4g}",
                                 ratio, faster]
                    lines.append(f"| {r['strategy']} | " + " | ".join(cells)
                                 + f" | {shares} | {','.join(map(str, r['batches']))} |")
    return lines


def plot(runs: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["work"], r["setting"]) for r in runs})
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for row, (work, setting) in enumerate(panels):
        metric = "accuracy" if work == "lenet" else "loss"
        for r in (r for r in runs if (r["work"], r["setting"]) == (work, setting)):
            for col, x in enumerate(("epochs", "seconds")):
                axes[row][col].plot([p[x] for p in r["curve"]], [p[metric] for p in r["curve"]],
                                    label=r["strategy"], marker=".")
        for col, x in enumerate(("epochs", "virtual seconds" if setting == "simulated"
                                 else "seconds")):
            ax = axes[row][col]
            ax.set_title(f"{work}, {setting}")
            ax.set_xlabel(x)
            ax.set_ylabel(f"held-out {metric}")
            if metric == "accuracy":
                ax.set_ylim(0.9, 1.0)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=",".join(WORKS))
    ap.add_argument("--setting", default=",".join(SETTINGS))
    ap.add_argument("--strategies", default=None, help="default: all five (and alone, with "
                    "--setting=devices)")
    ap.add_argument("--devices", default="cpu,gpu0", help="--setting=devices: the machine's "
                    "devices, one group per device (cpu:1,standin checks the bench without a "
                    "GPU)")
    ap.add_argument("--alone", default=None, help="--setting=devices: the device that trains "
                    "alone (default: the last of --devices)")
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--loss", type=float, default=0.3)
    ap.add_argument("--cap", type=int, default=3000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--data-dir", default=str(default_data_dir()))
    ap.add_argument("--zoo", default=str(pathlib.Path(os.environ.get(
        "CCT_SHARED", REPO.parent / "shared")) / "caffe-zoo"))
    ap.add_argument("--json", default=str(REPO / "bench" / "strategies.json"))
    ap.add_argument("--png", default=str(REPO / "bench" / "strategies.png"))
    ap.add_argument("--report", help="JSON files of earlier runs (comma-separated): print "
                    "their tables and draw the PNG, running nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        from cct import glog
        glog.set_quiet(True)         # the worker's own process: its result line is the output
        print("RESULT " + json.dumps(run_one(json.loads(args.worker))))
        return
    if args.strategies is None:
        args.strategies = ",".join(("alone",) + STRATEGIES)
    for name in ("work", "setting", "strategies"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    if args.report:
        runs = []
        for path in args.report.split(","):
            with open(path) as f:
                saved = json.load(f)
            print(f"# {path}: {saved['cpu']}")
            runs += saved["runs"]
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "runs": runs}, f)
        print("\n".join(report(runs, args)))
        plot(runs, args.png)
        return
    runs = []
    print(f"# {cpu_model()}, {os.cpu_count()} cores, {datetime.date.today()}"
          + (f"; --devices={args.devices}; {gpu_names()}" if "devices" in args.setting else ""))
    for work in args.work:
        for setting in args.setting:
            for strategy in args.strategies:
                if strategy == "alone" and setting != "devices":
                    continue          # the device alone is the devices setting's base
                job = {"work": work, "setting": setting, "strategy": strategy,
                       "cap": args.cap, "every": args.every, "target": args.target,
                       "loss": args.loss, "data_dir": args.data_dir, "zoo": args.zoo,
                       "devices": args.devices, "alone": args.alone}
                t0 = time.perf_counter()
                runs.append(spawn(job))
                print(f"  {work} {setting} {strategy}: {len(runs[-1]['curve'])} checks, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
                with open(args.json, "w") as f:
                    json.dump({"cpu": cpu_model(), "runs": runs}, f)
    print("\n".join(report(runs, args)))
    plot(runs, args.png)


if __name__ == "__main__":
    from cct.errors import CCTError
    try:
        main()
    except CCTError as e:   # a device this machine lacks, a bad flag: one line, no traceback
        raise SystemExit(f"bench_strategies: {e}")

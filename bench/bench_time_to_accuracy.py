"""Time to accuracy, probes included (issue 12, item 5): Caffe's own solver settings against
Omnivore's optimizer and cct's ``--optimize``, on one machine, in one run.

    python bench/bench_time_to_accuracy.py              # the full benchmark (a quiet machine)
    python bench/bench_time_to_accuracy.py --quick      # small caps: checks that it works

Workloads (bench_strategies.py's, built by its helpers):
* ``lenet``: examples/mnist/lenet_solver.prototxt (base_lr 0.01, inv policy, momentum 0.9) on
  mnist10k; target: test accuracy on the 2,000 held-out digits >= ``--target`` (0.98).
* ``cifar10_quick``: the zoo's cifar10_quick (base_lr 0.001, fixed, momentum 0.9) on
  bench_strategies' learnable synthetic images; target: held-out loss <= ``--loss`` (0.3).

Arms, each in a fresh process on this machine's cores (threads engine):
* ``caffe``: the solver's own settings, synchronous.
* ``omnivore``: cct/optimizer/omnivore.py, Omnivore's cold start (groups from 1 up, lr over
  four decades at momentum 0.9, then momentum x {lr, lr/10} with its pruning, each probe
  ``--omnivore-probe`` seconds of wall time, scored by the mean of its last 10 display
  losses, g chosen by the lowest loss in equal time), then training with its choice. Unlike
  Omnivore, probes branch in memory instead of relaunching processes (no 30 s per probe of
  start and kill), so this baseline is, if anything, faster than the original.
* ``optimize``: cct's optimizer (``cct train --optimize``): its plan, then training with its
  re-tunes.

Wall time = probes + training; the held-out evaluations every ``--every`` iterations are not
timed. Printed: a table of seconds (and iterations) to the target per arm, the probe seconds
in it, and the ratio to caffe's. Written: ``--json`` with every curve and ``--png`` with
accuracy (LeNet) and held-out loss (CIFAR10-quick) against wall time.
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
# After the installed packages: `import cct` is the installed cct; the repository gives only
# the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import cpu_model, default_data_dir, mnist_lmdbs, write_json  # noqa: E402
from bench.bench_momentum import solver_param as lenet_solver  # noqa: E402
from bench.worker import run_worker  # noqa: E402
from bench.bench_strategies import cifar_h5, cifar_solver, evaluate, first  # noqa: E402
from bench.bench_train import default_zoo  # noqa: E402

WORKS = ("lenet", "cifar10_quick")
ARMS = ("caffe", "omnivore", "optimize")
FULL = {"lenet": 10000, "cifar10_quick": 5000}
QUICK = {"lenet": 60, "cifar10_quick": 30}
# Omnivore probed 60-300 s on ImageNet nets; scaled to these small runs (about 250 and 100
# iterations per probe here).
OMNIVORE_PROBE = {"lenet": 3.0, "cifar10_quick": 8.0}


def solver_for(job: dict):
    from cct.api import Solver
    if job["work"] == "lenet":
        train, test = mnist_lmdbs(pathlib.Path(job["data_dir"]))
        param = lenet_solver(train, test, 0.01, job["cap"])
    else:
        train, test = cifar_h5(pathlib.Path(job["data_dir"]))
        param = cifar_solver(pathlib.Path(job["zoo"]), train, test, job["cap"])
    return Solver(param)


def reached(job: dict, acc: float, loss: float) -> bool:
    if job["work"] == "lenet":
        return acc >= job["target"] - 1e-9
    return loss <= job["loss"]


def run_one(job: dict) -> dict:
    """One arm on one workload: the curve of (iteration, wall seconds, accuracy, loss)."""
    from cct import glog
    from cct.optimizer import Optimizer
    from cct.optimizer.omnivore import OmnivoreSearch
    glog.set_quiet(True)
    solver = solver_for(job)
    tuner = None
    began = time.perf_counter()
    chosen = ""
    if job["arm"] == "omnivore":
        tuner = OmnivoreSearch(solver, probe_seconds=job["omnivore_probe"])
        choice = tuner.search()
        tuner.configure(choice)
        chosen = f"groups {choice.groups} lr {choice.lr:g} momentum {choice.momentum:g}"
    elif job["arm"] == "optimize":
        tuner = Optimizer(solver, probe_iters=job["probe_iters"],
                          retune_every=job["retune_every"])
        plan = tuner.start()
        chosen = plan.winner.describe()
    probe = time.perf_counter() - began
    step = tuner.step if tuner is not None else solver.step
    wall = probe
    curve = []
    try:
        while solver.iter < job["cap"]:
            t0 = time.perf_counter()
            step(min(job["every"], job["cap"] - solver.iter))
            wall += time.perf_counter() - t0
            driver = getattr(getattr(tuner, "opt", tuner), "driver", None)
            acc, loss = evaluate(solver, driver)
            curve.append({"iter": solver.iter, "seconds": wall, "accuracy": acc, "loss": loss})
            if not math.isfinite(loss) or reached(job, acc, loss):
                break
        retunes = getattr(tuner, "retunes", 0)
        return {**{k: job[k] for k in ("work", "arm", "cap", "every")}, "curve": curve,
                "probe_seconds": probe, "chosen": chosen, "retunes": retunes}
    finally:
        if tuner is not None:
            tuner.close()
        solver.close()


def spawn(job: dict) -> dict:
    return run_worker([sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                       json.dumps(job)], f"{job['work']} {job['arm']}")


def report(runs: List[dict], args) -> List[str]:
    lines = ["| work | arm | seconds to target | iterations | probe s | vs caffe | chosen |",
             "|---|---|---|---|---|---|---|"]
    for work in args.work:
        job = {"work": work, "target": args.target, "loss": args.loss}
        done = {}
        for r in (r for r in runs if r["work"] == work):
            p = first(r["curve"], lambda q: reached(job, q["accuracy"], q["loss"]))
            done[r["arm"]] = p
        base = done.get("caffe")
        for r in (r for r in runs if r["work"] == work):
            p = done[r["arm"]]
            last = r["curve"][-1] if r["curve"] else {"iter": 0, "seconds": r["probe_seconds"]}
            secs = f"{p['seconds']:.4g}" if p else f"> {last['seconds']:.4g} (not reached)"
            iters = str(p["iter"]) if p else f"> {last['iter']}"
            ratio = f"{base['seconds'] / p['seconds']:.2f}x" if p and base else "-"
            lines.append(f"| {work} | {r['arm']} | {secs} | {iters} | "
                         f"{r['probe_seconds']:.3g} | {ratio} | {r['chosen'] or 'solver'} |")
    return lines


def plot(runs: List[dict], works, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(works), figsize=(6 * len(works), 4), squeeze=False)
    for ax, work in zip(axes[0], works):
        key = "accuracy" if work == "lenet" else "loss"
        for r in (r for r in runs if r["work"] == work):
            xs = [r["probe_seconds"]] + [p["seconds"] for p in r["curve"]]
            ys = [math.nan] + [p[key] for p in r["curve"]]
            line, = ax.plot(xs, ys, marker=".", label=r["arm"])
            ax.axvline(r["probe_seconds"], color=line.get_color(), ls=":", lw=0.8)
        ax.set_title(f"{work}: held-out {key} (dotted: end of probes)")
        ax.set_xlabel("wall seconds, probes included")
        ax.set_ylabel(key)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=",".join(WORKS))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--quick", action="store_true", help="small caps and probes: a smoke run")
    ap.add_argument("--cap", type=int, help="iterations at most per arm (default per work)")
    ap.add_argument("--every", type=int, help="iterations between held-out evaluations")
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--loss", type=float, default=0.3)
    ap.add_argument("--omnivore-probe", type=float,
                    help="seconds per Omnivore probe (default per work: OMNIVORE_PROBE)")
    ap.add_argument("--probe-iters", type=int, help="iterations per --optimize probe")
    ap.add_argument("--retune-every", type=int, help="--optimize's re-tune interval")
    ap.add_argument("--data-dir", default=str(default_data_dir()))
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--json", default=str(REPO / "bench" / "time_to_accuracy.json"))
    ap.add_argument("--png", default=str(REPO / "bench" / "time_to_accuracy.png"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_one(json.loads(args.worker))))
        return 0
    args.work = args.work.split(",")
    caps = QUICK if args.quick else FULL
    every = args.every or (10 if args.quick else 100)
    probe_iters = args.probe_iters or (10 if args.quick else None)
    retune = args.retune_every or (1000 if args.quick else None)
    print(f"# {cpu_model()}, {os.cpu_count()} cores{', --quick' if args.quick else ''}")
    runs = []
    for work in args.work:
        for arm in args.arms.split(","):
            job = {"work": work, "arm": arm, "cap": args.cap or caps[work], "every": every,
                   "target": args.target, "loss": args.loss,
                   "omnivore_probe": args.omnivore_probe or (0.5 if args.quick else
                                                             OMNIVORE_PROBE[work]),
                   "probe_iters": probe_iters, "retune_every": retune,
                   "data_dir": args.data_dir, "zoo": args.zoo}
            runs.append(spawn(job))
            print(f"{work} {arm}: {len(runs[-1]['curve'])} evaluations, "
                  f"{runs[-1]['probe_seconds']:.3g} s of probes", flush=True)
    print()
    for line in report(runs, args):
        print(line)
    meta = {"date": datetime.date.today().isoformat(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "quick": args.quick, "target": args.target,
            "loss": args.loss,
            "omnivore_probe": {w: args.omnivore_probe or (0.5 if args.quick else OMNIVORE_PROBE[w])
                               for w in args.work}}
    write_json(args.json, meta, runs)
    plot(runs, args.work, args.png)
    print(f"\nwrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

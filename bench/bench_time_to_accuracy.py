"""Time to accuracy, probes included (issue 12, item 5; issue 33, item 5): Caffe's own solver
settings against Omnivore's optimizer and cct's ``--optimize``, on one machine, in one run.

    python bench/bench_time_to_accuracy.py --runs 3    # the full benchmark (a quiet machine)
    python bench/bench_time_to_accuracy.py --quick     # small caps: checks that it works

Workloads (bench_strategies.py's, built by its helpers):
* ``lenet``: examples/mnist/lenet_solver.prototxt (base_lr 0.01, inv policy, momentum 0.9) on
  mnist10k; target: test accuracy on the 2,000 held-out digits >= ``--target`` (0.98).
* ``cifar10_quick``: the zoo's cifar10_quick (base_lr 0.001, fixed, momentum 0.9) on
  bench_strategies' learnable synthetic images; target: held-out loss <= ``--loss`` (0.3).
* ``lenet_adam``: ``lenet``'s net, data, test and seed with the update of the zoo's
  examples/mnist/lenet_solver_adam.prototxt (Adam, base_lr 0.001, fixed, momentum 0.9 = beta1,
  momentum2 0.999 = beta2, delta 1e-8, no weight decay); target as ``lenet``'s.

Arms, each in a fresh process on this machine's cores (threads engine):
* ``caffe``: the solver's own settings, synchronous.
* ``omnivore``: cct/optimizer/omnivore.py, Omnivore's cold start (groups from 1 up, lr over
  four decades at momentum 0.9, then momentum x {lr, lr/10} with its pruning, each probe
  ``--omnivore-probe`` seconds of wall time, scored by the mean of its last 10 display
  losses, g chosen by the lowest loss in equal time), then training with its choice. Unlike
  Omnivore, probes branch in memory instead of relaunching processes (no 30 s per probe of
  start and kill), so this baseline is, if anything, faster than the original.
* ``optimize``: cct's optimizer (``cct train --optimize``): its plan, then training with its
  re-tunes; ``--optimize-args`` (a JSON object) adds keyword arguments to
  cct.optimizer.Optimizer, e.g. ``'{"probe_share": 0.05}'``.

Each (work, arm) runs ``--runs`` times, in rounds: within a round every arm runs once, in
``--arms`` order, so a drift of the machine's speed hits every arm alike. Wall time = probes +
training; the held-out evaluations (at every multiple of ``--every`` iterations, for every arm
alike) are not timed. Printed: the CPU and the date, then per work a table with a row per arm:
each run's seconds (and iterations) to the target, their median, each run's ratio to the caffe
run of its round, the ratio of the medians (a run that never reached the target counts as
infinitely slow), the probe seconds and the choices. Written after every run, per work:
``--json`` with every run and its curve and ``--png`` with the held-out accuracy (LeNet) or
loss (CIFAR10-quick) against wall time, a colour per arm, lighter for the repeats. ``{work}``
in either path is the work's name; a path without it gets ``_<work>`` before its suffix when
more than one work runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import statistics
import sys
import time
from typing import Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct; the repository gives only
# the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import cpu_model, default_data_dir, mnist_lmdbs, write_json  # noqa: E402
from bench.bench_momentum import solver_param as lenet_solver  # noqa: E402
from bench.worker import run_worker  # noqa: E402
from bench.bench_strategies import cifar_h5, cifar_solver, evaluate, first  # noqa: E402
from bench.bench_train import default_zoo  # noqa: E402

WORKS = ("lenet", "cifar10_quick", "lenet_adam")
ARMS = ("caffe", "omnivore", "optimize")
METRIC = {"lenet": "accuracy", "cifar10_quick": "loss", "lenet_adam": "accuracy"}
FULL = {"lenet": 10000, "cifar10_quick": 5000, "lenet_adam": 10000}
QUICK = {"lenet": 60, "cifar10_quick": 30, "lenet_adam": 60}
# Omnivore probed 60-300 s on ImageNet nets; scaled to these small runs (about 250 and 100
# iterations per probe here).
OMNIVORE_PROBE = {"lenet": 3.0, "cifar10_quick": 8.0, "lenet_adam": 3.0}
ADAM_SOLVER = "examples/mnist/lenet_solver_adam.prototxt"
# The fields of the update (rule, schedule, regularization) that lenet_adam takes from
# ADAM_SOLVER: set there, they are copied; unset, they are cleared to Caffe's defaults.
UPDATE_FIELDS = ("type", "base_lr", "lr_policy", "gamma", "power", "stepsize", "momentum",
                 "momentum2", "delta", "rms_decay", "weight_decay", "regularization_type")


def adam_solver(zoo: pathlib.Path, train_db: str, test_db: str, cap: int):
    """lenet_solver's param (net, LMDBs, test_iter 20, random_seed 1701) with the update
    fields of Caffe's lenet_solver_adam.prototxt, read from the zoo."""
    from cct.io.prototxt import read_solver_text
    path = zoo / ADAM_SOLVER
    if not path.exists():
        raise SystemExit(f"bench: lenet_adam needs Caffe's {ADAM_SOLVER}; {path} does not "
                         f"exist: give --zoo (a Caffe checkout) or leave lenet_adam out of "
                         f"--work")
    adam = read_solver_text(str(path))
    param = lenet_solver(train_db, test_db, adam.base_lr, cap)
    for field in UPDATE_FIELDS:
        if adam.HasField(field):
            setattr(param, field, getattr(adam, field))
        else:
            param.ClearField(field)
    return param


def solver_for(job: dict):
    from cct.api import Solver
    if job["work"] == "cifar10_quick":
        train, test = cifar_h5(pathlib.Path(job["data_dir"]))
        param = cifar_solver(pathlib.Path(job["zoo"]), train, test, job["cap"])
    else:
        train, test = mnist_lmdbs(pathlib.Path(job["data_dir"]))
        if job["work"] == "lenet_adam":
            param = adam_solver(pathlib.Path(job["zoo"]), train, test, job["cap"])
        else:
            param = lenet_solver(train, test, 0.01, job["cap"])
    if job.get("seed") is not None:
        param.random_seed = job["seed"]
    for name, value in job.get("solver_args", {}).items():
        setattr(param, name, value)         # checked against the schema in main
    return Solver(param)


def reached(job: dict, acc: float, loss: float) -> bool:
    if METRIC[job["work"]] == "accuracy":
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
        tuner = Optimizer(solver, **{"probe_iters": job["probe_iters"],
                                     "retune_every": job["retune_every"],
                                     **job["optimize_args"]})
        plan = tuner.start()
        chosen = plan.winner.describe()
    probe = time.perf_counter() - began
    step = tuner.step if tuner is not None else solver.step
    wall = probe
    curve = []
    try:
        while solver.iter < job["cap"]:
            t0 = time.perf_counter()
            # at multiples of `every` for every arm, as Caffe's tests fall: from a kept probe's
            # end (iteration 160, say) a fixed stride evaluated the optimizer's run at 260,
            # 360 ... against the solver's 200, 300 ...
            step(min(job["every"] - solver.iter % job["every"], job["cap"] - solver.iter))
            wall += time.perf_counter() - t0
            driver = getattr(getattr(tuner, "opt", tuner), "driver", None)
            acc, loss = evaluate(solver, driver)
            curve.append({"iter": solver.iter, "seconds": wall, "accuracy": acc, "loss": loss})
            if not math.isfinite(loss) or reached(job, acc, loss):
                break
        retunes = getattr(tuner, "retunes", 0)
        return {**{k: job[k] for k in ("work", "arm", "round", "cap", "every")},
                "curve": curve, "probe_seconds": probe, "chosen": chosen, "retunes": retunes}
    finally:
        if tuner is not None:
            tuner.close()
        solver.close()


def spawn(job: dict) -> dict:
    return run_worker([sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                       json.dumps(job)], f"{job['work']} {job['arm']} round {job['round']}")


# -- the report (pure functions of the runs; tests/bench/test_bench_time_to_accuracy.py) ----
def to_target(run: dict, target: float, loss: float) -> Optional[dict]:
    """The run's first held-out evaluation at the target; None when it never got there."""
    job = {"work": run["work"], "target": target, "loss": loss}
    return first(run["curve"], lambda q: reached(job, q["accuracy"], q["loss"]))


def _seconds(p: Optional[dict]) -> float:
    return p["seconds"] if p else math.inf


def _probe(run: dict) -> str:
    """The run's probe seconds; "0" for an arm that does not probe (a clock read apart)."""
    return f"{run['probe_seconds']:.3g}" if run["probe_seconds"] >= 5e-3 else "0"


def _ratio(base: float, other: float) -> str:
    """caffe's seconds over the other's: how many times sooner the other got there."""
    if math.isinf(base) or math.isinf(other):
        return "-"
    return f"{base / other:.2f}x"


def report(runs: List[dict], work: str, arms: List[str], target: float,
           loss: float) -> List[str]:
    """A row per arm: every run's seconds (iterations) to the target in round order, their
    median, each run's ratio to the caffe run of its round and the ratio of the medians."""
    lines = ["| work | arm | seconds to target (iterations), per run | median s | "
             "vs caffe, per round | vs caffe, medians | probe s | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    mine = [r for r in runs if r["work"] == work]
    caffe = {r["round"]: _seconds(to_target(r, target, loss)) for r in mine
             if r["arm"] == "caffe"}
    medians: Dict[str, float] = {}
    for arm in arms:
        rows = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["round"])
        if rows:
            medians[arm] = statistics.median(_seconds(to_target(r, target, loss))
                                             for r in rows)
    for arm in arms:
        rows = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["round"])
        if not rows:
            continue
        cells, ratios = [], []
        for r in rows:
            p = to_target(r, target, loss)
            if p:
                cells.append(f"{p['seconds']:.3g} ({p['iter']})")
            else:
                last = r["curve"][-1] if r["curve"] else {"iter": 0,
                                                         "seconds": r["probe_seconds"]}
                cells.append(f"> {last['seconds']:.3g} (> {last['iter']})")
            ratios.append(_ratio(caffe.get(r["round"], math.inf), _seconds(p)))
        median = medians[arm]
        median_cell = "not reached" if math.isinf(median) else f"{median:.3g}"
        probes = ", ".join(_probe(r) for r in rows)
        chosen = []
        for r in rows:
            c = r["chosen"] or "solver"
            if c not in chosen:
                chosen.append(c)
        lines.append(f"| {work} | {arm} | {', '.join(cells)} | {median_cell} | "
                     f"{', '.join(ratios)} | {_ratio(medians.get('caffe', math.inf), median)} | "
                     f"{probes} | {'; '.join(chosen)} |")
    return lines


def out_path(pattern: str, work: str, works: List[str]) -> str:
    """``pattern`` with ``{work}`` filled in; without it, ``_<work>`` goes before the suffix
    when several works share the pattern."""
    if "{work}" in pattern:
        return pattern.replace("{work}", work)
    if len(works) == 1:
        return pattern
    p = pathlib.Path(pattern)
    return str(p.with_name(f"{p.stem}_{work}{p.suffix}"))


def plot(runs: List[dict], work: str, arms: List[str], path: str) -> None:
    """Held-out metric against wall seconds, a colour per arm, the first round solid and the
    repeats lighter; dotted: the end of each run's probes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    key = METRIC[work]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in sorted((r for r in runs if r["work"] == work), key=lambda r: r["round"]):
        colour = f"C{arms.index(r['arm'])}" if r["arm"] in arms else "k"
        alpha = 1.0 if r["round"] == 0 else 0.4
        xs = [r["probe_seconds"]] + [p["seconds"] for p in r["curve"]]
        ys = [math.nan] + [p[key] for p in r["curve"]]
        ax.plot(xs, ys, marker=".", color=colour, alpha=alpha,
                label=r["arm"] if r["round"] == 0 else None)
        if r["probe_seconds"] >= 5e-3:
            ax.axvline(r["probe_seconds"], color=colour, alpha=alpha, ls=":", lw=0.8)
    ax.set_title(f"{work}: held-out {key} (dotted: end of probes; lighter: repeats)")
    ax.set_xlabel("wall seconds, probes included")
    ax.set_ylabel(key)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def json_object(ap: argparse.ArgumentParser, flag: str, text: str, example: str) -> dict:
    """A flag's JSON object, or the parser's error naming the flag and an example."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        ap.error(f"{flag} {text!r} is not JSON ({e}); give an object, e.g. '{example}'")
    if not isinstance(value, dict):
        ap.error(f"{flag} must be a JSON object, got {text!r}; e.g. '{example}'")
    return value


def check_solver_args(ap: argparse.ArgumentParser, solver_args: dict) -> None:
    """--solver-args' fields, each a scalar field of SolverParameter taking its value (the
    parser's error otherwise, before any run): a repeated field reads as a container and a
    message as a message; protobuf's own setter refuses a value of the wrong type."""
    from cct.proto import caffe_pb2
    blank = caffe_pb2.SolverParameter()
    for name, value in solver_args.items():
        try:
            if not isinstance(getattr(blank, name, None), (int, float, str)):
                raise TypeError("not a scalar field")
            setattr(blank, name, value)
        except (TypeError, ValueError) as e:
            ap.error(f"--solver-args: {name!r} = {value!r} is not a value of a scalar field "
                     f"of Caffe's SolverParameter ({e})")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=",".join(WORKS), help=f"of {', '.join(WORKS)}")
    ap.add_argument("--arms", default=",".join(ARMS), help="run in this order in each round")
    ap.add_argument("--runs", type=int, default=1, help="rounds: runs of each (work, arm)")
    ap.add_argument("--quick", action="store_true", help="small caps and probes: a smoke run")
    ap.add_argument("--cap", type=int, help="iterations at most per arm (default per work)")
    ap.add_argument("--every", type=int, help="iterations between held-out evaluations")
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--loss", type=float, default=0.3)
    ap.add_argument("--omnivore-probe", type=float,
                    help="seconds per Omnivore probe (default per work: OMNIVORE_PROBE)")
    ap.add_argument("--probe-iters", type=int, help="iterations per --optimize probe")
    ap.add_argument("--retune-every", type=int, help="--optimize's re-tune interval")
    ap.add_argument("--optimize-args", default="{}",
                    help="JSON object of keyword arguments for cct.optimizer.Optimizer "
                         "(after --probe-iters and --retune-every, which it overrides)")
    ap.add_argument("--solver-args", default="{}",
                    help="JSON object of SolverParameter fields replacing each work's, e.g. "
                         "'{\"base_lr\": 0.009}' for CIFAR10-quick at the lr --optimize "
                         "chooses: settings already good, which the optimizer must not cost "
                         "more than 10%% of")
    ap.add_argument("--seed-per-round", action="store_true",
                    help="round r's solvers (every arm's) seeded 1701 + r instead of 1701 for "
                         "all: rounds sample the initial weights instead of repeating one (a "
                         "target near a net's ceiling is crossed at an iteration that moves by "
                         "hundreds with them)")
    ap.add_argument("--data-dir", default=str(default_data_dir()))
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--json", default=str(REPO / "bench" / "time_to_accuracy_{work}.json"))
    ap.add_argument("--png", default=str(REPO / "bench" / "time_to_accuracy_{work}.png"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_one(json.loads(args.worker))))
        return 0
    works = args.work.split(",")
    arms = args.arms.split(",")
    unknown = [w for w in works if w not in WORKS] + [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown work or arm {', '.join(unknown)}: works are {', '.join(WORKS)}, "
                 f"arms {', '.join(ARMS)}")
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    optimize_args = json_object(ap, "--optimize-args", args.optimize_args,
                                '{"probe_share": 0.05}')
    solver_args = json_object(ap, "--solver-args", args.solver_args, '{"base_lr": 0.009}')
    check_solver_args(ap, solver_args)
    caps = QUICK if args.quick else FULL
    every = args.every or (10 if args.quick else 100)
    probe_iters = args.probe_iters or (10 if args.quick else None)
    retune = args.retune_every or (1000 if args.quick else None)
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {cpu_model()}, {os.cpu_count()} cores, {now:%Y-%m-%d %H:%M} UTC, "
          f"{args.runs} run{'s' if args.runs > 1 else ''} per arm"
          f"{', --quick' if args.quick else ''}", flush=True)
    tables = []
    for work in works:
        json_path = out_path(args.json, work, works)
        png_path = out_path(args.png, work, works)
        omnivore_probe = args.omnivore_probe or (0.5 if args.quick else OMNIVORE_PROBE[work])
        meta = {"date": now.date().isoformat(), "cpu": cpu_model(), "cores": os.cpu_count(),
                "quick": args.quick, "work": work, "arms": arms, "runs": args.runs,
                "target": args.target, "loss": args.loss, "omnivore_probe": omnivore_probe,
                "optimize_args": optimize_args, "solver_args": solver_args,
                "seed_per_round": args.seed_per_round}
        runs: List[dict] = []
        for rnd in range(args.runs):
            for arm in arms:
                job = {"work": work, "arm": arm, "round": rnd, "cap": args.cap or caps[work],
                       "every": every, "target": args.target, "loss": args.loss,
                       "omnivore_probe": omnivore_probe, "probe_iters": probe_iters,
                       "retune_every": retune, "optimize_args": optimize_args,
                       "solver_args": solver_args, "data_dir": args.data_dir, "zoo": args.zoo,
                       "seed": 1701 + rnd if args.seed_per_round else None}
                runs.append(spawn(job))
                p = to_target(runs[-1], args.target, args.loss)
                print(f"{work} {arm} round {rnd}: "
                      f"{'%.3g s' % p['seconds'] if p else 'not reached'}, "
                      f"{len(runs[-1]['curve'])} evaluations, "
                      f"{_probe(runs[-1])} s of probes", flush=True)
                write_json(json_path, meta, runs)
                plot(runs, work, arms, png_path)
        tables.append(report(runs, work, arms, args.target, args.loss))
        print(f"wrote {json_path} and {png_path}", flush=True)
    for lines in tables:
        print()
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

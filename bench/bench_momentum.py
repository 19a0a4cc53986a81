"""Asynchrony begets momentum (arXiv 1605.09774, Fig. 3/4/8) on LeNet / mnist10k, with the
simulated engine of cct/driver: iterations to a target test accuracy by number of groups g,
staleness model, explicit momentum and learning rate; or (``--loss-after N``) the test loss
after exactly N updates.

    python bench/bench_momentum.py --quick
    python bench/bench_momentum.py --staleness round-robin,exponential --lr 0.01 \\
        --groups 1,2,4,8,16 --mu=-0.225,0,0.45,0.675,0.9,auto,rule --cap 3000
    python bench/bench_momentum.py --issue33      # issue 33's target, about 2 minutes

Each run is a fresh solver from examples/mnist/lenet_solver.prototxt (random_seed 1701,
"inv" policy, weight decay 5e-4) with base_lr set, in a process of its own (one cct thread,
kernel plans fixed by the deterministic rule, so a run repeats whatever the machine's load),
wrapped in ``AsyncDriver(groups=g, engine="simulated", staleness=S, momentum=M,
allow_negative_momentum=True)``. One iteration is one update from one group's batch of 64, so
every g sees the same number of digits per iteration. Every ``--every`` iterations the test net
runs over the 2,000 held-out digits (test_iter 20 x batch 100); the metric is the first checked
iteration whose accuracy reaches ``--target``, or ">cap" when none does within ``--cap``
("div" when the loss or the weights went non-finite). ``--also-target`` accuracies below
it are read off the same runs' curves. ``auto`` is ``cct train --momentum=auto``'s measured
choice (cct/optimizer/momentum.choose_momentum, negative values allowed): its probes run
first, from the run's start, and are thrown away; their updates are reported apart
(``probe_updates``), never among the run's iterations. ``rule`` is the driver's own
``momentum="auto"``: per update, the solver's momentum 0.9 minus the implicit momentum
E[tau]/(1+E[tau]) of the measured staleness, negative values allowed.

``--issue33`` is issue 33's target: 8 groups, round-robin, base_lr 0.01, the test loss after
500 updates for mu 0, 0.15, ..., 0.9, auto and rule; auto passes when its loss is within 5% of
the best explicit momentum's (a table; every run to ``bench/momentum_loss.json``).

The LMDBs are the ones examples/mnist/create_mnist.sh writes when they exist; otherwise the
bench converts the bundled digits (examples/mnist/data) into ``--data-dir`` once.

Printed per target and (staleness, lr): a table of iterations to the target, rows g, columns
mu, the best explicit mu of each row marked with *; then per g the best explicit mu's
iterations, auto's
(with the explicit momentum it ended at), mu = 0.9's, and auto / 0.9. Written: every run with
its accuracy curve to ``--json`` (rewritten after each run; ``--resume`` skips the runs it
already holds) and a PNG to ``--png``, a row per target: the best mu against g, and iterations
against mu per g.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import pathlib
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct (whose compiled _C a source
# checkout lacks after a non-editable install); the repository gives only the `bench` package.
sys.path.append(str(REPO))
from bench.worker import cpu_model  # noqa: E402

MNIST = REPO / "examples" / "mnist"
SOLVER = MNIST / "lenet_solver.prototxt"
GROUPS = (1, 2, 4, 8, 16)
STALENESS = ("round-robin", "exponential")
# The paper's 0.225 steps (Sec. V) from -0.45 up, and auto.
MOMENTA = ("-0.45", "-0.225", "0", "0.225", "0.45", "0.675", "0.9", "auto")
# lenet_solver's base_lr, and 3x it: with mu below 0.9 the long-run step lr/(1 - mu) shrinks
# (0.1 at mu 0.9, 0.01 at mu 0), so low and negative momenta get a fair chance only at a
# larger lr; 0.1 would make mu 0.9's long-run step 1.0, where LeNet diverges.
LRS = (0.01, 0.03)
# Issue 33's target: test loss after 500 updates at 8 groups, auto within 5% of the best of
# these explicit momenta; "rule" is the driver's per-update formula (momentum="auto").
ISSUE33_MU = ("0", "0.15", "0.3", "0.45", "0.6", "0.75", "0.9", "auto", "rule")
QUICK = {"groups": (1, 4, 16), "mu": ("0", "0.45", "0.9", "auto"),
         "staleness": ("round-robin",), "lr": (0.01,), "cap": 2000}
PAPER_CIFAR = {1: 0.7, 2: 0.6, 4: 0.2, 8: 0.1}           # Fig. 3, best mu on cifar10_quick
PAPER_CIFAR_NEG = {1: 0.675, 2: 0.45, 4: 0.225, 8: 0.0, 16: -0.675}   # Fig. 8
TOL = 1e-6          # accuracy is a mean of float32 fractions; one digit in 2,000 is 5e-4


# -- the metric (pure functions; tests/bench/test_bench_momentum.py) -------------------------
def iterations_to_target(curve: Sequence[Tuple[int, float]], target: float) -> Optional[int]:
    """The first checked iteration whose test accuracy reaches ``target``; None if none."""
    for it, acc in curve:
        if acc >= target - TOL:
            return int(it)
    return None


def best_momenta(cells: Dict[str, Optional[int]]) -> List[str]:
    """The explicit momenta (not ``auto``) with the fewest iterations to the target, ties all
    kept, in the order given; [] when none reached it."""
    reached = {mu: n for mu, n in cells.items() if mu != "auto" and n is not None}
    if not reached:
        return []
    fewest = min(reached.values())
    return [mu for mu, n in reached.items() if n == fewest]


def ratio(a: Optional[int], b: Optional[int], cap: int) -> str:
    """a / b for two iteration counts, None meaning "not within cap": a bound when only one
    reached, "-" when neither did."""
    if a is not None and b is not None:
        return f"{a / b:.2f}"
    if a is not None:
        return f"<{a / cap:.2f}"
    if b is not None:
        return f">{cap / b:.2f}"
    return "-"


def ratio_cell(auto: dict, fixed: dict, cap: int, target: Optional[float] = None) -> str:
    """auto's iterations over mu 0.9's, or why there is no ratio."""
    if cell(fixed, cap, target) == "div":
        return "0.9 diverged"
    return ratio(iterations(auto, target), iterations(fixed, target), cap)


def cell(run: Optional[dict], cap: int, target: Optional[float] = None) -> str:
    """A run's iterations to ``target`` (its own target by default), ">cap" or "div"."""
    if run is None:
        return ""
    n = iterations(run, target)
    if n is not None:
        return str(n)
    return "div" if run["status"] == "diverged" else f">{cap}"


def iterations(run: dict, target: Optional[float] = None) -> Optional[int]:
    """Iterations to ``target`` read off the run's accuracy curve (a target below the run's
    own is read off the same curve: the run stopped only once it reached its own)."""
    if target is None:
        return run["iterations"]
    return iterations_to_target(run["curve"], target)


# -- data and solver -------------------------------------------------------------------------
def default_data_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "cct" / "mnist10k_lmdb"


def mnist_lmdbs(data_dir: pathlib.Path) -> Tuple[str, str]:
    """(train, test) LMDB folders: create_mnist.sh's, else converted into ``data_dir``."""
    example = (MNIST / "mnist_train_lmdb", MNIST / "mnist_test_lmdb")
    if all((p / "data.mdb").exists() for p in example):
        return str(example[0]), str(example[1])
    from cct.glog import quiet
    from cct.tools.convert_mnist_data import convert_dataset
    made = []
    for phase, prefix in (("train", "train"), ("test", "t10k")):
        db = data_dir / f"mnist_{phase}_lmdb"
        if not (db / "data.mdb").exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            part = data_dir / f"mnist_{phase}_lmdb.part{os.getpid()}"
            with quiet():
                convert_dataset(str(MNIST / "data" / f"{prefix}-images-idx3-ubyte.gz"),
                                str(MNIST / "data" / f"{prefix}-labels-idx1-ubyte.gz"),
                                str(part), "lmdb")
            os.replace(part, db)
        made.append(str(db))
    return made[0], made[1]


def solver_param(train_db: str, test_db: str, lr: float, cap: int):
    """lenet_solver.prototxt with its net inline (the Data sources pointed at the LMDBs),
    base_lr ``lr``, no display, no snapshots, and no tests of its own (the bench tests)."""
    from cct.io.prototxt import read_net, read_solver_text
    from cct.proto import caffe_pb2
    param = read_solver_text(str(SOLVER))
    net = read_net(str(REPO / param.net))
    for lp in net.layer:
        if lp.type == "Data":
            train = any(r.phase == caffe_pb2.TRAIN for r in lp.include)
            lp.data_param.source = train_db if train else test_db
    param.ClearField("net")
    param.net_param.CopyFrom(net)
    param.base_lr = lr
    param.max_iter = cap
    param.display = 0
    param.snapshot = 0
    param.snapshot_after_train = False
    param.test_interval = 1 << 30
    param.test_initialization = False
    return param


def evaluate(solver, driver) -> Tuple[float, float]:
    """Mean 'accuracy' and 'loss' of the first test net over its test_iter batches (all 2,000
    digits). A diverged net can score every digit right (no class beats a NaN logit in the
    Accuracy layer's comparisons), so the loss says whether the accuracy means anything."""
    driver.pull_statistics()
    net = solver.test_nets[0]
    net.share_trained_layers_with(solver.net)
    n = solver.param.test_iter[0]
    accuracy = loss = 0.0
    for _ in range(n):
        net.forward_prefilled()
        accuracy += float(net.blobs["accuracy"].data)
        loss += float(net.blobs["loss"].data)
    return accuracy / n, loss / n


# -- one run, in a process of its own ---------------------------------------------------------
def _init_worker() -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"


def run_one(job: dict) -> dict:
    import cct
    from cct.api import Solver
    from cct.backend import cpu, plans
    from cct.driver import AsyncDriver
    from cct.errors import CCTError
    cct.glog.set_quiet(True)
    cpu.set_num_threads(1)
    plans.set_deterministic(True)
    start = time.perf_counter()
    solver = Solver(solver_param(job["train_db"], job["test_db"], job["lr"], job["cap"]))
    probe: dict = {}
    mu = job["mu"]
    if mu == "auto":
        from cct.optimizer.momentum import choose_momentum
        chosen = choose_momentum(solver, groups=job["g"], engine="simulated",
                                 staleness=job["staleness"], allow_negative=True, log=False)
        mu = repr(chosen.momentum)
        probe = {"probe_updates": chosen.probe_updates, "probe_s": time.perf_counter() - start,
                 "probe_table": chosen.table(), "probe_reason": chosen.reason,
                 "probe_rounds": chosen.rounds}
    elif mu == "rule":
        mu = "auto"          # the driver's per-update rule: solver's momentum - E[tau]/(1+E[tau])
    driver = AsyncDriver(solver, groups=job["g"], engine="simulated", staleness=job["staleness"],
                         momentum=mu, allow_negative_momentum=True, seed=job["seed"])
    curve: List[Tuple[int, float]] = []
    status = "capped"
    try:
        if job.get("loss_after"):
            return {**_loss_after(job, solver, driver), **probe,
                    "wall_s": time.perf_counter() - start}
        while solver.iter < job["cap"]:
            try:
                driver.step(min(job["every"], job["cap"] - solver.iter))
            except CCTError as e:          # the solver's NaN/inf loss check; nothing else
                if "loss is" not in str(e):
                    raise
                status = "diverged"
                break
            accuracy, loss = evaluate(solver, driver)
            if not math.isfinite(loss):
                status = "diverged"
                break
            curve.append((solver.iter, accuracy))
            if iterations_to_target(curve[-1:], job["target"]) is not None:
                status = "reached"
                break
        stats = driver.store.stats
        explicit, implicit = driver.store.momentum(driver.store.stats)
        return {**{k: job[k] for k in ("staleness", "lr", "g", "mu", "seed", "cap", "every",
                                        "target")},
                "status": status, "iterations": iterations_to_target(curve, job["target"]),
                "run_iterations": solver.iter, "curve": curve,
                "staleness_mean": stats.mean(),
                "staleness_max": max(stats.histogram) if stats.histogram else 0,
                "explicit_momentum": float(explicit), "implicit_momentum": float(implicit),
                **probe, "wall_s": time.perf_counter() - start}
    finally:
        driver.close()
        solver.close()


def _loss_after(job: dict, solver, driver) -> dict:
    """Issue 33's measure: exactly ``loss_after`` updates (the auto arm's probes not among
    them), then the test net's loss and accuracy over the 2,000 held-out digits."""
    from cct.errors import CCTError
    status = "done"
    try:
        driver.step(job["loss_after"])
    except CCTError as e:              # the solver's NaN/inf loss check; nothing else
        if "loss is" not in str(e):
            raise
        status = "diverged"
    accuracy, loss = (math.nan, math.inf) if status == "diverged" else evaluate(solver, driver)
    if not math.isfinite(loss):
        status, loss = "diverged", math.inf
    explicit, implicit = driver.store.momentum(driver.store.stats)
    stats = driver.store.stats
    return {**{k: job[k] for k in ("staleness", "lr", "g", "mu", "seed", "loss_after", "cap",
                                    "every", "target")},
            "status": status, "updates": solver.iter, "test_loss": loss,
            "test_accuracy": accuracy, "staleness_mean": stats.mean(),
            "explicit_momentum": float(explicit), "implicit_momentum": float(implicit)}


def loss_table(runs: List[dict]) -> str:
    """Issue 33's table: test loss after N updates per momentum, the best explicit one, and
    auto's choice and whether its loss is within 5% of the best."""
    out = []
    for (staleness, lr, g, n) in sorted({(r["staleness"], r["lr"], r["g"], r["loss_after"])
                                         for r in runs}):
        these = [r for r in runs if (r["staleness"], r["lr"], r["g"], r["loss_after"])
                 == (staleness, lr, g, n)]
        fixed = sorted((r for r in these if r["mu"] not in ("auto", "rule")),
                       key=lambda r: float(r["mu"]))
        best = min(fixed, key=lambda r: r["test_loss"]) if fixed else None
        out += [f"#### staleness {staleness}, base_lr {lr:g}, {g} groups: test loss after {n} "
                f"updates", "", "| momentum | test loss | test accuracy | note |",
                "|---|---|---|---|"]
        for r in fixed + [r for r in these if r["mu"] == "rule"] + \
                [r for r in these if r["mu"] == "auto"]:
            loss = "div" if r["status"] == "diverged" else f"{r['test_loss']:.4f}"
            acc = "-" if r["status"] == "diverged" else f"{r['test_accuracy']:.4f}"
            note = "best explicit" if r is best else ""
            if r["mu"] == "rule":
                note = f"the driver's per-update rule, ended at {r['explicit_momentum']:.3f}"
            if r["mu"] == "auto":
                gap = r["test_loss"] / best["test_loss"] - 1 if best else math.nan
                note = (f"chose {r['explicit_momentum']:.4g} after {r['probe_updates']} probe "
                        f"updates ({r['probe_s']:.0f} s; rounds {', '.join(r['probe_rounds'])});"
                        f" {gap:+.1%} vs the best explicit: "
                        f"{'within' if gap <= 0.05 else 'NOT within'} 5%")
            out.append(f"| {r['mu']} | {loss} | {acc} | {note} |")
        out.append("")
    return "\n".join(out)


def key(r: dict) -> Tuple:
    return (r["staleness"], float(r["lr"]), int(r["g"]), r["mu"], int(r["cap"]),
            int(r["every"]), float(r["target"]), int(r["seed"]))


# -- reports ---------------------------------------------------------------------------------
def tables(runs: List[dict], staleness: str, lr: float, groups: Sequence[int],
           momenta: Sequence[str], cap: int, target: float) -> str:
    at = {(r["g"], r["mu"]): r for r in runs if r["staleness"] == staleness and r["lr"] == lr}
    out = [f"#### staleness {staleness}, base_lr {lr:g}: iterations to test accuracy "
           f"{target:g} (* best explicit mu of the row)", "",
           "| g | " + " | ".join(f"mu {m}" for m in momenta) + " |",
           "|---|" + "---|" * len(momenta)]
    for g in groups:
        cells = {m: iterations(at[(g, m)], target) for m in momenta if (g, m) in at}
        best = best_momenta(cells)
        row = [cell(at.get((g, m)), cap, target) + ("*" if m in best else "") for m in momenta]
        out.append(f"| {g} | " + " | ".join(row) + " |")
    out += ["", "| g | best explicit mu | its iterations | auto (explicit mu at the end) "
            "| mu 0.9 | auto / mu 0.9 |", "|---|---|---|---|---|---|"]
    for g in groups:
        cells = {m: iterations(at[(g, m)], target) for m in momenta if (g, m) in at}
        best = best_momenta(cells)
        auto, fixed = at.get((g, "auto")), at.get((g, "0.9"))
        auto_s = (f"{cell(auto, cap, target)} ({auto['explicit_momentum']:.3f})" if auto
                  else "")
        out.append(f"| {g} | {', '.join(best) or '-'} | "
                   f"{cells[best[0]] if best else f'>{cap}'} | {auto_s} | "
                   f"{cell(fixed, cap, target)} | "
                   + (ratio_cell(auto, fixed, cap, target) if auto and fixed else "") + " |")
    return "\n".join(out)


def plot(runs: List[dict], groups: Sequence[int], momenta: Sequence[str], cap: int,
         targets: Sequence[float], path: str) -> None:
    """One row per target: the best explicit mu against g (every staleness model and lr, with
    the paper's CIFAR optima and 0.9 - (1 - 1/g)), then iterations against mu, one line per g
    (auto a star at the explicit mu it ended at; not reached: above the cap, x if diverged)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = sorted({(r["staleness"], r["lr"]) for r in runs})
    numeric = [m for m in momenta if m != "auto"]
    over = cap * 1.05
    fig, axes = plt.subplots(len(targets), 1 + len(settings), squeeze=False,
                             figsize=(5.2 * (1 + len(settings)), 4.4 * len(targets)))
    for row, target in zip(axes, targets):
        ax = row[0]
        for (staleness, lr), marker in zip(settings, "osd^v<>"):
            xs, ys, spread = [], [], ([], [])
            for g in groups:
                cells = {r["mu"]: iterations(r, target) for r in runs
                         if (r["staleness"], r["lr"], r["g"]) == (staleness, lr, g)}
                best = [float(m) for m in best_momenta(cells)]
                if best:
                    mid = sum(best) / len(best)
                    xs.append(g)
                    ys.append(mid)
                    spread[0].append(mid - min(best))
                    spread[1].append(max(best) - mid)
            ax.errorbar(xs, ys, yerr=spread, marker=marker, capsize=3,
                        label=f"LeNet {staleness}, lr {lr:g}")
        ax.plot(list(PAPER_CIFAR), list(PAPER_CIFAR.values()), "k--", lw=1,
                label="paper CIFAR, Fig. 3")
        ax.plot(list(PAPER_CIFAR_NEG), list(PAPER_CIFAR_NEG.values()), "k:", lw=1,
                label="paper CIFAR, Fig. 8 (negative allowed)")
        ax.plot(list(groups), [0.9 - (1 - 1 / g) for g in groups], color="grey", lw=1,
                label="0.9 - (1 - 1/g)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(groups), [str(g) for g in groups])
        ax.set_xlabel("groups g")
        ax.set_ylabel("best explicit momentum (ties: range)")
        ax.set_title(f"best explicit mu by g, target {target:g}")
        ax.legend(fontsize=7)
        for ax, (staleness, lr) in zip(row[1:], settings):
            for g in groups:
                these = {r["mu"]: r for r in runs
                         if (r["staleness"], r["lr"], r["g"]) == (staleness, lr, g)}
                xs = [float(m) for m in numeric if m in these]
                ys = [iterations(these[m], target) or over for m in numeric if m in these]
                line, = ax.plot(xs, ys, marker="o", label=f"g = {g}")
                div = [float(m) for m in numeric
                       if m in these and these[m]["status"] == "diverged"
                       and iterations(these[m], target) is None]
                ax.plot(div, [over] * len(div), marker="x", ms=9, color=line.get_color(),
                        ls="none")
                if "auto" in these:
                    a = these["auto"]
                    ax.plot([a["explicit_momentum"]], [iterations(a, target) or over],
                            marker="*", ms=13, color=line.get_color(), mec="k", ls="none")
            ax.axhline(cap, color="grey", lw=0.8, ls=":")
            ax.set_xlabel("explicit momentum (star: auto, at the value it ended at)")
            ax.set_ylabel(f"iterations to {target:g} (above {cap}: not reached; x: diverged)")
            ax.set_title(f"LeNet mnist10k, {staleness}, lr {lr:g}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_json(path: str, meta: dict, runs: List[dict]) -> None:
    from cct.io.atomic import atomic_write

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1)
    atomic_write(path, write)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="g 1,4,16; mu 0,0.45,0.9,auto; round-robin; lr 0.01; cap 2000")
    ap.add_argument("--groups", help=f"comma list (default {','.join(map(str, GROUPS))})")
    ap.add_argument("--staleness", help=f"comma list (default {','.join(STALENESS)})")
    ap.add_argument("--mu", help=f"comma list of explicit momenta and/or auto "
                                 f"(default {','.join(MOMENTA)}); write --mu=-0.45,...")
    ap.add_argument("--lr", help=f"comma list of base_lr (default {','.join(map(str, LRS))})")
    ap.add_argument("--cap", type=int, help="iterations at most per run (default 4000)")
    ap.add_argument("--every", type=int, default=100, help="test every N iterations")
    ap.add_argument("--target", type=float, default=0.98, help="test accuracy to reach")
    ap.add_argument("--also-target", default="0.97",
                    help="comma list of lower accuracies also reported, read off the same "
                         "runs' curves ('' for none)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the exponential schedule")
    ap.add_argument("--workers", type=int, default=2, help="runs side by side (one core each)")
    ap.add_argument("--data-dir", default=str(default_data_dir()),
                    help="where to convert the bundled digits when create_mnist.sh's LMDBs "
                         "are absent")
    ap.add_argument("--json", default=str(REPO / "bench" / "momentum.json"))
    ap.add_argument("--png", default=str(REPO / "bench" / "momentum.png"))
    ap.add_argument("--loss-after", type=int, metavar="N",
                    help="issue 33's measure instead: the test loss after exactly N updates "
                         "per momentum (auto's probes not counted among them)")
    ap.add_argument("--issue33", action="store_true",
                    help="issue 33's target: --loss-after 500 --groups 8 --staleness "
                         "round-robin --lr 0.01 --mu 0,0.15,...,0.9,auto,rule")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs --json already holds and run only the others")
    args = ap.parse_args(argv)

    if args.issue33:
        args.loss_after = args.loss_after or 500
        args.groups, args.staleness, args.lr = (args.groups or "8",
                                                args.staleness or "round-robin",
                                                args.lr or "0.01")
        args.mu = args.mu or ",".join(ISSUE33_MU)
    if args.loss_after and args.json == ap.get_default("json"):
        args.json = str(REPO / "bench" / "momentum_loss.json")
    quick = QUICK if args.quick else {}
    groups = ([int(x) for x in args.groups.split(",")] if args.groups
              else list(quick.get("groups", GROUPS)))
    staleness = (args.staleness.split(",") if args.staleness
                 else list(quick.get("staleness", STALENESS)))
    momenta = args.mu.split(",") if args.mu else list(quick.get("mu", MOMENTA))
    lrs = [float(x) for x in args.lr.split(",")] if args.lr else list(quick.get("lr", LRS))
    cap = args.loss_after or args.cap or quick.get("cap", 4000)
    for m in momenta:
        if m not in ("auto", "rule"):
            float(m)
    if any(float(t) > args.target for t in args.also_target.split(",") if t):
        ap.error("--also-target values must not exceed --target: runs stop at --target")

    train_db, test_db = mnist_lmdbs(pathlib.Path(args.data_dir))
    jobs = [{"staleness": s, "lr": lr, "g": g, "mu": m, "seed": args.seed, "cap": cap,
             "every": args.every, "target": args.target, "train_db": train_db,
             "test_db": test_db, "loss_after": args.loss_after}
            for s in staleness for lr in lrs for g in groups for m in momenta]
    runs: List[dict] = []
    earlier: List[dict] = []
    if args.resume and os.path.exists(args.json):
        with open(args.json) as f:
            old = json.load(f)
        held = {key(r): r for r in old["runs"]}
        earlier = old["meta"].pop("earlier", []) + [old["meta"]]
        runs = [held[key(j)] for j in jobs if key(j) in held]
        jobs = [j for j in jobs if key(j) not in held]
    # The slow runs first (many groups, small momenta), so the last ones to finish are short.
    jobs.sort(key=lambda j: (-j["g"], j["mu"] not in ("auto", "rule")
                             and float(j["mu"]) > 0.5))
    meta = {"command": " ".join([os.path.basename(sys.executable), "bench/bench_momentum.py"]
                                + (sys.argv[1:] if argv is None else list(argv))),
            "cpu": cpu_model(), "cores": os.cpu_count(), "workers": args.workers,
            "date": datetime.date.today().isoformat(), "groups": groups,
            "staleness": staleness, "mu": momenta, "lr": lrs, "cap": cap,
            "every": args.every, "target": args.target, "seed": args.seed,
            "earlier": earlier}
    print(f"{len(jobs)} runs ({len(runs)} kept from {args.json}), {args.workers} at a time; "
          f"LMDBs {train_db}, {test_db}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.workers, initializer=_init_worker, maxtasksperchild=1) as pool:
        for k, r in enumerate(pool.imap_unordered(run_one, jobs), 1):
            runs.append(r)
            write_json(args.json, {**meta, "wall_s": time.perf_counter() - start}, runs)
            if args.loss_after:
                print(f"[{k}/{len(jobs)}] {r['staleness']} lr {r['lr']:g} g {r['g']} "
                      f"mu {r['mu']}: test loss {r['test_loss']:.4f} (explicit mu "
                      f"{r['explicit_momentum']:.3f}; {r['wall_s']:.0f} s)",
                      file=sys.stderr, flush=True)
                continue
            print(f"[{k}/{len(jobs)}] {r['staleness']} lr {r['lr']:g} g {r['g']} "
                  f"mu {r['mu']}: {cell(r, cap)} (tau mean {r['staleness_mean']:.2f}, "
                  f"explicit mu {r['explicit_momentum']:.3f}; {r['wall_s']:.0f} s)",
                  file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    meta["wall_s"] = wall
    write_json(args.json, meta, runs)

    print(f"{meta['command']}\nCPU: {meta['cpu']} ({meta['cores']} cores), {args.workers} "
          f"single-thread runs at a time; {meta['date']}; wall {wall / 60:.1f} min\n"
          f"target test accuracy {args.target} on the 2,000 test digits, checked every "
          f"{args.every} iterations, cap {cap}\n")
    if args.loss_after:
        print(loss_table(runs))
        print(f"wrote {args.json}")
        return 0
    targets = [args.target] + [float(t) for t in args.also_target.split(",") if t]
    for target in targets:
        for s in staleness:
            for lr in lrs:
                print(tables(runs, s, lr, groups, momenta, cap, target) + "\n")
    plot(runs, groups, momenta, cap, targets, args.png)
    print(f"wrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

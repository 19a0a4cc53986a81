"""Issue 33's own protocol for LeNet to 98%: `cct train` of lenet_solver's settings against
`cct train --optimize --target-accuracy 0.98`, both tested every 100 iterations by the
solver's own test net, wall clock from process start to the log's first test line at the
target (the way a script parsing Caffe's log would see it).

    python bench/bench_cli_time_to_accuracy.py --seeds 1701-1706   # six seeds, both arms

Where bench_time_to_accuracy.py times training and probes only, evaluating outside the run,
this counts everything a user waits for: interpreter and net start-up, the solver's tests
(20 batches of 100 every 100 iterations) and, for `--optimize`, its probes and re-tunes.
Each (seed, arm) is a fresh `cct train` process on this machine's cores; within a seed the
arms run one after the other (caffe first), so a drift of the machine's speed hits both alike.
The solver: examples/mnist/lenet_solver.prototxt with its net inline, the Data layers on the
mnist10k LMDBs (bench_momentum.mnist_lmdbs), test_interval 100, max_iter 10,000 (the run a
target implies is unknown to both arms), no snapshots, random_seed the seed; ``--base-lr``
and ``--momentum`` replace its lr and momentum (issue 33's "any workload": settings already
good leave the optimizer only its probes to pay).

Printed: the CPU and date, each seed's seconds (iteration) per arm and their ratio, the medians
and the ratio of the medians; ``--json`` keeps every run.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterable, List, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))

from bench.bench_momentum import default_data_dir, mnist_lmdbs, solver_param, write_json  # noqa: E402
from bench.worker import cpu_model  # noqa: E402

ARMS = ("caffe", "optimize")
TESTING = re.compile(r"Iteration (\d+), Testing net")
ACCURACY = re.compile(r"Test net output #\d+: accuracy = ([0-9.eE+-]+)")


def seeds_of(text: str) -> List[int]:
    """``1701-1706`` or ``1701,1703``: the seeds, in order."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def first_at_target(lines: Iterable[str], target: float) -> Optional[int]:
    """The iteration of the first test whose accuracy is at the target, from a Caffe log."""
    at = None
    for line in lines:
        m = TESTING.search(line)
        if m:
            at = int(m.group(1))
        m = ACCURACY.search(line)
        if m and at is not None and float(m.group(1)) >= target - 1e-9:
            return at
    return None


def solver_text(seed: int, every: int, cap: int, lr: float = 0.01,
                momentum: float = 0.9) -> str:
    from google.protobuf import text_format
    train, test = mnist_lmdbs(default_data_dir())
    param = solver_param(train, test, lr, cap)
    param.momentum = momentum
    param.test_interval = every
    param.display = every
    param.random_seed = seed
    return text_format.MessageToString(param)


def run_arm(arm: str, solver: pathlib.Path, target: float) -> Tuple[Optional[int], float]:
    """(iteration, seconds from process start) of the first test at ``target``; the process is
    stopped there (Caffe's arm would otherwise run to max_iter)."""
    cmd = [sys.executable, "-m", "cct.cli", "train", f"--solver={solver}"]
    if arm == "optimize":
        cmd += ["--optimize", f"--target-accuracy={target}"]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=solver.parent)
    try:
        seen: List[str] = []

        def lines():
            for line in proc.stderr:
                seen.append(line)
                yield line
        at = first_at_target(lines(), target)
        seconds = time.perf_counter() - began
    finally:
        proc.kill()
        proc.wait()
    if at is None and proc.returncode not in (0, -9):
        sys.stderr.write("".join(seen[-20:]))
        raise SystemExit(f"{arm}: cct train failed (exit {proc.returncode})")
    return at, seconds


def ratio(base: float, other: float) -> float:
    return base / other if other > 0 else float("inf")


def report(runs: List[dict]) -> List[str]:
    """The table: per seed each arm's seconds (iteration) and caffe/optimize; the medians."""
    by = {(r["seed"], r["arm"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    rows = ["| seed | caffe s (it) | optimize s (it) | caffe / optimize |", "|---|---|---|---|"]

    def cell(r):
        return f"{r['seconds']:.3g} ({r['iter']})" if r["iter"] is not None else "never"
    for s in seeds:
        c, o = by.get((s, "caffe")), by.get((s, "optimize"))
        if c is None or o is None:
            continue
        rows.append(f"| {s} | {cell(c)} | {cell(o)} | "
                    f"{ratio(_secs(c), _secs(o)):.2f}x |")
    med = {a: statistics.median(_secs(r) for r in runs if r["arm"] == a)
           for a in ARMS if any(r["arm"] == a for r in runs)}
    if len(med) == 2:
        rows.append(f"| median | {med['caffe']:.3g} | {med['optimize']:.3g} | "
                    f"{ratio(med['caffe'], med['optimize']):.2f}x |")
    return rows


def _secs(r: dict) -> float:
    return r["seconds"] if r["iter"] is not None else float("inf")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1701-1703", help="e.g. 1701-1706 or 1701,1704")
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--every", type=int, default=100, help="test_interval of both arms")
    ap.add_argument("--cap", type=int, default=10000, help="max_iter of both arms")
    ap.add_argument("--base-lr", type=float, default=0.01,
                    help="the solver's base_lr (lenet_solver's 0.01; e.g. 0.09 with "
                         "--momentum 0.675: settings the optimizer has nothing to add to)")
    ap.add_argument("--momentum", type=float, default=0.9, help="the solver's momentum")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args(argv)
    print(f"# {cpu_model()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
          flush=True)
    runs: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="cct-cli-tta-") as tmp:
        solver = pathlib.Path(tmp) / "solver.prototxt"
        for seed in seeds_of(args.seeds):
            solver.write_text(solver_text(seed, args.every, args.cap, args.base_lr,
                                          args.momentum))
            for arm in ARMS:
                at, seconds = run_arm(arm, solver, args.target)
                runs.append({"seed": seed, "arm": arm, "iter": at, "seconds": seconds})
                print(f"seed {seed} {arm}: "
                      + (f"{seconds:.3g} s, iteration {at}" if at is not None else "never"),
                      flush=True)
                if args.json:
                    write_json(args.json, {"cpu": cpu_model(), "target": args.target,
                                           "every": args.every, "cap": args.cap,
                                           "base_lr": args.base_lr,
                                           "momentum": args.momentum}, runs)
    print()
    print("\n".join(report(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two or more installed builds of cct on one machine, training step against training step, in
alternating processes: how a change to the compiled kernels (cct._C) is measured when the
machine's own noise is larger than the change.

    python bench/bench_builds.py --build new=/tmp/site --build old=/tmp/site_old \\
        --nets lenet,cifar10_quick --rounds 6
    python bench/bench_builds.py --build onednn=/tmp/site --build off=/tmp/site \\
        --env off:CCT_ONEDNN=off --precision bf16 --nets caffenet_b32

Each ``--build NAME=DIR`` is a folder that ``import cct`` finds cct in (a ``pip install
--target`` folder; two builds may be one folder run under different ``--env NAME:VAR=VALUE``
settings, such as a library kept out of the races). Each round starts one process per build, in turn, the order reversed every
other round, so that a slow minute of the machine falls on every build alike. Each process
runs bench_train's training step (its synthetic net; forward, backward and the SGD update, as
bench_train times cct; ``--precision bf16``: under cct train's bf16) ``--warmup`` times and
prints the median of the next ``--iters``. All processes share one folder of plan caches (the
machine cache, read before the net is built and written after, as cct train does), written
first by an untimed process per build, so that each build runs the same kernel plans in every
process (two builds share them where their plan caches' fingerprints agree); with
``--fresh-plans`` each process races its own instead (a change to the races themselves,
measured by how often a process ends up with slow plans). Printed per net and build: the
processes' medians (lowest-highest, and their median), each build's ratio to the first
build's, and how many processes started from cached plans.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # after the installed packages: `import cct` is a build's


def one_process(net_name: str, warmup: int, iters: int, precision: str) -> None:
    """In a child: the median training step of ``net_name`` as bench_train times cct's, in ms,
    on stdout, with how many plans it read from the machine cache and the folder cct came
    from."""
    import cct
    from cct import _C
    from cct.backend import plans
    from bench.bench_train import NETS, default_zoo, run_cct, use_bf16

    plans.use_machine_cache()   # as cct train: the cache, then the precision
    cached = _C.plan_count()
    if precision == "bf16" and use_bf16()["precision"] != "bf16":
        sys.exit("bench_builds: bf16 does not run on this CPU (CCT_BF16=emulate runs it)")
    prototxt, batch = NETS[net_name]
    times = run_cct(default_zoo() / prototxt, batch, warmup, iters)["times"]
    plans.persist()
    print(f"{statistics.median(times) * 1e3:.4f} {cached} {cct.__file__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", default=[], metavar="NAME=DIR",
                    help="a folder holding an installed cct (two or more)")
    ap.add_argument("--nets", default="lenet", help="comma-separated, from bench_train's nets")
    ap.add_argument("--rounds", type=int, default=6, help="processes per build and net")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30, help="timed steps per process")
    ap.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                    help="an environment variable set for one build's processes")
    ap.add_argument("--precision", choices=("float32", "bf16"), default="float32")
    ap.add_argument("--fresh-plans", action="store_true",
                    help="each process races its own plans (a cache of its own), so the "
                         "medians' spread shows how often the races pick a slow plan")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child's net
    args = ap.parse_args()
    if args.one:
        return one_process(args.one, args.warmup, args.iters, args.precision)

    builds = []
    for spec in args.build:
        name, sep, folder = spec.partition("=")
        if not sep or not (pathlib.Path(folder) / "cct").is_dir():
            sys.exit(f"bench_builds: --build {spec!r}: expected NAME=DIR with DIR/cct in it")
        builds.append((name, str(pathlib.Path(folder).resolve())))
    if len(builds) < 2:
        sys.exit("bench_builds: give two or more --build NAME=DIR")
    settings = {name: {} for name, _ in builds}
    for spec in args.env:
        name, sep, assignment = spec.partition(":")
        var, eq, value = assignment.partition("=")
        if not sep or not eq or not var or name not in settings:
            sys.exit(f"bench_builds: --env {spec!r}: expected NAME:VAR=VALUE, NAME one of "
                     f"{', '.join(settings)}")
        settings[name][var] = value

    shared = tempfile.TemporaryDirectory(prefix="cct_builds_cache_")
    for net_name in args.nets.split(","):
        ms = {name: [] for name, _ in builds}
        warm = {name: 0 for name, _ in builds}   # processes that started from cached plans
        # round -1, untimed: each build races its plans and writes them to the shared cache
        for r in range(-1, args.rounds):
            for name, folder in builds if r % 2 == 0 else builds[::-1]:
                if r < 0 and args.fresh_plans:
                    continue
                with tempfile.TemporaryDirectory(prefix="cct_builds_cache_") as own:
                    env = dict(os.environ, PYTHONPATH=folder,
                               XDG_CACHE_HOME=own if args.fresh_plans else shared.name,
                               **settings[name])
                    env.pop("CCT_PLAN_CACHE", None)   # the cache is XDG_CACHE_HOME's
                    out = subprocess.run(
                        [sys.executable, "-P", __file__, "--one", net_name, "--warmup",
                         str(args.warmup), "--iters", str(args.iters), "--precision",
                         args.precision], env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"bench_builds: {name} on {net_name} failed:\n{out.stderr[-2000:]}")
                value, cached, where = out.stdout.split()[-3:]
                if not where.startswith(folder):
                    sys.exit(f"bench_builds: {name} imported cct from {where}, not {folder}")
                if r >= 0:
                    ms[name].append(float(value))
                    warm[name] += int(cached) > 0
        first = statistics.median(ms[builds[0][0]])
        for name, _ in builds:
            v = ms[name]
            print(f"{net_name:14s} {name:10s} training step {min(v):8.3f}-{max(v):8.3f} ms, "
                  f"median {statistics.median(v):8.3f} ms, "
                  f"{statistics.median(v) / first:5.3f}x of {builds[0][0]}; "
                  f"{warm[name]} of {len(v)} from cached plans", flush=True)
            if args.fresh_plans:  # each process's own plans: the slow ones show here
                print(f"{'':25s} each process: {' '.join(f'{t:.3f}' for t in sorted(v))}")


if __name__ == "__main__":
    main()

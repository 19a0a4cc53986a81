"""The asynchronous driver on this machine: what the parameter store costs per update, and the
real engines against synchronous training on LeNet / mnist10k.

    python bench/bench_driver.py                     # both parts
    python bench/bench_driver.py --part overhead --nets lenet,cifar10_quick
    python bench/bench_driver.py --part engines --cap 3000

**overhead**: for each net (the zoo's prototxts on synthetic data, as bench_train.py builds
them), one group's training step (forward, backward and the solver's fused SGD update) against
what the store adds per update: the pull, the store's weights copied into the group's
preallocated params (cct.params.ParamSet). The push copies nothing: the store's update reads
the group's diffs where they are (ParamSet.with_gradients_of). Printed: milliseconds of each
and the pull's share of the step (target below 5% for CIFAR10-quick and CaffeNet).

**engines**: LeNet with examples/mnist/lenet_solver.prototxt's settings from the same seed
under sync on one 2-core device, sync split over two 1-core devices (the hybrid scheduler),
and async with 2 groups (threads; processes), each in a process of its own, with this
machine's plan cache. Printed: updates/s over the run, and the seconds and iterations until the
test accuracy on the 2,000 held-out digits first reaches 0.98 (checked every ``--every``
iterations, not counted in the seconds), or ">cap".

**kill**: LeNet async g=2 on the processes engine for ``--kill-iters`` iterations, once
untouched and once with group 1 killed by SIGKILL a quarter of the way in: both final test
accuracies and their difference (issue 9: within 0.5 point).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct (whose compiled _C a source
# checkout lacks after a non-editable install); the repository gives only the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import cpu_model, default_data_dir, mnist_lmdbs  # noqa: E402
from bench.bench_momentum import evaluate, solver_param  # noqa: E402
from bench.worker import run_worker  # noqa: E402
from bench.bench_train import (NETS, default_zoo, sgd_update, synthetic_net,  # noqa: E402
                               timed_iterations)

OVERHEAD_NETS = ("lenet", "cifar10_quick", "caffenet_b32")
CONFIGS = {
    "sync, 1 device of 2 cores": {"strategy": "sync", "devices": None},
    "sync, 2 devices of 1 core": {"strategy": "sync", "devices": "cpu:1,cpu:1"},
    "async g=2, threads": {"strategy": "async", "engine": "threads"},
    "async g=2, processes": {"strategy": "async", "engine": "processes"},
}


def overhead(name: str, zoo: str, iters: int) -> dict:
    from cct.params import ParamSet

    rel, batch = NETS[name]
    net = synthetic_net(pathlib.Path(zoo) / rel, batch)
    update = sgd_update(net)
    group = ParamSet.of_net(net)
    store = ParamSet.copy_of(group)

    def step():
        net.clear_param_diffs()
        net.forward_backward()
        update()

    def pull():
        store.copy_weights_to(group)

    times = {label: statistics.median(timed_iterations(fn, 1, iters))
             for label, fn in (("step", step), ("pull", pull))}
    return {"net": name, "batch": batch, "mb": store.nbytes / 2 ** 20, **times}


def engine_run(config: str, data_dir: str, cap: int, every: int) -> dict:
    """One configuration to the target, in this (fresh) process."""
    from cct.api import Solver
    from cct.driver import AsyncDriver
    from cct.glog import set_quiet

    set_quiet(True)
    spec = CONFIGS[config]
    train_db, test_db = mnist_lmdbs(pathlib.Path(data_dir))
    param = solver_param(train_db, test_db, 0.01, cap)
    solver = Solver(param, source=str(REPO / "examples/mnist/lenet_solver.prototxt"),
                    devices=spec.get("devices"))
    driver = None
    if spec["strategy"] == "async":
        driver = AsyncDriver(solver, groups=2, engine=spec["engine"])
    step = driver.step if driver else solver.step
    trained, reached, curve = 0.0, None, []
    try:
        while solver.iter < cap:
            t0 = time.perf_counter()
            step(every)
            trained += time.perf_counter() - t0
            acc, loss = evaluate(solver, driver or solver.gradient_source)
            if loss != loss:     # NaN: a diverged net scores any accuracy
                break
            curve.append((solver.iter, acc))
            if acc >= 0.98 - 1e-6:
                reached = (solver.iter, trained)
                break
    finally:
        if driver:
            driver.close()
        solver.close()
    return {"config": config, "updates_per_s": solver.iter / trained, "reached": reached,
            "curve": curve}


def kill_run(data_dir: str, iters: int, kill_at: int) -> dict:
    """LeNet, async g=2 on the processes engine, with group 1 killed by SIGKILL after
    ``kill_at`` updates (never when ``kill_at`` is 0); the final test accuracy."""
    import os
    import signal

    from cct.api import Solver
    from cct.driver import AsyncDriver
    from cct.glog import set_quiet

    set_quiet(True)
    train_db, test_db = mnist_lmdbs(pathlib.Path(data_dir))
    solver = Solver(solver_param(train_db, test_db, 0.01, iters))
    driver = AsyncDriver(solver, groups=2, engine="processes")
    try:
        if kill_at:
            driver.step(kill_at)
            os.kill(driver.groups[1].process.pid, signal.SIGKILL)
        driver.step(iters - solver.iter)
        return {"iter": solver.iter, "groups_left": len(driver.groups),
                "accuracy": evaluate(solver, driver)[0]}
    finally:
        driver.close()
        solver.close()


def spawn(args, config: str) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", config,
           "--data-dir", args.data_dir, "--cap", str(args.cap), "--every", str(args.every),
           "--kill-iters", str(args.kill_iters)]
    return run_worker(cmd, config)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["overhead", "engines", "kill", "both"], default="both",
                    help="kill: a group process killed mid-run against an unkilled run")
    ap.add_argument("--kill-iters", type=int, default=2000)
    ap.add_argument("--nets", default=",".join(OVERHEAD_NETS))
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--iters", type=int, default=5, help="timed repeats per overhead figure")
    ap.add_argument("--data-dir", default=str(default_data_dir()))
    ap.add_argument("--cap", type=int, default=3000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        if args.worker.startswith("kill:"):
            result = kill_run(args.data_dir, args.kill_iters, int(args.worker[5:]))
        else:
            result = engine_run(args.worker, args.data_dir, args.cap, args.every)
        print("RESULT " + json.dumps(result))
        return
    print(cpu_model())
    if args.part in ("overhead", "both"):
        print(f"{'net':<15}{'batch':>6}{'params MB':>11}{'step ms':>10}{'pull ms':>9}"
              f"{'share':>8}")
        for name in args.nets.split(","):
            r = overhead(name, args.zoo, args.iters)
            share = r["pull"] / r["step"]
            print(f"{name:<15}{r['batch']:>6}{r['mb']:>11.1f}{1e3 * r['step']:>10.1f}"
                  f"{1e3 * r['pull']:>9.2f}{100 * share:>7.1f}%", flush=True)
        print("share: pull / step; the update itself is in the step, as in sync training")
    if args.part in ("engines", "both"):
        print(f"{'configuration':<28}{'updates/s':>10}{'iters to 98%':>14}{'s to 98%':>10}")
        for config in CONFIGS:
            r = spawn(args, config)
            it, sec = (r["reached"] or (None, None))
            print(f"{config:<28}{r['updates_per_s']:>10.1f}"
                  f"{(str(it) if it else '>' + str(args.cap)):>14}"
                  f"{(f'{sec:.1f}' if sec else '-'):>10}", flush=True)
    if args.part == "kill":
        n = args.kill_iters
        whole = spawn(args, "kill:0")
        killed = spawn(args, f"kill:{n // 4}")
        print(f"LeNet, async g=2, processes, {n} iterations: unkilled accuracy "
              f"{whole['accuracy']:.4f}; group 1 killed (SIGKILL) after {n // 4} updates: "
              f"{killed['accuracy']:.4f} at iteration {killed['iter']} with "
              f"{killed['groups_left']} group left; difference "
              f"{100 * (whole['accuracy'] - killed['accuracy']):+.2f} points")


if __name__ == "__main__":
    main()

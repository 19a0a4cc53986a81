"""The Ray engine's cost per update against the threads engine, and a scale-out model checked
against one and two nodes here (issue 11).

    python bench/bench_ray.py                        # both parts
    python bench/bench_ray.py --part overhead --nets lenet,cifar10_quick --updates 30

**overhead**: for each net (the zoo's prototxt on synthetic data, as bench_train.py builds it;
the train net's Input blobs filled once and fed to the groups as a data layer's tops would
be), one group on one core under the threads engine and under the Ray engine (a local Ray,
one shard, the group actor with one CPU): seconds per update over ``--updates`` after
warm-up (one steady run, total time / updates). Printed: both, the difference (what Ray adds per update: actor calls, the weights and
the gradient through the object store, the batch shipped) and its share of the threads step
(target: under 5% for CIFAR10-quick and CaffeNet; LeNet's step is milliseconds, so it is
latency-bound).

**scale-out**: a model of updates per second with N nodes, one group per node and S store
shards: a group's update cycle is its step T plus moving 2M bytes (pull and push) over its
link of bandwidth B, plus the per-update overhead c measured above; the store applies at most
S / t_apply updates per second (t_apply: one shard's update time for its share, measured on
the driver's solver), and its links carry at most S x B / (2M) updates per second:

    updates/s(N) = min(N / (T + 2M/B + c), S / t_apply, S B / (2M))

(cct/optimizer/cluster.py's ``updates_per_second``, which ``cct plan --cluster`` plans with)

Checked against LeNet measured here with a ray.cluster_utils.Cluster of 1 and 2 one-CPU nodes
(on one 2-core machine the nodes share its memory bus, so B is the object store's measured
copy rate), then printed for N = 1..64 at a stated bandwidth (``--bandwidth``, default 1.25
GB/s, a 10 Gb/s network) for each net.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct (a source checkout lacks the
# compiled _C after a non-editable install); the repository gives only the `bench` package.
sys.path.append(str(REPO))

from bench.bench_momentum import cpu_model  # noqa: E402
from bench.bench_train import NETS, default_zoo, num_classes, train_net_param  # noqa: E402
from bench.worker import one_thread_env, run_worker  # noqa: E402
from cct.optimizer.cluster import apply_seconds  # noqa: E402
from cct.optimizer.cluster import updates_per_second as predict  # noqa: E402

OVERHEAD_NETS = ("lenet", "cifar10_quick", "caffenet_b32")


def synthetic_solver(name: str, zoo: str, max_iter: int):
    """A solver over the net's TRAIN graph with Input layers holding fixed synthetic data."""
    import numpy as np

    from cct.api import Solver
    from cct.proto import caffe_pb2
    rel, batch = NETS[name]
    net = train_net_param(pathlib.Path(zoo) / rel, batch)
    param = caffe_pb2.SolverParameter()
    param.net_param.CopyFrom(net)
    param.base_lr, param.momentum, param.weight_decay = 0.001, 0.9, 5e-4
    param.lr_policy = "fixed"
    param.max_iter, param.display, param.snapshot_after_train = max_iter, 0, False
    param.random_seed = 1
    solver = Solver(param)
    rng = np.random.default_rng(0)
    classes = num_classes(net)
    for layer, top in zip(solver.net.layers, solver.net.top_vecs):
        if layer.type == "Input":
            top[0].data[...] = rng.standard_normal(top[0].shape)
            for t in top[1:]:
                t.data[...] = rng.integers(0, classes, t.shape)
    return solver


def seconds_per_update(driver, solver, updates: int, warm: int) -> float:
    """Seconds per update in a steady run of ``updates`` (after ``warm``): the group is sent
    its next step as soon as its push is handed on, as in training."""
    driver.step(warm)
    t0 = time.perf_counter()
    driver.step(updates)
    return (time.perf_counter() - t0) / updates


def overhead_run(name: str, zoo: str, engine: str, updates: int) -> dict:
    from cct import glog
    from cct.driver import Driver
    glog.set_quiet(True)
    warm = 3
    solver = synthetic_solver(name, zoo, updates + warm + 1)
    kw = {"devices": "cpu:1"} if engine == "threads" else {"ps_shards": 1}
    driver = Driver(solver, groups=1, engine=engine, **kw)
    try:
        out = {"net": name, "engine": engine,
               "seconds": seconds_per_update(driver, solver, updates, warm),
               "model_bytes": solver.params.nbytes}
        if engine == "ray":
            out["bandwidth"] = driver.engine._bandwidth()
            out["apply_seconds"] = apply_seconds(solver)
        return out
    finally:
        driver.close()
        solver.close()


def nodes_run(nodes: int, updates: int) -> dict:
    """LeNet on synthetic data, one group per one-CPU node of a local Cluster: updates/s."""
    import ray
    from ray.cluster_utils import Cluster

    from cct import glog
    from cct.driver import Driver
    glog.set_quiet(True)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 200 << 20, "include_dashboard": False})
    for _ in range(nodes - 1):
        c.add_node(num_cpus=1, object_store_memory=200 << 20)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    solver = synthetic_solver("lenet", str(default_zoo()), updates + 20)
    driver = Driver(solver, groups=nodes, engine="ray", ps_shards=1)
    try:
        driver.step(10)
        t0 = time.perf_counter()
        driver.step(updates)
        return {"nodes": nodes, "updates_per_s": updates / (time.perf_counter() - t0)}
    finally:
        driver.close()
        solver.close()
        ray.shutdown()
        c.shutdown()


def spawn(args, job: dict) -> dict:
    return run_worker([sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                       json.dumps(job)], str(job), one_thread_env())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="overhead,scale-out")
    ap.add_argument("--nets", default=",".join(OVERHEAD_NETS))
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--bandwidth", type=float, default=1.25e9)
    ap.add_argument("--zoo", default=str(default_zoo()))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        if job["kind"] == "overhead":
            result = overhead_run(job["net"], job["zoo"], job["engine"], job["updates"])
        else:
            result = nodes_run(job["nodes"], job["updates"])
        print("RESULT " + json.dumps(result))
        return
    parts = args.part.split(",")
    print(f"# {cpu_model()}, {os.cpu_count()} cores")
    rows = {}
    if "overhead" in parts or "scale-out" in parts:
        print("\n| net | threads s/update | ray s/update | ray adds | share of the step |")
        print("|---|---|---|---|---|")
        for net in args.nets.split(","):
            updates = args.updates * (10 if net == "lenet" else 1)
            t = spawn(args, {"kind": "overhead", "net": net, "zoo": args.zoo,
                             "engine": "threads", "updates": updates})
            r = spawn(args, {"kind": "overhead", "net": net, "zoo": args.zoo,
                             "engine": "ray", "updates": updates})
            rows[net] = (t, r)
            add = r["seconds"] - t["seconds"]
            print(f"| {net} | {t['seconds'] * 1000:.4g} ms | {r['seconds'] * 1000:.4g} ms | "
                  f"{add * 1000:.3g} ms | {100 * add / t['seconds']:.1f}% |", flush=True)
    if "scale-out" in parts and "lenet" in rows:
        t, r = rows["lenet"]
        c = max(0.0, r["seconds"] - t["seconds"] - 2 * r["model_bytes"] / r["bandwidth"])
        print(f"\nLeNet: step T {t['seconds'] * 1000:.3g} ms, model {r['model_bytes']} bytes, "
              f"object-store copy rate {r['bandwidth'] / 1e9:.3g} GB/s, fixed overhead c "
              f"{c * 1000:.3g} ms, one shard's apply {r['apply_seconds'] * 1000:.3g} ms")
        print("\n| nodes | measured updates/s | predicted |")
        print("|---|---|---|")
        for n in (1, 2):
            m = spawn(args, {"kind": "nodes", "nodes": n, "updates": args.updates * 10})
            p = predict(n, t["seconds"], r["model_bytes"], r["bandwidth"], c,
                        r["apply_seconds"])
            print(f"| {n} | {m['updates_per_s']:.4g} | {p:.4g} |", flush=True)
        print(f"\nPredicted updates/s at {args.bandwidth / 1e9:g} GB/s per link, one group per "
              f"node, the overhead c above, 1 and 4 shards:")
        print("\n| net | N=1 | N=4 | N=16 | N=64 (1 shard) | N=64 (4 shards) |")
        print("|---|---|---|---|---|---|")
        for net, (t, r) in rows.items():
            cells = [predict(n, t["seconds"], r["model_bytes"], args.bandwidth, c,
                             r["apply_seconds"]) for n in (1, 4, 16, 64)]
            cells.append(predict(64, t["seconds"], r["model_bytes"], args.bandwidth, c,
                                 r["apply_seconds"], shards=4))
            print(f"| {net} | " + " | ".join(f"{v:.3g}" for v in cells) + " |")


if __name__ == "__main__":
    main()

"""Intel MKL's float32 GEMM against each GEMM cct's races decide (issue 34, item 1: "OpenBLAS's
SkylakeX kernels for thin GEMMs"): every GEMM the nets' plans race (the fully connected layers'
three GEMMs, the convolutions' weight gradients), timed as cct runs it (the plan the race chose:
an OpenBLAS operand order, the skinny engine, or MKL's sgemm where MKL is installed) against
MKL's ``cblas_sgemm`` as cct calls it (GEMM choice 5, cct/backend/mkl.py: the whole GEMM on
MKL's own GNU OpenMP threads, as many as cct's) and PyTorch's ``mm``; then each strided batched
GEMM the races met (Winograd's products, the pointwise layout's: the "gemm_batch" table, raced
where MKL is offered), OpenBLAS's batched call against MKL's.

    python bench/bench_thin_gemm.py [--nets cifar10_quick,caffenet_b32] [--rounds 5]

Needs MKL for its MKL column (``pip install -e ".[mkl]"``, or ``$CCT_BF16_LIBRARY`` naming a
libmkl_rt); without it the column says why it is empty. Prints the machine, then per net a row
per GEMM shape (ms, best of ``--rounds`` alternated rounds; GFLOP/s of cct's plan; MKL's and
PyTorch's speed as cct / them, > 1: they are faster) and the sum over the net's shapes, each
counted once: the share of its GEMM time MKL would save where it is faster than the plan (the
races' misses, once MKL is among their candidates); then the net's training iteration with MKL
among the races' candidates and without, alternated in one process.

PyTorch runs in a process of its own: it ships its own GNU OpenMP, whose default spin-wait
MKL's threads would share in this one (cct/backend/mkl.py then runs MKL on one thread).
"""
import argparse
import importlib.util
import json
import pathlib
import sys

import numpy as np

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, alternated_tables,  # noqa: E402
                               chosen_nets, machine, sgd_update, sgemm_peak, synthetic_net)
from bench.worker import run_worker, seconds  # noqa: E402

# A GEMM plan row's choice (csrc/gemm.cpp): OpenBLAS's two operand orders (False, True), its
# float32 orders for bf16 operands (2, 3), the skinny engine's 8- and 16-lane tiles (4, 6; 6
# only on AVX-512 CPUs), MKL's sgemm (5), the bf16 engines (8, 9), the thin engine (10; its
# 16-lane tile on AVX-512 CPUs, its 8-lane one on AVX2), cct's bf16 kernel in the skinny and
# the thin forms (11, 12; AVX512-BF16 CPUs).
CHOICE_NAMES = {False: "direct", True: "transp.", 2: "f32 d", 3: "f32 t", 4: "skinny",
                5: "MKL", 6: "skinny16", 8: "bf16 MKLt", 9: "bf16 cct", 10: "thin",
                11: "bf16 skinny", 12: "bf16 thin"}


def load_mkl():
    """True and MKL's version where cct's MKL sgemm runs here, else False and why not. The
    races get it as a candidate, as in cct train's runs, unless $CCT_MKL_SGEMM=off."""
    from cct import _C
    from cct.backend import mkl
    why = mkl.load()
    if why:
        return False, why
    mkl.offer_sgemm()
    offered = "raced" if _C.mkl_sgemm_offered() else "not raced ($CCT_MKL_SGEMM=off)"
    return True, f"{_C.mkl_version()}, {offered}"


def operands(row, rng):
    ta, tb, m, n, k = row[:5]
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
    return a, b, np.zeros((m, n), np.float32)


def shape_times(row, with_mkl: bool, rounds: int) -> dict:
    """Seconds of one plan row's GEMM, best of ``rounds``: cct with the row's choice, and
    with MKL's sgemm (the same row choosing it)."""
    from cct import _C
    from cct.backend import plans
    ta, tb, m, n, k, _, _, accumulate, choice = row
    a, b, out = operands(row, np.random.default_rng(0))

    def arm(plan):
        row_now = tuple(row[:8]) + (int(plan),)

        def run():
            _C.load_gemm_choices([row_now])  # both arms share the table's key
            _C.gemm(a, b, ta, tb, measured=True, out=out, accumulate=accumulate)
        return run
    arms = {"cct": arm(choice)}
    if with_mkl:
        arms["mkl"] = arm(plans.MKL_CHOICE)
        # The same product, or the comparison means nothing (C started at 0 in both).
        products = {}
        for name, plan in (("mkl", plans.MKL_CHOICE), ("direct", 0)):
            _C.load_gemm_choices([tuple(row[:8]) + (plan,)])
            products[name] = np.zeros_like(out)
            _C.gemm(a, b, ta, tb, measured=True, out=products[name], accumulate=True)
        scale = np.abs(products["direct"]).max() + 1e-30
        assert np.abs(products["mkl"] - products["direct"]).max() <= 1e-4 * scale, \
            f"MKL's product differs on {row}"
    best = best_alternated(arms, rounds)
    _C.load_gemm_choices([tuple(row)])
    return best


def best_alternated(arms: dict, rounds: int) -> dict:
    """Each arm's best seconds over ``rounds`` rounds, the arms' order reversed every other
    round."""
    times = {name: [] for name in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            times[name].append(seconds(arms[name]))
    return {name: min(v) for name, v in times.items()}


def batch_shape_times(row, rounds: int) -> dict:
    """Seconds of one batched row's call, best of ``rounds`` alternated: OpenBLAS's batched
    call (choice 0) and MKL's (5), on the same operands (their products checked close)."""
    from cct import _C
    from cct.backend import plans
    ta, tb, m, n, k, count, _, _, accumulate, _ = row
    rng = np.random.default_rng(0)
    a = rng.standard_normal((count, k, m) if ta else (count, m, k), np.float32)
    b = rng.standard_normal((count, n, k) if tb else (count, k, n), np.float32)
    outs = {name: np.zeros((count, m, n), np.float32) for name in ("blas", "mkl")}
    choice = {"blas": 0, "mkl": plans.MKL_CHOICE}

    def arm(name):
        def run():
            _C.load_gemm_batch_choices([tuple(row[:9]) + (choice[name],)])
            _C.gemm_batch(a, b, ta, tb, out=outs[name], accumulate=accumulate)
        return run
    for name in outs:
        outs[name][...] = 0
        arm(name)()
    scale = np.abs(outs["blas"]).max() + 1e-30
    assert np.abs(outs["mkl"] - outs["blas"]).max() <= 1e-4 * scale, \
        f"MKL's batched product differs on {row}"
    best = best_alternated({name: arm(name) for name in outs}, rounds)
    _C.load_gemm_batch_choices([tuple(row)])
    return best


def torch_times(rows, rounds: int, threads: int) -> list:
    """PyTorch's ``mm`` on each row's operands (seconds, best of ``rounds``; ``threads``
    threads), in a worker process; an empty list where PyTorch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return []
    shapes = [[int(v) for v in row[:5]] for row in rows]
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--torch-worker",
           json.dumps(shapes), "--rounds", str(rounds), "--threads", str(threads)]
    return run_worker(cmd, "the PyTorch run")["times"]


def torch_worker(shapes, rounds: int, threads: int) -> None:
    import torch
    torch.set_num_threads(threads)
    times = []
    for shape in shapes:
        ta, tb = shape[:2]
        a, b, _ = operands(shape, np.random.default_rng(0))
        ta_, tb_ = torch.from_numpy(a), torch.from_numpy(b)
        x, y = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
        torch.mm(x, y)
        times.append(min(seconds(lambda: torch.mm(x, y)) for _ in range(rounds)))
    print("RESULT " + json.dumps({"times": times}))


def net_rows(name: str, zoo) -> tuple:
    """The GEMM plan rows a net's training iteration races, each shape once, and its batched
    GEMMs' rows (raced where MKL is offered; those of layouts the convolution races tried and
    did not keep among them)."""
    from cct import _C
    from cct.backend import plans
    _C.clear_plans()
    rel, batch = NETS[name]
    net = synthetic_net(zoo / rel, batch)
    for _ in range(2):
        net.clear_param_diffs()
        net.forward_backward()
    table = plans.table()
    rows = [r for r in table["gemm"] if r[5] == 4]
    del net
    return rows, table.get("gemm_batch", [])


def iteration_with_and_without(name: str, zoo, rounds: int, iters: int = 3) -> dict:
    """The net's training iteration (ms, median of ``iters`` per round, best round) with MKL's
    sgemm among the GEMM races' candidates and without, alternated in one process: the races
    run once each way, then the two tables are installed in turn with the same convolution
    plans (the first way's), so that only the GEMM choices differ. Also how many raced shapes
    chose MKL."""
    from cct import _C
    from cct.backend import plans
    from cct.blob_memory import share_blob_diffs
    rel, batch = NETS[name]
    net = synthetic_net(zoo / rel, batch)
    share_blob_diffs(net)
    update = sgd_update(net)

    def step():
        net.clear_param_diffs()
        net.forward_prefilled()
        net.backward_all()
        update()
    offered, tables = _C.mkl_sgemm_offered(), {}
    try:
        for arm, offer in (("with", True), ("without", False)):
            _C.clear_plans()
            _C.set_mkl_sgemm_offered(offer)
            for _ in range(2):
                step()
            tables[arm] = plans.table()
    finally:
        _C.set_mkl_sgemm_offered(offered)
    tables["without"]["conv"] = tables["with"]["conv"]
    times = alternated_tables(tables, step, rounds, iters)
    _C.clear_plans()
    out = {arm: 1e3 * min(v) for arm, v in times.items()}
    out["chose_mkl"] = sum(row[-1] == plans.MKL_CHOICE for row in tables["with"]["gemm"])
    out["shapes"] = len(tables["with"]["gemm"])
    batched = tables["with"].get("gemm_batch", [])
    out["batch_chose_mkl"] = sum(row[-1] == plans.MKL_CHOICE for row in batched)
    out["batch_shapes"] = len(batched)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "cifar10_quick,caffenet_b32,googlenet_b32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(json.loads(args.torch_worker), args.rounds, args.threads)
    names = chosen_nets(ap, args)
    from cct import _C
    print(machine())
    with_mkl, mkl_note = load_mkl()
    print(f"SGEMM peak {sgemm_peak():.1f} GFLOP/s; MKL: {mkl_note}; {args.rounds} rounds, "
          f"alternated; ms, best")
    for name in names:
        rows, batched = net_rows(name, args.zoo)
        print(f"\n{name}: {len(rows)} raced GEMM shapes")
        print(f"{'ta tb    m     n      k acc':28} {'plan':>8} {'cct ms':>8} {'GF/s':>6} "
              f"{'MKL ms':>8} {'cct/MKL':>7} {'torch ms':>8} {'cct/torch':>9}")
        total = {"cct": 0.0, "best": 0.0}
        peer = [] if args.no_torch else torch_times(rows, args.rounds, _C.blas_num_threads())
        for i, row in enumerate(rows):
            ta, tb, m, n, k, _, _, acc, choice = row
            t = shape_times(row, with_mkl, args.rounds)
            if peer:
                t["torch"] = peer[i]
            total["cct"] += t["cct"]
            total["best"] += min(t["cct"], t.get("mkl", t["cct"]))
            mkl_cols = (f"{1e3 * t['mkl']:8.2f} {t['cct'] / t['mkl']:7.2f}" if "mkl" in t
                        else f"{'-':>8} {'-':>7}")
            torch_cols = (f"{1e3 * t['torch']:8.2f} {t['cct'] / t['torch']:9.2f}"
                          if "torch" in t else f"{'-':>8} {'-':>9}")
            print(f"{int(ta):2} {int(tb):2} {m:5} {n:5} {k:6} {int(acc):3} "
                  f"{CHOICE_NAMES[choice]:>8} {1e3 * t['cct']:8.2f} "
                  f"{2.0 * m * n * k / t['cct'] / 1e9:6.1f} {mkl_cols} {torch_cols}", flush=True)
        if with_mkl:
            saved = 1 - total["best"] / total["cct"]
            print(f"sum: cct {1e3 * total['cct']:.1f} ms; with MKL where faster "
                  f"{1e3 * total['best']:.1f} ms ({100 * saved:.0f}% of these GEMMs' time saved)")
        if batched:
            print(f"{len(batched)} strided batched GEMM shapes (tried by the layouts' races):")
            print(f"{'ta tb    m     n      k count acc':34} {'OpenBLAS ms':>11} {'GF/s':>6} "
                  f"{'MKL ms':>8} {'GF/s':>6} {'OB/MKL':>7}")
            for row in batched:
                ta, tb, m, n, k, count, _, _, acc, _ = row
                t = batch_shape_times(row, args.rounds)
                flops = 2.0 * m * n * k * count
                print(f"{int(ta):2} {int(tb):2} {m:5} {n:5} {k:6} {count:5} {int(acc):3} "
                      f"{1e3 * t['blas']:11.3f} {flops / t['blas'] / 1e9:6.1f} "
                      f"{1e3 * t['mkl']:8.3f} {flops / t['mkl'] / 1e9:6.1f} "
                      f"{t['blas'] / t['mkl']:7.2f}", flush=True)
        if with_mkl:
            it = iteration_with_and_without(name, args.zoo, args.rounds)
            print(f"iteration: MKL in the races {it['with']:.1f} ms ({it['chose_mkl']} of "
                  f"{it['shapes']} raced shapes chose it; batched {it['batch_chose_mkl']} of "
                  f"{it['batch_shapes']}), without {it['without']:.1f} ms: "
                  f"{it['without'] / it['with']:.3f}x", flush=True)
    _C.clear_plans()


if __name__ == "__main__":
    main()

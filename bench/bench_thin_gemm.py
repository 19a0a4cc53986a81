"""Whether Intel MKL's float32 GEMM should join cct's GEMM races (issue 34, item 1: "OpenBLAS's
SkylakeX kernels for thin GEMMs"): every GEMM the nets' plans race (the fully connected
layers' three GEMMs, the convolutions' weight gradients), timed as cct runs it (the plan the
race chose: an OpenBLAS operand order or the skinny engine) against MKL's ``cblas_sgemm``, the
whole GEMM on MKL's own threads (GNU OpenMP, as many as cct's), and PyTorch's ``mm``.

    python bench/bench_thin_gemm.py [--nets cifar10_quick,caffenet_b32] [--rounds 5]

Needs MKL (``pip install -e ".[bf16]"``, or ``$CCT_BF16_LIBRARY`` naming a libmkl_rt); without
it the MKL column says why it is empty. Prints the machine, then per net a row per GEMM shape
(ms, best of ``--rounds`` alternated rounds; GFLOP/s of cct's plan; MKL's and PyTorch's speed
as cct / them, > 1: they are faster) and the sum over the net's shapes, each counted once: the
share of its GEMM time MKL would save where it is faster. MKL is worth building into the race
on a CPU where that share is a noticeable part of the iteration (the bench_layers table).
"""
import argparse
import ctypes
import os
import pathlib
import sys

import numpy as np

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, chosen_nets, machine,  # noqa: E402
                               sgemm_peak, synthetic_net)
from bench.worker import seconds  # noqa: E402

# mkl_cblas.h / mkl_service.h
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
THREADING_GNU = 3


def load_mkl(threads: int):
    """MKL's runtime library with its GNU OpenMP layer on ``threads`` threads, or why not."""
    from cct.backend import precision
    path = precision.engine_path()
    if path is None:
        return None, "no MKL: pip install -e \".[bf16]\" or set $CCT_BF16_LIBRARY"
    # MKL's threads wait by spinning a while after a call (GNU OpenMP's default, 300,000
    # spins) and would take the cores from the cct arm timed next; cct's own threads park.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(path)
    except OSError as e:
        return None, f"MKL ({path}) did not load: {e}"
    if lib.MKL_Set_Threading_Layer(THREADING_GNU) != THREADING_GNU:
        return None, f"MKL ({path}) has no GNU threading layer"
    lib.MKL_Set_Dynamic(0)
    lib.MKL_Set_Num_Threads(threads)
    f, i, p = ctypes.c_float, ctypes.c_int, ctypes.c_void_p
    lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    lib.cblas_sgemm.restype = None
    return lib, path


def operands(row, rng):
    ta, tb, m, n, k = row[:5]
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
    return a, b, np.zeros((m, n), np.float32)


def shape_times(row, mkl, rounds: int, torch) -> dict:
    """Seconds per round of one plan row's GEMM: cct with the row's choice, MKL, PyTorch."""
    from cct import _C
    ta, tb, m, n, k, _, _, accumulate, _ = row
    a, b, out = operands(row, np.random.default_rng(0))
    _C.load_gemm_choices([tuple(row)])
    arms = {"cct": lambda: _C.gemm(a, b, ta, tb, measured=True, out=out, accumulate=accumulate)}
    if mkl is not None:
        c = np.zeros_like(out)
        args = (ROW_MAJOR, TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS, m, n, k, 1.0,
                a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1],
                1.0 if accumulate else 0.0, c.ctypes.data, n)
        arms["mkl"] = lambda: mkl.cblas_sgemm(*args)
        arms["mkl"]()
        # The same product, or the comparison means nothing (C started at 0 in both).
        want = np.zeros_like(out)
        _C.gemm(a, b, ta, tb, measured=True, out=want, accumulate=True)
        got = np.zeros_like(c)
        mkl.cblas_sgemm(*(args[:11] + (1.0, got.ctypes.data, n)))
        scale = np.abs(want).max() + 1e-30
        assert np.abs(got - want).max() <= 1e-4 * scale, f"MKL's product differs on {row}"
    times = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            times[arm].append(seconds(arms[arm]))
    if torch is not None:
        # After the others, not between them: PyTorch's OpenMP threads spin on after a call.
        ta_, tb_ = torch.from_numpy(a), torch.from_numpy(b)
        x, y = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
        torch.mm(x, y)
        times["torch"] = [seconds(lambda: torch.mm(x, y)) for _ in range(rounds)]
    return {arm: min(v) for arm, v in times.items()}


def net_rows(name: str, zoo) -> list:
    """The GEMM plan rows a net's training iteration races, each shape once."""
    from cct import _C
    from cct.backend import plans
    _C.clear_plans()
    rel, batch = NETS[name]
    net = synthetic_net(zoo / rel, batch)
    for _ in range(2):
        net.clear_param_diffs()
        net.forward_backward()
    rows = [r for r in plans.table()["gemm"] if r[5] == 4]
    del net
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "cifar10_quick,caffenet_b32,googlenet_b32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    names = chosen_nets(ap, args)
    from cct import _C
    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(_C.blas_num_threads())
        except ImportError:
            torch = None
    print(machine())
    mkl, mkl_note = load_mkl(_C.blas_num_threads())
    print(f"SGEMM peak {sgemm_peak():.1f} GFLOP/s; MKL: {mkl_note}; {args.rounds} rounds, "
          f"alternated; ms, best")
    choice_name = {False: "direct", True: "transp.", 2: "f32 d", 3: "f32 t", 4: "skinny"}
    for name in names:
        rows = net_rows(name, args.zoo)
        print(f"\n{name}: {len(rows)} raced GEMM shapes")
        print(f"{'ta tb    m     n      k acc':28} {'plan':>8} {'cct ms':>8} {'GF/s':>6} "
              f"{'MKL ms':>8} {'cct/MKL':>7} {'torch ms':>8} {'cct/torch':>9}")
        total = {"cct": 0.0, "best": 0.0}
        for row in rows:
            ta, tb, m, n, k, _, _, acc, choice = row
            t = shape_times(row, mkl, args.rounds, torch)
            total["cct"] += t["cct"]
            total["best"] += min(t["cct"], t.get("mkl", t["cct"]))
            mkl_cols = (f"{1e3 * t['mkl']:8.2f} {t['cct'] / t['mkl']:7.2f}" if "mkl" in t
                        else f"{'-':>8} {'-':>7}")
            torch_cols = (f"{1e3 * t['torch']:8.2f} {t['cct'] / t['torch']:9.2f}"
                          if "torch" in t else f"{'-':>8} {'-':>9}")
            print(f"{int(ta):2} {int(tb):2} {m:5} {n:5} {k:6} {int(acc):3} "
                  f"{choice_name[choice]:>8} {1e3 * t['cct']:8.2f} "
                  f"{2.0 * m * n * k / t['cct'] / 1e9:6.1f} {mkl_cols} {torch_cols}", flush=True)
        if mkl is not None:
            saved = 1 - total["best"] / total["cct"]
            print(f"sum: cct {1e3 * total['cct']:.1f} ms; with MKL where faster "
                  f"{1e3 * total['best']:.1f} ms ({100 * saved:.0f}% of these GEMMs' time saved)")
    _C.clear_plans()


if __name__ == "__main__":
    main()

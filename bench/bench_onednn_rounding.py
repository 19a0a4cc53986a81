"""oneDNN's bf16 convolutions with their activations rounded by cct (csrc/onednn.cpp's
RoundPlan, bf16.h's round_to_bf16_daz_2d; the default) against oneDNN's own reorders
(``_C.set_onednn_cct_rounding(False)``), kernel by kernel, on the zoo nets' convolutions under
bf16 GEMMs with oneDNN's layout forced.

    python bench/bench_onednn_rounding.py                          # caffenet_b32
    python bench/bench_onednn_rounding.py --nets caffenet_b32,googlenet_b32 --rounds 5

Each round times every kernel once in each arm, the arms in alternating order (this host's
speed moves between minutes), as the best of --repeats calls; the table shows each arm's
median over the rounds, oneDNN's / cct's (> 1: cct's rounding is faster) and whether the two
arms' results have the same bits (they must: both round as VCVTNEPS2BF16 does). The weights
are rounded by oneDNN's reorder in both arms (their layouts have two inner blocks), and so are
every kernel's results on their way out into the float32 blobs. Needs oneDNN (the ``onednn``
extra) and a CPU with bf16 units; elsewhere it says why and stops.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_conv_layouts import conv_layers  # noqa: E402
from bench.bench_train import NETS, default_zoo, machine, synthetic_net  # noqa: E402
from bench.worker import best_of  # noqa: E402

KERNELS = ("forward", "backward data", "weight gradient")


def kernel_calls(geom, x_shape, y_shape):
    """The layer's three kernels as calls on fixed random arrays, and a function returning
    their results' bytes."""
    import numpy as np

    from cct.backend import cpu

    rng = np.random.default_rng(0)
    kernel, _, _, _, group = geom
    x = rng.standard_normal(x_shape, dtype=np.float32)
    dy = rng.standard_normal(y_shape, dtype=np.float32)
    weight = rng.standard_normal((y_shape[1], x_shape[1] // group) + kernel, dtype=np.float32)
    bias = rng.standard_normal(y_shape[1], dtype=np.float32)
    y, dx, dw = np.empty_like(dy), np.empty_like(x), np.empty_like(weight)
    calls = (lambda: cpu.conv_forward(x, weight, bias, *geom, out=y),
             lambda: cpu.conv_backward_data(dy, weight, x.shape, *geom, out=dx),
             lambda: cpu.conv_backward_weight(x, dy, *geom, out=dw))
    return calls, lambda: (y.tobytes(), dx.tobytes(), dw.tobytes())


def time_layer(geom, x_shape, y_shape, rounds: int, repeats: int) -> dict:
    """{arm: [[seconds per round] per kernel]} and whether both arms gave the same bits."""
    from cct import _C

    calls, results = kernel_calls(geom, x_shape, y_shape)
    times = {True: [[] for _ in calls], False: [[] for _ in calls]}
    bits = {}
    try:
        for r in range(rounds):
            for arm in (True, False) if r % 2 == 0 else (False, True):
                _C.set_onednn_cct_rounding(arm)
                for k, call in enumerate(calls):
                    times[arm][k].append(best_of(call, repeats))
                bits[arm] = results()
    finally:
        _C.set_onednn_cct_rounding(True)
    return {"times": times, "same_bits": bits[True] == bits[False]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default="caffenet_b32", help=f"comma-separated, from: "
                    f"{', '.join(NETS)}")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of both arms")
    ap.add_argument("--repeats", type=int, default=3, help="calls per kernel and round (best)")
    ap.add_argument("--zoo", type=pathlib.Path, default=default_zoo())
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in names if n not in NETS]
    if unknown:
        ap.error(f"--nets: unknown {', '.join(unknown)} (expected some of {', '.join(NETS)})")

    from cct import _C
    from cct.backend import onednn, precision

    print(machine())
    why = onednn.load() if onednn.library_path() is not None else "oneDNN is not installed"
    if why is not None:
        print(f"nothing to time: {why}")
        return
    if not _C.cpu_has_bf16_units():
        print("nothing to time: this CPU has no bf16 units, so oneDNN's reorders round every "
              "operand here")
        return
    if precision.set_precision("bf16") != "bf16":
        print("nothing to time: bf16 GEMMs cannot run here")
        return
    _C.set_onednn_offered(False, True)
    _C.set_conv_layout(onednn.LAYOUT + 1)
    print(f"oneDNN {_C.onednn_version()}; best of {args.repeats} calls, median of "
          f"{args.rounds} alternated rounds; ms")
    header = (f"{'layer':<28} {'kernel':<16} {'oneDNN':>8} {'cct':>8} {'ratio':>6} "
              f"{'rounded':>7}  bits")
    for net_name in names:
        path, batch = NETS[net_name]
        net = synthetic_net(args.zoo / path, batch)
        print(f"\n{net_name} (batch {batch})\n{header}")
        sums = {True: 0.0, False: 0.0}
        for layer, geom, x_shape, y_shape in conv_layers(net):
            r = time_layer(geom, x_shape, y_shape, args.rounds, args.repeats)
            for k, kernel in enumerate(KERNELS):
                if _C.onednn_conv_impl(k, x_shape, y_shape[1], *geom, True) == "":
                    continue
                cct_ms = statistics.median(r["times"][True][k]) * 1e3
                dnnl_ms = statistics.median(r["times"][False][k]) * 1e3
                sums[True] += cct_ms
                sums[False] += dnnl_ms
                rounded = _C.onednn_conv_cct_rounded(k, x_shape, y_shape[1], *geom, True)
                print(f"{layer:<28} {kernel:<16} {dnnl_ms:8.2f} {cct_ms:8.2f} "
                      f"{dnnl_ms / cct_ms:6.2f} {rounded:>7}  "
                      f"{'same' if r['same_bits'] else 'DIFFER'}")
        if sums[True]:
            print(f"{'all':<28} {'':<16} {sums[False]:8.2f} {sums[True]:8.2f} "
                  f"{sums[False] / sums[True]:6.2f}")
    _C.set_conv_layout(0)


if __name__ == "__main__":
    main()

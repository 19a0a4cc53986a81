"""Where a training iteration's time goes, layer by layer, against this machine's two rooflines:
the SGEMM peak (the bf16 GEMM peak under --precision bf16) for the layers that multiply
(Convolution, Deconvolution, InnerProduct) and the bandwidth cct's threads stream memory at for
the rest.

    python bench/bench_layers.py                       # every bench net, by layer type
    python bench/bench_layers.py --nets caffenet_b32 --layers --iters 10

Each layer's forward and backward are timed on their own (Net.forward_from_to(i, i) and
backward_from_to(i, i), as `cct time` does) on bench_train's synthetic nets, except where
training runs one layer's pass inside another's: a convolution's forward runs the in-place
ReLU after it (Net._find_relu_fusions), a Concat's, MAX Pooling's or LRN's backward the
in-place ReLUs on its bottoms (Net._find_relu_backward_fusions), a Split's 1x1 convolutions
their backward as one
(Net._find_sibling_fusions). The inner pass's row is then 0 and its time is in the outer
layer's (--no-fusion times every layer alone, as `cct time`). The figure is the median over the
timed iterations. For every layer the bench also counts:

- its FLOPs: 2 per multiply-add of a weight tap with a top element, forward; backward the
  weight gradient's, plus the bottom diff's where the net needs it (the first convolution's
  bottom is data and needs none);
- its bytes: each blob it reads or writes, once (forward: bottoms, tops, params; backward: top
  diffs, bottoms, the bottom diffs it writes, params, their diffs read and written). That is
  a lower bound on the traffic (LRN's scale and pooling's mask are not counted), so a memory
  row's "% roof" understates how near it runs to the memory roofline.

The FLOPs are the direct algorithm's, so a convolution run by Winograd can pass 100% of the
compute roofline; the bandwidth is measured over 256 MiB, out of every cache, so a layer whose
blobs stay in the last-level cache can pass 100% of the memory one.

A layer is "compute"-bound when its FLOPs at the SGEMM peak would take longer than its bytes at
the copy bandwidth, else "memory"-bound; "% roof" is its speed against that bound's roofline.
Issue 16, item 3 asks why one CPU reaches a lower share of its SGEMM peak than another on the
same nets: run this there and here, and compare the shares of the memory-bound rows (a faster
FMA unit shrinks only the compute rows).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from collections import defaultdict

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, default_zoo, gemm_peak_name, machine,  # noqa: E402
                               sgemm_peak, synthetic_net)
from bench.worker import best_of, seconds  # noqa: E402

DEFAULT_NETS = ",".join(NETS)
MULTIPLYING = ("Convolution", "Deconvolution", "InnerProduct")


def copy_bandwidth(mib: int = 256, repeats: int = 10) -> float:
    """GB/s of cct's threaded ReLU out of place over ``mib`` MiB (read once, written once):
    the rate cct's elementwise kernels can stream at on this machine."""
    import numpy as np

    from cct import _C

    x = np.random.default_rng(0).standard_normal(mib << 18, dtype=np.float32)
    y = np.empty_like(x)
    return 2.0 * x.nbytes / best_of(lambda: _C.relu_forward(x, y, 0.0), repeats) / 1e9


def layer_flops(net, i: int) -> tuple:
    """(forward, backward) FLOPs of layer i: 2 per multiply-add of its weights with its tops
    (Deconvolution: with its bottoms); 0 for layers that do not multiply by weights."""
    layer = net.layers[i]
    if layer.type not in MULTIPLYING or not layer.blobs:
        return 0.0, 0.0
    w = layer.blobs[0].data
    per_output = w.size // w.shape[0]
    # A Deconvolution's weights multiply its bottom as a convolution's multiply its top.
    side = net.bottom_vecs[i] if layer.type == "Deconvolution" else net.top_vecs[i]
    macs = sum(b.data.size for b in side) * per_output
    backward = macs * (1 + any(net.bottom_need_backward[i]))
    return 2.0 * macs, 2.0 * backward


def layer_bytes(net, i: int) -> tuple:
    """(forward, backward) bytes layer i must at least move: each blob once (module doc);
    none for an Input layer's forward (whoever feeds the net fills its top) or a Split's (its
    tops share the bottom's data), and a Split's backward only reads the tops' diffs and
    writes their sum."""
    layer_type = net.layers[i].type
    bottoms, tops = net.bottom_vecs[i], net.top_vecs[i]
    params = net.layers[i].blobs
    size = lambda blobs: sum(b.data.nbytes for b in blobs)  # noqa: E731
    forward = 0 if layer_type in ("Input", "Split") else size(bottoms) + size(tops) + size(params)
    if not net.layer_need_backward[i]:
        return forward, 0
    diffs = sum(b.data.nbytes for b, need in zip(bottoms, net.bottom_need_backward[i]) if need)
    if layer_type == "Split":
        return forward, size(tops) + diffs
    return forward, size(tops) + size(bottoms) + diffs + 3 * size(params)


def profile(path: pathlib.Path, batch: int, warmup: int, iters: int,
            fusion: bool = True) -> list:
    """One row per layer: name, type, forward and backward median seconds, FLOPs and bytes;
    with ``fusion``, as training runs them:
    - a fused ReLU's forward inside its convolution's (the ReLU's row "fused": forward 0, and
      no forward bytes, its pass over memory being gone);
    - backward passes in the roles of Net.backward_all: a ReLU on a Concat's, MAX Pooling's or
      LRN's bottom inside that layer's backward, a Split's stacked 1x1 convolutions in their
      group's first one (each other's row "fused_backward": backward 0, no backward bytes; a
      stacked convolution's FLOPs are in its own row still, its time in the first one's)."""
    from cct.backend import plans
    from cct.blob_memory import share_blob_diffs

    plans.offer_libraries()  # the races' candidates of cct train's runs (use_machine_cache)
    net = synthetic_net(path, batch)
    share_blob_diffs(net)  # as cct train lays a train net's diffs out
    n = len(net.layers)
    # forward_from_to(i, i + 1) fuses such a pair; a layer timed alone never does
    fused = [fusion and f for f in net._relu_fused]
    inside = [False] + fused[:-1]   # a ReLU run inside the layer before it
    roles = net._training_roles() if fusion else {}
    within = [roles.get(i) == ("skip",) for i in range(n)]  # run at another layer's turn
    fwd, bwd = [[] for _ in range(n)], [[] for _ in range(n)]
    for it in range(warmup + iters):
        net.clear_param_diffs()
        for i in range(n):
            if inside[i]:
                t = 0.0   # run inside the layer before
            else:
                t = seconds(lambda: net.forward_from_to(i, i + 1 if fused[i] else i))
            if it >= warmup:
                fwd[i].append(t)
        for i in range(n - 1, -1, -1):
            t = 0.0 if within[i] else seconds(lambda: net._run_backward(i, i, roles))
            if it >= warmup:
                bwd[i].append(t)
    rows = []
    for i in range(n):
        flops, nbytes = layer_flops(net, i), layer_bytes(net, i)
        if inside[i]:
            nbytes = (0, nbytes[1])
        if within[i]:
            nbytes = (nbytes[0], 0)
        rows.append({"name": net.layer_names[i], "type": net.layers[i].type,
                     "fused": inside[i], "fused_backward": within[i],
                     "seconds": (statistics.median(fwd[i]), statistics.median(bwd[i])),
                     "flops": flops, "bytes": nbytes})
    return rows


def family_rows(rows: list) -> list:
    """The rows summed by layer type, the slowest first."""
    sums = defaultdict(lambda: {"seconds": [0.0, 0.0], "flops": [0.0, 0.0], "bytes": [0, 0],
                                "count": 0})
    for r in rows:
        s = sums[r["type"]]
        s["count"] += 1
        for key in ("seconds", "flops", "bytes"):
            s[key][0] += r[key][0]
            s[key][1] += r[key][1]
    out = [{"name": f"{t} x{s['count']}", "type": t, **{k: tuple(s[k]) for k in
            ("seconds", "flops", "bytes")}} for t, s in sums.items()]
    return sorted(out, key=lambda r: -sum(r["seconds"]))


def roofline(row: dict, peak: float, bandwidth: float) -> tuple:
    """(GFLOP/s, GB/s, bound, % of that bound's roofline) of a row, forward and backward
    together."""
    seconds = sum(row["seconds"])
    flops, nbytes = sum(row["flops"]), sum(row["bytes"])
    compute_s, memory_s = flops / (peak * 1e9), nbytes / (bandwidth * 1e9)
    bound = "-" if not flops and not nbytes else "compute" if compute_s >= memory_s else "memory"
    roof = 100.0 * max(compute_s, memory_s) / seconds if seconds > 0 else 0.0
    return flops / seconds / 1e9 if seconds else 0.0, nbytes / seconds / 1e9 if seconds else 0.0, \
        bound, roof


def print_table(title: str, rows: list, total: float, peak: float, bandwidth: float) -> None:
    print(title)
    print(f"{'layer':<28} {'fwd ms':>8} {'bwd ms':>8} {'share':>6} {'GFLOP/s':>8} {'GB/s':>6} "
          f"{'bound':>8} {'% roof':>7}")
    for r in rows:
        gflops, gbs, bound, roof = roofline(r, peak, bandwidth)
        share = 100.0 * sum(r["seconds"]) / total
        print(f"{r['name'][:28]:<28} {r['seconds'][0] * 1e3:8.2f} {r['seconds'][1] * 1e3:8.2f} "
              f"{share:5.1f}% {gflops:8.1f} {gbs:6.1f} {bound:>8} {roof:6.0f}%")


def summary(rows: list, total: float, peak: float, bandwidth: float) -> str:
    """How the iteration splits between the two rooflines, and how near each part runs."""
    parts = {}
    for bound in ("compute", "memory"):
        mine = [r for r in rows if roofline(r, peak, bandwidth)[2] == bound]
        seconds = sum(sum(r["seconds"]) for r in mine)
        ideal = sum(max(sum(r["flops"]) / (peak * 1e9), sum(r["bytes"]) / (bandwidth * 1e9))
                    for r in mine)
        parts[bound] = (seconds, ideal)
    c, m = parts["compute"], parts["memory"]
    return (f"compute-bound layers {c[0] * 1e3:.1f} ms ({100 * c[0] / total:.0f}% of the "
            f"iteration, {100 * c[1] / c[0] if c[0] else 0:.0f}% of their roofline); "
            f"memory-bound layers {m[0] * 1e3:.1f} ms ({100 * m[0] / total:.0f}%, "
            f"{100 * m[1] / m[0] if m[0] else 0:.0f}% of theirs)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=DEFAULT_NETS, help=f"comma-separated, from: "
                    f"{', '.join(NETS)}")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations (median shown)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    ap.add_argument("--layers", action="store_true", help="a row per layer as well as per type")
    ap.add_argument("--precision", choices=("float32", "bf16"), default="float32",
                    help="the GEMMs' arithmetic (cct time --precision)")
    ap.add_argument("--zoo", type=pathlib.Path, default=None, help="the caffe-zoo folder")
    ap.add_argument("--no-fusion", action="store_true",
                    help="time every layer alone, as cct time does: each ReLU the training "
                         "step runs inside the convolution before it gets its own forward, "
                         "and each layer its own backward")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in names if n not in NETS]
    if unknown:
        raise SystemExit(f"bench_layers: unknown net(s) {', '.join(unknown)}; known: "
                         f"{', '.join(NETS)}")
    zoo = args.zoo or default_zoo()
    from cct.backend.precision import set_precision
    print(machine())
    print(f"precision {set_precision(args.precision, source='bench_layers: --precision')}")
    peak, bandwidth = sgemm_peak(), copy_bandwidth()
    print(f"{gemm_peak_name()} {peak:.1f} GFLOP/s; copy bandwidth (cct's threaded ReLU, 256 MiB out of "
          f"place) {bandwidth:.1f} GB/s; median of {args.iters} iterations after {args.warmup}")
    profiles = [(name, NETS[name][1], profile(zoo / NETS[name][0], NETS[name][1], args.warmup,
                                              args.iters, fusion=not args.no_fusion))
                for name in names]
    # The host's other tenants move both figures: the larger of two measurements counts.
    peak, bandwidth = max(peak, sgemm_peak()), max(bandwidth, copy_bandwidth())
    print(f"measured again at the end: {gemm_peak_name()} {peak:.1f}, bandwidth {bandwidth:.1f} "
          f"(the larger of each counts)")
    for name, batch, rows in profiles:
        total = sum(sum(r["seconds"]) for r in rows)
        title = (f"\n{name} (batch {batch}): {total * 1e3:.1f} ms an iteration summed over the "
                 f"layers ({batch / total:.1f} img/s, update not included)")
        print_table(title, family_rows(rows), total, peak, bandwidth)
        relus = sum(r["fused"] for r in rows)
        if relus:
            print(f"({relus} ReLU forwards run inside the convolution before them, as training "
                  f"runs them: their time is in the Convolution rows)")
        within = defaultdict(int)
        for r in rows:
            within[r["type"]] += r["fused_backward"]
        if any(within.values()):
            print(f"({', '.join(f'{k} {t}' for t, k in within.items() if k)} backward passes "
                  f"run inside another layer's, as training runs them: a ReLU's in the layer "
                  f"that writes its diff, stacked 1x1 convolutions in their group's first)")
        if args.layers:
            print_table("by layer:", rows, total, peak, bandwidth)
        print(summary(rows, total, peak, bandwidth))


if __name__ == "__main__":
    main()

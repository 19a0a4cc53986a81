"""The ReLU backward fusions and Concat's copies, old against new in one process, on bench_train's
synthetic nets (GoogLeNet b32 and CaffeNet b32 by default):

- **Concat forward**: every Concat's forward through the backend's ``concat_forward``
  (csrc's ``concat_copy``, split between cct's threads) against the NumPy slice assignments
  that ConcatLayer ran before (one thread);
- **a layer's backward with its bottoms' ReLUs** (Net._find_relu_backward_fusions: a Concat as
  it copies each bottom's share, a MAX Pooling plane by plane, an LRN as it stores each diff)
  against the layer's backward followed by those ReLUs' own (as before: a second pass that
  reads the diff just written and writes it again), on the same arrays;
- **the training step's backward** (``Net.backward_all``) with the fusions against without.

Arms alternate within every round; each figure is the median over the rounds, each ratio
the median of the rounds' own ratios (old / new: above 1, the new is faster). Every pair of
arms is checked to leave the same bits first.

    python bench/bench_backward_fusions.py --rounds 11
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, chosen_nets, machine,  # noqa: E402
                               synthetic_net)
from bench.worker import seconds  # noqa: E402


def slice_forward(bottoms, top, axis: int) -> None:
    """ConcatLayer's forward before concat_forward: one NumPy slice assignment a bottom."""
    start = 0
    for b in bottoms:
        top[(slice(None),) * axis + (slice(start, start + b.shape[axis]),)] = b
        start += b.shape[axis]


def arms(net):
    """(name, old arm, new arm, what both must leave the same) per measured thing: each
    Concat's forward, each fused layer's backward with its ReLUs."""
    be = net.backend
    found = []
    for c, layer in enumerate(net.layers):
        if layer.type == "Concat":
            datas, top = [b.data for b in net.bottom_vecs[c]], net.top_vecs[c][0]
            found.append((f"{net.layer_names[c]} forward",
                          lambda d=datas, t=top, a=layer.axis: slice_forward(d, t.data, a),
                          lambda d=datas, t=top, a=layer.axis: be.concat_forward(d, a,
                                                                                out=t.data),
                          lambda t=top: t.data.tobytes()))
    for c, relus in net._relu_backward_fusions:
        layer, bottom, top = net.layers[c], net.bottom_vecs[c], net.top_vecs[c]
        relu = [None] * len(bottom)
        for k, j in relus.items():
            relu[k] = (bottom[k].data, net.layers[j].negative_slope)

        def separate(layer=layer, bottom=bottom, top=top, relus=relus):
            layer.backward(top, [True] * len(bottom), bottom)
            for j in relus.values():
                net.layers[j].backward(net.top_vecs[j], [True], net.bottom_vecs[j])

        def together(layer=layer, bottom=bottom, top=top, relu=relu):
            layer.backward(top, [True] * len(bottom), bottom, relu=relu)

        found.append((f"{net.layer_names[c]} backward ({len(relus)} ReLU"
                      f"{'s' * (len(relus) > 1)})", separate, together,
                      lambda bottom=bottom: b"".join(b.diff.tobytes() for b in bottom)))
    return found


def alternated(old, new, rounds: int) -> tuple:
    """(old's median seconds, new's, the median of the rounds' old / new)."""
    times, ratios = {"old": [], "new": []}, []
    for r in range(rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        got = {arm: seconds(old if arm == "old" else new) for arm in order}
        for arm in order:
            times[arm].append(got[arm])
        ratios.append(got["old"] / got["new"])
    return (statistics.median(times["old"]), statistics.median(times["new"]),
            statistics.median(ratios))


def bench_net(name: str, zoo: pathlib.Path, rounds: int) -> None:
    import numpy as np

    path, batch = NETS[name]
    net = synthetic_net(zoo / path, batch)
    net.forward_backward()  # every blob written; the plans raced
    rng = np.random.default_rng(1)
    for c, _ in net._relu_backward_fusions:   # top diffs of both signs for the ReLUs
        for t in net.top_vecs[c][:1]:
            t.diff[...] = rng.standard_normal(t.shape)
    rows = []
    for what, old, new, bits in arms(net):
        old()
        want = bits()
        new()
        if bits() != want:
            raise SystemExit(f"bench_backward_fusions: {what}: the two arms leave different bits")
        rows.append((what, *alternated(old, new, rounds)))
    fusions = net._relu_backward_fusions

    def without():
        net._relu_backward_fusions = []
        net.backward_all()

    def with_them():
        net._relu_backward_fusions = fusions
        net.backward_all()
    step = alternated(without, with_them, max(3, rounds // 3))
    net._relu_backward_fusions = fusions
    print(f"\n{name} (batch {batch}), {rounds} alternated rounds, median ms")
    print(f"{'what':42s} {'old ms':>9s} {'new ms':>9s} {'old/new':>8s}")
    for what, old_s, new_s, ratio in rows:
        print(f"{what:42s} {1e3 * old_s:9.3f} {1e3 * new_s:9.3f} {ratio:8.2f}")
    for label, pass_ in (("every Concat forward", " forward"),
                         ("every fused backward with its ReLUs", " backward")):
        old_s, new_s = (sum(r[i] for r in rows if pass_ in r[0]) for i in (1, 2))
        if new_s:
            print(f"{label:42s} {1e3 * old_s:9.3f} {1e3 * new_s:9.3f} {old_s / new_s:8.2f}")
    print(f"{'backward_all, the training step (' + str(max(3, rounds // 3)) + ' rounds)':42s} "
          f"{1e3 * step[0]:9.1f} {1e3 * step[1]:9.1f} {step[2]:8.3f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "googlenet_b32,caffenet_b32")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args(argv)
    names = chosen_nets(ap, args)
    from cct.backend import plans

    plans.offer_libraries()
    print(machine())
    for name in names:
        bench_net(name, args.zoo, args.rounds)

if __name__ == "__main__":
    main()

"""Concat's copies, old against new, in one process on bench_train's synthetic GoogLeNet:

- **forward**: every Concat's forward through the backend's ``concat_forward`` (csrc's
  ``concat_copy``, split between cct's threads) against the NumPy slice assignments that
  ConcatLayer ran before (one thread);
- **backward**: each Concat's backward with the backward of the ReLUs in place on its bottoms
  run inside it (Net._find_relu_backward_fusions: one pass over each bottom's share) against
  the Concat's plain copy followed by those ReLUs' own backward (as before: a second pass
  that reads the diff just written and writes it again), on the same arrays;
- **the training step's backward** (``Net.backward_all``) with the Concats' fusions against
  without.

Arms alternate within every round; each figure is the median over the rounds, each ratio
the median of the rounds' own ratios (old / new: above 1, the new is faster). Every pair of
arms is checked to leave the same bits first.

    python bench/bench_concat.py --rounds 15
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import NETS, default_zoo, machine, synthetic_net  # noqa: E402
from bench.worker import seconds  # noqa: E402


def slice_forward(bottoms, top, axis: int) -> None:
    """ConcatLayer's forward before concat_forward: one NumPy slice assignment a bottom."""
    start = 0
    for b in bottoms:
        top[(slice(None),) * axis + (slice(start, start + b.shape[axis]),)] = b
        start += b.shape[axis]


def arms(net):
    """(name, old arm, new arm, what both must leave the same) per measured thing."""
    be = net.backend
    found = []
    fused = dict(net._relu_backward_fusions)
    for c, layer in enumerate(net.layers):
        if layer.type != "Concat":
            continue
        bottom, top = net.bottom_vecs[c], net.top_vecs[c]
        axis = layer.axis
        datas = [b.data for b in bottom]
        found.append((f"{net.layer_names[c]} forward",
                      lambda d=datas, t=top[0], a=axis: slice_forward(d, t.data, a),
                      lambda d=datas, t=top[0], a=axis: be.concat_forward(d, a, out=t.data),
                      lambda t=top[0]: t.data.tobytes()))
        relus = fused.get(c, {})
        relu = [None] * len(bottom)
        for k, j in relus.items():
            relu[k] = (bottom[k].data, net.layers[j].negative_slope)

        def separate(c=c, layer=layer, bottom=bottom, top=top, relus=relus):
            layer.backward(top, [True] * len(bottom), bottom)
            for j in relus.values():
                net.layers[j].backward(net.top_vecs[j], [True], net.bottom_vecs[j])

        def together(layer=layer, bottom=bottom, top=top, relu=relu):
            layer.backward(top, [True] * len(bottom), bottom, relu=relu)

        found.append((f"{net.layer_names[c]} backward ({len(relus)} ReLUs)", separate, together,
                      lambda bottom=bottom: b"".join(b.diff.tobytes() for b in bottom)))
    return found


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="googlenet_b32", choices=sorted(NETS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--zoo", default=None, help="the caffe-zoo folder")
    args = ap.parse_args(argv)
    import numpy as np

    from cct.backend import plans

    plans.offer_libraries()
    path, batch = NETS[args.net]
    net = synthetic_net((pathlib.Path(args.zoo) if args.zoo else default_zoo()) / path, batch)
    print(machine())
    net.forward_backward()  # every blob written; the plans raced
    measured = arms(net)
    rng = np.random.default_rng(1)
    for c, layer in enumerate(net.layers):   # top diffs of both signs for the ReLUs
        if layer.type == "Concat":
            t = net.top_vecs[c][0].diff
            t[...] = rng.standard_normal(t.shape)
    rows = []
    for name, old, new, bits in measured:
        old()
        want = bits()
        new()
        if bits() != want:
            raise SystemExit(f"bench_concat: {name}: the two arms leave different bits")
        times = {"old": [], "new": []}
        ratios = []
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            got = {arm: seconds(old if arm == "old" else new) for arm in order}
            for arm in order:
                times[arm].append(got[arm])
            ratios.append(got["old"] / got["new"])
        rows.append((name, statistics.median(times["old"]), statistics.median(times["new"]),
                     statistics.median(ratios)))

    def step(fusions):
        net._relu_backward_fusions = fusions
        return seconds(net.backward_all)
    fusions = net._relu_backward_fusions
    others = [f for f in fusions if net.layers[f[0]].type != "Concat"]  # a MAX Pooling's
    steps = {"old": [], "new": []}
    ratios = []
    for r in range(max(3, args.rounds // 3)):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        got = {arm: step(others if arm == "old" else fusions) for arm in order}
        for arm in order:
            steps[arm].append(got[arm])
        ratios.append(got["old"] / got["new"])
    net._relu_backward_fusions = fusions
    print(f"{args.net} (batch {batch}), {args.rounds} alternated rounds, median ms")
    print(f"{'what':42s} {'old ms':>9s} {'new ms':>9s} {'old/new':>8s}")
    for name, old_s, new_s, ratio in rows:
        print(f"{name:42s} {1e3 * old_s:9.3f} {1e3 * new_s:9.3f} {ratio:8.2f}")
    for label, pass_ in (("every Concat forward", " forward"),
                         ("every Concat backward with its ReLUs", " backward")):
        old_s, new_s = (sum(r[i] for r in rows if pass_ in r[0]) for i in (1, 2))
        print(f"{label:42s} {1e3 * old_s:9.3f} {1e3 * new_s:9.3f} {old_s / new_s:8.2f}")
    print(f"{'backward_all (the training step)':42s} {1e3 * statistics.median(steps['old']):9.1f} "
          f"{1e3 * statistics.median(steps['new']):9.1f} {statistics.median(ratios):8.3f}")


if __name__ == "__main__":
    main()

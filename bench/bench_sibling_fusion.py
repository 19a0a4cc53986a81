"""What running the backward of a Split's 1x1 Convolutions as one stacked convolution saves
(cct/net.py's _find_sibling_fusions; cct/layers/conv.py's backward_siblings): per net, the
whole backward pass a layer at a time (Net.backward_from_to, as pycaffe runs it) and as
training runs it (Net.backward_all, which stacks each group), alternated round by round so
that the host's drift falls on both alike, each after the same forward; against a whole
training iteration (forward and backward) of the same net.

    python bench/bench_sibling_fusion.py [--nets googlenet_b32] [--rounds 8]

Prints the machine, then a row per net: its groups, the backward a layer at a time and
stacked (median and best, ms), what stacking saves (medians), and that as a share of the
iteration.
"""
import argparse
import pathlib
import statistics
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, chosen_nets, machine,  # noqa: E402
                               synthetic_net)
from bench.worker import seconds  # noqa: E402


def measure(net, rounds: int) -> dict:
    last = len(net.layers) - 1
    alone = lambda: net.backward_from_to(last, 0)  # noqa: E731
    for backward in (alone, net.backward_all, alone, net.backward_all):  # plans measured
        net.forward_prefilled()
        backward()
    times = {alone: [], net.backward_all: []}
    for r in range(rounds):
        order = (alone, net.backward_all) if r % 2 == 0 else (net.backward_all, alone)
        for backward in order:
            net.forward_prefilled()
            times[backward].append(seconds(backward))
    iteration = []
    for _ in range(max(2, rounds // 2)):
        net.clear_param_diffs()
        iteration.append(seconds(net.forward_backward))
    return {"groups": len(net._sibling_groups), "alone": times[alone],
            "stacked": times[net.backward_all], "iteration": statistics.median(iteration)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "googlenet_b32")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    names = chosen_nets(ap, args)
    print(machine())
    print(f"{args.rounds} rounds, alternated; backward ms as median / best; the iteration a "
          f"median")
    print(f"{'net':16} {'groups':>6} {'a layer at a time':>18} {'stacked':>16} "
          f"{'saved ms':>9} {'iteration ms':>13} {'saved':>6}")
    for name in names:
        rel, batch = NETS[name]
        r = measure(synthetic_net(args.zoo / rel, batch), args.rounds)
        alone, stacked = statistics.median(r["alone"]), statistics.median(r["stacked"])
        saved = alone - stacked
        print(f"{name:16} {r['groups']:6d} {1e3 * alone:9.1f} / {1e3 * min(r['alone']):6.1f} "
              f"{1e3 * stacked:7.1f} / {1e3 * min(r['stacked']):6.1f} {1e3 * saved:9.1f} "
              f"{1e3 * r['iteration']:13.1f} {100 * saved / r['iteration']:5.1f}%", flush=True)


if __name__ == "__main__":
    main()

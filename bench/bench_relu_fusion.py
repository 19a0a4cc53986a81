"""What running each Convolution's in-place ReLU inside the convolution's forward saves
(cct/net.py's _find_relu_fusions; csrc/conv.cpp's conv_forward with relu): per net, the
forward of every fused (Convolution, ReLU) pair run as two layers (Net.forward_from_to(i, i)
then (i + 1, i + 1)) and as the pair (forward_from_to(i, i + 1), which fuses), alternated
pair by pair and round by round so that the host's drift falls on both alike, best of each;
against a whole training iteration (forward and backward) of the same net.

    python bench/bench_relu_fusion.py [--nets googlenet_b32,caffenet_b32] [--rounds 5]

Prints the machine, then a row per net: the pairs, their forward as two layers and fused
(ms), what fusing saves, and that as a share of the iteration.
"""
import argparse
import pathlib
import statistics
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, chosen_nets, machine,  # noqa: E402
                               synthetic_net)
from bench.worker import seconds  # noqa: E402


def measure(net, rounds: int, repeats: int) -> dict:
    pairs = [i for i, fused in enumerate(net._relu_fused) if fused]
    for _ in range(2):  # plans measured, workspaces grown
        net.forward_backward()
    apart, together = {i: [] for i in pairs}, {i: [] for i in pairs}
    for _ in range(rounds):
        for i in pairs:
            for _ in range(repeats):
                apart[i].append(seconds(lambda: (net.forward_from_to(i, i),
                                                 net.forward_from_to(i + 1, i + 1))))
                together[i].append(seconds(lambda: net.forward_from_to(i, i + 1)))
    iteration = []
    for _ in range(max(2, rounds // 2)):
        net.clear_param_diffs()
        iteration.append(seconds(net.forward_backward))
    return {"pairs": len(pairs),
            "apart": sum(min(apart[i]) for i in pairs),
            "together": sum(min(together[i]) for i in pairs),
            "iteration": statistics.median(iteration)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "cifar10_quick,caffenet_b32,googlenet_b32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="timings per pair per round")
    args = ap.parse_args()
    names = chosen_nets(ap, args)
    print(machine())
    print(f"best of {args.rounds} rounds x {args.repeats} per pair; the iteration a median")
    print(f"{'net':16} {'pairs':>5} {'two layers ms':>14} {'fused ms':>9} {'saved ms':>9} "
          f"{'iteration ms':>13} {'saved':>6}")
    for name in names:
        rel, batch = NETS[name]
        net = synthetic_net(args.zoo / rel, batch)
        r = measure(net, args.rounds, args.repeats)
        saved = r["apart"] - r["together"]
        print(f"{name:16} {r['pairs']:5d} {1e3 * r['apart']:14.2f} {1e3 * r['together']:9.2f} "
              f"{1e3 * saved:9.2f} {1e3 * r['iteration']:13.1f} "
              f"{100 * saved / r['iteration']:5.1f}%", flush=True)


if __name__ == "__main__":
    main()

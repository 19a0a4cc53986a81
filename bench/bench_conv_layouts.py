"""Each convolution of the zoo's nets under each layout the kernels choose among: the lowered
GEMM (Caffe con Troll's, its batch partitions measured) against the direct kernel
(csrc/conv_direct.cpp, stride-1 float32 layers on AVX2/FMA CPUs), Winograd F(2x2, 3x3) or
F(2x2, 5x5) (csrc/conv_winograd.cpp, 3x3 and 5x5 stride-1 undilated float32 layers) and
Winograd F(4x4, 3x3) (3x3 ones), forward, backward data and backward weight, in the same run.
A strided layer (CaffeNet's conv1) gets the same three columns for its phase forms
(csrc/conv_phase.cpp: a stride-1 layer over the bottom's phase planes, kernel ceil(k / stride)).
On AVX-512 CPUs the direct layout's AVX-512 tiles (16-pixel vectors for forward and backward
data, or two output channels' 8 pixels to a vector where a row's last vector would hold 8 pixels
or fewer; two output channels to a vector for the weight gradient; direct's bits) have a column
of their own. Where oneDNN is installed and offered to the precision's races
(cct/backend/onednn.py; ``$CCT_ONEDNN=all`` for float32), its convolution has one too, for every
layer (it takes strides itself), with the implementation it picked.

    python bench/bench_conv_layouts.py                       # lenet, cifar10_quick, caffenet_b32
    python bench/bench_conv_layouts.py --nets cifar10_quick --repeats 10
    python bench/bench_conv_layouts.py --nets caffenet_b32 --precision bf16

Printed per layer and kernel: the best of --repeats calls in milliseconds for each layout that
applies ("-" where one does not), the fastest other layout's speed as a ratio of the lowered
one's (> 1: faster than lowered) in direct-convolution GFLOP/s, and the layout that training's
measured plan picks (layout mode 0, as `cct train` runs) with its own time: a plan much slower
than the fastest layout is a race that measured wrong (csrc/race.h). The nets come from
bench_train (the zoo's prototxts, synthetic data, the nets' own batches).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # after the installed packages: see bench_train.py

from bench.bench_train import (NETS, default_zoo, gemm_peak_name, machine,  # noqa: E402
                               sgemm_peak, synthetic_net)
from bench.worker import best_of  # noqa: E402

DEFAULT_NETS = "lenet,cifar10_quick,caffenet_b32"
KERNELS = ("forward", "backward data", "backward weight")
# cct._C.set_conv_layout's modes (DIRECT16: the direct layout's AVX-512 tiles)
LOWERED, DIRECT, WINOGRAD, WINOGRAD4, DIRECT16, ONEDNN, MEASURED = 1, 3, 4, 5, 9, 11, 0
OTHERS = (DIRECT, DIRECT16, WINOGRAD, WINOGRAD4)
PHASE = {DIRECT: 6, WINOGRAD: 7, WINOGRAD4: 8, DIRECT16: 10}  # a layout's phase form's mode


def phase_form(geom):
    """A strided undilated layer's phase form (kernel ceil(k / stride), stride 1, no pad), or
    None where it has none."""
    kernel, stride, _, dilation, group = geom
    if stride == (1, 1) or dilation != (1, 1) or any(k < s for k, s in zip(kernel, stride)):
        return None
    return tuple(-(-k // s) for k, s in zip(kernel, stride)), (1, 1), (0, 0), (1, 1), group


def applies(mode: int, kernel_id: int, geom, x_shape, num_output: int) -> bool:
    """Whether set_conv_layout(mode) runs its own layout on this kernel of a layer with bottom
    ``x_shape`` (else lowered)."""
    from cct import _C

    if mode == ONEDNN:
        return bool(onednn_impl(kernel_id, geom, x_shape, num_output))
    if mode in PHASE.values():
        phase = phase_form(geom)
        stride1 = next(m for m, p in PHASE.items() if p == mode)
        return phase is not None and applies(stride1, kernel_id, phase, x_shape, num_output)
    kernel, stride, pad, dilation, _ = geom
    if mode == DIRECT16:
        return _C.cpu_has_avx512() and applies(DIRECT, kernel_id, geom, x_shape, num_output)
    if mode == DIRECT:
        return stride == (1, 1) and _C.cpu_has_direct_conv()
    if mode in (WINOGRAD, WINOGRAD4):
        sizes = ((3, 3), (5, 5)) if mode == WINOGRAD else ((3, 3),)
        return (kernel in sizes and stride == (1, 1) and dilation == (1, 1)
                and (kernel_id != 1 or max(pad) <= kernel[0] - 1))
    return True


def onednn_impl(kernel_id: int, geom, x_shape, num_output: int) -> str:
    """oneDNN's implementation of this kernel where its layout is offered to this precision's
    races, else ""."""
    from cct import _C

    bf16 = _C.bf16_gemm_enabled()
    if not _C.onednn_offered(bf16):
        return ""
    kernel, stride, pad, dilation, group = geom
    return _C.onednn_conv_impl(kernel_id, x_shape, num_output, kernel, stride, pad, dilation,
                               group, bf16)



def other_modes(geom) -> tuple:
    """The layouts timed beside lowered: the stride-1 ones, or a strided layer's phase forms;
    oneDNN's where it is offered."""
    from cct import _C

    modes = tuple(PHASE[m] for m in OTHERS) if geom[1] != (1, 1) else OTHERS
    return modes + (ONEDNN,) * _C.onednn_offered(_C.bf16_gemm_enabled())


def conv_layers(net):
    """(name, geometry arguments, bottom shape, top shape) of each Convolution layer."""
    for name, layer in zip(net.layer_names, net.layers):
        if layer.type == "Convolution":
            geom = (tuple(layer.kernel), tuple(layer.stride), tuple(layer.pad),
                    tuple(layer.dilation), int(layer.group))
            yield name, geom, tuple(layer.in_shape4), tuple(layer.out_shape4)


def time_layer(geom, x_shape, y_shape, repeats: int) -> dict:
    import numpy as np

    from cct import _C
    from cct.backend import cpu, plans

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
    times = {}
    try:
        for mode in (LOWERED, *other_modes(geom), MEASURED):
            _C.set_conv_layout(mode)
            times[mode] = [best_of(call, repeats)
                           if applies(mode, k, geom, x_shape, y_shape[1]) else None
                           for k, call in enumerate(calls)]
    finally:
        _C.set_conv_layout(MEASURED)
    chosen = {}
    for kernel_id, geometry, size, _, modes, parts, layout, _ in _C.conv_plan_table():
        spelled = plans.conv_modes(modes)   # as cct train runs: nothing forced, measured
        if spelled["layout_mode"] == 0 and spelled["partition_mode"] == 0 and \
                spelled["measured"] and not spelled["caffe_engine"] and size == 4 and \
                geometry[:5] == [x_shape[0], x_shape[1], x_shape[2], x_shape[3], y_shape[1]] and \
                geometry[7:] == [*kernel, *geom[1], *geom[2], *geom[3], group]:
            chosen[kernel_id] = (f"{plans.CONV_LAYOUT_NAMES[layout]}, {parts} "
                                 f"part{'s' * (parts > 1)}")
    return {"times": times, "chosen": chosen}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=DEFAULT_NETS, help=f"comma-separated, from: "
                    f"{', '.join(NETS)}")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per kernel and layout")
    ap.add_argument("--zoo", type=pathlib.Path, default=None, help="the caffe-zoo folder")
    ap.add_argument("--precision", choices=("float32", "bf16"), default="float32",
                    help="the layouts' arithmetic (bf16: cct train --precision=bf16's)")
    args = ap.parse_args(argv)
    from cct import _C
    from cct.backend import plans
    from cct.backend.precision import set_precision

    plans.offer_libraries()  # the races' candidates of cct train's runs (use_machine_cache)
    if args.precision == "bf16":
        print(f"precision: {set_precision('bf16', source='--precision')}")

    zoo = args.zoo or default_zoo()
    names = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in names if n not in NETS]
    if unknown:
        raise SystemExit(f"bench: unknown net(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(NETS)}")
    if not zoo.is_dir():
        raise SystemExit(f"bench: no caffe-zoo folder at {zoo} (give --zoo or set CCT_SHARED)")
    print(machine())
    print(f"{gemm_peak_name()}: {sgemm_peak():.1f} GFLOP/s; best of {args.repeats} calls per kernel")
    if not _C.cpu_has_direct_conv():
        print("this CPU has no AVX2/FMA: the direct layout is left out")
    onednn = _C.onednn_offered(_C.bf16_gemm_enabled())
    if onednn:
        print(f"oneDNN {_C.onednn_version()}: its column is the onednn layout; its "
              f"implementations are listed after each net")
    print(f"{'layer':<24} {'kernel':<16} {'lowered ms':>10} {'direct ms':>10} {'direct16':>10} "
          f"{'wino2x2 ms':>10} {'wino4x4 ms':>10} " + f"{'onednn ms':>10} " * onednn +
          f"{'best GF/s':>9} {'ratio':>6} {'plan ms':>8}  plan")
    for net_name in names:
        path, batch = NETS[net_name]
        net = synthetic_net(zoo / path, batch)
        print(f"{net_name}:")
        impls = []
        for layer, geom, x_shape, y_shape in conv_layers(net):
            label = layer
            if onednn:
                impls.append(f"  {layer}: " + ", ".join(
                    f"{kernel} {onednn_impl(k, geom, x_shape, y_shape[1]) or '-'}"
                    for k, kernel in enumerate(KERNELS)))
            if geom[1] != (1, 1) and phase_form(geom) is None and not onednn:
                print(f"{label:<24} {'(stride ' + str(geom[1][0]) + ': lowered only)'}")
                continue
            modes = other_modes(geom)
            r = time_layer(geom, x_shape, y_shape, args.repeats)
            macs = (y_shape[0] * y_shape[1] * y_shape[2] * y_shape[3] * x_shape[1] // geom[4]
                    * geom[0][0] * geom[0][1])
            for k, kernel in enumerate(KERNELS):
                lowered = r["times"][LOWERED][k]
                others = [t[k] for mode, t in r["times"].items()
                          if mode in modes and t[k] is not None]
                best = min(others, default=lowered)
                cells = "".join(f"{t[k] * 1e3:10.2f} " if t[k] is not None else f"{'-':>10} "
                                for t in (r["times"][mode] for mode in modes))
                print(f"{label:<24} {kernel:<16} {lowered * 1e3:10.2f} {cells}"
                      f"{2 * macs / best / 1e9:9.1f} {lowered / best:6.2f} "
                      f"{r['times'][MEASURED][k] * 1e3:8.2f}  {r['chosen'].get(k, '?')}",
                      flush=True)
        if impls:
            print("oneDNN's implementations:\n" + "\n".join(impls))


if __name__ == "__main__":
    main()

"""Training throughput of cct on the Caffe model zoo's nets, against this machine's SGEMM peak
and, when PyTorch is installed, against PyTorch running the same nets layer for layer.

    python bench/bench_train.py                        # every net, 5 timed iterations each
    python bench/bench_train.py --nets lenet,caffenet_b32 --iters 2

Each net is read from its train_val prototxt in ../shared/caffe-zoo (``--zoo`` or CCT_SHARED to
move it), its database-backed data layers swapped for Input layers of the same shapes, and
trained on synthetic data: full iterations of forward, backward and the SGD update (momentum
0.9, weight decay 5e-4, the prototxt's lr_mult/decay_mult), as ``caffe train`` would run them.
Each framework runs each net in a subprocess of its own, so peak resident memory (ru_maxrss)
is that run's alone and no two thread pools meet; cct's blob diffs share memory as ``cct
train``'s do (cct/blob_memory.py).

Printed per net: images/s (median iteration); achieved GFLOP/s, counting training FLOPs as
3 x (multiply-adds of every Convolution and InnerProduct at the net's shapes) x 2; that as a
fraction of the SGEMM peak measured at the start of the same run (best of a few large float32
GEMMs through cct._C with cct's threads); peak RSS; PyTorch's images/s and cct's ratio to it. With ``--precision bf16`` also cct's
bf16 training (-precision=bf16) and PyTorch's bfloat16 autocast, with their peak RSS.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import json
import os
import pathlib
import resource
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
# After the installed packages: `import cct` is the installed cct (whose compiled _C a source
# checkout lacks after a non-editable install); the repository gives only the `bench` package.
sys.path.append(str(REPO))

from bench.worker import best_of, run_worker  # noqa: E402

# name: (prototxt under caffe-zoo, batch)
NETS = {
    "lenet": ("examples/mnist/lenet_train_test.prototxt", 64),
    "cifar10_quick": ("examples/cifar10/cifar10_quick_train_test.prototxt", 100),
    "caffenet_b256": ("models/bvlc_reference_caffenet/train_val.prototxt", 256),
    "caffenet_b32": ("models/bvlc_reference_caffenet/train_val.prototxt", 32),
    "alexnet_b32": ("models/bvlc_alexnet/train_val.prototxt", 32),
    "googlenet_b32": ("models/bvlc_googlenet/train_val.prototxt", 32),
}
DATA_TYPES = {"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData"}
BASE_LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4


def default_zoo() -> pathlib.Path:
    shared = pathlib.Path(os.environ.get("CCT_SHARED", REPO.parent / "shared"))
    return shared / "caffe-zoo"


def add_net_arguments(ap: argparse.ArgumentParser, default: str) -> None:
    """--nets (comma-separated, from NETS; ``default``) and --zoo, for the benches that time
    these nets (bench_relu_fusion, bench_sibling_fusion)."""
    ap.add_argument("--nets", default=default, help=f"comma-separated, from: {', '.join(NETS)}")
    ap.add_argument("--zoo", type=pathlib.Path, default=default_zoo(),
                    help="the caffe-zoo folder")


def chosen_nets(ap: argparse.ArgumentParser, args) -> list:
    """The names in --nets, refused through ``ap`` when one is unknown or the zoo is absent."""
    names = [n for n in args.nets.split(",") if n]
    unknown = [n for n in names if n not in NETS]
    if unknown:
        ap.error(f"unknown net(s) {', '.join(unknown)}; known: {', '.join(NETS)}")
    if not args.zoo.is_dir():
        ap.error(f"caffe-zoo folder {args.zoo} is absent (pass --zoo or set CCT_SHARED)")
    return names


# --------------------------------------------------------------------------------------------
# The nets: zoo prototxt -> TRAIN net with Input layers
# --------------------------------------------------------------------------------------------
def _example_shape(lp) -> tuple:
    source = lp.data_param.source or lp.image_data_param.source
    if lp.transform_param.crop_size:
        return (3, lp.transform_param.crop_size, lp.transform_param.crop_size)
    if "mnist" in source:
        return (1, 28, 28)
    if "cifar" in source:
        return (3, 32, 32)
    raise SystemExit(f"bench: no known example shape for data layer '{lp.name}' ({source})")


def train_net_param(path: pathlib.Path, batch: int):
    """The TRAIN-phase NetParameter of a zoo prototxt, its data layers replaced by Input
    layers of shape (batch, C, H, W) and (batch,) for the label."""
    from cct.io.prototxt import read_net_text
    from cct.proto import caffe_pb2

    param = read_net_text(str(path))
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for lp in param.layer:
        phases = [r.phase for r in lp.include if r.HasField("phase")]
        if phases and caffe_pb2.TRAIN not in phases:
            continue
        if lp.type in DATA_TYPES:
            new = caffe_pb2.LayerParameter(name=lp.name, type="Input", top=list(lp.top))
            new.input_param.shape.add().dim.extend((batch,) + _example_shape(lp))
            for _ in lp.top[1:]:
                new.input_param.shape.add().dim.append(batch)
            out.layer.add().CopyFrom(new)
        else:
            out.layer.add().CopyFrom(lp)
    out.state.phase = caffe_pb2.TRAIN
    return out


def num_classes(param) -> int:
    """num_output of the InnerProduct layers feeding the losses (the label range)."""
    producer = {t: lp for lp in param.layer for t in lp.top}
    outs = [producer[lp.bottom[0]].inner_product_param.num_output
            for lp in param.layer if lp.type == "SoftmaxWithLoss"]
    return min(outs)


def training_flops_per_image(net) -> float:
    """3 x forward multiply-adds of Convolution and InnerProduct layers x 2, per image."""
    macs = 0
    for layer, top in zip(net.layers, net.top_vecs):
        if layer.type in ("Convolution", "InnerProduct"):
            w = layer.blobs[0].data
            per_output = w.size // w.shape[0]  # (C/group) kh kw, or the IP's input size
            macs += sum(t.data.size for t in top) * per_output
    return 3.0 * 2.0 * macs / _input_batch(net)


def _input_batch(net) -> int:
    for layer, top in zip(net.layers, net.top_vecs):
        if layer.type == "Input":
            return top[0].data.shape[0]
    raise SystemExit("bench: the net has no Input layer")


# --------------------------------------------------------------------------------------------
# Workers (one subprocess per framework and net)
# --------------------------------------------------------------------------------------------
def timed_iterations(step, warmup: int, iters: int, counts: dict = None) -> list:
    """The seconds of each of ``iters`` calls of ``step`` after ``warmup`` untimed ones; with
    ``counts``, also its "faults" entry: the minor page faults per timed call (memory first
    touched on the hot path, which some machines pay dearly for: issue 16 measured 0.3 GiB/s
    on an Intel host)."""
    for _ in range(warmup):
        step()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if counts is not None:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        counts["faults"] = faults / max(iters, 1)
    return times


def alternated_tables(tables: dict, step, rounds: int, iters: int = 1, reset=None) -> dict:
    """Seconds of ``step`` under each kernel plan table of ``tables`` (name -> plans.table()),
    installed in turn, the order reversed every other round so that the host's drift falls on
    all alike: per round and table, one untimed step after the switch, then the median of
    ``iters`` timed ones (``reset``, when given, run untimed before each step)."""
    from cct.backend import plans
    times = {name: [] for name in tables}
    for r in range(rounds):
        for name in (list(tables) if r % 2 == 0 else list(tables)[::-1]):
            plans.install(tables[name])
            runs = []
            for _ in range(iters + 1):
                if reset is not None:
                    reset()
                t0 = time.perf_counter()
                step()
                runs.append(time.perf_counter() - t0)
            times[name].append(statistics.median(runs[1:]))
    return times


def synthetic_net(path: pathlib.Path, batch: int, backend: str = "cpu", engine: str = ""):
    """The TRAIN net of ``path`` at ``batch`` on ``backend``, its Input blobs filled with
    standard normal data and labels in the net's class range (the same values every run);
    ``engine`` (e.g. "CAFFE") is set as every convolution's convolution_param.engine."""
    import numpy as np

    from cct import glog
    from cct.net import Net
    from cct.proto import caffe_pb2

    param = train_net_param(path, batch)
    if engine:
        for lp in param.layer:
            if lp.type in ("Convolution", "Deconvolution"):
                lp.convolution_param.engine = caffe_pb2.ConvolutionParameter.Engine.Value(engine)
    with glog.quiet():
        net = Net(param, phase=caffe_pb2.TRAIN, backend=backend, source=str(path))
    classes = num_classes(param)
    rng = np.random.default_rng(0)
    xp = net.backend.xp
    for layer, top in zip(net.layers, net.top_vecs):
        if layer.type == "Input":
            top[0].data[...] = xp.asarray(rng.standard_normal(top[0].shape))
            for t in top[1:]:
                t.data[...] = xp.asarray(rng.integers(0, classes, t.shape))
    return net


def sgd_update(net, clears_diffs: bool = False):
    """The solver's SGD update (momentum, weight decay, the prototxt's lr/decay mults) as a
    function to call after each backward pass; ``clears_diffs`` leaves the diffs zero for the
    next pass, as the solver's step loop has the CPU's kernel do between two iterations of one
    step (Solver._update_may_clear)."""
    rates = [(BASE_LR * m, WEIGHT_DECAY * d)
             for m, d in zip(net.params_lr, net.params_weight_decay)]
    history = [net.backend.xp.zeros_like(p.data) for p in net.learnable_params]
    extra = {"clear_diff": True} if clears_diffs else {}

    def update():
        for p, v, (lr, wd) in zip(net.learnable_params, history, rates):
            net.backend.sgd_update(p.data, p.diff, v, lr, MOMENTUM, wd, **extra)
    return update


def run_cct(path: pathlib.Path, batch: int, warmup: int, iters: int, engine: str = "") -> dict:
    from cct.backend import plans
    from cct.blob_memory import share_blob_diffs

    plans.offer_libraries()  # the races' candidates of cct train's runs (use_machine_cache)
    net = synthetic_net(path, batch, engine=engine)
    share_blob_diffs(net)  # as cct train lays its train net's diffs out
    # The solver's step loop lets the update leave the diffs zero for the next pass; a build
    # from before that (bench_builds' older builds) clears them in a pass of their own.
    fused = "clear_diff" in inspect.signature(net.backend.sgd_update).parameters
    update = sgd_update(net, clears_diffs=fused)
    phase = {"forward_backward": [], "update": []}
    net.clear_param_diffs()   # the first pass's; a fused update then leaves them zero

    def step():
        t0 = time.perf_counter()
        if not fused:
            net.clear_param_diffs()
        net.forward_prefilled()
        net.backward_all()
        t1 = time.perf_counter()
        update()
        t2 = time.perf_counter()
        phase["forward_backward"].append(t1 - t0)
        phase["update"].append(t2 - t1)

    counts = {}
    times = timed_iterations(step, warmup, iters, counts)
    return {"times": times, "flops_per_image": training_flops_per_image(net),
            "faults_per_iter": counts["faults"],
            "update_s": statistics.median(phase["update"][warmup:]),
            "threads": __import__("cct._C", fromlist=["_C"]).get_num_threads()}


def torch_model(param):
    """A torch.nn.Module that runs the Caffe layers of ``param`` in order on a dict of blobs:
    the same net layer for layer (Input, Convolution, Pooling, LRN, ReLU, InnerProduct,
    Dropout, Concat, SoftmaxWithLoss)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from cct.proto import caffe_pb2

    PP = caffe_pb2.PoolingParameter

    def pair(values, h, w, default):
        if h or w:
            return (h, w)
        values = list(values) or [default]
        return (values[0], values[-1])

    class CaffeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.steps = []
            self.mods = nn.ModuleDict()
            channels = {}
            for lp in param.layer:
                key = lp.name.replace("/", "_").replace(".", "_")
                if lp.type == "Input":
                    for top, shape in zip(lp.top, lp.input_param.shape):
                        channels[top] = shape.dim[1] if len(shape.dim) > 1 else None
                    self.steps.append(("input", lp, None))
                    continue
                if lp.type == "Convolution":
                    cp = lp.convolution_param
                    mod = nn.Conv2d(channels[lp.bottom[0]], cp.num_output,
                                    pair(cp.kernel_size, cp.kernel_h, cp.kernel_w, 1),
                                    pair(cp.stride, cp.stride_h, cp.stride_w, 1),
                                    pair(cp.pad, cp.pad_h, cp.pad_w, 0),
                                    pair(cp.dilation, 0, 0, 1), cp.group, bias=cp.bias_term)
                    self.mods[key] = mod
                    channels[lp.top[0]] = cp.num_output
                elif lp.type == "InnerProduct":
                    mod = nn.LazyLinear(lp.inner_product_param.num_output,
                                        bias=lp.inner_product_param.bias_term)
                    self.mods[key] = mod
                    channels[lp.top[0]] = lp.inner_product_param.num_output
                elif lp.type == "Concat":
                    channels[lp.top[0]] = sum(channels[b] for b in lp.bottom)
                else:
                    channels[lp.top[0]] = channels.get(lp.bottom[0])
                self.steps.append((lp.type, lp, key))

        def forward(self, blobs):
            loss = 0
            for kind, lp, key in self.steps:
                if kind == "input":
                    continue
                x = [blobs[b] for b in lp.bottom]
                if kind in ("Convolution", "InnerProduct"):
                    y = self.mods[key](x[0] if kind == "Convolution" else x[0].flatten(1))
                elif kind == "ReLU":
                    y = F.relu(x[0])
                elif kind == "Pooling":
                    pp = lp.pooling_param
                    k = pair([pp.kernel_size] if pp.kernel_size else [], pp.kernel_h,
                             pp.kernel_w, 1)
                    s = pair([pp.stride], pp.stride_h, pp.stride_w, 1)
                    p = pair([pp.pad], pp.pad_h, pp.pad_w, 0)
                    if pp.global_pooling:
                        k = tuple(x[0].shape[2:])
                    if pp.pool == PP.MAX:
                        y = F.max_pool2d(x[0], k, s, p, ceil_mode=True)
                    else:
                        y = F.avg_pool2d(x[0], k, s, p, ceil_mode=True)
                elif kind == "LRN":
                    rp = lp.lrn_param
                    y = F.local_response_norm(x[0], rp.local_size, rp.alpha, rp.beta, rp.k)
                elif kind == "Dropout":
                    y = F.dropout(x[0], lp.dropout_param.dropout_ratio, training=True)
                elif kind == "Concat":
                    y = torch.cat(x, dim=lp.concat_param.axis)
                elif kind == "SoftmaxWithLoss":
                    weight = lp.loss_weight[0] if lp.loss_weight else 1.0
                    loss = loss + weight * F.cross_entropy(x[0], x[1].long())
                    continue
                else:
                    raise SystemExit(f"bench: no PyTorch counterpart for layer type {kind}")
                blobs[lp.top[0]] = y
            return loss

    return CaffeNet()


def torch_training_step(path: pathlib.Path, batch: int, device: str = "cpu",
                        bf16: bool = False, fp16: bool = False):
    """PyTorch's training iteration of the same net on synthetic data: zero_grad, forward,
    backward, SGD step (momentum, weight decay), as a function; with ``bf16`` the forward pass
    under autocast to bfloat16 (PyTorch's mixed precision: float32 weights and step); with
    ``fp16`` under autocast to float16, the loss scaled by a GradScaler (its recipe)."""
    import contextlib

    import torch

    param = train_net_param(path, batch)
    classes = num_classes(param)
    gen = torch.Generator(device=device).manual_seed(0)
    blobs = {}
    for lp in param.layer:
        if lp.type == "Input":
            blobs[lp.top[0]] = torch.randn(*lp.input_param.shape[0].dim, generator=gen,
                                           device=device)
            for top in lp.top[1:]:
                blobs[top] = torch.randint(0, classes, (batch,), generator=gen, device=device)
    model = torch_model(param).to(device)
    model(dict(blobs))  # materialise the lazy InnerProduct weights
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)

    def autocast():
        if bf16 or fp16:
            return torch.autocast(device_type=device,
                                  dtype=torch.bfloat16 if bf16 else torch.float16)
        return contextlib.nullcontext()

    scaler = torch.amp.GradScaler(device) if fp16 else None

    def step():
        opt.zero_grad()
        with autocast():
            loss = model(dict(blobs))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return step


def run_torch(path: pathlib.Path, batch: int, warmup: int, iters: int,
              bf16: bool = False) -> dict:
    import torch

    from cct._C import available_cores

    torch.set_num_threads(available_cores())
    step = torch_training_step(path, batch, bf16=bf16)
    times = timed_iterations(step, warmup, iters)
    return {"times": times, "threads": torch.get_num_threads(), "version": torch.__version__}


def use_bf16() -> dict:
    """Turns cct's bf16 GEMMs on (as -precision=bf16 does) and says what it got: "bf16" only
    where the CPU has bf16 units, or under $CCT_BF16=emulate."""
    from cct import _C
    from cct.backend import precision
    got = precision.set_precision("bf16", source="bench")
    return {"precision": got, "native": bool(_C.cpu_has_bf16_units())}


def bf16_plans() -> str:
    """Where this process's bf16 GEMM shapes went, from its plan table: the engine (and those
    raced shape by shape), then the plain and the batched GEMM shapes by what they chose, and
    the convolutions' kernels by layout."""
    from cct import _C
    from cct.backend import plans
    tab = plans.table()
    engine, others = _C.bf16_engine(), _C.bf16_shape_engines()

    def where(choice, batched):
        choice = int(choice)
        if choice in plans.BF16_ENGINE_CHOICES:
            return plans.BF16_ENGINE_CHOICES[choice]
        if choice == plans.BF16_SKINNY_CHOICE and not batched:
            return "avx512bf16 skinny"   # cct's kernel in the skinny form (csrc/bf16.h)
        if choice == plans.BF16_THIN_CHOICE and not batched:
            return "avx512bf16 thin"   # and in the thin form
        if choice == plans.ONEDNN_CHOICE:
            return "onednn"   # oneDNN's matmul, where oneDNN is offered (csrc/onednn.h)
        on_engine = choice == plans.BF16_ITEMS_CHOICE if batched else choice < 2
        return engine if on_engine else "float32"

    parts = []
    for key, batched in (("gemm", False), ("gemm_batch", True)):
        counts = collections.Counter(where(row[-1], batched) for row in tab.get(key, [])
                                     if row[6 if batched else 5] == 2)   # bf16's rows
        spread = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
        parts.append(f"{sum(counts.values())} {'batched' if batched else 'plain'}"
                     + (f" ({spread})" if spread else ""))
    convs = collections.Counter(plans.CONV_LAYOUT_NAMES[row[6]] for row in tab.get("conv", [])
                                if plans.conv_modes(row[4])["bf16"])
    if convs:   # the convolutions' kernels by layout, oneDNN's among them where offered
        parts.append(f"{sum(convs.values())} convolution kernels ("
                     + ", ".join(f"{n} {name}" for name, n in sorted(convs.items())) + ")")
    return (f"engine {engine}, shape by shape also {' and '.join(others) or 'none'}; "
            + "; ".join(parts))


def worker(args) -> None:
    if args.worker == "peak":
        result = {"gflops": sgemm_peak(), "machine": machine()}
    elif args.worker == "peak-bf16":
        result = use_bf16()
        result["gflops"] = sgemm_peak() if result["precision"] == "bf16" else None
    else:
        rel, batch = NETS[args.net]
        path, batch = pathlib.Path(args.zoo) / rel, args.batch or batch
        if args.worker == "cct-rule":
            from cct.backend import plans
            plans.set_deterministic(True)
        extra = {}
        if args.worker == "cct-bf16":
            extra = use_bf16()
        if args.worker.startswith("torch"):
            result = run_torch(path, batch, args.warmup, args.iters,
                               bf16=args.worker == "torch-bf16")
        else:
            result = run_cct(path, batch, args.warmup, args.iters,
                             engine="CAFFE" if args.worker == "cct-caffe" else "")
            if extra.get("precision") == "bf16":
                result["bf16_plans"] = bf16_plans()
        result.update(extra)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("RESULT " + json.dumps(result))


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------
def sgemm_peak(size: int = 3072, repeats: int = 5) -> float:
    """Best GFLOP/s of a size x size x size float32 GEMM through cct._C, cct's threads: bf16
    arithmetic while bf16 GEMMs are on (--precision bf16), which gemm_peak_name names."""
    import numpy as np

    from cct import _C

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    return 2.0 * size ** 3 / best_of(lambda: _C.gemm(a, b), repeats) / 1e9


def gemm_peak_name() -> str:
    """What sgemm_peak measures now: "SGEMM peak", or "bf16 GEMM peak" while bf16 GEMMs are
    on (bench_layers' and bench_conv_layouts' --precision bf16 rooflines)."""
    from cct import _C
    return "bf16 GEMM peak" if _C.bf16_gemm_enabled() else "SGEMM peak"


def spawn(kind: str, net: str, args) -> dict:
    """Run one worker. The driver itself stays small (no NumPy arrays, no torch): a forked
    child starts with its parent's peak RSS."""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", kind, "--net", net,
           "--zoo", str(args.zoo), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    return run_worker(cmd, f"the {kind} run of {net}" if net else f"the {kind} run")


def machine() -> str:
    import platform

    import numpy as np

    from cct import _C

    from bench.worker import cpu_model
    model = cpu_model()
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    avx = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    forced = ", ".join(f"{v}={os.environ[v]}" for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
                       if os.environ.get(v))
    # A machine that sets these (for older OpenBLAS builds) runs OpenBLAS's kernels for that
    # core type whatever the CPU: a Zen 5 set to Haswell read an SGEMM peak of 206 GFLOP/s
    # against 378-400 with SkylakeX's, which OpenBLAS 0.3.34 picks there (bench/RESULTS.md).
    note = f" ({forced} set: OpenBLAS's kernels for that core)" if forced else ""
    return (f"{model}, {_C.available_cores()} cores available ({avx}), Python "
            f"{platform.python_version()}, NumPy {np.__version__}, cct BLAS: "
            f"{_C.blas_config()}{note}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS),
                    help=f"comma-separated, from: {', '.join(NETS)}")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per net")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    ap.add_argument("--batch", type=int, default=0, help="override every net's batch")
    ap.add_argument("--zoo", default=str(default_zoo()), help="the caffe-zoo folder")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every arm this many times, alternated, one process each; a "
                         "column is the median of the rounds' and a ratio the median of the "
                         "rounds' own ratios, each round's ratios printed under the net's row")
    ap.add_argument("--deterministic", action="store_true",
                    help="also train each net with --deterministic's fixed kernel plans and "
                         "print that speed as a ratio of the measured plans'")
    ap.add_argument("--caffe-engine", action="store_true",
                    help="also train each net with engine: CAFFE on every convolution (Caffe's "
                         "own arithmetic: lowered or pointwise) and print that speed as a ratio "
                         "of the measured plans'")
    ap.add_argument("--precision", choices=["float32", "bf16"], default="float32",
                    help="bf16: also train each net with cct's -precision=bf16 and PyTorch's "
                         "bfloat16 autocast (on a CPU without bf16 units cct trains float32 "
                         "and says so; CCT_BF16=emulate runs the bf16 numerics anyway)")
    ap.add_argument("--worker", choices=["cct", "cct-rule", "cct-caffe", "cct-bf16", "torch",
                                         "torch-bf16", "peak", "peak-bf16"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--net", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        ap.error(f"unknown nets {unknown}; known: {', '.join(NETS)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be 1 or more, got {args.rounds}")
    if not pathlib.Path(args.zoo).is_dir():
        ap.error(f"caffe-zoo folder {args.zoo} is absent (pass --zoo or set CCT_SHARED)")
    have_torch = not args.no_torch and importlib.util.find_spec("torch") is not None

    info = spawn("peak", "", args)
    peak = info["gflops"]
    print(info["machine"])
    print(f"SGEMM peak (3072^3 float32 through cct._C): {peak:.1f} GFLOP/s at the start "
          f"(measured again at the end; the larger one counts)")
    print(f"{args.iters} timed iterations per net after {args.warmup} warm-up; median shown")
    if have_torch:  # the peer's version, read without importing it into this process
        from importlib import metadata
        print(f"PyTorch {metadata.version('torch')} in its own processes")
    header = (f"{'net':<15}{'batch':>6}{'img/s':>9}{'GFLOP/s':>9}{'% peak':>8}{'RSS MB':>9}"
              f"{'update':>8}{'faults':>8}")
    if have_torch:
        header += f"{'torch img/s':>13}{'torch RSS':>11}{'ratio':>7}"
    if args.deterministic:
        header += f"{'rule img/s':>12}{'rule/measured':>15}"
    if args.caffe_engine:
        header += f"{'CAFFE img/s':>13}{'CAFFE/measured':>16}"
    bf16 = args.precision == "bf16"
    if bf16:
        info16 = spawn("peak-bf16", "", args)
        if info16["precision"] != "bf16":
            print("bf16: this CPU has no bf16 units, so cct's bf16 column trains in float32 "
                  "(CCT_BF16=emulate runs the bf16 numerics, slowly)")
        else:
            print(f"bf16 GEMM peak (3072^3 through the engine): {info16['gflops']:.1f} GFLOP/s, "
                  f"{'native' if info16['native'] else 'EMULATED: no bf16 units, speeds say nothing'}")
        header += f"{'bf16 img/s':>12}{'bf16 RSS':>10}{'/f32':>6}"
        if have_torch:
            header += f"{'torch bf16':>12}{'t bf16 RSS':>12}{'ratio':>7}"
    print(header)
    rows, bf16_lines = [], []
    arms = ["cct"] + ["torch"] * have_torch + ["cct-rule"] * args.deterministic
    arms += ["cct-caffe"] * args.caffe_engine + ["cct-bf16"] * bf16
    arms += ["torch-bf16"] * (bf16 and have_torch)
    for name in nets:
        batch = args.batch or NETS[name][1]
        # Each round runs every arm once, one process after another; a ratio is the median of
        # the rounds' own ratios, each between processes run back to back: on a shared host
        # the same pair of processes gave CaffeNet b32 bf16 / float32 anywhere in 0.91-2.15
        # (bench/RESULTS.md, the forty-fifth session).
        runs = {arm: [] for arm in arms}
        for _ in range(args.rounds):
            for arm in arms:
                runs[arm].append(spawn(arm, name, args))
        ips = {arm: [batch / statistics.median(r["times"]) for r in rs]
               for arm, rs in runs.items()}

        def speed(arm):
            return statistics.median(ips[arm])

        def ratio(arm, over):
            return statistics.median(a / b for a, b in zip(ips[arm], ips[over]))

        def rss(arm):
            return max(r["peak_rss_mb"] for r in runs[arm])

        res = runs["cct"]
        gflops = res[0]["flops_per_image"] * speed("cct") / 1e9
        update = statistics.median(r["update_s"] / statistics.median(r["times"]) for r in res)
        faults = statistics.median(r["faults_per_iter"] for r in res)
        line = (f"{name:<15}{batch:>6}{speed('cct'):>9.1f}{gflops:>9.1f}"
                f"{100 * gflops / peak:>7.0f}%{rss('cct'):>9.0f}{100 * update:>7.0f}%"
                f"{faults:>8.0f}")
        spreads = []
        if have_torch:
            line += f"{speed('torch'):>13.1f}{rss('torch'):>11.0f}{ratio('cct', 'torch'):>7.2f}"
            spreads.append(("cct / torch", "cct", "torch"))
        if args.deterministic:
            line += f"{speed('cct-rule'):>12.1f}{ratio('cct-rule', 'cct'):>15.2f}"
        if args.caffe_engine:
            line += f"{speed('cct-caffe'):>13.1f}{ratio('cct-caffe', 'cct'):>16.2f}"
        if bf16:
            line += (f"{speed('cct-bf16'):>12.1f}{rss('cct-bf16'):>10.0f}"
                     f"{ratio('cct-bf16', 'cct'):>6.2f}")
            spreads.append(("bf16 / f32", "cct-bf16", "cct"))
            plans = [r["bf16_plans"] for r in runs["cct-bf16"] if "bf16_plans" in r]
            if plans:
                bf16_lines.append(f"  {name}: {plans[-1]}")
            if have_torch:
                line += (f"{speed('torch-bf16'):>12.1f}{rss('torch-bf16'):>12.0f}"
                         f"{ratio('cct-bf16', 'torch-bf16'):>7.2f}")
                spreads.append(("bf16 / torch bf16", "cct-bf16", "torch-bf16"))
        rows.append((line, gflops))
        print(line, flush=True)
        if args.rounds > 1:
            print(f"  {name}, {args.rounds} rounds: " + "; ".join(
                f"{label} " + " ".join(f"{a / b:.2f}" for a, b in zip(ips[x], ips[y]))
                for label, x, y in spreads) + f"; cct img/s "
                + " ".join(f"{v:.1f}" for v in ips["cct"]), flush=True)
    end_peak = spawn("peak", "", args)["gflops"]
    if end_peak > peak:
        peak = end_peak
        print(f"SGEMM peak at the end: {peak:.1f} GFLOP/s; % peak recomputed:")
        for line, gflops in rows:
            print(line[:39] + f"{100 * gflops / peak:>7.0f}%" + line[47:])
    else:
        print(f"SGEMM peak at the end: {end_peak:.1f} GFLOP/s")
    print("update: share of the iteration spent in the SGD update (the solver's fused kernel); "
          "faults: cct's minor page faults per timed iteration (memory first touched on the "
          "hot path)")
    if args.deterministic:
        print("rule: the same net with --deterministic's fixed plans (one batch partition per "
              "thread; Winograd F(2x2) on 3x3 and 5x5 layers of 16+ channels, the direct layout "
              "on thin stride-1 layers, either on a strided layer's phase form where it adds at "
              "most a third more taps, else lowered; direct GEMM order), nothing timed")
    if args.caffe_engine:
        print("CAFFE: the same net with engine: CAFFE on every convolution (lowered or "
              "pointwise, batch partitions measured)")
    if bf16:
        print("bf16: cct -precision=bf16 (/f32: against cct's float32 above) and PyTorch's "
              "bfloat16 autocast (ratio: cct bf16 / torch bf16)")
        if bf16_lines:
            print("bf16 GEMM shapes by where the races put them (plain GEMMs and strided "
                  "batched ones):")
            print("\n".join(bf16_lines))


if __name__ == "__main__":
    main()

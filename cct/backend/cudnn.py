"""cuDNN convolutions for the GPU backend, through NVIDIA's cudnn frontend (the
``nvidia-cudnn-frontend`` package: cuDNN's graph API from Python, on device pointers).

CuPy dropped its cuDNN bindings; the frontend takes the blobs' CuPy arrays as bare device
addresses, so nothing is copied and no other framework is involved. One cuDNN graph per
operation and geometry (forward, backward data, backward filter; groups, strides, pads and
dilation as Caffe gives them), built the first time a shape comes and kept:

* **its plan chosen by measurement**: the engines cuDNN's heuristics propose are built, each
  is timed on the layer's own arrays (CUDA events, after one untimed run) and the fastest is
  kept, as the CPU's kernel plans are (cct/backend/plans.py). Under ``--deterministic``
  (:func:`cct.backend.plans.deterministic`) engines with cuDNN's NONDETERMINISTIC note are
  left out and nothing is timed: the heuristics' first engine is taken, so a rerun runs the
  same engines whatever the load.
* **float32 stays float32**: with TF32 off (CuPy's ``CUPY_TF32``, off by default, as Caffe's
  float32), engines whose notes say they convert their inputs down (TF32 tensor cores) are
  left out. In another precision (:attr:`Convolutions.precision`, cct/backend/reduced.py)
  ``tf32`` takes them; ``bf16`` and ``fp16`` run the graph on bf16 or half copies of the
  operands (one cast kernel each, as PyTorch's autocast casts) with float32 accumulation, the
  result cast back into the float32 blob; an engine must then agree with the lowering path in
  the same precision to that precision's accuracy (reduced.ACCURACY).
* **a geometry cuDNN refuses** (no engine for it, a data type it lacks) is remembered and
  runs the lowering path of :mod:`cct.backend.array_kernels`, with one warning naming it.

Prototxt ``engine: CAFFE`` keeps a layer on the lowering path (Caffe's own arithmetic);
``DEFAULT`` and ``CUDNN`` take cuDNN where it is installed (:func:`available`).
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Tuple

from ..glog import warning
from ..install import install_hint
from . import plans, reduced
from .shapes import accumulating, disjoint

try:
    import cudnn as _fe
    _IMPORT_PROBLEM = ""
except ImportError as e:
    _fe = None
    _IMPORT_PROBLEM = f"the cudnn frontend is not installed ({e})"
except (OSError, RuntimeError) as e:  # the frontend without a loadable cuDNN runtime
    _fe = None
    _IMPORT_PROBLEM = f"the cudnn frontend cannot load cuDNN ({e})"

#: at most this many of the heuristics' engines are built and timed per graph
MAX_TIMED_PLANS = 8
#: the largest difference from the lowering path, relative to the result's largest magnitude,
#: an engine may show on the layer's arrays when it is chosen: float32 rounding of sums of
#: thousands of terms (the engines measured agree to 1e-6); TF32 or reduced-precision
#: engines (1e-3) are left out
ACCURACY = 1e-4
#: engines asking for more scratch memory than this are left out (FFT engines ask for
#: gigabytes on a large batch; the memory is the net's)
WORKSPACE_LIMIT = 1 << 30
#: untimed and timed runs of each candidate engine (3 timed runs after 1 once picked an engine
#: for LeNet's conv2 that ran 2.2x slower than the lowering afterwards, on an H200)
_WARMUP, _REPEATS = 2, 10


def available() -> Tuple[bool, str]:
    """(True, cuDNN's version) when the frontend and cuDNN load here, else (False, why and
    which extra to install)."""
    if _fe is None:
        return False, f"{_IMPORT_PROBLEM}; for cuDNN convolutions: {install_hint('gpu-cuda13')}"
    try:
        return True, f"cuDNN {_fe.backend_version_string()}"
    except Exception as e:  # the frontend loads, the runtime library does not
        return False, f"cuDNN cannot be loaded ({type(e).__name__}: {e})"


def _tf32_allowed() -> bool:
    # CuPy's own switch for its GEMMs; the same one decides for the convolutions.
    return os.environ.get("CUPY_TF32", "0") == "1"


def _half_dtype(cupy, precision: str):
    """The storage of cuDNN's operands in ``precision``: CuPy's float16, or uint16 holding
    bf16 (CuPy has no bfloat16)."""
    return cupy.float16 if precision == "fp16" else cupy.uint16


def _dense_strides(shape) -> list:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= int(extent)
    return list(reversed(strides))


class _Graph:
    """One built cuDNN graph: its frontend graph, the tensors to bind, the chosen plan."""

    __slots__ = ("graph", "inputs", "output", "index", "workspace", "name", "half")

    def __init__(self, graph, inputs, output, index, workspace, name, half=None):
        self.graph, self.inputs, self.output = graph, inputs, output
        self.index, self.workspace, self.name = index, workspace, name
        self.half = half     # "bf16"/"fp16": the graph's tensors are half copies


class Convolutions:
    """The cuDNN graphs of one process, per device: built on first use, planned, kept."""

    def __init__(self, cupy):
        self.cupy = cupy
        #: what the convolutions multiply in (cct/backend/reduced.py), the GPU backend's
        #: set_precision's
        self.precision = "float32"
        self._casts = None
        self._graphs: Dict[tuple, Optional[_Graph]] = {}
        self._handles: Dict[int, object] = {}
        self._workspaces: Dict[int, object] = {}
        self._refused: Dict[tuple, str] = {}
        #: the engine each graph runs, by its key (what `cct time` and the tests read)
        self.table: Dict[tuple, str] = {}
        #: engines a plan table named (a snapshot's side file, the machine's cache), by key
        #: without the device: taken without timing when they run and agree
        self.preferred: Dict[tuple, str] = {}

    # -- the three operations ----------------------------------------------------------------
    # Each takes ``lowered``, the lowering path's result of the same call as a function: the
    # reference each engine is checked against when a graph is built.
    def forward(self, x, weight, stride, pad, dilation, out, lowered):
        """y = conv(x, weight) on cuDNN, into ``out`` when given; None where cuDNN refuses the
        geometry (the caller lowers instead)."""
        n, c, h, w = x.shape
        o, _, kh, kw = weight.shape
        ho = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
        wo = (w + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
        return self._run("fprop", (x, weight), (n, o, ho, wo), stride, pad, dilation, out,
                         lowered)

    def backward_data(self, dy, weight, x_shape, stride, pad, dilation, out, lowered):
        return self._run("dgrad", (dy, weight), tuple(int(s) for s in x_shape), stride, pad,
                         dilation, out, lowered)

    def backward_weight(self, x, dy, weight_shape, stride, pad, dilation, out, accumulate,
                        lowered):
        if accumulate and out is not None:
            # cuDNN writes its result; Caffe adds into the param diff (iter_size, shared
            # weights), so the gradient goes to a scratch array first.
            dw = self._run("wgrad", (x, dy), tuple(weight_shape), stride, pad, dilation, None,
                           lowered)
            if dw is None:
                return None
            out += dw
            return out
        return self._run("wgrad", (x, dy), tuple(weight_shape), stride, pad, dilation, out,
                         lowered)

    # -- graphs ------------------------------------------------------------------------------
    def _run(self, op, operands, out_shape, stride, pad, dilation, out, lowered):
        cupy = self.cupy
        dtype = operands[0].dtype
        if dtype != cupy.float32 or any(a.dtype != dtype for a in operands):
            return None  # the lowering path's dtypes (float64 checks, bf16 rounding) stay there
        device = cupy.cuda.runtime.getDevice()
        key = (op, device, tuple(operands[0].shape), tuple(operands[1].shape), out_shape,
               tuple(stride), tuple(pad), tuple(dilation), self._arithmetic(),
               plans.deterministic())
        graph = self._graphs.get(key, False)
        if graph is None:
            return None   # refused once: nothing to prepare, the lowering runs
        operands = tuple(a if a.flags.c_contiguous else cupy.ascontiguousarray(a)
                         for a in operands)
        if out is None or not out.flags.c_contiguous or out.shape != out_shape:
            target = cupy.empty(out_shape, dtype)
        else:
            target = out
        if graph is False:
            graph = self._build(key, op, operands, target, stride, pad, dilation, device,
                                lowered)
            self._graphs[key] = graph
        if graph is None:
            return None
        self._execute(graph, operands, target, device)
        if target is not out and out is not None:
            out[...] = target
            return out
        return target

    def _arithmetic(self) -> str:
        """The precision the graphs run in: the backend's, TF32 where CuPy's switch asks for
        it on float32."""
        if self.precision == "float32" and _tf32_allowed():
            return "tf32"
        return self.precision

    def _handle(self, device: int):
        handle = self._handles.get(device)
        if handle is None:
            handle = self._handles[device] = _fe.create_handle()
        # The layers' kernels run on CuPy's current stream; cuDNN's must follow it (a
        # captured iteration runs on a stream of its own).
        _fe.set_stream(handle, self.cupy.cuda.get_current_stream().ptr)
        return handle

    def _workspace(self, device: int, size: int):
        ws = self._workspaces.get(device)
        if ws is None or ws.size < size:
            ws = self._workspaces[device] = self.cupy.empty(max(int(size), 1), self.cupy.uint8)
        return ws

    def _build(self, key, op, operands, target, stride, pad, dilation, device, lowered):
        F = _fe.data_type.FLOAT
        arithmetic = key[8]
        half = arithmetic if arithmetic in reduced.HALF else None
        io = {None: F, "bf16": _fe.data_type.BFLOAT16, "fp16": _fe.data_type.HALF}[half]
        try:
            handle = self._handle(device)
            g = _fe.pygraph(io_data_type=io, intermediate_data_type=F, compute_data_type=F,
                            handle=handle)
            a, b = (g.tensor(name=f"in{i}", dim=list(t.shape), stride=_dense_strides(t.shape),
                             data_type=io) for i, t in enumerate(operands))
            attrs = dict(padding=list(pad), stride=list(stride), dilation=list(dilation),
                         compute_data_type=F)
            if op == "fprop":
                y = g.conv_fprop(image=a, weight=b, name="conv", **attrs)
            elif op == "dgrad":
                y = g.conv_dgrad(loss=a, filter=b, name="conv", **attrs)
            else:
                y = g.conv_wgrad(image=a, loss=b, name="conv", **attrs)
            y.set_output(True).set_data_type(io)
            y.set_dim(list(target.shape)).set_stride(_dense_strides(target.shape))
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([_fe.heur_mode.A, _fe.heur_mode.FALLBACK])
            # float32 sums in every precision; tensor cores only where the precision allows
            notes = [_fe.numerical_note.REDUCED_PRECISION_REDUCTION]
            if plans.deterministic():
                notes.append(_fe.numerical_note.NONDETERMINISTIC)
            if arithmetic == "float32":
                notes += [_fe.numerical_note.DOWN_CONVERT_INPUTS,
                          _fe.numerical_note.TENSOR_CORE]
            if notes:
                g.deselect_numeric_notes(notes)
            g.check_support()
            g.build_plans(_fe.build_plan_policy.ALL)
            graph = self._choose(key, g, (a, b), y, operands, target, device, lowered(),
                                 half)
        except Exception as e:  # cudnnGraphNotSupportedError, no engine left, a bad geometry
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._refused[key] = reason
            warning("cudnn.py:0", f"cuDNN has no engine for a {op} convolution of {tuple(operands[0].shape)}"
                    f" by {tuple(operands[1].shape)} (stride {tuple(stride)}, pad "
                    f"{tuple(pad)}, dilation {tuple(dilation)}): {reason}; it runs lowered")
            return None
        finally:
            # what the race and the lowered reference took (im2col of a whole batch) goes
            # back to the device, not to the pool's high-water mark
            self.cupy.get_default_memory_pool().free_all_blocks()
        self.table[key] = graph.name
        return graph

    def _choose(self, key, g, tensors, y, operands, target, device, reference,
                half=None) -> _Graph:
        """The engine to keep: of the heuristics' engines in their order, those that run and
        agree with the lowering path's ``reference`` within float32 rounding, the first under
        --deterministic, else the fastest of the first MAX_TIMED_PLANS."""
        count = int(g.get_execution_plan_count())
        if count == 0:
            raise RuntimeError("no execution plan left after the filters")
        wanted = 1 if plans.deterministic() else MAX_TIMED_PLANS
        named = self.preferred.get(_portable(key))
        order, named_index = list(range(count)), None
        if named is not None:   # the table's engine first: taken alone if it runs and agrees
            names = [str(g.get_plan_name_at_index(i)) for i in order]
            if named in names:
                named_index = names.index(named)
                order.remove(named_index)
                order.insert(0, named_index)
        scale = float(self.cupy.abs(reference).max()) or 1.0
        timings, why = [], {}
        for index in order:
            try:
                size = int(g.get_workspace_size_plan_at_index(index))
                if size > WORKSPACE_LIMIT:
                    why[index] = f"a workspace of {size:,} bytes"
                    continue
                graph = _Graph(g, tensors, y, index, size, str(g.get_plan_name_at_index(index)),
                               half)
                self._execute(graph, operands, target, device)
                err = float(self.cupy.abs(target - reference).max()) / scale
                if not err <= max(ACCURACY, reduced.ACCURACY[key[8]]):  # NaN too
                    why[index] = f"{graph.name} is {err:.1e} off the lowering"
                    continue
                if index == named_index:
                    return graph
                seconds = 0.0 if wanted == 1 else self._time(graph, operands, target, device)
            except Exception as e:  # an engine that did not build or does not run here
                why[index] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                continue
            timings.append((seconds, index, graph))
            if len(timings) == wanted:
                break
        if not timings:
            first = "; ".join(f"plan {i}: {w}" for i, w in list(why.items())[:3])
            raise RuntimeError(f"none of {count} execution plans ran ({first})")
        timings.sort(key=lambda t: (t[0], t[1]))
        return timings[0][2]

    def _time(self, graph, operands, target, device) -> float:
        cupy = self.cupy
        for _ in range(_WARMUP):
            self._execute(graph, operands, target, device)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        stream = cupy.cuda.get_current_stream()
        start.record(stream)
        for _ in range(_REPEATS):
            self._execute(graph, operands, target, device)
        stop.record(stream)
        stop.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, stop))

    def _execute(self, graph, operands, target, device) -> None:
        a, b = graph.inputs
        result = target
        if graph.half:
            operands = tuple(self._to_half(x, graph.half) for x in operands)
            result = self.cupy.empty(target.shape, _half_dtype(self.cupy, graph.half))
        pack = {a: operands[0].data.ptr, b: operands[1].data.ptr, graph.output: result.data.ptr}
        ws = self._workspace(device, graph.workspace)
        graph.graph.execute_plan_at_index(pack, ws, index=graph.index,
                                          handle=self._handle(device))
        if graph.half:
            self._from_half(result, graph.half, target)

    def _cast_kernels(self):
        if self._casts is None:
            ek = self.cupy.ElementwiseKernel
            self._casts = {way: ek(*spec) for way, spec in reduced.BF16_KERNELS.items()}
        return self._casts

    def _to_half(self, x, half):
        if half == "fp16":
            return x.astype(self.cupy.float16)
        return self._cast_kernels()["to"](x)

    def _from_half(self, h, half, out) -> None:
        if half == "fp16":
            out[...] = h           # CuPy's elementwise copy casts float16 to float32
        else:
            self._cast_kernels()["from"](h, out)

    def refused(self) -> Dict[tuple, str]:
        """The geometries cuDNN refused and why (they run lowered)."""
        return dict(self._refused)

    # -- the plan table (cct/backend/plans.py keeps it with the CPU's) -------------------------
    def rows(self) -> list:
        """[op, x, w, out shapes, stride, pad, dilation, precision, deterministic, engine]
        per graph built: JSON for the machine's cache and a snapshot's side file."""
        return [[*map(_listed, _portable(k)), name] for k, name in sorted(self.table.items())]

    def install_rows(self, rows) -> int:
        """Take a table's engines as the ones to try first (see :meth:`_choose`)."""
        taken = {}
        for row in rows:
            if not (isinstance(row, list) and len(row) == 10 and isinstance(row[-1], str)
                    and row[0] in ("fprop", "dgrad", "wgrad")):
                raise ValueError(f"a cudnn plan row is not [op, shapes, stride, pad, dilation, "
                                 f"precision, deterministic, engine]: {str(row):.80}")
            taken[tuple(tuple(v) if isinstance(v, list) else v for v in row[:-1])] = row[-1]
        self.preferred.update(taken)
        return len(taken)


def _portable(key: tuple) -> tuple:
    """A graph's key without its device id: the same engine serves the same geometry on any
    GPU of the machine."""
    return key[:1] + key[2:]


def _listed(v):
    return list(v) if isinstance(v, tuple) else v


def convolutions(cupy) -> Optional[Convolutions]:
    """The process's cuDNN convolutions on ``cupy``, or None where cuDNN is not usable."""
    ok, _ = available()
    return Convolutions(cupy) if ok else None


def wrap_lowering(kernels, convs: Convolutions, pair: Callable) -> None:
    """Route ``kernels``' three convolution kernels through ``convs`` for every engine but
    CAFFE, keeping the lowering as each one's fallback and as the reference an engine is
    checked against when chosen. The lowering's refusals come first: an out= that overlaps an
    input (cuDNN would read what it writes), accumulate without an out=."""
    lowered_forward = kernels.conv_forward
    lowered_data = kernels.conv_backward_data
    lowered_weight = kernels.conv_backward_weight

    def conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out=None,
                     engine="DEFAULT"):
        disjoint(kernels.xp, "conv_forward", out, x=x, weight=weight, bias=bias)
        if engine != "CAFFE":
            y = convs.forward(x, weight, pair(stride), pair(pad), pair(dilation), out,
                              lambda: lowered_forward(x, weight, None, kernel, stride, pad,
                                                      dilation, group))
            if y is not None:
                if bias is not None:
                    y += bias.reshape(1, -1, 1, 1).astype(y.dtype, copy=False)
                return y
        return lowered_forward(x, weight, bias, kernel, stride, pad, dilation, group, out=out,
                               engine=engine)

    def conv_backward_data(dy, weight, x_shape, kernel, stride, pad, dilation, group, out=None,
                           engine="DEFAULT"):
        disjoint(kernels.xp, "conv_backward_data", out, dy=dy, weight=weight)
        if engine != "CAFFE":
            dx = convs.backward_data(dy, weight, x_shape, pair(stride), pair(pad),
                                     pair(dilation), out,
                                     lambda: lowered_data(dy, weight, x_shape, kernel, stride,
                                                          pad, dilation, group))
            if dx is not None:
                return dx
        return lowered_data(dy, weight, x_shape, kernel, stride, pad, dilation, group, out=out,
                            engine=engine)

    def conv_backward_weight(x, dy, kernel, stride, pad, dilation, group, out=None,
                             accumulate=False, engine="DEFAULT"):
        accumulating("conv_backward_weight", out, accumulate)
        disjoint(kernels.xp, "conv_backward_weight", out, x=x, dy=dy)
        if engine != "CAFFE":
            kh, kw = pair(kernel)
            shape = (dy.shape[1], x.shape[1] // int(group), kh, kw)
            dw = convs.backward_weight(x, dy, shape, pair(stride), pair(pad), pair(dilation),
                                       out, accumulate,
                                       lambda: lowered_weight(x, dy, kernel, stride, pad,
                                                              dilation, group))
            if dw is not None:
                return dw
        return lowered_weight(x, dy, kernel, stride, pad, dilation, group, out=out,
                              accumulate=accumulate, engine=engine)

    kernels.conv_forward = conv_forward
    kernels.conv_backward_data = conv_backward_data
    kernels.conv_backward_weight = conv_backward_weight

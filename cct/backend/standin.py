"""An array module with CuPy's rules, over NumPy: the device memory that CI's ``numpy`` backend
stands in with (:mod:`cct.backend.npdevice`).

A stand-in is only as good as its refusals. NumPy converts, fills and mixes freely where CuPy
refuses, so a stand-in made of plain NumPy arrays once let CI pass a GPU path that could not
take one step on a GPU. A :class:`DeviceArray` holds a NumPy array that host code cannot reach
except the ways CuPy 14 allows (its documented behaviour, ``cupy/_core/core.pyx``):

refused, as CuPy refuses
  * implicit conversion to a host array: ``np.asarray(d)``, ``np.array(d)``,
    ``np.float32(d)``/``dtype.type(d)`` of any size, ``host[...] = d``, a C++ (pybind11) or
    numba kernel given ``d``: TypeError, CuPy's message (``ndarray.__array__`` raises);
  * assigning or filling a device array from a host array: ``d[...] = host`` with a host array
    of one or more dimensions is CuPy's ``fill`` and raises ValueError ("non-scalar
    numpy.ndarray cannot be used for fill"); a list raises TypeError;
  * mixing host and device arrays in one operation: a ufunc, an operator, an ``xp`` function
    or a method given a host array (CuPy's ``Unsupported type <class 'numpy.ndarray'>``);
  * ``ndarray.set`` from anything but a host array of the same shape and dtype, ``.get(out=)``
    into anything but one; ``set`` into a strided device view, ``get(out=)`` into a strided
    host view;
  * ``numpy.copyto`` into a host array from a device one (CuPy takes the call and raises
    AttributeError on the host destination).

allowed, as CuPy allows (each one a counted copy)
  * ``float(d)``, ``int(d)``, ``bool(d)``, ``complex(d)`` of a one-element array, ``d.item()``,
    ``d.tolist()``, ``format(d, spec)``;
  * ``xp.asarray(host)`` / ``xp.array`` / ``xp.ascontiguousarray`` (host to device),
    ``d.get()``, ``d.get(out=host)``, ``d.set(host)``, ``xp.asnumpy(d)``.

stream capture (a CUDA graph), as CuPy 14 and CUDA do it
  * between :func:`begin_capture` and :func:`end_capture` (on the capturing thread) every
    device operation is recorded with the arrays it reads and writes, not only run; the
    :class:`Graph` replays them (:meth:`Graph.launch`) with the values those arrays hold then,
    and host scalars as they were at capture: a learning rate passed as a Python number is
    baked in, as in a real graph; random draws repeat their captured values (the generator's
    state lives on the host);
  * refused while capturing: every host<->device copy (``float(d)``, ``get``, ``set``,
    ``asarray(host)``: CUDA's "operation not permitted when stream is capturing"), and cuBLAS
    (``matmul``, ``dot``, ``@``, ``tensordot``, ``einsum``, ``linalg``: CuPy refuses to set a
    cuBLAS handle's stream during a capture); :func:`own_matmul` is the GEMM through a handle
    of cct's own, which a capture takes (cct.backend.gpu's).

Reductions and scalar indexing give 0-d device arrays, never NumPy scalars, as on CuPy
(``d.max()``, ``d[0]``): the value stays on the device until host code asks for it explicitly.

:class:`Copies` counts every host<->device copy (count and bytes each way) so tests can assert
how many an iteration makes (``with npdevice.copies.counting() as c: ...``).
:class:`OutOfMemoryError` is CuPy's error for a device whose memory ran out.
"""
from __future__ import annotations

import contextlib
import operator
import threading
import types
from typing import Any, Iterator

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from .reduced import round_operand

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly.")
FILL = "non-scalar numpy.ndarray cannot be used for fill"


class Copies:
    """Host<->device copies made through a stand-in namespace: counts and bytes each way."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.to_device = 0
            self.to_host = 0
            self.bytes_to_device = 0
            self.bytes_to_host = 0
            self.sizes = []  # (direction, bytes) of each copy, in order

    def record(self, direction: str, nbytes: int) -> None:
        with self._lock:
            if direction == "to_device":
                self.to_device += 1
                self.bytes_to_device += int(nbytes)
            else:
                self.to_host += 1
                self.bytes_to_host += int(nbytes)
            self.sizes.append((direction, int(nbytes)))

    @contextlib.contextmanager
    def counting(self) -> Iterator["Copies"]:
        """Zeroes the counters, then yields them."""
        self.reset()
        yield self

    def __repr__(self) -> str:
        return (f"Copies(to_device={self.to_device} ({self.bytes_to_device} B), "
                f"to_host={self.to_host} ({self.bytes_to_host} B))")


class OutOfMemoryError(MemoryError):
    """CuPy's ``cupy.cuda.memory.OutOfMemoryError``, with its message: what a stand-in device
    raises when its memory runs out (tests raise it to play a GPU that is too small)."""

    def __init__(self, size: int, total: int, limit: int = 0):
        self._size, self._total, self._limit = size, total, limit
        msg = f"Out of memory allocating {size:,} bytes"
        if limit:
            msg += f" (allocated so far: {total:,} bytes, limit set to: {limit:,} bytes)."
        elif total != -1:
            msg += f" (allocated so far: {total:,} bytes)."
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self._size, self._total, self._limit))


def _refuse_host(value, what: str):
    raise TypeError(f"Unsupported type {type(value)!r} in {what}: a host (NumPy) array cannot "
                    f"be mixed with device arrays; copy it with xp.asarray() first")


def _unwrap(value, what: str):
    """A device array's NumPy array; Python and NumPy scalars as they are; containers
    unwrapped item by item; a host array refused."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, np.ndarray):
        _refuse_host(value, what)
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, what) for v in value)
    return value


def _wrap(value, copies: "Copies"):
    if isinstance(value, np.ndarray):
        return DeviceArray(value, copies)
    if isinstance(value, np.generic):  # CuPy's reductions and scalar indexing stay on device
        return DeviceArray(np.asarray(value), copies)
    if isinstance(value, tuple):
        return tuple(_wrap(v, copies) for v in value)
    if isinstance(value, list):
        return [_wrap(v, copies) for v in value]
    return value


# -- stream capture ---------------------------------------------------------------------------
CAPTURING = "operation not permitted when stream is capturing"
CUBLAS_CAPTURE = "calling cuBLAS API during stream capture is currently unsupported"
# The functions CuPy runs through cuBLAS (its setStream refuses a capturing stream).
_CUBLAS = frozenset(("matmul", "dot", "vdot", "inner", "outer", "tensordot", "einsum",
                     "kron", "matrix_power"))
_capture = threading.local()


class _Op:
    """One recorded device operation: ``fn`` on the same NumPy arrays again, its result
    copied into the array that held it at capture (nothing to copy when it wrote ``out=``)."""

    __slots__ = ("fn", "args", "kwargs", "target", "constant")

    def __init__(self, fn, args, kwargs, target, constant):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.target, self.constant = target, constant

    def replay(self) -> None:
        if self.constant:
            return
        result = self.fn(*self.args, **self.kwargs)
        targets = self.target if isinstance(self.target, tuple) else (self.target,)
        results = result if isinstance(self.target, tuple) else (result,)
        for t, r in zip(targets, results):
            if t is not None and r is not t:
                np.copyto(t, r, casting="unsafe")


class Graph:
    """A captured sequence of device operations (a CUDA graph): :meth:`launch` runs them
    again, reading and writing the arrays they did at capture."""

    def __init__(self, ops):
        self.ops = ops

    def launch(self) -> None:
        if capturing():
            raise RuntimeError(f"launching a graph: {CAPTURING}")
        for op in self.ops:
            op.replay()


def capturing() -> bool:
    """Whether this thread is capturing."""
    return getattr(_capture, "ops", None) is not None


def begin_capture() -> None:
    if capturing():
        raise RuntimeError("this thread's stream is capturing already")
    _capture.ops = []


def end_capture() -> Graph:
    """Ends this thread's capture (also after an operation failed in it)."""
    ops, _capture.ops = getattr(_capture, "ops", None), None
    if ops is None:
        raise RuntimeError("end_capture without begin_capture")
    return Graph(ops)


def _refuse_capturing(what: str) -> None:
    if capturing():
        raise RuntimeError(f"{what}: {CAPTURING}")


def _raw(value):
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, (tuple, list)):
        return tuple(_raw(v) for v in value)
    return None


# Operations that write an argument in place without an ``out=`` (NumPy's copyto, put,
# ufunc.at, ndarray.sort ...).
_IN_PLACE = frozenset(("copyto", "put", "place", "putmask", "fill_diagonal", "sort", "at"))


def _run(fn, raw_args, raw_kwargs, copies: "Copies", out=None, name: str = "",
         constant: bool = False):
    """``fn`` on unwrapped arguments: ``out`` when it wrote there, else its result as device
    arrays. While this thread captures, the operation is recorded (CuPy's cuBLAS refused) and,
    as on a GPU, nothing already in device memory changes: one that writes an existing array
    (``out=``, an index, in place) runs only when the graph is launched; one that makes a new
    array runs now for its shape, its values being the graph's to write."""
    ops = getattr(_capture, "ops", None)
    if ops is None:
        result = fn(*raw_args, **raw_kwargs)
        return out if out is not None else _wrap(result, copies)
    if name in _CUBLAS:
        raise NotImplementedError(CUBLAS_CAPTURE)
    if out is not None or name in _IN_PLACE:
        ops.append(_Op(fn, raw_args, raw_kwargs, None, constant))
        return out
    with np.errstate(all="ignore"):     # values not yet written: the graph's to compute
        wrapped = _wrap(fn(*raw_args, **raw_kwargs), copies)
    ops.append(_Op(fn, raw_args, raw_kwargs, _raw(wrapped), constant))
    return wrapped


def own_matmul(a: "DeviceArray", b: "DeviceArray", out: "DeviceArray" = None,
               precision: str = "float32") -> "DeviceArray":
    """``a @ b`` (into ``out``) as cct's own cuBLAS handle computes it
    (cct.backend.gpu.CublasGemm): taken by a capture, unlike CuPy's matmul; in ``precision``
    its operands rounded as a tensor core rounds them (cct/backend/reduced.py), the sums
    float32."""
    for x in (a, b) + (() if out is None else (out,)):
        if not isinstance(x, DeviceArray):
            _refuse_host(x, "a GEMM")
    kwargs = {} if out is None else {"out": out._a}
    if precision == "float32":
        fn = np.matmul
    else:
        def fn(x, y, **kw):       # a replay rounds the values its arrays hold then
            return np.matmul(round_operand(x, precision), round_operand(y, precision), **kw)
    return _run(fn, (a._a, b._a), kwargs, a._copies, out=out)


def _unwrap_kwargs(kwargs: dict, what: str) -> dict:
    out = {}
    for k, v in kwargs.items():
        if k == "out" and v is not None:
            outs = v if isinstance(v, tuple) else (v,)
            for o in outs:
                if not isinstance(o, DeviceArray):
                    _refuse_host(o, f"{what}'s out=")
            v = tuple(o._a for o in outs) if isinstance(v, tuple) else v._a
        elif k == "dtype" or k == "casting" or k == "order":
            pass
        else:
            v = _unwrap(v, what)
        out[k] = v
    return out


def _index(key, what: str):
    """An index: ints, slices, None, Ellipsis, device arrays and lists of ints (CuPy turns a
    list into a device index array); a host array is refused."""
    if isinstance(key, tuple):
        return tuple(_index(k, what) for k in key)
    if isinstance(key, DeviceArray):
        return key._a
    if isinstance(key, np.ndarray):
        _refuse_host(key, what)
    return key


# Methods of CuPy's ndarray that compute on the device: forwarded to NumPy's, arguments
# unwrapped (a host array refused), results device arrays.
_METHODS = frozenset((
    "all", "any", "argmax", "argmin", "argsort", "astype", "clip", "conj", "copy", "cumsum",
    "cumprod", "diagonal", "dot", "flatten", "max", "mean", "min", "nonzero", "prod", "ravel",
    "repeat", "reshape", "round", "sort", "squeeze", "std", "sum", "swapaxes", "take", "trace",
    "transpose", "var", "view"))

# Plain attributes that never touch the values.
_ATTRIBUTES = frozenset(("shape", "dtype", "size", "ndim", "strides", "nbytes", "itemsize"))


class DeviceArray(NDArrayOperatorsMixin):
    """A device array of the stand-in: NumPy memory behind CuPy's rules (module docstring)."""

    __slots__ = ("_a", "_copies")

    def __init__(self, array: np.ndarray, copies: Copies):
        self._a = array
        self._copies = copies

    # Refused: every implicit route to a host array ------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    # Plain attributes ----------------------------------------------------------------------
    def __getattr__(self, attr: str) -> Any:
        # Never forward NumPy's own protocols (__array_interface__, __array_struct__, the
        # buffer): each would hand NumPy the host memory without a word.
        if attr in _ATTRIBUTES:
            return getattr(self._a, attr)
        if attr in _METHODS:
            method = getattr(self._a, attr)
            copies = self._copies

            def call(*args, **kwargs):
                what = f"ndarray.{attr}()"
                return _run(method, _unwrap(args, what), _unwrap_kwargs(kwargs, what), copies,
                            name=attr)
            return call
        raise AttributeError(f"the device stand-in's ndarray has no attribute {attr!r} "
                             f"(cct.backend.standin: CuPy's ndarray methods only)")

    @property
    def T(self) -> "DeviceArray":
        return DeviceArray(self._a.T, self._copies)

    @property
    def flags(self):
        return self._a.flags

    @property
    def base(self):
        return None if self._a.base is None else DeviceArray(self._a.base, self._copies)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for item in self._a:
            yield _wrap(item, self._copies)

    def __repr__(self) -> str:
        return f"device stand-in array({self._a!r})"

    __str__ = __repr__

    # Indexing --------------------------------------------------------------------------------
    def __getitem__(self, key) -> "DeviceArray":
        return _run(operator.getitem, (self._a, _index(key, "an index")), {}, self._copies)

    def __setitem__(self, key, value) -> None:
        key = _index(key, "an index")
        if isinstance(value, DeviceArray):
            _run(operator.setitem, (self._a, key, value._a), {}, self._copies, out=self)
            return
        # CuPy's scatter 'update' with anything but a device array is ndarray.fill's rule.
        if isinstance(value, np.ndarray):
            if value.shape != ():
                raise ValueError(FILL)
            value = value.item()
        if not isinstance(value, (bool, int, float, complex, np.generic)):
            raise TypeError(f"Unsupported type {type(value)!r}")
        _run(operator.setitem, (self._a, key, value), {}, self._copies, out=self)

    def fill(self, value) -> None:
        self[...] = value

    # Operators and NumPy's protocols -----------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        what = f"numpy.{ufunc.__name__}"
        raw = _unwrap(inputs, what)
        out = kwargs.get("out")
        if out is not None:
            out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _run(getattr(ufunc, method), raw, _unwrap_kwargs(kwargs, what), self._copies,
                    out=out, name="at" if method == "at" else ufunc.__name__)

    def __array_function__(self, func, types_, args, kwargs):
        what = f"numpy.{func.__name__}"
        if func is np.copyto and args and not isinstance(args[0], DeviceArray):
            # CuPy's copyto takes the call and reads its host destination as a device array
            # (CuPy 14.2 on an H200: AttributeError, not the TypeError of mixing).
            raise AttributeError(f"'numpy.ndarray' object has no attribute 'data' in {what}: "
                                 f"copy a device array to the host with get(out=)")
        if any(issubclass(t, np.ndarray) for t in types_):
            _refuse_host(np.empty(0), what)
        return _run(func, _unwrap(args, what), _unwrap_kwargs(kwargs, what), self._copies,
                    out=kwargs.get("out"), name=func.__name__)

    # Allowed: explicit copies, and a one-element array's value --------------------------------
    def get(self, stream=None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """A host copy (CuPy's ``ndarray.get``), into ``out`` when given: a host array of the
        same shape and dtype."""
        _refuse_capturing("a device-to-host copy")
        if out is not None:
            if not isinstance(out, np.ndarray) or isinstance(out, DeviceArray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self._a.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self._a.dtype} "
                                f"array")
            if out.shape != self._a.shape:
                raise ValueError("Shape mismatch")
            # CuPy copies a strided device view through a contiguous one of its own (seen on
            # CuPy 14.2); the host side must be contiguous.
            if not (out.flags.c_contiguous or out.flags.f_contiguous):
                raise RuntimeError("Cannot set to non-contiguous array")
            np.copyto(out, self._a)
            host = out
        else:
            host = np.array(self._a, order=order)
        self._copies.record("to_host", self._a.nbytes)
        return host

    def set(self, arr: np.ndarray, stream=None) -> None:
        """Copies a host array of the same shape and dtype in (CuPy's ``ndarray.set``)."""
        _refuse_capturing("a host-to-device copy")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, not {type(arr)}")
        if arr.dtype != self._a.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self._a.dtype} array")
        if arr.shape != self._a.shape:
            raise ValueError("Shape mismatch")
        if _order(self._a) is None:
            raise RuntimeError("Cannot set to non-contiguous array")
        np.copyto(self._a, arr)
        self._copies.record("to_device", arr.nbytes)

    def _value(self):
        _refuse_capturing("reading a device value on the host")
        self._copies.record("to_host", self._a.nbytes)
        return self._a

    def item(self, *args):
        return self._value().item(*args)

    def tolist(self):
        return self._value().tolist()

    def __float__(self) -> float:
        return float(self._value())

    def __int__(self) -> int:
        return int(self._value())

    def __bool__(self) -> bool:
        return bool(self._value())

    def __complex__(self) -> complex:
        return complex(self._value())

    def __format__(self, spec: str) -> str:
        return format(self._value(), spec)

    def __reduce__(self):  # pickled through the host, as CuPy's arrays are
        return (_from_pickle, (self.get(),))


def _order(a: np.ndarray):
    """"C" or "F" for a contiguous array (C first), None for a strided view."""
    return "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else None


def _from_pickle(host: np.ndarray) -> DeviceArray:
    return DeviceArray(host, Copies())


# --------------------------------------------------------------------------------------------
# The namespace
# --------------------------------------------------------------------------------------------
# The explicit host-to-device copies: everything else that takes arrays refuses host ones.
_FROM_HOST = frozenset(("asarray", "array", "asanyarray", "ascontiguousarray"))


class _Ufunc:
    """A NumPy ufunc taking device arrays only (CuPy's ufuncs), with its methods (``at``,
    ``reduce``, ``accumulate``, ``outer``) under the same rule."""

    def __init__(self, ufunc: np.ufunc, copies: Copies):
        self._ufunc = ufunc
        self._copies = copies
        self.__name__ = ufunc.__name__

    def _call(self, fn, args, kwargs, what, method: str = ""):
        out = kwargs.get("out")
        if out is not None:
            out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _run(fn, _unwrap(args, what), _unwrap_kwargs(kwargs, what), self._copies,
                    out=out, name="at" if method == "at" else self.__name__)

    def __call__(self, *args, **kwargs):
        return self._call(self._ufunc, args, kwargs, f"xp.{self.__name__}")

    def __getattr__(self, attr: str):
        member = getattr(self._ufunc, attr)
        if not callable(member):
            return member
        return lambda *args, **kwargs: self._call(member, args, kwargs,
                                                  f"xp.{self.__name__}.{attr}", attr)


def _function(name: str, fn, copies: Copies, constant: bool = False):
    what = f"xp.{name}"
    base = name.rsplit(".", 1)[-1]
    # every linalg routine goes through cuBLAS/cuSOLVER handles on CuPy
    refused = base if not name.startswith("linalg.") else "dot"

    def call(*args, **kwargs):
        return _run(fn, _unwrap(args, what), _unwrap_kwargs(kwargs, what), copies,
                    out=kwargs.get("out"), name=refused, constant=constant)
    call.__name__ = name
    call.__doc__ = f"{what}: NumPy's {name} under CuPy's rules (device arrays only)."
    return call


def _from_host(name: str, fn, copies: Copies):
    def call(obj, dtype=None, *args, **kwargs):
        if isinstance(obj, DeviceArray):  # on the device already: CuPy casts or copies there
            return _run(fn, (obj._a, dtype) + args, kwargs, copies)
        _refuse_capturing(f"xp.{name} of host values (a host-to-device copy)")
        a = fn(obj, dtype, *args, **kwargs)
        if isinstance(obj, np.ndarray):
            a = np.array(a, copy=True)  # device memory of its own, never the host array
        copies.record("to_device", a.nbytes)
        return DeviceArray(a, copies)
    call.__name__ = name
    call.__doc__ = f"xp.{name}: a host array or list copied to the device (counted)."
    return call


def _asnumpy(a, stream=None, order: str = "C", out=None, blocking: bool = True):
    """CuPy's ``asnumpy``: a device array's host copy; host values as they are."""
    if isinstance(a, DeviceArray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def _submodule(name: str, module, copies: Copies, constant: bool = False) -> types.ModuleType:
    """``constant``: a capture keeps the values of its calls (random draws: the generator's
    state is on the host, so a graph repeats what it drew at capture)."""
    sub = types.ModuleType(name)
    for attr, value in vars(module).items():
        if attr.startswith("_"):
            continue
        if callable(value) and not isinstance(value, type):
            setattr(sub, attr, _function(f"{name.rsplit('.', 1)[-1]}.{attr}", value, copies,
                                         constant))
    return sub


def namespace(name: str, copies: Copies) -> types.ModuleType:
    """An ``xp`` over NumPy with CuPy's rules, counting its copies in ``copies``: dtypes and
    constants are NumPy's (as CuPy's are), ``xp.ndarray`` is :class:`DeviceArray`, every
    function and ufunc takes and gives device arrays, ``asarray``/``array``/
    ``ascontiguousarray`` copy host values in, ``asnumpy`` copies out."""
    xp = types.ModuleType(name, "NumPy under CuPy's rules: the device stand-in's array module")
    for attr in dir(np):
        if attr.startswith("_"):
            continue
        try:
            value = getattr(np, attr)
        except AttributeError:
            continue
        if isinstance(value, np.ufunc):
            value = _Ufunc(value, copies)
        elif isinstance(value, (type, types.ModuleType)) or not callable(value):
            pass  # dtypes, constants, errstate, dtype, ...
        elif attr in _FROM_HOST:
            value = _from_host(attr, value, copies)
        else:
            value = _function(attr, value, copies)
        setattr(xp, attr, value)
    xp.ndarray = DeviceArray
    xp.asnumpy = _asnumpy
    xp.random = _submodule(f"{name}.random", np.random, copies, constant=True)
    xp.linalg = _submodule(f"{name}.linalg", np.linalg, copies)
    # ``dtype.type(x)``, ``np.float32(x)`` stay NumPy's: on a device array they raise, as on
    # CuPy, through DeviceArray.__array__.
    return xp

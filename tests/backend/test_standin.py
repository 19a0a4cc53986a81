"""The device stand-in (cct/backend/standin.py) refuses what CuPy refuses and allows what CuPy
allows: each rule as a probe, run on the stand-in here and on real CuPy where a GPU is present
(the same probe must give the same outcome on both: the stand-in is checked against the part
it stands in for), and the copy counter."""
import numpy as np
import pytest

from cct.backend import gpu, npdevice

GPU_OK, GPU_REASON = gpu.available()

# Each probe: (name, function of (xp, host array, device array), the outcome CuPy 14 gives:
# None when allowed, else the exception type). The device array is 2x3 float32 0..5, the host
# array a NumPy one of the same shape.
IMPLICIT = TypeError
PROBES = [
    # implicit conversion to the host, refused
    ("np.asarray", lambda xp, h, d: np.asarray(d), IMPLICIT),
    ("np.array", lambda xp, h, d: np.array(d), IMPLICIT),
    ("np.float32 of a 0-d array", lambda xp, h, d: np.float32(d.max()), IMPLICIT),
    ("dtype.type of a 0-d array", lambda xp, h, d: d.dtype.type(d.sum()), IMPLICIT),
    ("host[...] = device", lambda xp, h, d: h.__setitem__(Ellipsis, d), IMPLICIT),
    # CuPy's copyto takes the call and reads the host destination as a device array
    ("np.copyto(host, device)", lambda xp, h, d: np.copyto(h, d), AttributeError),
    # assigning or filling device memory from host arrays, refused
    ("device[...] = host", lambda xp, h, d: d.__setitem__(Ellipsis, h), ValueError),
    ("device[0] = host row", lambda xp, h, d: d.__setitem__(0, h[0]), ValueError),
    ("device.fill(host)", lambda xp, h, d: d.fill(h), ValueError),
    # mixing host and device arrays in one operation, refused
    ("device + host", lambda xp, h, d: d + h, TypeError),
    ("host * device", lambda xp, h, d: h * d, TypeError),
    ("xp.add(device, host)", lambda xp, h, d: xp.add(d, h), TypeError),
    ("np.maximum(device, host)", lambda xp, h, d: np.maximum(d, h), TypeError),
    ("xp.where(host mask)", lambda xp, h, d: xp.where(h > 2, d, 0), TypeError),
    ("device += host", lambda xp, h, d: d.__iadd__(h), TypeError),
    ("device.dot(host.T)", lambda xp, h, d: d.dot(h.T), TypeError),
    ("xp.matmul out=host", lambda xp, h, d: xp.matmul(d, d.T, out=np.empty((2, 2), d.dtype)),
     TypeError),
    # allowed, as CuPy allows
    ("float of a 0-d array", lambda xp, h, d: float(d.sum()), None),
    ("int of a one-element array", lambda xp, h, d: int(d[1, 2]), None),
    ("bool of a 0-d comparison", lambda xp, h, d: bool((d > -1).all()), None),
    ("item", lambda xp, h, d: d[0, 0].item(), None),
    ("tolist", lambda xp, h, d: d.tolist(), None),
    ("xp.asarray(host)", lambda xp, h, d: xp.asarray(h), None),
    ("get", lambda xp, h, d: d.get(), None),
    ("get(out=host)", lambda xp, h, d: d.get(out=h), None),
    ("set(host)", lambda xp, h, d: d.set(h), None),
    ("device[...] = python scalar", lambda xp, h, d: d.__setitem__(Ellipsis, 2.5), None),
    ("device[...] = NumPy scalar", lambda xp, h, d: d.__setitem__(0, np.float32(1)), None),
    ("device[...] = 0-d host array", lambda xp, h, d: d.__setitem__(Ellipsis, np.array(3.0)),
     None),
    ("device * NumPy scalar", lambda xp, h, d: d * np.float32(2), None),
    ("np.exp(device) dispatches", lambda xp, h, d: np.exp(d), None),
    ("device[device index]", lambda xp, h, d: d[xp.asarray(np.array([1, 0]))], None),
    # ndarray.set and get(out=) check what they are given
    ("set of another shape", lambda xp, h, d: d.set(h[:1]), ValueError),
    ("set of another dtype", lambda xp, h, d: d.set(h.astype(np.float64)), TypeError),
    ("get(out=) of a strided view",
     lambda xp, h, d: d[:, 1:].get(out=np.empty((2, 2), np.float32)), None),
    ("get(out=) into a strided host view",
     lambda xp, h, d: d.get(out=np.empty((2, 6), np.float32)[:, ::2]), RuntimeError),
    ("set of a strided view", lambda xp, h, d: d[:, 1:].set(h[:, 1:].copy()), RuntimeError),
    ("get of a strided view", lambda xp, h, d: d[:, 1:].get(), None),
]


def _arrays(xp):
    host = np.arange(6, dtype=np.float32).reshape(2, 3) + 10
    return host, xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))


def _outcome(xp, probe):
    host, dev = _arrays(xp)
    try:
        probe(xp, host, dev)
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return type(e)
    return None


def _check(xp, name, probe, want):
    got = _outcome(xp, probe)
    if want is None:
        assert got is None, f"{name}: CuPy allows it, but it raised {got.__name__}"
    else:
        assert got is not None and issubclass(got, want), \
            f"{name}: CuPy raises {want.__name__}, this gave {got and got.__name__}"


@pytest.mark.parametrize("name,probe,want", PROBES, ids=[p[0] for p in PROBES])
def test_the_stand_in_follows_cupys_rule(name, probe, want):
    _check(npdevice.xp, name, probe, want)


@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU to check the rules on: {GPU_REASON}")
@pytest.mark.parametrize("name,probe,want", PROBES, ids=[p[0] for p in PROBES])
def test_real_cupy_gives_the_same_outcome(name, probe, want):
    _check(gpu.xp, name, probe, want)


def test_a_deliberate_implicit_conversion_fails_with_cupys_message():
    d = npdevice.xp.ones(3, np.float32)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.float32(d.sum())
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        d[...] = np.zeros(3, np.float32)


def test_a_device_array_cannot_enter_a_compiled_kernel():
    from cct.backend import cpu
    d = npdevice.xp.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        cpu.relu_forward(d, 0.0)
    with pytest.raises(TypeError):
        cpu.sgd_update(d, d, d, 0.1, 0.9, 0.0)


def test_reductions_and_scalar_indexing_stay_on_the_device():
    xp = npdevice.xp
    d = xp.asarray(np.arange(6, dtype=np.float32))
    for value in (d.sum(), d.max(), d[2], xp.sum(d)):
        assert isinstance(value, xp.ndarray) and value.shape == ()


def test_copies_are_counted_each_way():
    xp = npdevice.xp
    with npdevice.copies.counting() as c:
        d = xp.asarray(np.zeros((4, 5), np.float32))         # 80 bytes in
        d += 1                                                 # on the device: no copy
        host = d.get()                                         # 80 bytes out
        float(d.sum())                                         # 4 bytes out
        d.set(host)                                            # 80 bytes in
    assert (c.to_device, c.bytes_to_device) == (2, 160)
    assert (c.to_host, c.bytes_to_host) == (2, 84)
    assert c.sizes == [("to_device", 80), ("to_host", 80), ("to_host", 4), ("to_device", 80)]


def test_movement_handles_strided_views_as_cupy_needs():
    """``get(out=)`` into a strided host view and ``set`` of a strided device view are
    refused (CuPy copies memory as it lies on those sides); the backend's movement goes around
    that for views."""
    from cct import backend
    xp = npdevice.xp
    d = xp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    with pytest.raises(RuntimeError):
        d.get(out=np.empty((3, 8), np.float32)[:, ::2])
    with pytest.raises(RuntimeError):
        d[:, 1:].set(np.zeros((3, 3), np.float32))
    host = np.zeros((3, 8), np.float32)
    backend.copy(host[:, ::2], d)                       # a strided host target
    assert host[:, ::2].tolist() == d.tolist()
    backend.copy(d[:, 1:3], np.full((3, 2), 7, np.float32))   # a strided device target
    assert (d.get()[:, 1:3] == 7).all() and d.get()[0, 0] == 0


def test_a_staged_copy_to_the_device_is_one_call_of_the_stage():
    """The GPU's to_device copies into a contiguous out through its stage (pinned memory, no
    wait for the device); a strided out goes through an assignment as before."""
    from cct import backend
    xp = npdevice.xp
    staged = []

    def stage(out, values):
        staged.append(values.shape)
        out.set(values)

    _, to_device = backend.cupy_movement(xp, npdevice.is_device, stage=stage)
    d = xp.asarray(np.zeros((3, 4), np.float32))
    to_device(np.arange(12, dtype=np.float64).reshape(3, 4), out=d)
    assert staged == [(3, 4)] and d.tolist() == np.arange(12).reshape(3, 4).tolist()
    to_device(np.ones((3, 2), np.float32), out=d[:, 1:3])
    assert staged == [(3, 4)] and (d.get()[:, 1:3] == 1).all()

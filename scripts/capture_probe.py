"""What a CUDA graph can hold of cct's GPU iteration (issue 29, item 3): each kind of operation
the layers use, captured alone with CuPy's stream capture, replayed, and compared with the same
operation run eagerly; and a float32 GEMM through a cuDNN matmul graph (nvidia-cudnn-frontend)
against cupy.matmul, since CuPy refuses to capture its own cuBLAS calls. One line per probe;
run on a GPU (scripts/gpu_check.sh runs it).

    python scripts/capture_probe.py
"""
import sys

import numpy as np


def captured(cupy, fn):
    """fn() captured on a stream of its own (after one eager call there), then replayed: the
    replay's result, or the exception the capture raised."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            out = fn()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    return out


def cudnn_matmul(cupy, m, k, n):
    """C = A @ B through a cuDNN matmul graph on CuPy arrays, as a function of (A, B, C)."""
    import cudnn
    F = cudnn.data_type.FLOAT
    handle = cudnn.create_handle()
    g = cudnn.pygraph(io_data_type=F, intermediate_data_type=F, compute_data_type=F,
                      handle=handle)
    a = g.tensor(name="A", dim=[1, m, k], stride=[m * k, k, 1], data_type=F)
    b = g.tensor(name="B", dim=[1, k, n], stride=[k * n, n, 1], data_type=F)
    c = g.matmul(name="mm", A=a, B=b, compute_data_type=F)
    c.set_output(True).set_data_type(F).set_dim([1, m, n]).set_stride([m * n, n, 1])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE,
                              cudnn.numerical_note.DOWN_CONVERT_INPUTS,
                              cudnn.numerical_note.REDUCED_PRECISION_REDUCTION])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    ws = cupy.empty(max(int(g.get_workspace_size()), 1), cupy.uint8)

    def run(A, B, C):
        cudnn.set_stream(handle, cupy.cuda.get_current_stream().ptr)
        g.execute({a: A.data.ptr, b: B.data.ptr, c: C.data.ptr}, ws, handle=handle)
        return C
    return run


def own_cublas_sgemm(cupy):
    """C = A @ B (row-major float32) through cuBLAS on a handle of our own, with a workspace
    set (cublasSetWorkspace, what cuBLAS asks of a captured call) and called through ctypes:
    CuPy's own wrappers refuse any cuBLAS call while a stream captures. A function of
    (A, B, C)."""
    import ctypes

    lib = None
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise OSError("no libcublas found")
    handle = ctypes.c_void_p()
    if lib.cublasCreate_v2(ctypes.byref(handle)):
        raise RuntimeError("cublasCreate failed")
    workspace = cupy.empty(32 << 20, cupy.uint8)
    lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data.ptr),
                              ctypes.c_size_t(workspace.size))
    lib.cublasSetMathMode(handle, 0)          # CUBLAS_DEFAULT_MATH: no TF32
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def run(A, B, C):
        m, k = A.shape
        n = B.shape[1]
        lib.cublasSetStream_v2(handle, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr))
        # row-major C = A B is column-major C^T = B^T A^T: no transposes, B first
        status = lib.cublasSgemm_v2(handle, 0, 0, n, m, k, ctypes.byref(one),
                                    ctypes.c_void_p(B.data.ptr), n,
                                    ctypes.c_void_p(A.data.ptr), k, ctypes.byref(zero),
                                    ctypes.c_void_p(C.data.ptr), n)
        if status:
            raise RuntimeError(f"cublasSgemm status {status}")
        return C
    run.keep = (workspace, handle)
    return run


def main() -> int:
    import cupy

    from cct.backend import gpu

    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((64, 20, 24, 24), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((50, 20, 5, 5), dtype=np.float32))
    a = cupy.asarray(rng.standard_normal((64, 800), dtype=np.float32))
    b = cupy.asarray(rng.standard_normal((800, 500), dtype=np.float32))
    label = cupy.asarray(rng.integers(0, 10, (64, 1)).astype(np.float32))
    logits = cupy.asarray(rng.standard_normal((64, 10, 1), dtype=np.float32))
    gen = cupy.random.RandomState(1)
    probes = {
        "elementwise (x * 2 + 1)": lambda: x * 2 + 1,
        "reduction (x.sum over axes)": lambda: x.sum(axis=(0, 2, 3)),
        "take (im2col gather)": lambda: cupy.take(x.reshape(-1), cupy.arange(1000) * 7),
        "argmax": lambda: x.reshape(64, -1).argmax(axis=1),
        "MAX pooling (Caffe's kernel)": lambda: gpu.max_pool_forward(x, 2, 2, 0, (12, 12))[0],
        "SoftmaxWithLoss forward (deferred)":
            lambda: gpu.softmax_loss_forward(logits, label, None, deferred=True)[1],
        "cuDNN convolution (frontend)":
            lambda: gpu.conv_forward(x, w, None, 5, 1, 0, 1, 1),
        "Dropout draws (CuPy's RandomState)": lambda: gen.random_sample((1000,), cupy.float32),
        "cupy.matmul (cuBLAS)": lambda: cupy.matmul(a, b),
    }
    try:
        mm = cudnn_matmul(cupy, 64, 800, 500)
        c = cupy.empty((64, 500), cupy.float32)
        probes["cuDNN matmul graph"] = lambda: mm(a, b, c)
    except Exception as e:
        print(f"cuDNN matmul graph: not built ({type(e).__name__}: {str(e)[:200]})")
    try:
        sgemm = own_cublas_sgemm(cupy)
        c2 = cupy.empty((64, 500), cupy.float32)
        probes["cuBLAS on a handle of our own (ctypes)"] = lambda: sgemm(a, b, c2)
    except Exception as e:
        print(f"cuBLAS through ctypes: not set up ({type(e).__name__}: {str(e)[:200]})")
    bad = 0
    for name, fn in probes.items():
        try:
            want = cupy.array(fn(), copy=True)
        except Exception as e:
            print(f"{name:<38} eager: FAILED {type(e).__name__}: {str(e)[:160]}")
            bad += 1
            continue
        try:
            got = captured(cupy, fn)
            same = "random: new draws" if "Dropout" in name else (
                "same" if bool(cupy.allclose(got, want, rtol=1e-5, atol=1e-6)) else "DIFFERS")
            print(f"{name:<38} captured and replayed: {same}")
        except Exception as e:
            print(f"{name:<38} capture refused: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    if "cuDNN matmul graph" in probes:
        ref = cupy.matmul(a, b)
        got = probes["cuDNN matmul graph"]()
        err = float(cupy.abs(got - ref).max() / cupy.abs(ref).max())
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        times = {}
        for label_, fn in (("cuDNN", probes["cuDNN matmul graph"]), ("cuBLAS", lambda: cupy.matmul(a, b))):
            fn()
            start.record()
            for _ in range(20):
                fn()
            stop.record()
            stop.synchronize()
            times[label_] = cupy.cuda.get_elapsed_time(start, stop) / 20
        print(f"cuDNN matmul 64x800x500 against cuBLAS: rel err {err:.1e}, "
              f"{times['cuDNN']:.3f} ms against {times['cuBLAS']:.3f} ms")
    own = probes.get("cuBLAS on a handle of our own (ctypes)")
    if own is not None:
        ref = cupy.matmul(a, b)
        err = float(cupy.abs(own() - ref).max() / cupy.abs(ref).max())
        print(f"cuBLAS through ctypes against cupy.matmul: rel err {err:.1e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""cct's cuDNN convolutions against its lowering path on one GPU: for convolution geometries
of the zoo nets (strides, pads, groups, dilation, 1x1), each of forward, backward data and
backward weight on the same arrays through both, the largest difference relative to the
result's scale, each path's device time, and the engine cuDNN's plan race kept. Prints one
line per geometry and operation; exits 1 when a result disagrees or cuDNN is not used. With
``--precision bf16|fp16|tf32`` both paths run in that precision (cct/backend/reduced.py:
cuDNN on half copies, the lowering's GEMMs on tensor cores) and agree to its accuracy.

    python scripts/cudnn_probe.py [--precision bf16]
"""
import argparse
import sys

import numpy as np

from cct.backend import cudnn, gpu, reduced

# (N, C, H, W), (O, C/group, kh, kw), stride, pad, dilation, group, where it comes from
CASES = [
    ((64, 1, 28, 28), (20, 1, 5, 5), 1, 0, 1, 1, "LeNet conv1"),
    ((64, 20, 12, 12), (50, 20, 5, 5), 1, 0, 1, 1, "LeNet conv2"),
    ((100, 32, 16, 16), (32, 32, 5, 5), 1, 2, 1, 1, "CIFAR10-quick conv2"),
    ((32, 3, 227, 227), (96, 3, 11, 11), 4, 0, 1, 1, "CaffeNet conv1"),
    ((32, 96, 27, 27), (256, 48, 5, 5), 1, 2, 1, 2, "CaffeNet conv2 (group 2)"),
    ((32, 192, 28, 28), (64, 192, 1, 1), 1, 0, 1, 1, "GoogLeNet 1x1"),
    ((8, 16, 20, 20), (16, 16, 3, 3), 1, 2, 2, 1, "dilation 2"),
]


def main() -> int:
    import cupy
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="float32", choices=reduced.PRECISIONS)
    precision = gpu.set_precision(ap.parse_args().precision)
    tolerance = max(1e-4, reduced.ACCURACY[precision])
    ok, why = cudnn.available()
    print(f"cudnn: {ok}, {why}; precision {precision} (agreement within {tolerance:g})")
    if not ok:
        return 1
    print("numerical notes:", [n for n in dir(cudnn._fe.numerical_note) if n.isupper()])
    convs = gpu.convolutions
    bad = 0
    rng = np.random.default_rng(0)
    for xs, ws, s, p, d, g, where in CASES:
        x = cupy.asarray(rng.standard_normal(xs, dtype=np.float32))
        w = cupy.asarray(rng.standard_normal(ws, dtype=np.float32) * 0.1)
        geom = ((ws[2], ws[3]), (s, s), (p, p), (d, d), g)
        y_ref = gpu.conv_forward(x, w, None, *geom, engine="CAFFE")
        dy = cupy.asarray(rng.standard_normal(y_ref.shape, dtype=np.float32))
        runs = {
            "fprop": (lambda e: gpu.conv_forward(x, w, None, *geom, engine=e)),
            "dgrad": (lambda e: gpu.conv_backward_data(dy, w, xs, *geom, engine=e)),
            "wgrad": (lambda e: gpu.conv_backward_weight(x, dy, *geom, engine=e)),
        }
        for op, run in runs.items():
            before = len(convs.table)
            try:
                got, ref = run("DEFAULT"), run("CAFFE")
                scale = float(cupy.abs(ref).max()) or 1.0
                err = float(cupy.abs(got - ref).max()) / scale
                t_cudnn = gpu.milliseconds_per_call(lambda: run("DEFAULT"), 5)
                t_low = gpu.milliseconds_per_call(lambda: run("CAFFE"), 5)
            except Exception as e:
                print(f"{where:<26} {op}: FAILED {type(e).__name__}: {e}")
                bad += 1
                continue
            engine = [v for k, v in convs.table.items() if k[0] == op and k[2] in
                      (tuple(x.shape), tuple(dy.shape))]
            used = len(convs.table) > before or engine
            status = "ok" if err < tolerance and used else "BAD"
            bad += status != "ok"
            print(f"{where:<26} {op}: rel err {err:.1e}, cudnn {t_cudnn:.3f} ms, lowered "
                  f"{t_low:.3f} ms ({t_low / t_cudnn:.1f}x), engine "
                  f"{engine[-1] if engine else 'none (lowered)'} {status}", flush=True)
    for key, why in convs.refused().items():
        print("refused:", key, why)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

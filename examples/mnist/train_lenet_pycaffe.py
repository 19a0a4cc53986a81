"""Train LeNet on the bundled MNIST digits through the pycaffe API (``import cct as caffe``).

Reads the gzipped IDX files in data/, runs Caffe's lenet_solver settings (SGD, base_lr 0.01,
momentum 0.9, weight_decay 0.0005, lr_policy "inv" with gamma 1e-4 and power 0.75, LeNet's
lr_mult 1 for weights and 2 for biases) as a plain pycaffe loop, and prints the test accuracy
on the 2,000 held-out digits. Usage: python examples/mnist/train_lenet_pycaffe.py [iterations]
"""
import gzip
import pathlib
import sys

import numpy as np

import cct as caffe

HERE = pathlib.Path(__file__).resolve().parent


def read_idx(name: str) -> np.ndarray:
    raw = gzip.open(HERE / "data" / name).read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main(iterations: int = 500) -> float:
    caffe.set_mode_cpu()
    caffe.set_random_seed(1701)
    train_x = read_idx("train-images-idx3-ubyte.gz")[:, None] * np.float32(1 / 256)
    train_y = read_idx("train-labels-idx1-ubyte.gz").astype(np.float32)
    test_x = read_idx("t10k-images-idx3-ubyte.gz")[:, None] * np.float32(1 / 256)
    test_y = read_idx("t10k-labels-idx1-ubyte.gz").astype(np.float32)

    prototxt = str(HERE / "lenet_input_train_test.prototxt")
    train = caffe.Net(prototxt, caffe.TRAIN)
    test = caffe.Net(prototxt, caffe.TEST)
    test.share_with(train)
    lr_mults = [1.0, 2.0]
    history = {name: [np.zeros_like(b.data) for b in blobs] for name, blobs in train.params.items()}
    batch = train.blobs["data"].num
    for it in range(iterations):
        lo = (it * batch) % len(train_x)
        idx = np.arange(lo, lo + batch) % len(train_x)
        loss = train.forward(data=train_x[idx], label=train_y[idx])["loss"]
        for blobs in train.params.values():
            for b in blobs:
                b.diff[...] = 0
        train.backward()
        lr = 0.01 * (1 + 0.0001 * it) ** -0.75
        for name, blobs in train.params.items():
            for b, v, mult in zip(blobs, history[name], lr_mults):
                v[...] = 0.9 * v + lr * mult * (b.diff + 0.0005 * b.data)
                b.data[...] -= v
        if it % 100 == 0:
            print(f"Iteration {it}, lr = {lr:g}, loss = {float(loss):g}")
    correct = 0.0
    tb = test.blobs["data"].num
    for lo in range(0, len(test_x), tb):
        out = test.forward(data=test_x[lo:lo + tb], label=test_y[lo:lo + tb])
        correct += float(out["accuracy"]) * tb
    accuracy = correct / len(test_x)
    print(f"Test accuracy after {iterations} iterations: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    caffe.init_log(1)  # keep the net-initialisation log quiet
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)

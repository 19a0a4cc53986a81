"""Caffe's own trained LeNet, loaded by cct, scores what Caffe's log says on Caffe's LMDB."""
import numpy as np

import cct as caffe
from cct.glog import set_quiet


def test_lenet_iter_2000_test_accuracy_matches_caffe_log(caffe_fixtures, monkeypatch):
    monkeypatch.chdir(caffe_fixtures)  # the prototxt names its LMDBs relative to this folder
    set_quiet(True)
    try:
        net = caffe.Net("lenet_train_test.prototxt", caffe.TEST,
                        weights="lenet_iter_2000.caffemodel")
    finally:
        set_quiet(False)
    accuracy, loss = [], []
    for _ in range(20):  # test_iter 20 x batch 100 = the 2,000 test digits
        out = net.forward()
        accuracy.append(float(out["accuracy"]))
        loss.append(float(out["loss"]))
    # lenet_train.log: "Test net output #0: accuracy = 0.9815", "#1: loss = 0.0758345"
    assert "%g" % np.float32(np.mean(accuracy)) == "0.9815"
    assert abs(np.mean(loss) - 0.0758345) < 2e-6

"""bench/bench_gpu.py's cct worker without a GPU: the iteration on the stand-in device and
the CPU+stand-in split, placed as cct train places them (the master net on the device, so a
split giving the device every image copies no weight). On a GPU the bench is run by hand
(bench/RESULTS.md)."""
import importlib.util
import pathlib

import pytest

from .. import conftest

spec = importlib.util.spec_from_file_location(
    "bench_gpu", pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("devices", ["standin", "cpu:1,standin"])
def test_the_cct_worker_runs_where_cct_train_places_the_nets(devices):
    zoo = conftest.need(conftest.CAFFE_ZOO)
    from cct import glog
    with glog.quiet():
        r = bench.run_cct("lenet", devices, str(zoo), warmup=1, iters=1)
    assert r["img_s"] > 0 and sum(r["split"]) == 64 and r["flops"] > 0
    assert "graph_img_s" not in r and "graph_error" not in r   # asked for no graph
    if devices == "standin":
        assert r["copies"] == []
    else:
        # the CPU replica's copies, both ways of counting them (with a share, it has copies)
        (c,) = r["copies"]
        assert c["device"].startswith("cpu") and c["serial_ms"] > 0
        assert c["waited_ms"] >= 0 if c["n"] else c["waited_ms"] == 0


def test_the_graph_column_replays_the_iteration_on_the_stand_in():
    """--graph's column: the iteration as cct train runs it on a device, replayed as a graph
    (the stand-in's capture: the same code path, the refusals of a real one)."""
    zoo = conftest.need(conftest.CAFFE_ZOO)
    from cct import glog
    with glog.quiet():
        r = bench.run_cct("lenet", "standin", str(zoo), warmup=1, iters=1, graphs=True)
    assert "graph_error" not in r, r.get("graph_error")
    assert r["graph_img_s"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_reduced_precision_rows_run_on_the_stand_in(precision):
    """--precisions' rows: the stand-in's GEMMs in the precision (fp16 under its loss scale),
    replayed as a graph too; the process's precision is put back after."""
    zoo = conftest.need(conftest.CAFFE_ZOO)
    from cct import glog
    from cct.backend import npdevice
    try:
        with glog.quiet():
            r = bench.run_cct("lenet", "standin", str(zoo), warmup=1, iters=1, graphs=True,
                              precision=precision)
        assert npdevice.precision() == precision
    finally:
        npdevice.set_precision("float32")
    assert r["img_s"] > 0 and r["skipped"] == 0
    assert "graph_error" not in r, r.get("graph_error")

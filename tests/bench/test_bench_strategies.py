"""bench/bench_strategies.py's devices setting (issue 30, item 4): one group or learner per
device, small CPU batches and whole device batches for Hogbatch, the device alone as the base;
each strategy runs on a CPU core and the stand-in device (the bench checked without a GPU)."""
import importlib.util
import pathlib

import pytest

spec = importlib.util.spec_from_file_location(
    "bench_strategies",
    pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_strategies.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_device_settings_give_each_device_its_group_and_batch():
    names = ["cpu", "gpu0"]
    assert bench.device_kw("alone", names, 64) == {} and bench.device_kw("sync", names, 64) == {}
    assert bench.device_kw("async", names, 64) == {
        "strategy": "async", "groups": None, "devices": "cpu,gpu0", "engine": "threads"}
    assert bench.device_kw("hogbatch", names, 64)["batch_sizes"] == [16, 64]
    assert bench.device_kw("adaptive-hogbatch", ["cpu:2", "cpu@1-3", "gpu1"], 100)[
        "batch_sizes"] == [25, 25, 100]
    sma = bench.device_kw("sma", names, 64)
    assert (sma["learners"], sma["batch_sizes"]) == (2, [32, 32])


@pytest.mark.parametrize("strategy", ["alone", "sync", "hogbatch", "sma"])
def test_each_strategy_trains_on_a_core_and_the_stand_in(strategy):
    job = {"work": "lenet", "setting": "devices", "strategy": strategy, "cap": 4, "every": 2,
           "target": 0.98, "loss": 0.3, "data_dir": str(bench.default_data_dir()), "zoo": "",
           "devices": "cpu:1,standin", "alone": None}
    from cct import glog
    with glog.quiet():
        run = bench.run_one(job)
    assert [p["iter"] for p in run["curve"]] == [2, 4] and run["diverged"] is None
    assert all(0.0 <= p["accuracy"] <= 1.0 and p["loss"] > 0 for p in run["curve"])
    if strategy == "alone":
        assert run["batches"] == [64] and run["updates"] == {}
    elif strategy == "sync":         # the hybrid split: each device's images of the batch
        assert sum(run["updates"].values()) == 64
    elif strategy == "hogbatch":
        assert run["batches"] == [16, 64] and sum(run["updates"].values()) == 4
    else:
        assert run["batches"] == [32, 32]

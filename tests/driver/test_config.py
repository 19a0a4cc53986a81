"""The driver's pieces (issue 32): one DriverConfig that the CLI fills and the Python API takes,
the engines taken from a registry, the strategies as objects. A config and the same keywords
build the same run, update for update; a contradiction is refused before a group exists."""
import dataclasses

import numpy as np
import pytest

from cct.api import Solver
from cct.driver import ENGINES, STRATEGIES, Driver, DriverConfig
from cct.driver.placement import Placement
from cct.driver.strategies import STRATEGY_TYPES, ModelAveragingStrategy, StoreStrategy
from cct.errors import CCTError

from ..test_scheduler import data_list, params_of, solver_param  # noqa: F401  (fixture)
from .test_driver import losses


def test_the_config_is_frozen_and_a_change_is_a_copy():
    config = DriverConfig(groups=4, engine="simulated")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.groups = 2
    other = config.replace(groups=2)
    assert (config.groups, other.groups, other.engine) == (4, 2, "simulated")


def test_every_engine_and_strategy_is_registered():
    assert set(ENGINES) == {"threads", "processes", "simulated", "ray"}
    assert all(issubclass(p, Placement) for p in ENGINES.values())
    assert set(STRATEGY_TYPES) == set(STRATEGIES) - {"sync"}
    assert STRATEGY_TYPES["sma"] is ModelAveragingStrategy
    assert {STRATEGY_TYPES[s] for s in ("async", "hogbatch", "adaptive-hogbatch")} == {
        StoreStrategy}


@pytest.mark.parametrize("settings, message", [
    (dict(strategy="sync"), "sync is the solver's own solve()"),
    (dict(engine="gpu-cluster"), "unknown engine 'gpu-cluster'; known: threads, processes"),
    (dict(simulate_speeds=[1, 2]), "add --engine=simulated"),
    (dict(strategy="sma", sync_fc=True), "not sma"),
    (dict(strategy="sma", momentum="0.5"), "--sma-momentum"),
    (dict(sync_fc=True, engine="processes"), "threads and simulated engines"),
    (dict(groups=0), "at least 1"),
    (dict(engine="simulated", groups=2, simulate_speeds=[1.0]), "one per group"),
    (dict(engine="simulated", momentum="fast"), "'auto' or a number"),
])
def test_contradictions_are_refused_before_a_group_exists(data_list, tmp_path,  # noqa: F811
                                                         settings, message):
    solver = Solver(solver_param(data_list, tmp_path))
    try:
        with pytest.raises(CCTError, match=message.replace("(", r"\(").replace(")", r"\)")):
            Driver(solver, DriverConfig(**settings))
        assert solver.gradient_source.__class__.__name__ == "NetSource"   # nothing attached
    finally:
        solver.close()


def test_one_group_per_device_when_groups_is_not_given():
    config = DriverConfig(groups=None, devices="cpu:1,cpu:1", engine="simulated").resolved()
    assert config.groups == 2 and len(config.devices) == 2
    assert DriverConfig(groups=None).resolved().groups == 1
    assert DriverConfig(strategy="sma", learners=3).resolved().groups == 3
    assert DriverConfig(strategy="sma", learners="auto", engine="simulated",
                        simulate_speeds=[1, 2, 4]).resolved().groups == 3


@pytest.mark.parametrize("strategy", ["async", "adaptive-hogbatch", "sma"])
def test_a_config_and_the_same_keywords_train_alike(data_list, tmp_path, capfd,  # noqa: F811
                                                    strategy):
    param = solver_param(data_list, tmp_path)
    settings = dict(strategy=strategy, groups=2, engine="simulated", seed=3)
    runs = []
    for make in (lambda s: Driver(s, DriverConfig(**settings)),
                 lambda s: Driver(s, **settings),
                 lambda s: Driver(s, DriverConfig(groups=5), **{**settings, "groups": 2})):
        solver = Solver(param)
        driver = make(solver)
        try:
            capfd.readouterr()
            driver.step(6)
            runs.append((params_of(solver), losses(capfd.readouterr().err)))
        finally:
            driver.close()
            solver.close()
    (want_params, want_losses), *others = runs
    assert len(want_losses) == 6
    for got_params, got_losses in others:
        assert got_losses == want_losses
        assert all(np.array_equal(a, b) for a, b in zip(want_params, got_params))

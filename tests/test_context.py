"""The run context (issue 32): one value holding what a run sets for the whole process (seed,
deterministic plans, precision), applied in one place and handed to a driver's group
processes, which start with none of the parent's settings."""
import pickle

import numpy as np
import pytest

from cct import rng
from cct.backend import plans, precision
from cct.context import RunContext
from cct.proto import caffe_pb2


@pytest.fixture
def restored():
    """The process's settings as they were, after the test."""
    from cct.native import _C
    before = (plans.deterministic(), precision.precision(), _C.get_num_threads())
    yield
    plans.set_deterministic(before[0])
    precision.set_precision(before[1])
    _C.set_num_threads(before[2])


def test_of_solver_reads_the_seed_and_the_precision():
    param = caffe_pb2.SolverParameter(random_seed=7)
    assert RunContext.of_solver(param, "s.prototxt") == RunContext(7, None, None, "cpu",
                                                                   "s.prototxt")
    param.precision = caffe_pb2.SolverParameter.BF16
    param.random_seed = -1
    got = RunContext.of_solver(param, backend="gpu", deterministic=True)
    assert (got.seed, got.precision, got.deterministic, got.backend) == (None, "bf16", True,
                                                                         "gpu")


def test_apply_sets_the_seed_and_the_plans_switch(restored):
    RunContext(seed=5, deterministic=True).apply()
    a = rng.get_rng().random(3)
    assert plans.deterministic()
    RunContext(seed=5).apply()          # None leaves the switch as it is
    assert plans.deterministic() and np.array_equal(rng.get_rng().random(3), a)
    RunContext(deterministic=False).apply()
    assert not plans.deterministic()


def test_the_current_context_travels_to_a_group_process(restored):
    """What a spawned group process receives (pickled) and applies before building its net."""
    from cct.driver.processes import _group_net
    plans.set_deterministic(True)
    sent = pickle.loads(pickle.dumps(RunContext.current()))
    assert sent.deterministic and sent.seed is None and sent.precision == "float32"
    plans.set_deterministic(False)      # what a fresh process would have
    net_param = caffe_pb2.NetParameter(name="n")
    layer = net_param.layer.add(name="x", type="Input", top=["x"])
    layer.input_param.shape.add(dim=[1, 2])
    net = _group_net(net_param.SerializeToString(), "<f4", [], 0, 0, None, sent)
    assert plans.deterministic() and net.blob_names == ["x"]

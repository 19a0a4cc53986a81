"""One group's places (issue 30, item 3): with several devices, the optimizer measures the
seconds per iteration of one group on the solver's own nets, on each device alone and on the
hybrid split over all of them (the same updates wherever they run), trains every one-group
candidate on the fastest, says so in the log, and keeps the driver's groups one per device.
Checked on CPU cores and the stand-in device (no GPU here)."""
import numpy as np
import pytest

from cct import cli
from cct.api import Solver
from cct.optimizer import Candidate, Optimizer
from cct.optimizer.plan import _one_group_places
from cct.params import NetSource

from ..test_scheduler import data_list, solver_param  # noqa: F401  (fixture)


class _Solver:
    def __init__(self, backend):
        self.backend = backend


def test_places_are_the_solvers_nets_each_other_device_and_the_hybrid():
    assert _one_group_places(_Solver("cpu"), None) == ([None], "cpu (the solver's nets)")
    assert _one_group_places(_Solver("gpu"), "gpu0") == ([None], "gpu0 (the solver's nets)")
    # the solver's nets on the first device of its own: that device alone is their place
    assert _one_group_places(_Solver("gpu"), "cpu,gpu0") == (
        [None, "cpu", "cpu,gpu0"], "gpu0 (the solver's nets)")
    assert _one_group_places(_Solver("cpu"), "cpu:1,cpu:1") == (
        [None, "cpu:1", "cpu:1,cpu:1"], "cpu (the solver's nets)")


def test_one_group_trains_where_it_is_fastest(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0, max_iter=60)
    solver = Solver(param, backend="numpy")      # the stand-in holds the nets, as a GPU would
    opt = Optimizer(solver, engine="threads", devices="cpu:1,standin", groups=[1],
                    probe_iters=5, lr_multiples=(0.3, 1.0), momentum_offsets=(0.0,))
    try:
        capfd.readouterr()
        plan = opt.make_plan()
        opt.log_plan(plan)
        err = capfd.readouterr().err
        names = [name for name, _ in plan.places]
        assert names == ["standin (the solver's nets)", "cpu:1", "cpu:1,standin"]
        hes = [he for _, he in plan.places]
        assert all(np.isfinite(hes)) and min(hes) > 0
        best = opt.places[int(np.argmin(hes))]
        assert opt.sync_place == best
        assert all(c.place == best for c in plan.candidates if c.strategy == "sync")
        assert "one group, by place" in err and f"chose {plan.places[int(np.argmin(hes))][0]}" \
            in err
        # the winner trains there: the solver's own nets, or a scheduler over the place
        opt.configure(plan.winner)
        assert isinstance(solver.gradient_source, NetSource) == (best is None)
    finally:
        opt.close()
        solver.close()


def test_a_place_is_built_once_per_change_not_per_probe(data_list, tmp_path):  # noqa: F811
    solver = Solver(solver_param(data_list, tmp_path, display=0, max_iter=40))
    opt = Optimizer(solver, engine="threads", devices="cpu:1,cpu:1", groups=[1])
    try:
        hybrid = Candidate("sync", 1, 16, 0.1, 0.5, place="cpu:1,cpu:1")
        opt.configure(hybrid)
        source = solver.gradient_source
        opt.configure(Candidate("sync", 1, 16, 0.03, 0.5, place="cpu:1,cpu:1"))
        assert solver.gradient_source is source            # same place: kept
        opt.configure(Candidate("sync", 1, 16, 0.1, 0.5))
        assert isinstance(solver.gradient_source, NetSource)
    finally:
        opt.close()
        solver.close()


@pytest.mark.parametrize("command", ["plan", "train"])
def test_the_cli_races_the_places(data_list, tmp_path, capfd, command):  # noqa: F811
    from google.protobuf import text_format
    param = solver_param(data_list, tmp_path, display=0, max_iter=40)
    param.snapshot_after_train = False
    path = tmp_path / "solver.prototxt"
    path.write_text(text_format.MessageToString(param))
    args = [f"--solver={path}", "--devices=cpu:1,standin"]
    assert cli.main([command] + args + (["--optimize"] if command == "train" else [])) == 0
    err = capfd.readouterr().err
    assert "one group, by place" in err and "standin (the solver's nets)" in err

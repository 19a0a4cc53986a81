"""The solver loop, its log lines, snapshots and resume, errors, and the pycaffe solver API;
against real Caffe: two LeNet SGD steps and the resume from Caffe's lenet_iter_1000 state."""
import contextlib
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import cct
from cct import rng
from cct.errors import CCTError
from cct.io import weights
from cct.io.prototxt import read_solver_text
from cct.proto import caffe_pb2
from cct.io.solverstate import read_solver_state, read_solver_state_hdf5, solver_state_bytes
from cct.solver import (SIDE_SUFFIX, Solver,
                        solver_from_file)
from tests.test_solver_rules import (_info_logging, batches, chunk_net, feed,  # noqa: F401
                                     ls_net, solver_param)

LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ (\S+)\] (.*)$")


def solver_log(err: str, prefixes=("solver.cpp", "sgd_solver.cpp", "caffe.cpp")):
    """(source, message) of the solver's own log lines."""
    out = []
    for line in err.splitlines():
        m = LINE.match(line)
        if m and m.group(1).split(":")[0] in prefixes:
            out.append((m.group(1), m.group(2)))
    return out


def make(tmp_path=None, net=None, **fields) -> Solver:
    if tmp_path is not None:
        fields.setdefault("snapshot_prefix", str(tmp_path / "snap"))
    return Solver(solver_param(net or ls_net(), **fields), "<test solver>")


def write(path, text):
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------------------------------------
# Against real Caffe
# ------------------------------------------------------------------------------------------------
def lenet_sgd_solver(folder, monkeypatch, backend="cpu"):
    """Caffe's LeNet SGD solver (fixtures/caffe/numerics) on ``backend``, its params set to
    those Caffe started from, and Caffe's record of its two steps (lenet_sgd_step.npz)."""
    monkeypatch.chdir(folder / "numerics")
    z = np.load("lenet_sgd_step.npz")
    s = solver_from_file("lenet_sgd_solver.prototxt", backend=backend)
    for name, blobs in s.net.params.items():
        for i, b in enumerate(blobs):
            b.data[...] = z[f"step1/before/{name}/{i}/data"]
    return s, z


def test_two_lenet_sgd_steps_match_caffe(caffe_fixtures, monkeypatch):
    s, z = lenet_sgd_solver(caffe_fixtures, monkeypatch)
    assert s.type == "SGD" and s.test_nets == []
    for k in (1, 2):
        s.net.blobs["data"].data[...] = z[f"step{k}/input/data"]
        s.net.blobs["label"].data[...] = z[f"step{k}/input/label"]
        for name, blobs in s.net.params.items():
            for i, b in enumerate(blobs):
                np.testing.assert_allclose(b.data, z[f"step{k}/before/{name}/{i}/data"],
                                           rtol=1e-5, atol=1e-7)
        s.step(1)
        assert s.iter == int(z[f"step{k}/solver_iter"])
        assert s.smoothed_loss == pytest.approx(float(z[f"step{k}/loss"]), rel=1e-5)
        j = 0
        for name, blobs in s.net.params.items():
            for i, b in enumerate(blobs):
                np.testing.assert_allclose(b.data, z[f"step{k}/after/{name}/{i}/data"],
                                           rtol=1e-5, atol=1e-7)
                # Caffe leaves the update (= the new momentum) in the diff. Entries near zero
                # are cancellations whose last bits depend on the GEMMs' summation order (cct
                # picks its GEMM layouts by timing), so the floor is relative to the array.
                update = z[f"step{k}/after/{name}/{i}/diff"]
                floor = 1e-5 * float(np.abs(update).max())
                np.testing.assert_allclose(b.diff, update, rtol=1e-4, atol=floor)
                np.testing.assert_allclose(s.history[j], update, rtol=1e-4, atol=floor)
                j += 1


def lenet_solver(tmp_path, **fields) -> Solver:
    """Caffe's LeNet solver from the fixture folder (run from there), snapshots to tmp_path."""
    p = read_solver_text("lenet_solver.prototxt")
    p.snapshot_prefix = str(tmp_path / "lenet")
    for k, v in fields.items():
        setattr(p, k, v)
    return Solver(p, "lenet_solver.prototxt")


def test_resume_from_caffe_solverstate_tests_like_caffe(caffe_fixtures, monkeypatch, tmp_path,
                                                        capsys):
    monkeypatch.chdir(caffe_fixtures)
    s = lenet_solver(tmp_path, display=1)
    s.restore("lenet_iter_1000.solverstate")
    assert s.iter == 1000 and s.current_step == 0
    state = read_solver_state("lenet_iter_1000.solverstate")
    assert len(state["history"]) == len(s.history) == 8
    for mine, caffe in zip(s.history, state["history"]):
        np.testing.assert_array_equal(mine, caffe)
    trained = weights.load_weights("lenet_iter_1000.caffemodel")
    for name, blobs in s.net.params.items():
        for b, a in zip(blobs, trained[name]):
            np.testing.assert_array_equal(b.data, a)
    capsys.readouterr()
    s.step(1)   # tests at 1000 first (test_interval 500), then trains iteration 1000
    log = solver_log(capsys.readouterr().err)
    msgs = [m for _, m in log]
    assert log[0] == ("solver.cpp:347", "Iteration 1000, Testing net (#0)")
    assert log[1] == ("solver.cpp:414", "    Test net output #0: accuracy = 0.9805")
    m = re.fullmatch(r"    Test net output #1: loss = (\S+) \(\* 1 = (\S+) loss\)", msgs[2])
    assert m and float(m.group(1)) == pytest.approx(0.0775682, rel=2e-5)
    m = re.fullmatch(r"Iteration 1000 \(\S+ iter/s, \S+s/1 iters\), loss = (\S+)", msgs[3])
    assert m and float(m.group(1)) == pytest.approx(0.0166353, rel=2e-4)
    assert ("sgd_solver.cpp:112", "Iteration 1000, lr = 0.00931012") in log
    assert s.iter == 1001


def test_restore_logs_like_caffe(caffe_fixtures, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(caffe_fixtures)
    s = lenet_solver(tmp_path)
    capsys.readouterr()
    s.restore("lenet_iter_1000.solverstate")
    assert solver_log(capsys.readouterr().err) == [
        ("caffe.cpp:235", "Resuming from lenet_iter_1000.solverstate"),
        ("sgd_solver.cpp:336", "SGDSolver: restoring history")]


def test_snapshot_after_caffe_restore_is_byte_identical(caffe_fixtures, monkeypatch, tmp_path):
    monkeypatch.chdir(caffe_fixtures)
    s = lenet_solver(tmp_path)
    s.restore("lenet_iter_1000.solverstate")
    model = s.snapshot()
    assert model == str(tmp_path / "lenet_iter_1000.caffemodel")
    with open(model, "rb") as f, open("lenet_iter_1000.caffemodel", "rb") as g:
        assert f.read() == g.read()
    state = read_solver_state("lenet_iter_1000.solverstate")
    with open(tmp_path / "lenet_iter_1000.solverstate", "rb") as f:
        ours = f.read()
    assert ours == solver_state_bytes(1000, model, 0, state["history"])
    # Caffe's own file is this very encoding of its own fields.
    with open("lenet_iter_1000.solverstate", "rb") as f:
        assert f.read() == solver_state_bytes(1000, "lenet_iter_1000.caffemodel", 0,
                                              state["history"])
    parsed = caffe_pb2.SolverState.FromString(ours)
    assert parsed.iter == 1000 and parsed.learned_net == model and len(parsed.history) == 8
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_restore_caffe_hdf5_state_and_write_caffe_layout(caffe_fixtures, monkeypatch, tmp_path,
                                                         capsys):
    monkeypatch.chdir(caffe_fixtures)
    s = lenet_solver(tmp_path, snapshot_format=caffe_pb2.SolverParameter.HDF5)
    capsys.readouterr()
    s.restore("lenet_iter_1000.solverstate.h5")
    assert ("sgd_solver.cpp:336", "SGDSolver: restoring history") not in \
        solver_log(capsys.readouterr().err)   # Caffe logs it for binary states only
    assert s.iter == 1000
    binary = read_solver_state("lenet_iter_1000.solverstate")
    for mine, caffe in zip(s.history, binary["history"]):
        np.testing.assert_array_equal(mine, caffe)
    trained = weights.load_weights("lenet_iter_1000.caffemodel")
    np.testing.assert_array_equal(s.net.params["ip2"][0].data, trained["ip2"][0])
    model = s.snapshot()
    assert model == str(tmp_path / "lenet_iter_1000.caffemodel.h5")
    with h5py.File(tmp_path / "lenet_iter_1000.solverstate.h5", "r") as ours, \
            h5py.File("lenet_iter_1000.solverstate.h5", "r") as caffe:
        assert sorted(ours) == sorted(caffe) == ["current_step", "history", "iter",
                                                 "learned_net"]
        for key in ("iter", "current_step"):
            assert ours[key].dtype == caffe[key].dtype == np.int32
            assert ours[key].shape == caffe[key].shape == (1,)
            assert ours[key][0] == caffe[key][0]
        t_ours, t_caffe = ours["learned_net"].id.get_type(), caffe["learned_net"].id.get_type()
        assert t_ours.get_strpad() == t_caffe.get_strpad() == h5py.h5t.STR_NULLTERM
        assert ours["learned_net"].shape == caffe["learned_net"].shape == ()
        assert ours["learned_net"][()] == model.encode()
        for i in range(8):
            a, b = ours["history"][str(i)], caffe["history"][str(i)]
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a[()], b[()])
    again = read_solver_state_hdf5(str(tmp_path / "lenet_iter_1000.solverstate.h5"))
    assert again["iter"] == 1000 and again["learned_net"] == model


def test_cct_snapshot_resumes_lenet_on_lmdb_exactly(caffe_fixtures, monkeypatch, tmp_path):
    """Data layer position and random state travel in the side file: 2 + 2 iterations from a
    snapshot give the weights of 4 uninterrupted ones, bit for bit."""
    monkeypatch.chdir(caffe_fixtures)
    straight = lenet_solver(tmp_path, test_initialization=False)
    straight.step(4)
    first = lenet_solver(tmp_path, test_initialization=False)
    first.step(2)
    first.snapshot()
    resumed = lenet_solver(tmp_path, test_initialization=False, random_seed=3)
    resumed.restore(str(tmp_path / "lenet_iter_2.solverstate"))
    resumed.step(2)
    for a, b in zip(straight.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    for s in (straight, first, resumed):
        s.close()


@pytest.mark.parametrize("name", ["lenet_iter_1000.caffemodel", "lenet_iter_1000.caffemodel.h5",
                                  "renamed.solverstate"])
def test_a_model_given_as_state_is_refused(caffe_fixtures, monkeypatch, tmp_path, name):
    monkeypatch.chdir(caffe_fixtures)
    s = lenet_solver(tmp_path)
    path = name
    if name == "renamed.solverstate":
        path = str(tmp_path / name)
        shutil.copy("lenet_iter_1000.caffemodel", path)
    with pytest.raises(CCTError, match="not a solver state; resuming expects the .solverstate"):
        s.restore(path)
    assert s.iter == 0


# ------------------------------------------------------------------------------------------------
# The loop and its log lines
# ------------------------------------------------------------------------------------------------
def test_solve_logs_like_caffe(tmp_path, capsys):
    s = make(tmp_path, max_iter=4, display=2, test_iter=[2], test_interval=2, snapshot=3,
             snapshot_after_train=True)
    capsys.readouterr()
    s.solve()
    prefix = str(tmp_path / "snap")
    num = r"[-+\d.e]+"
    expected = [
        ("solver.cpp:289", "Solving least_squares"),
        ("solver.cpp:290", "Learning Rate Policy: fixed"),
        ("solver.cpp:347", r"Iteration 0, Testing net \(#0\)"),
        ("solver.cpp:414", rf"    Test net output #0: loss = {num} \(\* 1 = {num} loss\)"),
        ("solver.cpp:239", rf"Iteration 0 \(0 iter/s, {num}s/2 iters\), loss = {num}"),
        ("solver.cpp:258", rf"    Train net output #0: loss = {num} \(\* 1 = {num} loss\)"),
        ("sgd_solver.cpp:112", r"Iteration 0, lr = 0.1"),
        ("solver.cpp:347", r"Iteration 2, Testing net \(#0\)"),
        ("solver.cpp:414", rf"    Test net output #0: loss = {num} \(\* 1 = {num} loss\)"),
        ("solver.cpp:239", rf"Iteration 2 \({num} iter/s, {num}s/2 iters\), loss = {num}"),
        ("solver.cpp:258", rf"    Train net output #0: loss = {num} \(\* 1 = {num} loss\)"),
        ("sgd_solver.cpp:112", r"Iteration 2, lr = 0.1"),
        ("solver.cpp:464", f"Snapshotting to binary proto file {re.escape(prefix)}_iter_3"
                           r"\.caffemodel"),
        ("sgd_solver.cpp:284", f"Snapshotting solver state to binary proto file "
                               f"{re.escape(prefix)}_iter_3\\.solverstate"),
        ("solver.cpp:464", f"Snapshotting to binary proto file {re.escape(prefix)}_iter_4"
                           r"\.caffemodel"),
        ("sgd_solver.cpp:284", f"Snapshotting solver state to binary proto file "
                               f"{re.escape(prefix)}_iter_4\\.solverstate"),
        ("solver.cpp:327", rf"Iteration 4, loss = {num}"),
        ("solver.cpp:347", r"Iteration 4, Testing net \(#0\)"),
        ("solver.cpp:414", rf"    Test net output #0: loss = {num} \(\* 1 = {num} loss\)"),
        ("solver.cpp:332", r"Optimization Done\."),
    ]
    log = solver_log(capsys.readouterr().err)
    assert len(log) == len(expected), log
    for (src, msg), (want_src, pattern) in zip(log, expected):
        assert src == want_src and re.fullmatch(pattern, msg), (src, msg)
    assert s.iter == 4
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"snap_iter_{i}.{ext}" for i in (3, 4)
        for ext in ("caffemodel", "solverstate", "solverstate" + SIDE_SUFFIX))


def test_init_logs_like_caffe(tmp_path, capsys):
    net_file = write(tmp_path / "net.prototxt", ls_net())
    solver_file = write(tmp_path / "solver.prototxt",
                        f'net: "{net_file}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
                        f'test_iter: 1\ntest_interval: 10\n')
    solver_from_file(solver_file)
    err = capsys.readouterr().err
    log = solver_log(err)
    assert log[0] == ("solver.cpp:45", "Initializing solver from parameters: ")
    assert log[1:] == [
        ("solver.cpp:102", f"Creating training net from net file: {net_file}"),
        ("solver.cpp:190", f"Creating test net (#0) specified by net file: {net_file}"),
        ("solver.cpp:57", "Solver scaffolding done.")]
    # The parameters follow on their own lines, as DebugString prints them (field order).
    after = err.split("Initializing solver from parameters: \n", 1)[1]
    assert after.startswith(f'test_iter: 1\ntest_interval: 10\nbase_lr: 0.01\n'
                            f'lr_policy: "fixed"\nsnapshot_prefix: "{tmp_path}/solver"\n'
                            f'net: "{net_file}"\nI')


def _emulate_smoothing(losses, average_loss):
    """Caffe's UpdateSmoothedLoss in float32, written out."""
    f = np.float32
    smoothed, kept, out = f(0), [], []
    for i, loss in enumerate(losses):
        loss = f(loss)
        if len(kept) < average_loss:
            kept.append(loss)
            smoothed = (smoothed * f(len(kept) - 1) + loss) / f(len(kept))
        else:
            smoothed = smoothed + (loss - kept[i % average_loss]) / f(average_loss)
            kept[i % average_loss] = loss
        out.append(smoothed)
    return out


@pytest.mark.parametrize("average_loss", [1, 3])
def test_displayed_loss_is_caffes_smoothed_loss(average_loss, capsys):
    data = batches(7, seed=11)
    s = make(display=1, average_loss=average_loss, max_iter=7)
    losses = []
    s.add_callback(lambda: feed(s, *data[s.iter]),
                   lambda: losses.append(float(s.net.blobs["loss"].data)))
    capsys.readouterr()
    s.step(7)
    shown = [re.search(r"loss = (\S+)$", m).group(1) for src, m in
             solver_log(capsys.readouterr().err) if src == "solver.cpp:239"]
    assert shown == ["%g" % v for v in _emulate_smoothing(losses, average_loss)]
    assert s.smoothed_loss == _emulate_smoothing(losses, average_loss)[-1]


def test_steps_as_one_go_on_as_one_caffe_step():
    """Step calls are each a Caffe Step (the smoothed loss starts again, as pycaffe's
    solver.step(n) in a loop does); inside steps_as_one they are pieces of one (the
    optimizer's chunks): the smoothed loss of step(3) + step(4) is step(7)'s."""
    data = batches(7, seed=11)

    def smoothed(pieces, one):
        s = make(display=0, average_loss=3, max_iter=7)
        out = []
        s.add_callback(lambda: feed(s, *data[s.iter]), lambda: out.append(s.smoothed_loss))
        s.start_steps()
        with s.steps_as_one() if one else contextlib.nullcontext():
            for n in pieces:
                s.step(n)
        return out

    whole = smoothed([7], False)
    assert smoothed([3, 4], True) == whole
    apart = smoothed([3, 4], False)
    assert apart[:3] == whole[:3] and apart[3] != whole[3]


def _trained(pieces, **fields):
    """A least-squares solver after step(n) for each n in ``pieces`` on the same batches, and
    how many times its net cleared the diffs."""
    data = batches(sum(pieces), seed=5)
    s = make(momentum=0.9, weight_decay=0.01, **fields)
    clears = []
    clear = s.net.clear_param_diffs
    s.net.clear_param_diffs = lambda: (clears.append(s.iter), clear())
    s.add_callback(lambda: feed(s, *data[s.iter]), lambda: None)
    for n in pieces:
        s.step(n)
    return s, clears


@pytest.mark.parametrize("fields", [{}, {"iter_size": 2}, {"type": "Nesterov"},
                                    {"snapshot_diff": True}], ids=str)
def test_an_update_inside_a_step_clears_the_diffs_for_the_next(fields):
    """Between two iterations of one step() call, SGD's update leaves the diffs zero (the next
    clear, in the update's own pass) and the next iteration clears nothing; training gives the
    same bits as one step(1) call per iteration, and each step() ends with Caffe's update values
    in the diffs. Other rules, and snapshot_diff (a snapshot would write the diffs), clear as
    Caffe does."""
    fused, clears = _trained([4], **fields)
    apart, clears_apart = _trained([1] * 4, **fields)
    assert clears_apart == [0, 1, 2, 3]
    sgd = fields.get("type", "SGD") == "SGD" and not fields.get("snapshot_diff")
    assert clears == ([0] if sgd else [0, 1, 2, 3])
    for a, b in zip(fused.net.learnable_params, apart.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.diff, b.diff)
        assert np.any(a.diff)
    for a, b in zip(fused.history, apart.history):
        np.testing.assert_array_equal(a, b)


def test_iter_size_loss_is_the_mean_over_passes(capsys):
    x, t = batches(1, n=8, seed=12)[0]
    s = make(net=chunk_net("loss_halves", x.astype(np.float32), t.astype(np.float32), 4),
             iter_size=2, display=1)
    halves = []
    for lo in (0, 4):
        r = x[lo:lo + 4] @ s.net.params["ip"][0].data.reshape(-1).astype(np.float64) \
            + float(s.net.params["ip"][1].data[0]) - t[lo:lo + 4, 0]
        halves.append((r ** 2).sum() / 8)
    capsys.readouterr()
    s.step(1)
    m = re.search(r"loss = (\S+)$", [m for src, m in solver_log(capsys.readouterr().err)
                                     if src == "solver.cpp:239"][0])
    assert float(m.group(1)) == pytest.approx(np.mean(halves), rel=1e-5)


def test_test_nets_share_the_trained_params_and_compute_loss(capsys):
    s = make(test_iter=[2, 1], test_interval=100, test_compute_loss=True)
    assert len(s.test_nets) == 2
    assert all(n.phase == caffe_pb2.TEST for n in s.test_nets)
    capsys.readouterr()
    s.test_all()
    train_w = s.net.params["ip"][0].data
    for n in s.test_nets:
        assert np.shares_memory(n.params["ip"][0].data, train_w)
    log = solver_log(capsys.readouterr().err)
    assert [src for src, _ in log] == ["solver.cpp:347", "solver.cpp:401", "solver.cpp:414"] * 2
    assert log[3] == ("solver.cpp:347", "Iteration 0, Testing net (#1)")


def test_test_state_selects_stages():
    net = ls_net() + """
      layer { name: "extra" type: "Power" bottom: "ip" top: "extra"
              include { phase: TEST stage: "with_extra" } }
    """
    s = make(net=net, test_iter=[1, 1], test_interval=10,
             test_state=[caffe_pb2.NetState(), caffe_pb2.NetState(stage=["with_extra"])])
    assert "extra" not in s.test_nets[0].layer_names
    assert "extra" in s.test_nets[1].layer_names
    assert "extra" not in s.net.layer_names


def test_test_net_files_and_train_net_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.prototxt", ls_net())
    write(tmp_path / "test.prototxt", ls_net(n=2))
    s = solver_from_file(write(tmp_path / "solver.prototxt",
                               'train_net: "train.prototxt"\ntest_net: "test.prototxt"\n'
                               'test_iter: 3\ntest_interval: 5\nbase_lr: 0.1\n'
                               'lr_policy: "fixed"\n'))
    assert len(s.test_nets) == 1
    assert s.test_nets[0].blobs["data"].shape == (2, 3)


# ------------------------------------------------------------------------------------------------
# Early stop, snapshot requests, divergence, atomic writes
# ------------------------------------------------------------------------------------------------
def test_stop_request_snapshots_and_stops(tmp_path, capsys):
    calls = []

    def action():
        calls.append(1)
        return "stop" if len(calls) == 2 else "none"

    s = Solver(solver_param(ls_net(), max_iter=10, snapshot_prefix=str(tmp_path / "snap"),
                            snapshot_after_train=True), "<t>", action_request=action)
    capsys.readouterr()
    s.solve()
    assert s.iter == 2
    log = [m for _, m in solver_log(capsys.readouterr().err)]
    assert log[-1] == "Optimization stopped early."
    assert "Optimization Done." not in log
    assert os.path.exists(tmp_path / "snap_iter_2.caffemodel")


def test_stop_request_during_a_test_interrupts_it(tmp_path, capsys):
    s = Solver(solver_param(ls_net(), max_iter=5, test_iter=[3], test_interval=2,
                            snapshot_prefix=str(tmp_path / "snap")),
               "<t>", action_request=lambda: "stop")
    capsys.readouterr()
    s.solve()
    log = [m for _, m in solver_log(capsys.readouterr().err)]
    assert log[2:] == ["Iteration 0, Testing net (#0)", "Test interrupted.",
                       "Optimization stopped early."]
    assert s.iter == 0


def test_snapshot_request_writes_a_snapshot_now(tmp_path):
    s = Solver(solver_param(ls_net(), max_iter=3, snapshot_prefix=str(tmp_path / "snap")),
               "<t>", action_request=lambda: "snapshot" if s.iter == 1 else "none")
    s.solve()
    assert os.path.exists(tmp_path / "snap_iter_1.solverstate")
    assert not os.path.exists(tmp_path / "snap_iter_2.solverstate")


def test_nan_loss_stops_with_a_clear_error_and_no_snapshot(tmp_path):
    data = batches(5, seed=13)
    s = make(tmp_path, snapshot=2, max_iter=10, snapshot_after_train=True)

    def feed_batch():
        x, t = data[s.iter]
        if s.iter == 3:
            t = t * np.nan
        feed(s, x, t)

    s.add_callback(feed_batch, lambda: None)
    with pytest.raises(CCTError, match=r"loss is NaN at iteration 3; training stopped without "
                                       r"writing a snapshot \(the last good snapshot is "
                                       + re.escape(str(tmp_path / "snap_iter_2.solverstate"))):
        s.solve()
    assert sorted(p for p in os.listdir(tmp_path) if "iter_3" in p) == []
    assert np.isfinite(s.net.params["ip"][0].data).all()


def test_nan_loss_from_nan_weights_names_the_weights_file(tmp_path):
    src = make()
    src.net.params["ip"][0].data[0, 1] = np.nan
    path = str(tmp_path / "bad.caffemodel")
    src.net.save(path)
    data = batches(1, seed=13)
    s = make(tmp_path, weights=[path])
    s.add_callback(lambda: feed(s, *data[0]), lambda: None)
    with pytest.raises(CCTError, match=r"loss is NaN at iteration 0; .* The weights file "
                                       + re.escape(f"'{path}' holds NaN/inf values (layer "
                                                   f"'ip' param 0); fix or replace it.")):
        s.solve()


def test_a_failed_state_write_leaves_no_partial_file(tmp_path, monkeypatch):
    s = make(tmp_path)

    class FullDisk:
        """A file that takes 10 bytes, then fails as a full disk does."""
        def __init__(self, path, mode="r"):
            self.f = open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:10])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("cct.io.solverstate.open", FullDisk, raising=False)
    with pytest.raises(CCTError, match="No space left on device"):
        s.snapshot()
    assert not os.path.exists(tmp_path / "snap_iter_0.solverstate")
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


@pytest.mark.parametrize("fmt,model,state", [("BINARYPROTO", ".caffemodel", ".solverstate"),
                                              ("HDF5", ".caffemodel.h5", ".solverstate.h5")])
def test_snapshot_renames_model_then_side_file_then_state(tmp_path, monkeypatch, fmt, model,
                                                          state):
    """A kill between two renames never leaves a state without its side file: the state,
    which a resume starts from, comes last."""
    kw = dict(type="SGD", momentum=0.9,
              snapshot_format=caffe_pb2.SolverParameter.SnapshotFormat.Value(fmt))
    s = make(tmp_path, **kw)
    s.step(1)
    s.snapshot()
    renamed, real_replace = [], os.replace

    def replace(src, dst):
        renamed.append(os.path.basename(dst))
        if dst.endswith(state):
            raise KeyboardInterrupt   # the process dies between the last two renames
        real_replace(src, dst)

    s.step(1)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        s.snapshot()
    monkeypatch.undo()
    assert renamed == [f"snap_iter_2{model}", f"snap_iter_2{state}{SIDE_SUFFIX}",
                       f"snap_iter_2{state}"]
    assert sorted(os.listdir(tmp_path)) == sorted([
        f"snap_iter_1{model}", f"snap_iter_1{state}", f"snap_iter_1{state}{SIDE_SUFFIX}",
        f"snap_iter_2{model}", f"snap_iter_2{state}{SIDE_SUFFIX}"])
    # The run resumes from the last complete snapshot; the orphan side file is overwritten
    # with the next snapshot of its iteration.
    resumed = make(tmp_path, **kw)
    resumed.restore(str(tmp_path / f"snap_iter_1{state}"))
    resumed.step(1)
    resumed.snapshot()
    np.testing.assert_array_equal(resumed.net.params["ip"][0].data, s.net.params["ip"][0].data)
    assert os.path.exists(tmp_path / f"snap_iter_2{state}")


def test_snapshot_removes_temp_files_left_by_killed_writers(tmp_path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    left = [f"snap_iter_20.caffemodel.tmp-{child.pid}",
            f"snap_iter_20.solverstate.cct.json.tmp-{child.pid}",
            f"snap_iter_40.solverstate.tmp-{os.getpid()}"]   # an earlier process with our pid
    kept = [f"snap_iter_40.caffemodel.tmp-{os.getppid()}",   # a live writer's
            f"other_iter_20.caffemodel.tmp-{child.pid}"]     # another prefix's
    for name in left + kept:
        (tmp_path / name).write_bytes(b"partial")
    make(tmp_path).snapshot()
    assert sorted(p for p in os.listdir(tmp_path) if ".tmp-" in p) == sorted(kept)
    err = capsys.readouterr().err
    for name in left:
        assert f"Removed {tmp_path / name}, left by an interrupted snapshot" in err


# ------------------------------------------------------------------------------------------------
# Exact resume of cct's own runs (random generator and data positions in the side file)
# ------------------------------------------------------------------------------------------------
def test_side_file_restores_data_position_and_rng(tmp_path):
    x, t = batches(1, n=12, seed=14)[0]
    net = chunk_net("resume_thirds", x.astype(np.float32), t.astype(np.float32), 4)
    kw = dict(type="SGD", momentum=0.9, snapshot_prefix=str(tmp_path / "r"))
    straight = make(net=net, **kw)
    straight.step(5)

    first = make(net=net, **kw)
    first.step(2)
    first.snapshot()
    saved_rng = rng.get_rng().bit_generator.state
    state = str(tmp_path / "r_iter_2.solverstate")
    assert os.path.exists(state + SIDE_SUFFIX)

    resumed = make(net=net, **dict(kw, random_seed=5))
    resumed.restore(state)
    assert rng.get_rng().bit_generator.state == saved_rng
    resumed.step(3)
    np.testing.assert_array_equal(resumed.net.params["ip"][0].data,
                                  straight.net.params["ip"][0].data)

    os.remove(state + SIDE_SUFFIX)   # a Caffe-written state: data restarts from the start
    plain = make(net=net, **kw)
    plain.restore(state)
    plain.step(3)
    assert not np.array_equal(plain.net.params["ip"][0].data,
                              straight.net.params["ip"][0].data)


LMDB_NET = """
  name: "digits"
  layer {{ name: "data" type: "Data" top: "data" top: "label"
    data_param {{ source: "{db}" batch_size: 2 backend: LMDB }}
    transform_param {{ mirror: true }} }}
  layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
    inner_product_param {{ num_output: 10 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
  layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""


@pytest.fixture
def lmdb_snapshot(tmp_path):
    """(solver factory, state file) of a net on an LMDB, snapshotted after 3 iterations."""
    from tests.layers.test_data import digits_db
    net = LMDB_NET.format(db=digits_db(tmp_path, 7))

    def solver():
        return make(tmp_path, net=net, type="SGD", momentum=0.9)
    first = solver()
    first.step(3)
    first.snapshot()
    first.close()
    return solver, str(tmp_path / "snap_iter_3.solverstate")


def _side(state: str, change) -> None:
    import json
    with open(state + SIDE_SUFFIX) as f:
        side = json.load(f)
    change(side)
    with open(state + SIDE_SUFFIX, "w") as f:
        json.dump(side, f)


@pytest.mark.parametrize("damage, words", [
    (b"{not json", "it cannot be read"),
    (b"\xff\xfe{}", "it cannot be read"),
    (b"[1, 2]", "it holds a JSON list, not cct's object of format 1"),
    (lambda side: side.update(format=2), "its format is 2; this cct reads format 1"),
    (lambda side: side.update(iter=7), "it was written for iteration 7 and weights"),
    (lambda side: side.update(learned_net=["x"]), "it was written for iteration 3 and weights "
                                                  "['x']"),
    (lambda side: side.update(data=[]), "its 'data' entry is not an object"),
    # Before: TypeError/KeyError from NumPy and from the data layer's restore.
    (lambda side: side.update(rng={"bit_generator": "PCG64", "state": "x"}),
     "its random generator state is unusable"),
    (lambda side: side["data"]["train"]["data"].update(position="x", key=5),
     "the data position of layer 'data' (train net) is unusable"),
    (lambda side: side["data"]["train"].update(data=[]),
     "the data position of layer 'data' (train net) is unusable"),
])
def test_a_damaged_side_file_is_a_warning(lmdb_snapshot, capsys, damage, words):
    """The resume goes on (as from a Caffe state) and the log says it is not exact."""
    solver, state = lmdb_snapshot
    if isinstance(damage, bytes):
        with open(state + SIDE_SUFFIX, "wb") as f:
            f.write(damage)
    else:
        _side(state, damage)
    s = solver()
    generator = rng.get_rng().bit_generator.state
    capsys.readouterr()
    s.restore(state)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("W")]
    assert len(warnings) == 1, warnings
    assert f"{state}{SIDE_SUFFIX}: {words}" in warnings[0]
    assert warnings[0].endswith("; the resumed run will not repeat the interrupted one bit "
                                "for bit.")
    if "random generator" in words:
        assert rng.get_rng().bit_generator.state == generator
    s.step(4)   # the data layer reads on, wrapping around the 7 records
    assert s.iter == 7
    s.close()


def test_a_missing_side_file_is_logged(lmdb_snapshot, capsys):
    solver, state = lmdb_snapshot
    os.remove(state + SIDE_SUFFIX)
    s = solver()
    capsys.readouterr()
    s.restore(state)
    assert f"{state}{SIDE_SUFFIX} is absent (a state written by Caffe" in capsys.readouterr().err
    s.close()


# ------------------------------------------------------------------------------------------------
# Restore errors and paths
# ------------------------------------------------------------------------------------------------
def test_restore_errors(tmp_path):
    sgd = make(tmp_path, type="SGD", momentum=0.9)
    sgd.snapshot()
    state = str(tmp_path / "snap_iter_0.solverstate")
    adam = make(tmp_path, type="Adam", momentum=0.9)
    with pytest.raises(CCTError, match="holds 2 history blobs; this Adam solver keeps 4"):
        adam.restore(state)
    with pytest.raises(CCTError, match="does not exist"):
        sgd.restore(str(tmp_path / "nope.solverstate"))
    with open(state, "rb") as f:
        data = f.read()
    truncated = write(tmp_path / "cut.solverstate", "")
    with open(truncated, "wb") as f:
        f.write(data[:-5])
    with pytest.raises(CCTError, match="not a valid binary SolverState"):
        sgd.restore(truncated)
    os.remove(tmp_path / "snap_iter_0.caffemodel")
    with pytest.raises(CCTError, match=r"names the weights file .*snap_iter_0\.caffemodel"):
        sgd.restore(state)


def state_with(tmp_path, name, **fields):
    """The tiny solver's snapshot at iteration 0 with some SolverState fields replaced
    (learned_net as bytes, to write what protobuf would refuse to encode)."""
    from cct.proto import caffe_raw_pb2
    state = caffe_raw_pb2.SolverStateRaw.FromString(
        (tmp_path / "snap_iter_0.solverstate").read_bytes())
    learned_net = fields.pop("learned_net", None)
    for k, v in fields.items():
        setattr(state, k, v)
    data = state.SerializeToString()
    if learned_net is not None:
        state.ClearField("learned_net")
        data = state.SerializeToString() + b"\x12" + bytes([len(learned_net)]) + learned_net
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("fields, words", [
    # Before: ValueError (math domain error) from the "inv" policy at the first step.
    ({"iter": -2 ** 31}, ["iter is -2147483648; expected a count from 0 to 2147483647"]),
    ({"iter": -1}, ["iter is -1"]),
    ({"current_step": -3}, ["current_step is -3"]),
    # Before: TypeError (protobuf hands the field back as bytes).
    ({"learned_net": b"snap\xff.caffemodel"},
     ["learned_net is b'snap\\xff.caffemodel', which is not UTF-8 text"]),
])
def test_solverstate_fields_no_solver_writes(tmp_path, fields, words):
    sgd = make(tmp_path, type="SGD", momentum=0.9, lr_policy="inv", gamma=0.1, power=0.75)
    sgd.snapshot()
    path = state_with(tmp_path, "bad.solverstate", **fields)
    with pytest.raises(CCTError) as e:
        sgd.restore(path)
    assert f"solver state '{path}'" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_unreadable_learned_net_names_the_state(tmp_path, monkeypatch):
    sgd = make(tmp_path, type="SGD", momentum=0.9)
    sgd.snapshot()
    state = str(tmp_path / "snap_iter_0.solverstate")

    def refuse(*args, **kw):  # what a file without read permission gives (tests run as root)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("cct.io.weights.open", refuse, raising=False)
    with pytest.raises(CCTError, match=rf"solver state '{state}' names the weights file "
                                       r"'.*snap_iter_0\.caffemodel' \(learned_net\), which "
                                       r"cannot be used: cannot read weights file .*Permission "
                                       r"denied"):
        sgd.restore(state)


def _h5_replace(name, value):
    def change(f):
        del f[name]
        f.create_dataset(name, data=value)
    return change


@pytest.mark.parametrize("change, words", [
    (_h5_replace("iter", b"1000"), ["iter holds string data, expected one integer"]),
    (_h5_replace("iter", np.array([2 ** 40])), ["iter is 1099511627776; expected a count"]),
    (_h5_replace("iter", np.array([-5], np.int32)), ["iter is -5; expected a count"]),
    (_h5_replace("iter", np.array([1.5])), ["iter holds 1 value(s) of type 'float64'; "
                                            "expected one integer"]),
    (_h5_replace("current_step", np.zeros(0, np.int32)), ["current_step holds 0 value(s)"]),
    # Before: UnicodeDecodeError.
    (_h5_replace("learned_net", np.bytes_(b"\xff\xfe")),
     ["learned_net is b'\\xff\\xfe', which is not UTF-8 text"]),
    (_h5_replace("learned_net", np.arange(3)), ["learned_net is not a dataset holding one "
                                                "string"]),
    # Before: KeyError, AttributeError, TypeError.
    (lambda f: f["history"].create_dataset("x", data=[1.0]),
     ["history holds 0, 1, x; expected datasets named 0 to 2"]),
    (_h5_replace("history", np.ones(2)), ["history is a dataset, expected a group"]),
    (lambda f: (f["history"].__delitem__("1"), f["history"].create_group("1")),
     ["history/1 is a group, expected a dataset of history values"]),
])
def test_hdf5_solverstate_of_the_wrong_layout(tmp_path, change, words):
    sgd = make(tmp_path, type="SGD", momentum=0.9, snapshot_format=caffe_pb2.SolverParameter.HDF5)
    sgd.snapshot()
    path = str(tmp_path / "snap_iter_0.solverstate.h5")
    with h5py.File(path, "r+") as f:
        change(f)
    with pytest.raises(CCTError) as e:
        sgd.restore(path)
    assert f"solver state '{path}'" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_hdf5_solverstate_with_damaged_metadata(tmp_path):
    sgd = make(tmp_path, type="SGD", momentum=0.9, snapshot_format=caffe_pb2.SolverParameter.HDF5)
    sgd.snapshot()
    path = tmp_path / "snap_iter_0.solverstate.h5"
    data = bytearray(path.read_bytes())
    heaps = [i for i in range(len(data)) if data.startswith(b"HEAP", i)]
    data[heaps[-1] + 1] ^= 0xFF  # the history group's name heap
    path.write_bytes(data)
    with pytest.raises(CCTError, match=rf"cannot read HDF5 solver state '{path}': it is damaged"):
        sgd.restore(str(path))


def test_learned_net_is_found_beside_the_state(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    (tmp_path / "run" / "snaps").mkdir()
    s = make(snapshot_prefix="snaps/x", type="SGD", momentum=0.9)
    s.step(1)
    s.snapshot()
    assert read_solver_state("snaps/x_iter_1.solverstate")["learned_net"] == \
        "snaps/x_iter_1.caffemodel"
    monkeypatch.chdir(tmp_path)
    r = make(snapshot_prefix=str(tmp_path / "y"), type="SGD", momentum=0.9, random_seed=3)
    r.restore("run/snaps/x_iter_1.solverstate")
    np.testing.assert_array_equal(r.net.params["ip"][0].data, s.net.params["ip"][0].data)


# ------------------------------------------------------------------------------------------------
# Configuration errors
# ------------------------------------------------------------------------------------------------
def test_a_solver_without_a_net_names_the_file(tmp_path):
    path = write(tmp_path / "solver.prototxt", 'base_lr: 0.1\nlr_policy: "fixed"\n')
    with pytest.raises(CCTError, match=re.escape(path) + ": the solver names no net to train"):
        solver_from_file(path)


@pytest.mark.parametrize("extra,message", [
    ('train_net: "b.prototxt"', "more than one train net (net, train_net)"),
    ("test_iter: 2", "need a positive test_interval"),
    ("test_iter: 1 test_interval: 5 test_state { } test_state { }",
     "test_state must be unspecified or specified once per test net"),
    ('test_net: "a.prototxt" test_net: "a.prototxt" test_iter: 1 test_interval: 5',
     "test_iter must be specified for each test network"),
    ("average_loss: 0", "average_loss must be at least 1"),
    ("iter_size: 0", "iter_size must be at least 1"),
])
def test_inconsistent_solvers_are_clear_errors(tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a.prototxt", ls_net())
    path = write(tmp_path / "solver.prototxt",
                 f'net: "a.prototxt" base_lr: 0.1 lr_policy: "fixed" {extra}')
    with pytest.raises(CCTError, match=re.escape(message)):
        solver_from_file(path)


def test_net_paths_are_relative_to_the_cwd_with_a_hint(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    write(tmp_path / "exp" / "a.prototxt", ls_net())
    path = write(tmp_path / "exp" / "solver.prototxt",
                 'net: "a.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CCTError, match=r"net file 'a.prototxt' does not exist .*It exists "
                                       r"beside the solver file"):
        solver_from_file(path)
    monkeypatch.chdir(tmp_path / "exp")
    assert solver_from_file("solver.prototxt").net.name == "least_squares"


def test_unwritable_snapshot_prefix_fails_up_front(tmp_path):
    with pytest.raises(CCTError, match="Cannot write to snapshot prefix"):
        make(snapshot=10, snapshot_prefix=str(tmp_path / "missing_dir" / "snap"))


# ------------------------------------------------------------------------------------------------
# Fine-tuning weights
# ------------------------------------------------------------------------------------------------
def test_copy_weights_and_solver_weights_field(tmp_path, capsys):
    src = make(random_seed=1)
    path = str(tmp_path / "w.caffemodel")
    src.net.save(path)
    s = make(random_seed=2, test_iter=[1], test_interval=5)
    assert not np.array_equal(s.net.params["ip"][0].data, src.net.params["ip"][0].data)
    capsys.readouterr()
    s.copy_weights([path])
    for net in [s.net] + s.test_nets:
        np.testing.assert_array_equal(net.params["ip"][0].data, src.net.params["ip"][0].data)
    assert solver_log(capsys.readouterr().err) == [("solver.cpp:72", f"Finetuning from {path}")] * 2
    w = make(random_seed=3, weights=[f" {path} "])
    np.testing.assert_array_equal(w.net.params["ip"][0].data, src.net.params["ip"][0].data)


# ------------------------------------------------------------------------------------------------
# pycaffe's solver API
# ------------------------------------------------------------------------------------------------
def test_pycaffe_solver_api(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "net.prototxt", ls_net())
    path = write(tmp_path / "adam_solver.prototxt",
                 'net: "net.prototxt"\ntype: "Adam"\nbase_lr: 0.01\nmomentum: 0.9\n'
                 'lr_policy: "fixed"\nmax_iter: 3\ntest_iter: 1\ntest_interval: 2\n')
    path = os.path.basename(path)
    s = cct.get_solver(path)
    assert isinstance(s, cct.AdamSolver) and s.rule.type == "Adam"
    assert isinstance(s.param, caffe_pb2.SolverParameter) and s.param.max_iter == 3
    assert len(s.test_nets) == 1 and s.net.phase == caffe_pb2.TRAIN
    s.step(2)
    assert s.iter == 2
    s.solve()
    assert s.iter == 3
    assert os.path.exists(tmp_path / "adam_solver_iter_3.caffemodel")   # default prefix
    sgd = cct.SGDSolver(path)   # the class decides the rule, as in pycaffe
    assert sgd.rule.type == "SGD" and len(sgd.history) == 2
    for cls, kind in [(cct.NesterovSolver, "Nesterov"), (cct.AdaGradSolver, "AdaGrad"),
                      (cct.RMSPropSolver, "RMSProp"), (cct.AdaDeltaSolver, "AdaDelta")]:
        p = read_solver_text(path)
        p.momentum = 0.9 if kind in ("Nesterov", "AdaDelta") else 0
        assert cls(p).rule.type == kind
    model = s.snapshot()
    assert model == "adam_solver_iter_3.caffemodel"
    r = cct.AdamSolver(path)
    r.restore("adam_solver_iter_3.solverstate")
    assert r.iter == 3
    for a, b in zip(r.history, s.history):
        np.testing.assert_array_equal(a, b)

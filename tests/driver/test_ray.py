"""The Ray engine (cct/driver/ray_engine.py) on a real Ray cluster of two nodes on this machine
(ray.cluster_utils.Cluster; each test module shuts down only the cluster it started): one group
gives the threads engine's losses; a killed group actor and a killed store shard are survived;
snapshots resume exactly; a removed node's group moves."""
import os
import re
import signal
import sys
import time

import numpy as np
import pytest

from cct.api import Solver
from cct.driver import Driver
from cct.driver.ray_engine import auto_shards, import_ray, shard_bounds
from cct.errors import CCTError

from ..test_scheduler import data_list, params_of, solver_param  # noqa: F401  (fixture)
from .test_driver import losses

ray = pytest.importorskip("ray", reason="the Ray engine's tests need Ray (the test-full extra)")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 100 << 20, "include_dashboard": False})
    worker = c.add_node(num_cpus=1, object_store_memory=100 << 20)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    yield c, worker
    ray.shutdown()
    c.shutdown()


def run(param, capfd, iters, **kw):
    solver = Solver(param)
    driver = Driver(solver, **kw)
    try:
        capfd.readouterr()
        driver.step(iters)
        driver.pull_statistics()
        return params_of(solver), losses(capfd.readouterr().err), driver
    finally:
        driver.close()
        solver.close()


def _snapshot_after(param, iters, **kw):
    """Train ``iters`` updates with a driver, snapshot, and close everything."""
    solver = Solver(param)
    driver = Driver(solver, **kw)
    try:
        driver.step(iters)
        solver.snapshot()
    finally:
        driver.close()
        solver.close()


def test_shards_split_by_bytes_and_the_auto_rule():
    assert shard_bounds([100, 100, 100, 100], 2) == [[0, 1], [2, 3]]
    assert shard_bounds([10, 1000, 10], 2) == [[0], [1, 2]]   # by each param's middle
    assert shard_bounds([5, 5], 8) == [[0], [1]]              # no empty shard
    assert shard_bounds([1, 1, 1, 1000], 3) == [[0, 1], [2], [3]]
    assert shard_bounds([1000, 1, 1, 1], 3) == [[0], [1], [2, 3]]
    # 2 x 244 MB over 1 GB/s hides under a 0.25 s step with 2 shards.
    assert auto_shards(244_000_000, 0.25, 1e9) == 2
    assert auto_shards(1_700_000, 0.017, 6e9) == 1


def test_without_ray_a_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(CCTError, match=r"pip install .*\[ray\]'"):
        import_ray()


def test_one_ray_group_gives_the_threads_engines_losses(cluster, data_list, tmp_path,  # noqa: F811
                                                         capfd):
    # A Ray group takes one core (its actor's num_cpus); the threads engine's group gets the
    # same one core, since OpenBLAS rounds differently with another thread count.
    param = solver_param(data_list, tmp_path)
    want_params, want_losses, _ = run(param, capfd, 6, groups=1, engine="threads",
                                      devices="cpu:1")
    got_params, got_losses, _ = run(param, capfd, 6, groups=1, engine="ray", ps_shards=2)
    assert got_losses == want_losses and len(want_losses) == 6
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


def test_ray_groups_bring_batchnorm_statistics_back(cluster, data_list, tmp_path):  # noqa: F811
    from cct.driver.groups import unlearned_params
    param = solver_param(data_list, tmp_path, batch_norm=True, display=0)
    got = []
    for kw in (dict(engine="threads", devices="cpu:1"), dict(engine="ray", ps_shards=1)):
        solver = Solver(param)
        driver = Driver(solver, groups=1, **kw)
        try:
            driver.step(4)
            driver.pull_statistics()
            got.append([p.data.copy() for p in unlearned_params(solver.net)])
        finally:
            driver.close()
            solver.close()
    assert got[0] and any(np.abs(w).sum() > 0 for w in got[0])
    for a, b in zip(*got):
        assert np.array_equal(a, b)


def test_lenet_reaches_975_on_two_nodes_through_a_killed_group_and_shard(
        cluster, caffe_fixtures, tmp_path, capfd):
    from .test_strategies_mnist import lenet
    param = lenet(caffe_fixtures, str(tmp_path / "lenet"))
    param.display = 100
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="ray", ps_shards=2)
    driver.engine.checkpoint_every = 50
    try:
        log = capfd.readouterr().err
        assert len(re.findall(r"Store shard \d \(pid \d+, node \w+\)", log)) == 2
        nodes = {node for _, node in re.findall(r"group \d \(pid (\d+), node (\w+)\)", log)}
        assert len(nodes) == 2            # one group on each node
        group = _kill_when(driver, lambda d: d.groups[1].pid, 200)       # from outside, by pid
        shard = _kill_when(driver, lambda d: d.engine.shard_pids[1], 230)
        accuracy = 0.0
        while solver.iter < 2000 and accuracy < 0.975:
            driver.step(200)
            solver.test_all()
            accuracy = solver.test_scores[0][0][1]
        log = capfd.readouterr().err
        said = [line for line in log.splitlines() if "driver.cpp" in line and (
            line.startswith(("W", "E")) or "Engine" in line)]
        assert accuracy >= 0.975, (solver.iter, accuracy, said)
        assert f"group 1: the actor (pid {group}) died; Ray restarted it" in log, said
        assert re.search(rf"store shard 1 \(pid {shard}\) was lost; Ray restarted it as pid "
                         rf"\d+ on node \w+ from its checkpoint at version \d+: \d+ update", log)
        shares = re.findall(r"Updates by group: group 0 (\d+) .*, group 1 (\d+)", log)
        assert shares and all(int(n) > 100 for n in shares[-1])
    finally:
        driver.close()
        solver.close()


def test_the_cli_without_ray_says_what_to_install(caffe_fixtures, tmp_path):
    import shutil
    import subprocess
    for name in ("lenet_train_test.prototxt", "lenet_solver.prototxt", "mnist10k_train_lmdb",
                 "mnist10k_test_lmdb"):
        src = caffe_fixtures / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    hide = ("import sys; sys.modules['ray'] = None; from cct.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", hide, "train", "--solver=lenet_solver.prototxt",
                          "--strategy=async", "--groups=2", "--engine=ray"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1
    assert "[ray]'" in run.stderr and "cct[ray]" not in run.stderr
    assert "Traceback" not in run.stderr


def _kill_when(driver, pid_of, after: int):
    """Run ``after`` updates, SIGKILL the process ``pid_of(driver)``, wait for it to go."""
    driver.step(after)
    pid = pid_of(driver)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        time.sleep(0.05)
    return pid


def test_a_killed_group_actor_is_restarted_and_training_goes_on(cluster, data_list,  # noqa: F811
                                                                 tmp_path, capfd):
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="ray", ps_shards=1)
    try:
        old = _kill_when(driver, lambda d: d.groups[1].pid, 5)
        driver.step(15)
        log = capfd.readouterr().err
        assert solver.iter == 20 and len(driver.groups) == 2
        assert re.search(rf"group 1: the actor \(pid {old}\) died; Ray restarted it as pid "
                         rf"\d+ on node \w+ \(2 restart\(s\) left\)", log), log[-3000:]
        assert driver.groups[1].pid != old
    finally:
        driver.close()
        solver.close()


def test_a_killed_shard_restarts_from_its_checkpoint(cluster, data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, groups=1, engine="ray", ps_shards=2)
    driver.engine.checkpoint_every = 0
    try:
        driver.step(4)
        # A checkpoint at version 4 for both shards (as every checkpoint_every updates).
        for shard in driver.engine.shards:
            ray.get(shard._write_checkpoint.remote())
        old = _kill_when(driver, lambda d: d.engine.shard_pids[1], 3)
        driver.step(5)
        log = capfd.readouterr().err
        assert solver.iter == 12
        assert re.search(rf"store shard 1 \(pid {old}\) was lost; Ray restarted it as pid \d+ "
                         rf"on node \w+ from its checkpoint at version 4: \d+ update\(s\) of "
                         rf"its params lost", log), log[-3000:]
        driver.pull_statistics()
        assert all(np.isfinite(p).all() for p in params_of(solver))
    finally:
        driver.close()
        solver.close()


def test_ray_snapshots_are_caffe_files_and_resume_exactly(cluster, data_list, tmp_path,  # noqa: F811
                                                          capfd):
    param = solver_param(data_list, tmp_path, display=0, max_iter=12)
    whole, _, _ = run(param, capfd, 12, groups=1, engine="ray", ps_shards=2)
    _snapshot_after(param, 5, groups=1, engine="ray", ps_shards=2)
    from cct.io.weights import load_weights
    assert load_weights(str(tmp_path / "snap_iter_5.caffemodel"))["conv"]
    solver = Solver(param)
    driver = Driver(solver, groups=1, engine="ray", ps_shards=1)   # another sharding
    try:
        solver.restore(str(tmp_path / "snap_iter_5.solverstate"))
        driver.step(7)
        driver.pull_statistics()
        for a, b in zip(whole, params_of(solver)):
            assert np.array_equal(a, b)
    finally:
        driver.close()
        solver.close()


def test_a_removed_nodes_group_moves(cluster, data_list, tmp_path, capfd):  # noqa: F811
    c, _ = cluster
    extra = c.add_node(num_cpus=1, object_store_memory=100 << 20)
    c.wait_for_nodes()
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, groups=3, engine="ray", ps_shards=1)
    try:
        driver.step(3)
        extra_id = extra.node_id[:8]
        on_extra = [g for g in driver.groups if g.node == extra_id]
        assert on_extra           # 3 one-CPU groups on 4 CPUs: one is on the extra node
        c.remove_node(extra)
        driver.step(9)
        assert solver.iter == 12 and len(driver.groups) == 3
        for g in on_extra:
            assert g.node != extra_id
    finally:
        driver.close()
        solver.close()


def test_groups_read_their_own_part_of_the_lmdb(cluster, caffe_fixtures, tmp_path, capfd):
    from .test_strategies_mnist import lenet
    param = lenet(caffe_fixtures, str(tmp_path / "lenet"))
    param.display = 0
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="ray", ps_shards=1, ray_data="local")
    try:
        assert "Data: each group's own data layers read its part of the database" in \
            capfd.readouterr().err
        driver.step(60)
        solver.test_all()
        # Two asynchronous groups learn (chance is 0.1); how far in 60 steps depends on the
        # host's load: 0.82-0.87 in five runs here, 0.786 once under a CI run beside another
        # test run, which a 0.8 bound failed.
        assert solver.test_scores[0][0][1] > 0.7
        assert sum(driver.feeder.records.values()) >= 60 * 64   # and those in flight
    finally:
        driver.close()
        solver.close()


def test_a_retried_push_is_applied_once(cluster, tmp_path):
    from cct.driver.ray_engine import StoreShard
    from cct.proto import caffe_pb2
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.0, lr_policy="fixed")
    shard = ray.remote(StoreShard).options(num_cpus=0).remote(
        0, p.SerializeToString(), "SGD", [(3,)], "<f4", [1.0], [0.0],
        str(tmp_path / "shard.npz"), 0)
    shard.set_weights.remote([np.ones(3, np.float32)])
    grad = [np.ones(3, np.float32)]
    assert ray.get(shard.push.remote(0, 1, grad, 0.1, 0, 0.0)) == 1
    assert ray.get(shard.push.remote(0, 1, grad, 0.1, 0, 0.0)) == 1     # the same push again
    assert ray.get(shard.push.remote(1, 1, grad, 0.1, 1, 0.0)) == 2     # another group's
    np.testing.assert_allclose(ray.get(shard.weights.remote())[0], 0.8, rtol=1e-6)
    ray.kill(shard)


# -- SMA on Ray: the learners' replicas in the driver, their gradients from actors -----------
def test_sma_on_ray_one_learner_alpha_0_is_the_threads_engines_plain_training(
        cluster, data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path)
    sma = dict(groups=1, strategy="sma", learners=1, sma_alpha=0.0)
    solver = Solver(param)
    driver = Driver(solver, engine="threads", devices="cpu:1", **sma)
    try:
        capfd.readouterr()
        driver.step(6)
        want_losses = losses(capfd.readouterr().err)
        want = [np.array(w) for w in driver.groups[0].params.weights()]
    finally:
        driver.close()
        solver.close()
    solver = Solver(param)
    z0 = params_of(solver)
    driver = Driver(solver, engine="ray", **sma)
    try:
        assert not driver.engine.shards          # the central model is the driver's solver
        capfd.readouterr()
        driver.step(6)
        assert losses(capfd.readouterr().err) == want_losses and len(want_losses) == 6
        for a, b in zip(want, driver.groups[0].params.weights()):
            assert np.array_equal(a, b)          # the learner trains as plain SGD does
        for a, b in zip(z0, params_of(solver)):
            assert np.array_equal(a, b)          # alpha 0: z never moves
    finally:
        driver.close()
        solver.close()


def test_sma_on_ray_snapshots_resume_exactly_through_a_killed_learner(
        cluster, data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0, max_iter=12)
    sma = dict(groups=2, engine="ray", strategy="sma", learners=2, sma_momentum=0.3)
    whole, _, _ = run(param, capfd, 12, **sma)
    _snapshot_after(param, 5, **sma)
    assert (tmp_path / "snap_iter_5.solverstate.cct.sma.npz").exists()
    solver = Solver(param)
    driver = Driver(solver, **sma)
    try:
        solver.restore(str(tmp_path / "snap_iter_5.solverstate"))
        driver.step(7)
        for a, b in zip(whole, params_of(solver)):
            assert np.array_equal(a, b)          # z, the .caffemodel's weights
        old = _kill_when(driver, lambda d: d.groups[1].pid, 0)
        driver.step(4)
        log = capfd.readouterr().err
        assert re.search(rf"group 1: the actor \(pid {old}\) died; Ray restarted it", log)
        assert solver.iter == 16 and len(driver.groups) == 2
        assert all(np.isfinite(p).all() for p in params_of(solver))
    finally:
        driver.close()
        solver.close()


def test_sma_on_ray_learners_auto_adds_learners_sharing_the_cores(cluster, data_list,  # noqa: F811
                                                                  tmp_path, capfd):
    param = solver_param(data_list, tmp_path, display=0, max_iter=40)
    solver = Solver(param)
    driver = Driver(solver, groups=1, engine="ray", strategy="sma", learners="auto",
                    batch_sizes=[4])
    try:
        driver.step(12)
        log = capfd.readouterr().err
        steps = re.findall(r"SMA autotune: (\d) learner\(s\): [\d.]+ records/s.*; "
                           r"(adding|removing)", log)
        assert steps and steps[0] == ("1", "adding"), log[-3000:]
        # Timing decides how far it goes; the learners are what the log says they are.
        count, action = int(steps[-1][0]), steps[-1][1]
        assert len(driver.groups) == (count + 1 if action == "adding" else count - 1)
        assert solver.iter == 12
        assert all(np.isfinite(p).all() for p in params_of(solver))
    finally:
        driver.close()
        solver.close()


@pytest.mark.parametrize("strategy", ["async", "sma"])
def test_a_device_group_on_ray(cluster, data_list, tmp_path, capfd, strategy):  # noqa: F811
    """A group on a device (the stand-in here; a GPU asks Ray for one) builds its net on that
    device in its actor and gives the numbers of the same group on CPUs (SMA: the learner's
    replica in the driver, its gradient from the device actor)."""
    param = solver_param(data_list, tmp_path)
    want_params, want_losses, _ = run(param, capfd, 4, groups=1, engine="ray", ps_shards=1,
                                      strategy=strategy)
    got_params, got_losses, driver = run(param, capfd, 4, groups=None, engine="ray",
                                         ps_shards=1, devices="standin", strategy=strategy)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    for a, b in zip(want_params, got_params):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * np.abs(a).max())


# -- issue 31: no error lines of Ray's in a normal run; hangs and --groups bounded ------------
RAY_ERROR_LINE = re.compile(r"^\[[\d\- :,]+ E \d+ \d+\]", re.M)   # Ray's C++ log, error level


def test_a_normal_ray_run_logs_no_error_line_of_rays(cluster, data_list, tmp_path,  # noqa: F811
                                                      capfd):
    param = solver_param(data_list, tmp_path, display=0)
    capfd.readouterr()
    run(param, capfd, 3, groups=2, engine="ray", ps_shards=2)
    time.sleep(1)       # the core worker's lines come from its own threads
    err = capfd.readouterr().err
    assert not RAY_ERROR_LINE.search(err), err[-3000:]
    assert "constructor arguments in the object store" not in err


def test_a_stopped_group_actor_is_dropped_after_the_timeout(cluster, data_list, tmp_path,  # noqa: F811
                                                            capfd):
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="ray", ps_shards=1, group_timeout=3)
    victim = driver.groups[1].pid
    try:
        driver.step(2)
        os.kill(victim, signal.SIGSTOP)
        driver.step(4)
        log = capfd.readouterr().err
        assert solver.iter == 6 and [g.index for g in driver.groups] == [0]
        assert re.search(rf"group 1 \(pid {victim}, .*\) failed and is dropped: NoAnswer: the "
                         rf"actor did not answer within 3 s", log), log[-3000:]
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
        driver.close()
        solver.close()


def test_more_ray_groups_than_the_clusters_cpus_are_refused(cluster, data_list,  # noqa: F811
                                                            tmp_path):
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    try:
        with pytest.raises(CCTError, match=r"--groups=4 with --engine=ray: each group's "
                                           r"actor takes 1 CPU and the cluster has 3: at most 3"):
            Driver(solver, groups=4, engine="ray", ps_shards=1)
        with pytest.raises(CCTError, match=r"--groups=1000000 with --engine=ray: .*lower "
                                           r"--groups"):
            Driver(solver, groups=1000000, engine="ray", ps_shards=1)
    finally:
        solver.close()

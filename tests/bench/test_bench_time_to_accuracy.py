"""bench/bench_time_to_accuracy.py's report: seconds to the target per run, medians, ratios to
the caffe run of the same round; per-work output names; lenet_adam's solver from Caffe's
lenet_solver_adam.prototxt."""
import importlib.util
import math
import pathlib

import pytest

spec = importlib.util.spec_from_file_location(
    "bench_time_to_accuracy",
    pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_time_to_accuracy.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def run(arm, rnd, seconds_at, work="lenet", probe=0.0):
    """A run whose accuracy reaches 0.98 at the given seconds (None: never)."""
    curve = [{"iter": 100, "seconds": probe + 1.0, "accuracy": 0.9, "loss": 0.5}]
    if seconds_at is not None:
        curve.append({"iter": 200, "seconds": seconds_at, "accuracy": 0.981, "loss": 0.1})
    return {"work": work, "arm": arm, "round": rnd, "curve": curve, "probe_seconds": probe,
            "chosen": "" if arm == "caffe" else f"lr {rnd}"}


def test_report_gives_every_run_the_median_and_both_ratios():
    runs = [run("caffe", 0, 20.0), run("optimize", 0, 10.0, probe=2.0),
            run("caffe", 1, 24.0), run("optimize", 1, 16.0, probe=3.0),
            run("caffe", 2, 22.0), run("optimize", 2, 11.0, probe=2.5)]
    lines = bench.report(runs, "lenet", ["caffe", "optimize"], 0.98, 0.3)
    assert len(lines) == 4
    caffe, opt = lines[2], lines[3]
    assert "| 20 (200), 24 (200), 22 (200) | 22 | 1.00x, 1.00x, 1.00x | 1.00x | 0, 0, 0 |" in caffe
    # Per round 20/10, 24/16, 22/11; medians 22 / 11.
    assert "| 10 (200), 16 (200), 11 (200) | 11 | 2.00x, 1.50x, 2.00x | 2.00x |" in opt
    assert "| 2, 3, 2.5 | lr 0; lr 1; lr 2 |" in opt


def test_a_run_that_never_reached_the_target_counts_as_infinitely_slow():
    runs = [run("caffe", 0, 20.0), run("omnivore", 0, None, probe=4.0),
            run("caffe", 1, 20.0), run("omnivore", 1, None, probe=4.0)]
    omnivore = bench.report(runs, "lenet", ["caffe", "omnivore"], 0.98, 0.3)[3]
    assert "> 5 (> 100)" in omnivore and "not reached" in omnivore
    assert "| -, - | - |" in omnivore
    assert math.isinf(bench._seconds(bench.to_target(runs[1], 0.98, 0.3)))


def test_cifar_is_judged_by_the_held_out_loss():
    r = run("caffe", 0, 30.0, work="cifar10_quick")
    assert bench.to_target(r, 0.98, 0.3)["seconds"] == 30.0
    assert bench.to_target(r, 0.98, 0.05) is None


def test_out_path_is_per_work():
    assert bench.out_path("b/t_{work}.json", "lenet", ["lenet"]) == "b/t_lenet.json"
    assert bench.out_path("/tmp/t.json", "lenet", ["lenet"]) == "/tmp/t.json"
    assert bench.out_path("/tmp/t.png", "lenet_adam", ["lenet", "lenet_adam"]) == \
        "/tmp/t_lenet_adam.png"


def test_lenet_adam_takes_caffe_s_adam_update_and_keeps_lenet_s_test():
    zoo = bench.default_zoo()
    if not (zoo / bench.ADAM_SOLVER).exists():
        pytest.skip(f"no {bench.ADAM_SOLVER} in {zoo}")
    param = bench.adam_solver(zoo, "train_db", "test_db", 50)
    assert param.type == "Adam" and param.lr_policy == "fixed"
    assert param.base_lr == pytest.approx(0.001) and param.momentum == pytest.approx(0.9)
    assert param.momentum2 == pytest.approx(0.999) and param.delta == pytest.approx(1e-8)
    assert param.weight_decay == 0 and not param.HasField("gamma")
    assert list(param.test_iter) == [20] and param.random_seed == 1701 and param.max_iter == 50


def test_optimize_args_must_be_a_json_object():
    with pytest.raises(SystemExit):
        bench.main(["--optimize-args", "[1]"])
    with pytest.raises(SystemExit):
        bench.main(["--work", "alexnet"])


def test_seed_per_round_seeds_every_arm_of_a_round_alike(monkeypatch):
    """--seed-per-round: round r's solver is seeded 1701 + r whatever the arm; without it, the
    work's own seed (1701) in every round."""
    import cct.api
    from cct.proto import caffe_pb2
    monkeypatch.setattr(bench, "mnist_lmdbs", lambda d: ("train", "test"))
    monkeypatch.setattr(bench, "lenet_solver",
                        lambda *a: caffe_pb2.SolverParameter(random_seed=1701))
    monkeypatch.setattr(cct.api, "Solver", lambda param: param)
    job = {"work": "lenet", "cap": 10, "data_dir": "d", "zoo": "z"}
    assert bench.solver_for(job).random_seed == 1701
    assert bench.solver_for({**job, "seed": None}).random_seed == 1701
    assert bench.solver_for({**job, "seed": 1703}).random_seed == 1703


def test_solver_args_replace_the_works_settings(monkeypatch, capsys):
    """--solver-args: settings already good (e.g. CIFAR10-quick at lr 0.009) replace the
    work's; a name that is not a scalar field of SolverParameter is refused by name."""
    import cct.api
    from cct.proto import caffe_pb2
    monkeypatch.setattr(bench, "mnist_lmdbs", lambda d: ("train", "test"))
    monkeypatch.setattr(bench, "lenet_solver",
                        lambda *a: caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9))
    monkeypatch.setattr(cct.api, "Solver", lambda param: param)
    job = {"work": "lenet", "cap": 10, "data_dir": "d", "zoo": "z",
           "solver_args": {"base_lr": 0.09, "momentum": 0.675}}
    param = bench.solver_for(job)
    assert param.base_lr == pytest.approx(0.09) and param.momentum == pytest.approx(0.675)
    for bad in ('{"base_lrr": 0.1}', '{"test_iter": 5}', '{"base_lr": [0.1]}', '[0.1]',
                '{"base_lr": "fast"}'):
        with pytest.raises(SystemExit):
            bench.main(["--solver-args", bad])
        assert "--solver-args" in capsys.readouterr().err

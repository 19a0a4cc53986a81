"""Planning past this machine (cct/optimizer/cluster.py): the scale-out model against
hand-computed values, the -cluster form and its errors, and `cct plan -cluster` printing a plan
for a 4-node cluster while writing nothing."""
import os

import pytest

from cct import cli
from cct.errors import CCTError
from cct.optimizer.cluster import Cluster, ClusterModel, parse_cluster, updates_per_second

from ..test_scheduler import data_list  # noqa: F401  (fixture)
from .test_optimizer import _solver_file


def test_scale_out_model_against_hand_computed_values():
    # T 20 ms, M 1 MB, B 1 GB/s: 2M/B = 2 ms; c 1 ms; one shard's apply 1 ms.
    kw = dict(step=0.020, model_bytes=1e6, bandwidth=1e9, overhead=0.001, apply=0.001)
    # 4 nodes: 4 / 23 ms = 173.9/s, under the shard's 1000/s and its link's 1e9/2e6 = 500/s.
    assert updates_per_second(4, **kw) == pytest.approx(4 / 0.023)
    # 64 nodes: 2783/s from the groups, so the one shard's link bounds it at 500/s ...
    assert updates_per_second(64, **kw) == pytest.approx(500.0)
    # ... four shards lift the link bound to 2000/s, under the shards' 4000/s.
    assert updates_per_second(64, shards=4, **kw) == pytest.approx(2000.0)
    # A slow apply (10 ms) bounds one shard at 100/s.
    assert updates_per_second(64, **dict(kw, apply=0.010)) == pytest.approx(100.0)
    # bench_ray's LeNet row (bench/RESULTS.md): T 21.47 ms, M 1.72 MB, B 4.17 GB/s, c 10.6 ms.
    assert updates_per_second(1, 0.02147, 1.72e6, 4.17e9, 0.0106, 0.00019) == \
        pytest.approx(1 / (0.02147 + 2 * 1.72e6 / 4.17e9 + 0.0106))


def test_bench_ray_uses_the_same_function():
    import bench.bench_ray as bench_ray
    assert bench_ray.predict is updates_per_second


def test_cluster_model_he_per_group_count():
    model = ClusterModel(Cluster(nodes=4, bandwidth=1e9, shards=1), model_bytes=1e6,
                         apply=0.001)

    class C:
        def __init__(self, groups):
            self.groups, self.batch = groups, 16
    assert model(C(1), 0.020) == pytest.approx(0.020)        # alone on its node: T
    # later measurements at the same batch do not move T
    assert model(C(2), 0.5) == pytest.approx(0.022 / 2)
    assert model(C(4), 0.5) == pytest.approx(0.022 / 4)


def test_parse_cluster_and_its_errors():
    c = parse_cluster("nodes=4,bandwidth=1.25e9")
    assert (c.nodes, c.bandwidth, c.shards, c.overhead) == (4, 1.25e9, None, 0.0)
    assert c.groups() == [1, 2, 4]
    assert parse_cluster("nodes=6, bandwidth=1e9, shards=2, overhead=0.01").groups() == \
        [1, 2, 4, 6]
    for text, why in (("nodes=4", "'bandwidth' is missing"),
                      ("nodes=four,bandwidth=1e9", "nodes must be an integer, got 'four'"),
                      ("nodes=4,bandwidth=0", "bandwidth must be positive"),
                      ("nodes=4,bandwidth=1e9,links=2", "unknown key 'links'"),
                      ("4,1e9", "'4' is not key=value")):
        with pytest.raises(CCTError) as e:
            parse_cluster(text)
        assert why in str(e.value)
        assert "expected nodes=N,bandwidth=BYTES_PER_S[,shards=S]" in str(e.value)


def test_cct_plan_for_a_4_node_cluster_writes_nothing(data_list, tmp_path, capfd,  # noqa: F811
                                                      monkeypatch):
    path = _solver_file(data_list, tmp_path, max_iter=40, snapshot=10)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert cli.main(["plan", "-solver", path, "-cluster", "nodes=4,bandwidth=1.25e9",
                     "-staleness", "exponential"]) == 0
    err = capfd.readouterr().err
    assert sorted(os.listdir(tmp_path)) == before
    assert "Cluster: 4 nodes at 1.25 GB/s, auto shards" in err
    assert "g=1:" in err and "g=4:" in err
    assert "HE s/iter" in err and "wins: predicted" in err
    # the 4-group rows carry the model's HE for 4 nodes, not the simulated engine's timing
    he4 = err.split("g=4: ")[1].split(" s/iter")[0]
    rows = [line.split("optimizer.py:0]")[1].split() for line in err.splitlines()
            if "optimizer.py:0]" in line and " async " in line]
    assert [r for r in rows if r[2] == "4"]
    assert all(r[6] == he4 for r in rows if r[2] == "4")

def test_cct_plan_cluster_error_is_one_clear_line(data_list, tmp_path, capfd):  # noqa: F811
    path = _solver_file(data_list, tmp_path, max_iter=40)
    assert cli.main(["plan", "-solver", path, "-cluster", "nodes=4"]) == 1
    err = capfd.readouterr().err
    assert "'bandwidth' is missing; expected nodes=N,bandwidth=BYTES_PER_S" in err

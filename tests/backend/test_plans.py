"""Kernel plans chosen once and kept (cct/backend/plans.py, csrc/conv.cpp, csrc/gemm.cpp): the
first call's result is the chosen plan's, an installed table is what runs, deterministic mode
times nothing, the machine's cache is written, merged and read back, and the race that picks a
plan (csrc/race.h) runs the candidates it should."""
import json

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, plans

from .kernel_cases import close, conv_arrays, rand

# Big enough that both partitionings and both GEMM orders are candidates, small enough to be quick.
GEOMETRY = (6, 5, 11, 11, 7, (3, 3), (1, 1), (1, 1), (1, 1), 1)


@pytest.fixture
def fresh_plans():
    """Empty plan tables and two threads; afterwards empty again, measuring, threads restored."""
    threads = cpu.get_num_threads()
    cpu.set_num_threads(2)
    _C.clear_plans()
    yield
    plans.set_deterministic(False)
    _C.clear_plans()
    cpu.set_num_threads(threads)


def conv_step(x, weight, bias, dy, geom, dweight):
    """Forward, backward data and an accumulating backward weight: every planned kernel."""
    y = cpu.conv_forward(x, weight, bias, *geom)
    dx = cpu.conv_backward_data(dy, weight, x.shape, *geom)
    cpu.conv_backward_weight(x, dy, *geom, out=dweight, accumulate=True)
    return y, dx, dweight


def test_first_call_gives_the_chosen_plans_result(fresh_plans):
    """The call that times the plans returns what every later call returns, although the
    plans it timed round differently (the last one timed need not be the fastest)."""
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    start = np.random.default_rng(3).standard_normal(weight.shape).astype(np.float32)
    first = conv_step(x, weight, bias, dy, geom, start.copy())
    assert _C.plan_count() >= 3
    for _ in range(2):
        again = conv_step(x, weight, bias, dy, geom, start.copy())
        for a, b in zip(first, again):
            assert np.array_equal(a, b)


def forced_result(x, weight, bias, dy, geom, start, mode, layout=1):
    """The result with `mode`'s partitions and `layout`'s layout (set_conv_layout: 1 lowered,
    3 direct where it applies)."""
    _C.set_partition_mode(mode)
    _C.set_conv_layout(layout)
    try:
        return conv_step(x, weight, bias, dy, geom, start.copy())
    finally:
        _C.set_partition_mode(0)
        _C.set_conv_layout(0)


@pytest.mark.parametrize("parts", [1, 2])
def test_an_installed_table_is_what_runs(fresh_plans, parts):
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    start = np.zeros(weight.shape, np.float32)
    conv_step(x, weight, bias, dy, geom, start.copy())
    table = plans.table()
    for row in table["conv"]:
        row[5:8] = [parts, 0, False]
    _C.clear_plans()
    assert plans.install(table) == (len(table["conv"]) + len(table["gemm"])
                                    + len(table.get("gemm_batch", [])))
    mine = conv_step(x, weight, bias, dy, geom, start.copy())
    assert _C.plan_count() == (len(table["conv"]) + len(table["gemm"])   # nothing timed
                               + len(table.get("gemm_batch", [])))
    want = forced_result(x, weight, bias, dy, geom, start, parts)
    for a, b in zip(mine, want):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("mode,partition,deterministic", [(0, 0, False), (4, 0, False),
                                                         (0, 2, False), (0, 0, True)])
def test_conv_modes_spells_out_the_kernels_modes(fresh_plans, mode, partition, deterministic):
    """plans.conv_modes reads a row's modes as conv.cpp's plan_modes wrote them (its radix is
    the number of layouts, which grows with them)."""
    x, weight, bias, _, geom = conv_arrays(GEOMETRY, np.float32)
    plans.set_deterministic(deterministic)
    _C.set_conv_layout(mode)
    _C.set_partition_mode(partition)
    try:
        cpu.conv_forward(x, weight, bias, *geom)
    finally:
        _C.set_conv_layout(0)
        _C.set_partition_mode(0)
    (row,) = _C.conv_plan_table()
    assert plans.conv_modes(row[4]) == {"layout_mode": mode, "partition_mode": partition,
                                        "measured": not deterministic, "bf16": False,
                                        "caffe_engine": False}
    assert plans.CONV_LAYOUT_NAMES[row[6]] in ("lowered", "winograd", "direct", "direct16",
                                               "winograd4x4", "pointwise")


def test_table_round_trips_through_json(fresh_plans):
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    conv_step(x, weight, bias, dy, geom, np.zeros(weight.shape, np.float32))
    table = json.loads(json.dumps(plans.table()))
    _C.clear_plans()
    plans.install(table)
    assert plans.table() == table


def test_adding_into_c_and_overwriting_it_are_measured_apart(fresh_plans):
    """One shape, two races: OpenBLAS overwrites C in two passes and a bf16 kernel adds in one
    that reads C, so which order (and precision) is faster depends on beta."""
    a, b = rand((24, 300), np.float32, 1), rand((300, 200), np.float32, 2)
    out = np.zeros((24, 200), np.float32)
    cpu.matmul(a, b, out=out)
    cpu.matmul(a, b, out=out, accumulate=True)
    rows = [r for r in plans.table()["gemm"] if r[2:5] == [24, 200, 300]]
    assert sorted(r[7] for r in rows) == [False, True]
    close(out, 2 * (a.astype(np.float64) @ b).astype(np.float32), np.float32)


def test_a_table_from_before_beta_was_in_the_key_holds_its_choice_for_both(fresh_plans):
    old = {"gemm": [[False, True, 24, 200, 300, 4, 1, True]]}
    assert plans.install(old) == 2
    assert sorted(plans.table()["gemm"]) == [[False, True, 24, 200, 300, 4, 1, False, True],
                                             [False, True, 24, 200, 300, 4, 1, True, True]]


def test_a_batched_row_from_before_the_element_size_is_a_float32_row(fresh_plans):
    """Batched rows written before batches raced bf16 (nine fields) were float32 calls': a run
    resumed from such a table keeps their choices, under element size 4."""
    old = {"gemm_batch": [[False, True, 24, 40, 16, 16, 1, True, 0]]}
    assert plans.install(old) == 1
    assert plans.table()["gemm_batch"] == [[False, True, 24, 40, 16, 16, 4, 1, True, 0]]


@pytest.mark.parametrize("bad", [
    [], {"conv": 3}, {"conv": [[0, [1] * 16, 4, 1, 0, 1, 0]]},
    {"conv": [[0, [1] * 15, 4, 1, 0, 1, 0, False]]},
    {"conv": [[0, [1] * 16, 4, 1, 0, 1, 0, "no"]]},
    {"conv": [[7, [1] * 16, 4, 1, 0, 1, 0, False]]},
    {"conv": [[0, [1] * 16, 4, 0, 0, 1, 0, False]]},
    {"conv": [[0, [1] * 16, 4, 1, 0, 1, 0, False]], "gemm": [[True, False, 1, 2, 3, 4, 1, 1]]},
    {"gemm": [[True, False, 1.5, 2, 3, 4, 1, True]]},
    {"gemm": [[True, False, 2 ** 70, 2, 3, 4, 1, True]]},
    {"gemm": [[True, False, 1, 2, 3, 4, 1, 0, True]]},
    {"gemm": [[True, False, 1, 2, 3, 4, 1, True, 2]]},
    {"conv": [], "bf16": "amx"},
], ids=str)
def test_a_damaged_table_is_refused_whole(fresh_plans, bad):
    with pytest.raises(ValueError):
        plans.install(bad)
    assert _C.plan_count() == 0


def test_deterministic_mode_gives_the_rule_plan_without_timing(fresh_plans):
    plans.set_deterministic(True)
    assert plans.deterministic()
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    start = np.zeros(weight.shape, np.float32)
    mine = conv_step(x, weight, bias, dy, geom, start.copy())
    table = plans.table()
    # one partition a thread; GEOMETRY's 7 filters over 5 channels are thin: direct, on AVX2
    layout = 2 if _C.cpu_has_direct_conv() else 0
    assert {tuple(r[5:8]) for r in table["conv"]} == {(2, layout, False)}
    assert all(r[4] >= 15 for r in table["conv"])     # never taken for a measured plan
    assert not any(r[8] for r in table["gemm"])       # the direct operand order
    plans.set_deterministic(False)
    _C.set_gemm_order(1)
    try:
        want = forced_result(x, weight, bias, dy, geom, start, 2, layout=3)
    finally:
        _C.set_gemm_order(0)
    for a, b in zip(mine, want):
        assert np.array_equal(a, b)


def rule_layouts(case, dtype):
    """The layouts the rule gives a conv_arrays case's forward, backward data and backward
    weight (0 lowered, 2 direct, 3 Winograd), from fresh plans."""
    _C.clear_plans()
    x, weight, bias, dy, geom = conv_arrays(case, dtype)
    conv_step(x, weight, bias, dy, geom, np.zeros(weight.shape, dtype))
    got = {r[0]: r[6] for r in plans.table()["conv"]}
    return tuple(got[k] for k in range(3))


@pytest.mark.skipif(not _C.cpu_has_direct_conv(), reason="the direct layout needs AVX2 and FMA")
def test_the_rule_takes_the_direct_layout_on_thin_layers_only(fresh_plans):
    """Direct where the lowered GEMM has 4 to 64 rows and, for backward data, the flipped
    convolution's pad is no larger than the layer's; lowered elsewhere (and for float64)."""
    plans.set_deterministic(True)
    cases = {  # case -> layouts of forward, backward data, backward weight (2 direct)
        (2, 6, 9, 9, 8, (5, 5), (1, 1), (2, 2), (1, 1), 1): (2, 2, 2),    # CIFAR10-quick-like
        (2, 6, 9, 9, 8, (5, 5), (1, 1), (0, 0), (1, 1), 1): (2, 0, 2),    # pad 0: data lowered
        (2, 2, 9, 9, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1): (2, 0, 2),    # 2 channels: data lowered
        (2, 6, 9, 9, 66, (3, 3), (1, 1), (1, 1), (1, 1), 1): (0, 2, 0),   # 66 filters: lowered
        (2, 8, 9, 9, 66, (3, 3), (1, 1), (1, 1), (1, 1), 2): (2, 2, 2),   # 33 and 4 per group
        # strided: the phase form (layouts 5 phase-direct, 6 phase-winograd) where it adds at
        # most a third more taps: not for a 3x3 stride-2 layer (16 taps for 9); GoogLeNet's
        # conv1 in small (64 for 49) is a thin 4x4 layer, its flipped pad too large for data
        (2, 6, 9, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1), 1): (0, 0, 0),
        (2, 3, 17, 16, 8, (7, 7), (2, 2), (3, 3), (1, 1), 1): (5, 0, 5),
    }
    for case, want in cases.items():
        assert rule_layouts(case, np.float32) == want, case
    assert rule_layouts(list(cases)[0], np.float64) == (0, 0, 0)


def test_the_rule_takes_winograd_on_layers_of_16_channels_or_more(fresh_plans):
    """Winograd F(2x2) (layout 3) on 3x3 and 5x5 stride-1 layers with 16 or more channels in
    and out per group, except backward data where the flipped pad exceeds the layer's; not
    F(4x4, 3x3) (4), and never for float64."""
    plans.set_deterministic(True)
    thin = 2 if _C.cpu_has_direct_conv() else 0
    cases = {  # case -> layouts of forward, backward data, backward weight
        (2, 16, 9, 9, 16, (5, 5), (1, 1), (2, 2), (1, 1), 1): (3, 3, 3),
        (2, 16, 9, 9, 16, (5, 5), (1, 1), (0, 0), (1, 1), 1): (3, 0, 3),  # pad 0: data not
        (2, 32, 13, 13, 96, (3, 3), (1, 1), (1, 1), (1, 1), 2): (3, 3, 3),  # 16 / 48 a group
        (2, 15, 9, 9, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1): (thin, thin, thin),  # 15 in
        (2, 16, 9, 9, 16, (7, 7), (1, 1), (3, 3), (1, 1), 1): (thin, thin, thin),  # 7x7
        # CaffeNet's conv1 in small (11x11 stride 4): F(2x2) on its 3x3 phase form of 48
        # channels (layout 6), backward data lowered (the flipped pad 2 exceeds the layer's 0)
        (2, 3, 27, 27, 16, (11, 11), (4, 4), (0, 0), (1, 1), 1): (6, 0, 6),
    }
    for case, want in cases.items():
        assert rule_layouts(case, np.float32) == want, case
    assert rule_layouts(list(cases)[0], np.float64) == (0, 0, 0)


@pytest.fixture
def machine_cache(tmp_path, monkeypatch):
    """The machine cache in a scratch folder, as if this process had not loaded it yet."""
    monkeypatch.setenv("CCT_PLAN_CACHE", str(tmp_path))
    monkeypatch.setitem(plans._state, "loaded", False)
    monkeypatch.setitem(plans._state, "path", None)
    monkeypatch.setitem(plans._state, "saved_count", None)
    return tmp_path


def test_machine_cache_is_written_merged_and_read(fresh_plans, machine_cache):
    plans.use_machine_cache()
    path = plans.cache_path()
    assert path.startswith(str(machine_cache))
    plans.persist()                               # nothing timed yet: nothing written
    assert not (machine_cache / path.split("/")[-1]).exists()
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    conv_step(x, weight, bias, dy, geom, np.zeros(weight.shape, np.float32))
    # Another run wrote a different choice for one of our shapes first: the file keeps its.
    theirs = plans.table()
    theirs["conv"][0][5] = 3 - theirs["conv"][0][5]
    with open(path, "w") as f:
        json.dump(dict(theirs, format=plans.FORMAT), f)
    plans.persist()
    with open(path) as f:
        saved = json.load(f)
    assert saved["fingerprint"] == plans.fingerprint()
    assert sorted(map(json.dumps, saved["conv"])) == sorted(map(json.dumps, theirs["conv"]))
    assert len(saved["gemm"]) == len(theirs["gemm"])
    # The batched GEMMs' table, where MKL is offered (their races).
    assert len(saved.get("gemm_batch", [])) == len(theirs.get("gemm_batch", []))
    _C.clear_plans()
    plans._state["loaded"] = False
    plans.use_machine_cache()
    assert _C.plan_count() == (len(saved["conv"]) + len(saved["gemm"])
                               + len(saved.get("gemm_batch", [])))
    assert sorted(map(json.dumps, plans.table()["conv"])) == sorted(map(json.dumps, saved["conv"]))


def test_the_bf16_engine_is_a_plan_cached_with_the_others(fresh_plans, machine_cache,
                                                         monkeypatch):
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_saved", None)
    plans.use_machine_cache()
    assert "bf16" not in plans.table()
    monkeypatch.setitem(plans._state, "bf16_shapes", [])
    # as precision.py's race does: the engine, and those raced shape by shape besides it
    plans.record_bf16_engine("mkl", ["avx512bf16"])
    plans.persist()                              # a new choice, no new shapes: written
    with open(plans.cache_path()) as f:
        written = json.load(f)
    assert written["bf16"] == "mkl" and written["bf16_shapes"] == ["avx512bf16"]
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_shapes", [])
    plans._state["loaded"] = False
    plans.use_machine_cache()
    assert plans.bf16_engine() == "mkl" and plans.table()["bf16"] == "mkl"
    assert plans.bf16_shape_engines() == ["avx512bf16"]


def test_a_damaged_machine_cache_is_ignored_with_a_warning(fresh_plans, machine_cache, capfd):
    path = plans.cache_path()
    (machine_cache / path.split("/")[-1]).write_text('{"format": 1, "conv": [[1, 2]]}')
    plans.use_machine_cache()
    assert _C.plan_count() == 0
    assert "ignoring the kernel plan cache" in capfd.readouterr().err


def test_cache_off_and_deterministic_mode_leave_it_alone(fresh_plans, machine_cache, monkeypatch):
    monkeypatch.setenv("CCT_PLAN_CACHE", "off")
    assert plans.cache_path() is None
    monkeypatch.setenv("CCT_PLAN_CACHE", str(machine_cache))
    plans.set_deterministic(True)
    plans.use_machine_cache()
    x, weight, bias, dy, geom = conv_arrays(GEOMETRY, np.float32)
    conv_step(x, weight, bias, dy, geom, np.zeros(weight.shape, np.float32))
    plans.persist()
    assert list(machine_cache.iterdir()) == []


# The plans' race (csrc/race.h) on given times: each candidate's list is its seconds on its
# successive runs, the last repeated.
@pytest.mark.parametrize("times, skip_over, fastest, runs", [
    # a clear winner: two rounds, no more
    ([[1.0], [2.0], [1.5]], float("inf"), 0, [0, 1, 2, 0, 1, 2]),
    # the GEMMs' rule: a candidate over twice the best first time is not run again; the
    # near-tie (within 15%) runs twice more, then the race ends
    ([[1.0], [2.5], [1.1]], 2.0, 0, [0, 1, 2, 0, 2, 0, 2, 0, 2]),
    # a disturbance over both of a candidate's first runs: timed close to the best, it runs
    # again and wins; then it leads by more than 15% and the race ends
    ([[1.0], [1.1, 1.05, 0.8]], float("inf"), 1, [0, 1, 0, 1, 0, 1]),
    # a true tie: two more rounds, and the earlier candidate
    ([[1.0], [1.0]], float("inf"), 0, [0, 1, 0, 1, 0, 1, 0, 1]),
    # one candidate: its two runs
    ([[1.0]], float("inf"), 0, [0, 0]),
])
def test_the_race_times_the_near_ties_again(times, skip_over, fastest, runs):
    assert _C.plan_race(times, skip_over) == (fastest, runs[-1], runs)


def test_the_race_refuses_a_candidate_without_a_time():
    with pytest.raises(ValueError, match="every candidate needs a time"):
        _C.plan_race([[1.0], []], 2.0)

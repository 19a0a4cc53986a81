"""Omnivore's cold start as a baseline (cct/optimizer/omnivore.py): its scoring, HE and skip
rules against hand-computed values, and a search on the tiny HDF5 net that branches in memory
and leaves the run where it was."""
import math

import numpy as np
import pytest

from cct.optimizer.omnivore import (OmnivoreSearch, Probe, display_lines, score,
                                    seconds_per_iteration)

from ..test_scheduler import data_list  # noqa: F401  (fixture)
from .test_optimizer import _solver, _state


def test_display_lines_score_and_he_by_hand():
    record = [(0.1 * (i + 1), float(i)) for i in range(60)]       # 12 display lines of 5
    lines = display_lines(record)
    assert len(lines) == 12 and lines[0] == (pytest.approx(0.5), 2.0)
    assert score(lines) == pytest.approx(np.mean([2.0 + 5 * k for k in range(2, 12)]))
    # N = 12, k = 12 - 6 = 6: (t[11] - t[6]) / 5 / 5 = (6.0 - 3.5) / 25 = 0.1 s/iteration
    assert seconds_per_iteration(lines) == pytest.approx(0.1)
    assert math.isnan(score(lines[:3] + [(1.0, math.nan)]))


def test_grid_and_skip_rules():
    s = OmnivoreSearch.__new__(OmnivoreSearch)
    assert s._grid(None, (1e-2, 1e-4)) == [(1e-4, 0.9), (1e-2, 0.9)]
    prev = Probe(1, 0.01, 0.9)
    kept = [(lr, mu) for lr, mu in s._grid(prev, ()) if not s._skip(lr, mu, prev, None)]
    # after a g = 1 optimum of (lr*, 0.9): {mu <= 0.9 at lr*} and {mu >= 0.9 at lr*/10}
    assert kept == [(0.001, 0.9), (0.01, 0.0), (0.01, 0.3), (0.01, 0.6), (0.01, 0.9)]
    assert s._skip(0.01, 0.6, Probe(2, 0.01, 0.6), (0.01, 0.3)) == "skipped: at or above a NaN"


def test_search_branches_and_leaves_the_run_where_it_was(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=40)
    search = OmnivoreSearch(solver, probe_seconds=0.02, groups=[1, 2], engine="simulated")
    try:
        solver.step(2)
        before = _state(solver)
        choice = search.search()
        after = _state(solver)
        for a, b in zip(before[0] + before[1], after[0] + after[1]):
            assert np.array_equal(a, b)
        assert before[2:] == after[2:]
        g1 = [p for p in choice.probes if p.groups == 1]
        assert [(p.lr, p.momentum) for p in g1] == [(1e-4, 0.9), (1e-3, 0.9), (1e-2, 0.9),
                                                    (1e-1, 0.9)]
        assert all(p.lines >= 1 for p in g1) and 1 in choice.he
        assert sum("chosen" in p.status for p in choice.probes) == 1
        search.configure(choice)
        search.step(3)
        assert solver.iter == 5
    finally:
        search.close()
        solver.close()

"""Issue 33, items 1 and 3: no evidence, no spending. The evidence test (`leaving`), the
plateau escape (the lr ladder upward, then the largest lr that has not diverged going on
until it falls), the fallback to the solver's settings when nothing falls within the probe
share, and multi-group candidates predicted from their one-group twin when their own short
probes say "never". The search logic runs on synthetic probe curves (a fake `probe` that
writes what a plateau of known length would give), so each rule is checked on its own; one
run on the tiny net checks the fallback on real probes."""
import math

import numpy as np
import pytest

from cct.api import Solver
from cct.optimizer import Optimizer
from cct.optimizer.curve import fit_power_law
from cct.optimizer.curve import leaving
from cct.optimizer.plan import TRUNK, _fastest_round, _short

from ..test_scheduler import data_list, solver_param  # noqa: F401  (fixture)


def test_leaving_needs_a_drop_beyond_the_noise_and_two_percent():
    rng = np.random.default_rng(0)
    flat = 2.3026 + 0.003 * rng.standard_normal(200)
    assert not leaving(flat)
    drift = np.linspace(2.303, 2.293, 200) + 0.003 * rng.standard_normal(200)  # 0.4%
    assert not leaving(drift)
    falling = np.linspace(2.3, 1.0, 20) + 0.05 * rng.standard_normal(20)
    assert leaving(falling)
    assert not leaving(falling[:5])                      # too short to say
    assert not leaving(list(falling[:19]) + [math.nan])  # a NaN is no evidence
    noisy = np.concatenate([np.full(10, 2.3), np.full(10, 2.2)]) + 0.5 * rng.standard_normal(20)
    assert not leaving(noisy)                            # 4% down, within the noise


class Plateau:
    """Fake probes: the loss sits at 2.3 until iteration ``escape(lr)`` (fewer for larger
    lr), then falls as a power law; lr at or above ``diverge`` blows up after 30 iterations.
    Records the iterations each lr was probed for."""

    def __init__(self, opt, escape, diverge):
        self.opt, self.escape, self.diverge = opt, escape, diverge
        self.iters = {}

    def losses(self, lr, n):
        rng = np.random.default_rng(int(lr * 1e6) % 1000)
        e = self.escape(lr)
        out = []
        for t in range(1, n + 1):
            if lr >= self.diverge and t > 30:
                v = 2.3 * 1.2 ** (t - 30)
            elif t <= e:
                v = 2.3
            else:
                v = 2.3 * ((t - e + 10) / 10.0) ** -0.8
            out.append(v + 0.002 * rng.standard_normal())
        return out

    def reshape(self, above, change):
        """Probes of an lr over ``above`` give ``change(losses)`` instead."""
        inner = self.losses
        self.losses = lambda lr, n: change(inner(lr, n)) if lr > above else inner(lr, n)

    def __call__(self, cand, iters, keep=False, due=False):
        cand.probed += iters
        self.iters[(cand.groups, cand.lr)] = cand.probed
        cand.losses = self.losses(cand.lr, cand.probed)
        cand.state = {"fake": cand.probed} if keep else None
        cand.fit = fit_power_law(cand.losses, self.opt.solver.iter)
        if cand.fit.diverged:
            cand.status = "pruned: diverged"
            cand.drop_branch()
        else:
            cand.status = "kept"
        return cand


@pytest.fixture
def opt(data_list, tmp_path):  # noqa: F811
    solver = Solver(solver_param(data_list, tmp_path, max_iter=100000, base_lr=0.001,
                                 display=0))
    o = Optimizer(solver, engine="simulated", groups=[1], momentum_offsets=(0.0,),
                  probe_iters=20)
    o.measure_he = lambda c, keep=False: setattr(c, "he", 0.01) or 0.01
    yield o
    o.close()
    solver.close()


def test_a_plateau_climbs_the_ladder_and_keeps_the_largest_lr_that_leaves_it(opt):
    fake = Plateau(opt, escape=lambda lr: 2.7 / lr, diverge=0.05)   # 0.027: 100 iterations
    opt.probe = fake
    plan = opt.make_plan(limit=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.027)
    assert leaving(plan.winner.losses)
    # the solver's own lr went on first, doubling to TRUNK probes (it would leave at 2,700);
    # then the ladder went up from it to the first that diverged (0.081), which went on
    # until it did; 0.027 then doubled until it fell; the rungs between stayed at 20
    probed = {round(lr, 6): n for (_, lr), n in fake.iters.items()}
    assert probed[0.001] == TRUNK * 20
    assert probed[0.003] == probed[0.009] == 20
    assert probed[0.081] >= 40 and probed[0.027] >= 100
    assert "plateau at lr 0.001: lr 0.027 left it" in plan.plateau
    assert "lr 0.081 diverged" in plan.plateau
    # no momentum probes on a plateau: they would each have to leave it too
    assert all(c.momentum == pytest.approx(0.9) for c in plan.candidates)
    others = [c for c in plan.candidates if c is not plan.winner and c.lr < 0.027]
    assert all(c.status.startswith("pruned: on the plateau") for c in others)


def test_no_fall_within_the_probe_share_trains_with_the_solver_settings(opt):
    fake = Plateau(opt, escape=lambda lr: 1e9, diverge=1e9)          # nothing ever leaves
    opt.probe = fake
    opt.probe_share = 0.001          # 0.001 x 100,000 x 0.01 s = 1 s of probes
    plan = opt.make_plan(limit=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.001)
    assert plan.winner.momentum == pytest.approx(0.9)
    assert "training with the solver's settings" in plan.plateau
    # and the spending stopped: the solver's own lr (the trunk) at most TRUNK probes, the
    # ladder's rungs no doubling past the share
    probed = {round(lr, 6): n for (_, lr), n in fake.iters.items()}
    assert probed.pop(0.001) <= TRUNK * 20
    assert max(probed.values()) <= 40


def test_the_solvers_lr_leaving_the_plateau_on_its_own_stands(opt):
    """CIFAR10-quick at lr 0.009: the solver's own probe leaves the plateau at 110 and the
    escape's ladder cost 0.6x of the solver's time to the target finding nothing better. The
    solver's lr goes on first (it is training): when it leaves within TRUNK probes, nothing
    else is probed, its settings stand and the log says why. Larger lrs would have left
    sooner here (30 iterations): the trunk gives that up for a plateau costing nothing."""
    fake = Plateau(opt, escape=lambda lr: 100 if lr < 0.002 else 30, diverge=1e9)
    opt.probe = fake
    plan = opt.make_plan(limit=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.001)
    assert plan.winner.momentum == pytest.approx(0.9)
    probed = {round(lr, 6): n for (_, lr), n in fake.iters.items()}
    assert list(probed) == [0.001] and probed[0.001] <= TRUNK * 20
    assert plan.winner.state is not None         # kept: training goes on from its end
    assert "the solver's lr left it within" in plan.plateau
    assert "its settings stand" in plan.plateau
    assert plan.left_alone is plan.winner
    # a plateau then a fall fits no power law well: when the fit says flat, the reason says
    # what happened instead of "flat loss curves"
    plan.winner.iters = math.inf
    assert "left the plateau by themselves" in opt._reason(plan)


def test_a_solver_lr_rising_off_the_plateau_searches_below_it(opt):
    """A trunk whose loss rises past the plateau's ceiling is the solver's lr diverging: no
    escape upward from it; the lr search goes down."""
    fake = Plateau(opt, escape=lambda lr: 1e9, diverge=1e9)
    fake.reshape(0.0005, lambda out: [v if t <= 30 else 2.6 for t, v in enumerate(out, 1)])
    opt.probe = fake
    plan = opt.make_plan(limit=10 ** 6)
    probed = {round(lr, 6): n for (_, lr), n in fake.iters.items()}
    assert plan.winner.lr == pytest.approx(0.001 / 3)
    assert probed == {0.001: 40, 0.000333: 20}       # hurt at its first doubling; then down


def test_limit_stops_the_escape_before_a_test_or_snapshot(opt):
    fake = Plateau(opt, escape=lambda lr: 2.7 / lr, diverge=0.05)
    opt.probe = fake
    plan = opt.make_plan(limit=60)
    assert all(n <= 60 for n in fake.iters.values())
    assert "a longer probe would pass iteration 60" in plan.plateau


def test_the_plateaus_probes_pass_a_test_interval_under_their_length(opt):
    """A test every 100 iterations cut the trunk at 100 and the escape after it (CIFAR10-quick
    at lr 0.009: 0.64x the solver's own settings). The trunk and the escape's doubling pass
    the run's tests (their branches stop at each for a capture: _branch); the rungs' first
    probes still end before the next test."""
    fake = Plateau(opt, escape=lambda lr: 2.7 / lr, diverge=0.05)
    asked = []

    def probe(cand, iters, keep=False, due=False):
        asked.append((round(cand.lr, 6), cand.probed + iters, due))
        return fake(cand, iters, keep, due)

    opt.probe = probe
    opt.solver.param.test_interval = 100
    assert opt._limit(10 ** 6) == 100 and opt._limit(10 ** 6, due=False) == 100000
    plan = opt.make_plan(stop=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.027)
    probed = {round(lr, 6): n for (_, lr), n in fake.iters.items()}
    assert probed[0.001] == TRUNK * 20 > 100
    assert probed[0.027] > 100
    assert "a longer probe would pass" not in plan.plateau
    past = [(lr, n) for lr, n, tests in asked if n > 100]
    assert past and all(tests for lr, n, tests in asked if n > 100)
    assert all(n <= 100 for lr, n, tests in asked if not tests)


def test_a_plateau_probe_stopped_short_limits_the_rest_only_while_it_stands(opt):
    """A probe that stopped short at a test (its capture would not fit: _branch) and stands
    ends the plateau's reach there; one cut by the plateau's ceiling is pruned (_hurt) and
    leaves the reach to the next (the first form of this rule read the cut as a stop, and
    the escape's next lr stopped at 76 iterations on CIFAR10-quick)."""
    c = opt._candidate(1, opt.data_batch, 0.027, 0.9)
    c.status, c.probed = "kept", 76
    assert _short(c, 40, 40, 0, 5000) == 76
    assert _short(c, 36, 40, 0, 5000) == 5000
    c.status = "pruned: diverged"
    assert _short(c, 40, 40, 0, 5000) == 5000


@pytest.mark.parametrize("two_fast, pruned", [(0.029, True), (0.020, False)])
def test_more_groups_must_be_faster_in_the_quietest_rounds_too(opt, two_fast, pruned):
    """Two groups measured once in a quiet moment (0.0365 s/iter) pass HE_GAIN against one
    group's median over loaded probes (0.0404), not against its fastest rounds (0.024): the
    plan then prunes them (CIFAR10-quick under a load that comes and goes, 0.44x before)."""
    opt.groups = [1, 2]
    he = {1: (0.0404, 0.024), 2: (0.0365, two_fast)}

    def measure(c, keep=False):
        c.he, opt.he[c.config] = he[c.groups][0], he[c.groups][0]
        opt._fast[c.config] = he[c.groups][1]
        return c.he

    opt.measure_he = measure
    opt.probe = Plateau(opt, escape=lambda lr: 0, diverge=1e9)
    plan = opt.make_plan(limit=10 ** 6)
    two = [c for c in plan.candidates if c.groups == 2]
    assert two
    gone = [c.status.endswith("with fewer groups in their fastest rounds") for c in two]
    assert all(gone) if pruned else not any(gone)
    assert _fastest_round([(0.0, 1), (1.0, 1), (2.0, 1), (2.5, 1), (2.7, 1), (3.6, 1)], 2) \
        == pytest.approx(0.35)        # its one whole round past the first two: 0.7 / 2


def test_the_first_probe_goes_on_from_the_kept_he_branch(data_list, tmp_path):  # noqa: F811
    """The plan's first HE measurement runs the solver's own settings: kept, the first probe
    of those settings begins as it (its iterations are not run twice) and sees what a probe
    from the start would: the same losses."""
    solver = Solver(solver_param(data_list, tmp_path, max_iter=400, display=0))
    o = Optimizer(solver, engine="simulated", groups=[1])
    try:
        c = o._candidate(1, o.data_batch, 0.01, 0.9)
        o.measure_he(c, keep=True)
        assert solver.iter == 0 and o._warm is not None
        ran = []
        step = o._step
        o._step = lambda n: ran.append(n) or step(n)
        warm = o.probe(o._candidate(1, o.data_batch, 0.01, 0.9), 20)
        assert warm.probed == 20 and o._warm is None
        assert ran == [20 - (2 + o.he_iters)]      # the HE branch's iterations not again
        fresh = o.probe(o._candidate(1, o.data_batch, 0.01, 0.9), 20)
        np.testing.assert_allclose(warm.losses, fresh.losses, rtol=1e-5)
        # another candidate does not take it
        o.he.clear()
        o.measure_he(c, keep=True)
        other = o.probe(o._candidate(1, o.data_batch, 0.03, 0.9), 20)
        assert other.probed == 20 and o._warm is not None
    finally:
        o.close()
        solver.close()


def test_a_real_plateau_on_the_tiny_net_keeps_the_solver_settings(data_list, tmp_path):  # noqa: F811
    solver = Solver(solver_param(data_list, tmp_path, max_iter=400, base_lr=1e-9, display=0))
    o = Optimizer(solver, engine="simulated", groups=[1], momentum_offsets=(0.0,),
                  probe_iters=10, probe_share=0.05)
    try:
        plan = o.make_plan()
    finally:
        o.close()
        solver.close()
    assert plan.winner.lr == pytest.approx(1e-9)
    assert "no lr up to" in plan.plateau and "solver's settings" in plan.plateau


def test_multi_group_candidates_are_predicted_from_their_one_group_twin(opt):
    """Four groups at (lr, mu) go as one group at (lr, mu + implicit): when their own short
    probes predict never, the twin's prediction stands in, and the table says so."""
    from cct.optimizer import Candidate, Plan
    ref_fit = fit_power_law([2.3 * (t / 10.0) ** -0.5 for t in range(1, 41)])
    twin = Candidate("sync", 1, 16, 0.03, 0.675, he=0.01, fit=ref_fit, probed=40,
                     status="kept")
    flat = fit_power_law([2.3] * 20)
    four = Candidate("async", 4, 16, 0.03, -0.05, he=0.003, fit=flat, probed=20, status="kept")
    far = Candidate("async", 4, 16, 0.03, -0.5, he=0.003, fit=flat, probed=20, status="kept")
    opt.target_loss = 0.5
    opt.implicit[four.config] = 0.73
    plan = Plan(candidates=[twin, four, far])
    opt._score(plan, [twin, four, far])
    assert math.isfinite(twin.iters)
    assert four.iters == pytest.approx(twin.probed + twin.iters - four.probed)
    assert "extrapolated from one group at lr 0.03 momentum 0.675" in four.basis
    assert math.isinf(far.iters) and far.basis == ""    # -0.5 + 0.73 is not near 0.675
    row = next(r for r in plan.table() if r.split()[0] == "1")
    assert "predicted extrapolated from one group" in row


def test_a_prediction_without_evidence_ties_and_the_paired_loss_decides(opt):
    """Late in a run 20-iteration curves are flat: a slope of 33 +- 110 predicts a finite time
    by chance; it counts as no prediction, and the lower paired loss at the probe's end wins."""
    from cct.optimizer import Candidate, CurveFit, Plan
    noisy = Candidate("sync", 1, 16, 0.001, 0.99, he=0.01, probed=20, status="kept",
                      fit=CurveFit(1e40, 33.0, 1220, 0.0725, c_se=110.0))
    calm = Candidate("sync", 1, 16, 0.001, 0.9, he=0.01, probed=20, status="kept",
                     fit=CurveFit(0.03, 0.0, 1220, 0.0254, c_se=math.inf))
    assert math.isfinite(noisy.fit.iterations_to(0.02)) and not noisy.fit.falling
    plan = Plan(candidates=[noisy, calm])
    assert opt._score(plan, [noisy, calm]) is calm
    assert math.isinf(noisy.iters)


def test_one_group_retunes_probe_the_lr_and_a_third_of_it_only(opt):
    from cct.optimizer import Candidate
    opt.momentum_offsets = [-0.225, 0.0, 0.225]
    assert list(opt._retune_offsets(Candidate("sync", 1, 16, 0.01, 0.9))) == [0.0]
    assert list(opt._retune_offsets(Candidate("async", 4, 16, 0.01, 0.2))) == [-0.225, 0.0,
                                                                                0.225]


def test_retunes_do_not_take_the_lr_below_the_solvers(data_list, tmp_path):  # noqa: F811
    """The short-horizon bias: late probes favour the smaller lr every time, and re-tunes
    ratcheted an Adam run's lr down to 1e-7. At the solver's own lr a one-group re-tune has
    nothing left to probe and keeps it."""
    solver = Solver(solver_param(data_list, tmp_path, max_iter=400, base_lr=0.05, display=0))
    o = Optimizer(solver, engine="simulated", groups=[1], probe_iters=5, retune_every=1000)
    try:
        o.configure(o._candidate(1, o.data_batch, 0.05, 0.9))
        kept = o.retune("a test")
        assert kept.lr == pytest.approx(0.05) and o.current.lr == pytest.approx(0.05)
        o.configure(o._candidate(1, o.data_batch, 0.45, 0.9))
        moved = o.retune("a test")
        assert moved.lr >= 0.05 * (1 - 1e-6)
    finally:
        o.close()
        solver.close()


class Falling:
    """Fake probes that fall as a power law whose exponent depends on the total momentum
    (explicit + the implicit momentum of the candidate's groups), peaking at 0.9; records the
    (groups, lr, momentum) each probe ran."""

    def __init__(self, opt):
        self.opt, self.ran = opt, []

    def __call__(self, cand, iters, keep=False, due=False):
        cand.probed += iters
        self.ran.append((cand.groups, round(cand.lr, 6), round(cand.momentum, 4)))
        mu = cand.momentum + self.opt.implicit.get(cand.config, 0.0)
        c = 0.8 - abs(mu - 0.9) - abs(math.log(cand.lr / 0.03)) / 10
        cand.losses = [2.3 * (t / 5.0) ** -c for t in range(1, cand.probed + 1)]
        cand.state = {"fake": cand.probed} if keep else None
        cand.fit = fit_power_law(cand.losses, self.opt.solver.iter)
        cand.status = "kept"
        return cand


def _two_group_plan(opt, lr_multiples):
    """A plan over one and two groups on Falling probes: two groups twice as fast per
    iteration, with an implicit momentum of 0.5 (staleness 1)."""
    opt.groups = [1, 2]
    opt.momentum_offsets = [-0.225, 0.0, 0.225]
    opt.lr_multiples = lr_multiples
    opt.target_loss = 0.3

    def he(c, keep=False):
        c.he = 0.01 if c.groups == 1 else 0.005
        opt.implicit[c.config] = 0.0 if c.groups == 1 else 0.5
        return c.he
    opt.measure_he = he
    fake = Falling(opt)
    opt.probe = fake
    return opt.make_plan(limit=10 ** 6), fake


def test_a_group_count_is_probed_once_its_candidates_borrow_their_twins_predictions(opt):
    """Issue 33, item 3: the two-group candidates are predicted from their one-group twins
    without a probe each; the best of them alone is probed and stands for two groups."""
    plan, fake = _two_group_plan(opt, [1.0, 3.0, 9.0])
    two = [c for c in plan.candidates if c.groups == 2]
    assert len(two) == 6
    assert sum(1 for g, _, _ in fake.ran if g == 2) >= 1
    assert len({(lr, mu) for g, lr, mu in fake.ran if g == 2}) == 1     # one candidate only
    probed = next(c for c in two if c.probed)
    borrowed = [c for c in two if c.status.startswith("not probed: predicted")]
    assert borrowed and all(c.probed == 0 and math.isfinite(c.iters) for c in borrowed)
    assert all(probed.seconds <= c.seconds for c in borrowed)
    assert f"{probed.describe()} stands for 2 groups" in borrowed[0].status
    rows = plan.table()
    assert any("not probed: predicted" in r for r in rows)


def test_without_a_twin_every_candidate_of_the_count_is_probed(opt):
    """Adam's beta1 is no velocity: no twin, no borrowed prediction, each probed as before."""
    opt.solver.type = "Adam"
    plan, _ = _two_group_plan(opt, [1.0, 3.0])
    two = [c for c in plan.candidates if c.groups == 2]
    assert two and all(c.probed or c.status.startswith("pruned") for c in two)


def test_he_counts_whole_rounds_of_groups_in_step():
    """Two groups updating in bursts (one update each, then a gap): counted over whole rounds
    the rate is half a burst's period; a span from a burst's second update to a burst's first
    made it 20% faster than it is."""
    from cct.optimizer.plan import _rate
    bursts = [(t + d, 1.0) for t in range(6) for d in (0.0, 0.001)]   # 12 updates, 6 rounds
    assert _rate(bursts, 2, 1) == pytest.approx(0.5, rel=1e-2)
    even = [(t * 0.1, 1.0) for t in range(10)]
    assert _rate(even, 1, 1) == pytest.approx(0.1)
    assert _rate(even[:3], 2, 1) is None                # no whole round past the warm-up


def test_probes_refine_a_configurations_he(opt):
    """The run's first measurement is its first iterations (slow); its probes' own rates
    outvote it: HE is the median of the measurement and of every probe's rate."""
    from cct.optimizer import Candidate
    c = Candidate("sync", 1, 16, 0.01, 0.9)
    opt._rates[c.config] = [0.02]
    opt.he[c.config] = 0.02
    for rate in (0.010, 0.011):
        opt._refine_he(c, [(t * rate, 1.0) for t in range(20)])
    assert opt.he[c.config] == pytest.approx(0.011)
    opt._refine_he(c, [(t * 0.5, 1.0) for t in range(5)])     # too short to count
    assert len(opt._rates[c.config]) == 3


def test_a_rung_that_blows_up_and_comes_back_to_the_plateau_has_diverged(opt):
    """CIFAR10-quick at lr 0.027 went from 2.303 to 17.0 and back to 2.30, where it stayed:
    alive by its end, dead in fact. The escape drops it and the next lower rung goes on."""
    fake = Plateau(opt, escape=lambda lr: 2.7 / lr, diverge=1e9)     # 0.009: 300 iterations
    # 0.027 and up: a spike at 22-26, then the plateau
    fake.reshape(0.02, lambda out: [17.0 if 22 <= t < 27 else (2.3 if t >= 27 else v)
                                    for t, v in enumerate(out, 1)])
    opt.probe = fake
    plan = opt.make_plan(limit=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.009)
    assert leaving(plan.winner.losses)
    blown = next(c for c in plan.candidates if c.lr == pytest.approx(0.027))
    assert blown.status.startswith("pruned: diverged (loss 17 at its iteration 22, over the "
                                   "plateau's 2.3")
    assert "lr 0.027 diverged at" in plan.plateau


def test_a_rung_noisy_above_the_plateau_has_left_it_upward(opt):
    """CIFAR10-quick from lr 0.009: lr 0.729 sat at 2.30-2.42 for 640 iterations, never 1.5x
    the plateau's 2.303, and the escape spent its whole share doubling it (0.21x of the
    solver's settings, which leave the plateau at 110). A loss more than 1% (and six of the
    solver's own plateau deviations) above the plateau is off it, upward: that rung is out
    within its first probe, and the solver's lr, which does leave (after its trunk: at 200),
    goes on and wins."""
    fake = Plateau(opt, escape=lambda lr: 200 if lr < 0.002 else 1e9, diverge=1e9)
    rng = np.random.default_rng(3)
    # every larger lr: jitter of several percent above the plateau, never falling
    fake.reshape(0.002, lambda out: [2.3 + abs(0.06 * rng.standard_normal()) if t > 3 else v
                                     for t, v in enumerate(out, 1)])
    opt.probe = fake
    plan = opt.make_plan(limit=10 ** 6)
    assert plan.winner.lr == pytest.approx(0.001)
    assert leaving(plan.winner.losses)
    above = [c for c in plan.candidates if c.lr > 0.002]
    assert above and all("over the plateau's 2.3 by more than its noise" in c.status
                         for c in above)
    assert all(fake.iters[(1, c.lr)] == 20 for c in above)     # one probe each, no doubling


class Edge:
    """Fake probes around an lr ``best``: a power law whose exponent falls with the distance
    from ``best`` (in decades) and from momentum 0.675; at or above ``diverge`` the loss blows
    up. Records the (lr, momentum) each probe ran."""

    def __init__(self, opt, best, diverge):
        self.opt, self.best, self.diverge, self.ran = opt, best, diverge, []

    def __call__(self, cand, iters, keep=False, due=False):
        cand.probed += iters
        self.ran.append((round(cand.lr, 6), round(cand.momentum, 4)))
        if cand.lr >= self.diverge * (1 - 1e-9):
            cand.losses = [2.3 * 1.5 ** t for t in range(cand.probed)]
        else:
            c = 1.0 - abs(math.log10(cand.lr / self.best)) - abs(cand.momentum - 0.675)
            cand.losses = [2.3 * ((t + 10) / 10.0) ** -c for t in range(1, cand.probed + 1)]
        cand.state = {"fake": cand.probed} if keep and cand.lr < self.diverge else None
        cand.fit = fit_power_law(cand.losses, self.opt.solver.iter)
        cand.status = "pruned: diverged" if cand.fit.diverged else "kept"
        return cand


def test_settings_at_the_edge_of_stability_stand_without_a_momentum_grid(data_list, tmp_path):  # noqa: F811
    """Issue 33's 0.9x floor: settings already good (LeNet at lr 0.09 momentum 0.675, the
    plan's own choice) lost 10-20% of a short run to the momentum grid's four probes, which
    chose the solver's settings again. When x3 the solver's lr diverges and a third of it
    ranks behind, the solver's settings stand: no momentum probes, and the log says why."""
    solver = Solver(solver_param(data_list, tmp_path, max_iter=100000, base_lr=0.09,
                                 momentum=0.675, display=0))
    o = Optimizer(solver, engine="simulated", groups=[1], probe_iters=20)
    o.measure_he = lambda c, keep=False: setattr(c, "he", 0.01) or 0.01
    try:
        fake = Edge(o, best=0.09, diverge=0.27)
        o.probe = fake
        plan = o.make_plan(limit=10 ** 6)
        assert plan.winner.lr == pytest.approx(0.09)
        assert plan.winner.momentum == pytest.approx(0.675)
        assert sorted(fake.ran) == [(0.03, 0.675), (0.09, 0.675), (0.27, 0.675)]
        assert "lr 0.27 diverged and lr 0.03 ranked behind" in plan.edge
        # the same solver lr with room above it: the lr moves, the momenta are probed
        o.plan = None
        fake = Edge(o, best=0.27, diverge=2.43)
        o.probe = fake
        plan = o.make_plan(limit=10 ** 6)
        assert plan.edge == ""
        assert {mu for _, mu in fake.ran} == {0.45, 0.675, 0.9}
        assert plan.winner.lr == pytest.approx(0.27)
    finally:
        o.close()
        solver.close()


def test_a_probe_past_the_escapes_ceiling_stops_there(data_list, tmp_path):  # noqa: F811
    """While the escape runs, a probe whose loss passes the plateau's ceiling stops at the end
    of that iteration (its remaining iterations would be waste: _hurt drops it); the run is
    left as it was. A stop the user asks for during a probe is held for the run."""
    solver = Solver(solver_param(data_list, tmp_path, max_iter=400, display=0))
    o = Optimizer(solver, engine="simulated", groups=[1])
    try:
        c = o._candidate(1, o.data_batch, 0.05, 0.9)
        o._ceiling = 0.0                 # every loss is past it
        branch = o._branch(c, 10, keep=True)
        assert branch.cut and len(branch.record) == 1
        assert solver.iter == 0 and not solver.requested_early_exit
        assert o.probe(c, 10).probed == 1          # the iterations it ran, not the asked
        o._ceiling = None
        assert len(o._branch(c, 10).record) == 10
        # the user's stop during a probe is the run's: held, it stops training's first
        # iteration, not the probe (whose capture would forget it)
        asked = ["stop"]
        o._user_action = lambda: asked.pop() if asked else "none"
        branch = o._branch(c, 10)
        assert not branch.cut and len(branch.record) == 10
        assert not solver.requested_early_exit and o._action() == "stop"
        assert o._action() == "none"
    finally:
        o.close()
        solver.close()

"""The optimizer: chooses strategy, groups, batch, learning rate and momentum for the shortest
predicted time to a target, from measurements taken inside the run (cct/optimizer/plan.py),
the advisor's batch, device and shard rules (cct/optimizer/advisor.py), planning for a cluster
(cct/optimizer/cluster.py) and Omnivore's optimizer as a baseline (cct/optimizer/omnivore.py).
From Python::

    solver = cct.get_solver("solver.prototxt")
    opt = cct.optimizer.Optimizer(solver, target_loss=0.1)
    opt.solve()           # plan (logged), train, re-tune; stops at the target
    opt.close()
"""
from .advisor import Advice, advise
from .cluster import Cluster, ClusterModel, parse_cluster, updates_per_second
from .curve import CurveFit, fit_power_law, smooth
from .momentum import MomentumChoice, choose_momentum
from .omnivore import OmnivoreSearch
from .plan import Candidate, Optimizer, Plan

__all__ = ["Optimizer", "Candidate", "Plan", "CurveFit", "fit_power_law", "smooth", "Advice",
           "advise", "Cluster", "ClusterModel", "parse_cluster", "updates_per_second",
           "OmnivoreSearch", "choose_momentum", "MomentumChoice"]

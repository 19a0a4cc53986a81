"""Mutated net and solver prototxts: parsed, upgraded, built and run one step; every failure a
CCTError."""
from __future__ import annotations

import pathlib

from hypothesis import given
from hypothesis import strategies as st

import cct
from cct.io.prototxt import read_solver_text
from cct.net import TEST, TRAIN
from cct.solver import Solver
from cct.solver_rules import learning_rate

from .conftest import TINY_NET, lenet_text
from .mutate import apply, fuzz, mutations, number_op, only_cct_errors, write_bytes

SOLVER = (b'net: "{net}"\ntest_iter: 1\ntest_interval: 500\nbase_lr: 0.01\nmomentum: 0.9\n'
          b'weight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\n'
          b'stepsize: 100\nmax_iter: 2000\nsnapshot: 1000\nsnapshot_prefix: "{prefix}"\n'
          b'random_seed: 1701\niter_size: 1\naverage_loss: 1\nclip_gradients: 10\n'
          b'display: 100\n# a comment: \xe9t\xe9\n')


MANY_LAYERS = pathlib.Path(__file__).with_name("many_layers.prototxt")


def build_and_run(path: str, phase: int) -> None:
    net = cct.Net(path, phase)
    try:
        net.forward()
        net.backward()
    finally:
        net.close()


@given(seed=st.integers(0, 2), phase=st.sampled_from([TRAIN, TEST]),
       mutation=mutations(number_op(), max_byte_ops=2))
@fuzz(default_examples=700)
def test_net_prototxt(fuzz_dir, datum_db, seed, phase, mutation):
    seeds = [lenet_text().encode(), TINY_NET.format(db=datum_db).encode(),
             MANY_LAYERS.read_bytes()]
    data = apply(seeds[seed], mutation)
    path = write_bytes(fuzz_dir / "net.prototxt", data)
    only_cct_errors(lambda: build_and_run(path, phase), "net prototxt", data)


def solve_one_step(path: str) -> None:
    s = Solver(read_solver_text(path), path)
    try:
        for it in (0, 1, 10 ** 6, 2 ** 31 - 1):
            learning_rate(s.param, it, 0)
        # The prototxt may ask for 2^31 forward passes per step or per test: run one.
        s.param.iter_size = 1
        s.param.test_initialization = False
        s.step(1)
    finally:
        for net in [s.net] + s.test_nets:
            net.close()


@given(mutation=mutations(number_op(), max_byte_ops=2))
@fuzz(default_examples=550)
def test_solver_prototxt(fuzz_dir, mutation):
    net = write_bytes(fuzz_dir / "solver_net.prototxt", lenet_text().encode())
    seed = SOLVER.replace(b"{net}", net.encode()).replace(
        b"{prefix}", str(fuzz_dir / "solver_snap").encode())
    data = apply(seed, mutation)
    path = write_bytes(fuzz_dir / "solver.prototxt", data)
    only_cct_errors(lambda: solve_one_step(path), "solver prototxt", data)


"""The ``cct`` command: Caffe's ``caffe`` tool with its commands and gflags-style flags.

Flags are accepted in every gflags spelling: ``-model x``, ``-model=x``, ``--model=x``,
``--model x``. A user error prints one paragraph (``cct: error: ...``) and exits with status 1;
never a traceback.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from . import glog as log
from .errors import CCTError
from .flags import Flags

USAGE = """usage: cct <command> <args>

commands:
  test            score a model (-model, -weights, -iterations, -level, -stage)
  time            benchmark forward/backward of a model (-model, -iterations, -phase, -level,
                  -stage)

Flags take any gflags spelling: -model x, -model=x, --model=x, --model x."""


def _phase(name: str):
    from .net import TEST, TRAIN
    phases = {"TRAIN": TRAIN, "TEST": TEST}
    if name not in phases:
        raise CCTError(f"-phase must be TRAIN or TEST, got '{name}'")
    return phases[name]


def _require(flags: Flags, name: str, why: str) -> str:
    value = flags.get(name)
    if not value:
        raise CCTError(f"{flags.command}: {why} (give -{name})")
    return value


def cmd_test(argv: List[str]) -> int:
    """Caffe's ``caffe test``: average each output over -iterations forward passes (TEST)."""
    from .api import Net
    from .net import TEST

    flags = Flags("test", argv, {"model": "", "weights": "", "iterations": "50", "gpu": "",
                                 "level": "0", "stage": ""})
    model = _require(flags, "model", "Need a model definition to score.")
    weights = _require(flags, "weights", "Need model weights to score.")
    iterations = flags.int("iterations")
    log.info("caffe.cpp:290", "Use CPU.")
    net = Net(model, TEST, level=flags.int("level"), stages=flags.list("stage"), weights=weights)
    log.info("caffe.cpp:308", f"Running for {iterations} iterations.")
    scores: List[float] = []
    owners: List[int] = []
    total_loss = 0.0
    for i in range(iterations):
        total_loss += net.forward_prefilled()
        idx = 0
        for j, blob_id in enumerate(net.output_blob_indices):
            values = np.asarray(net.blobs_list[blob_id].data, np.float32).ravel()
            name = net.blob_names[blob_id]
            for v in values:
                if i == 0:
                    scores.append(float(v))
                    owners.append(j)
                else:
                    scores[idx] += float(v)
                log.info("caffe.cpp:331", f"Batch {i}, {name} = {_g(v)}")
                idx += 1
    log.info("caffe.cpp:336", f"Loss: {_g(total_loss / max(iterations, 1))}")
    for score, j in zip(scores, owners):
        blob_id = net.output_blob_indices[j]
        mean = score / max(iterations, 1)
        weight = net.blob_loss_weights[blob_id]
        extra = f" (* {_g(weight)} = {_g(weight * mean)} loss)" if weight else ""
        log.info("caffe.cpp:348", f"{net.blob_names[blob_id]} = {_g(mean)}{extra}")
    return 0


def cmd_time(argv: List[str]) -> int:
    """Caffe's ``caffe time``: per-layer forward and backward times averaged over iterations."""
    from .api import Net

    flags = Flags("time", argv, {"model": "", "iterations": "50", "phase": "TRAIN", "gpu": "",
                                 "level": "0", "stage": "", "weights": ""})
    model = _require(flags, "model", "Need a model definition to time.")
    iterations = flags.int("iterations")
    log.info("caffe.cpp:352", "Use CPU.")
    net = Net(model, _phase(flags.get("phase")), level=flags.int("level"),
              stages=flags.list("stage"), weights=flags.get("weights") or None)
    log.info("caffe.cpp:365", "Performing Forward")
    loss = net.forward_prefilled()
    log.info("caffe.cpp:370", f"Initial loss: {_g(loss)}")
    log.info("caffe.cpp:371", "Performing Backward")
    net.backward_all()
    n = len(net.layers)
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    log.info("caffe.cpp:380", "*** Benchmark begins ***")
    log.info("caffe.cpp:381", f"Testing for {iterations} iterations.")
    total_fwd = total_bwd = 0.0
    start_all = time.perf_counter()
    for it in range(iterations):
        t_iter = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            net.forward_from_to(i, i)
            fwd[i] += time.perf_counter() - t
        t_mid = time.perf_counter()
        for i in range(n - 1, -1, -1):
            t = time.perf_counter()
            net.backward_from_to(i, i)
            bwd[i] += time.perf_counter() - t
        t_end = time.perf_counter()
        total_fwd += t_mid - t_iter
        total_bwd += t_end - t_mid
        log.info("caffe.cpp:396", f"Iteration: {it + 1} forward-backward time: "
                 f"{_g((t_end - t_iter) * 1e3)} ms.")
    total = time.perf_counter() - start_all
    it = max(iterations, 1)
    log.info("caffe.cpp:399", "Average time per layer: ")
    for i, name in enumerate(net.layer_names):
        log.info("caffe.cpp:402", f"{name:>10}\tforward: {_g(fwd[i] * 1e3 / it)} ms.")
        log.info("caffe.cpp:405", f"{name:>10}\tbackward: {_g(bwd[i] * 1e3 / it)} ms.")
    log.info("caffe.cpp:410", f"Average Forward pass: {_g(total_fwd * 1e3 / it)} ms.")
    log.info("caffe.cpp:412", f"Average Backward pass: {_g(total_bwd * 1e3 / it)} ms.")
    log.info("caffe.cpp:414", f"Average Forward-Backward: {_g(total * 1e3 / it)} ms.")
    log.info("caffe.cpp:416", f"Total Time: {_g(total * 1e3)} ms.")
    log.info("caffe.cpp:417", "*** Benchmark ends ***")
    return 0


COMMANDS: Dict[str, Callable[[List[str]], int]] = {"test": cmd_test, "time": cmd_time}


def _g(x) -> str:
    return "%g" % float(x)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "-help", "--help", "help"):
        print(USAGE)
        return 0 if argv else 1
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"cct: error: unknown command '{command}'.\n{USAGE}", file=sys.stderr)
        return 1
    try:
        return COMMANDS[command](rest)
    except CCTError as e:
        print(f"cct: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cct: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

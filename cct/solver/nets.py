"""The nets a SolverParameter names (Caffe's Solver::InitTrainNet and InitTestNets): where each
net's NetParameter comes from, its NetState, and the ``weights`` files copied into it.

A :class:`SolverNets` builds them once for a solver and remembers which weights files it
copied, to name the culprit when a loss turns NaN (:meth:`SolverNets.non_finite_weights_file`).
"""
from __future__ import annotations

import math
import os
from typing import List, Tuple

import numpy as np

from ..errors import CCTError, ProtoError
from ..glog import info
from ..io import weights
from ..io.prototxt import read_net_text
from ..io.upgrade import upgrade_net
from ..net import TEST, TRAIN, Net
from ..proto import caffe_pb2

TRAIN_NET_FIELDS = ("net", "net_param", "train_net", "train_net_param")


class SolverNets:
    """The train and test nets of ``param`` (``source`` names the solver file in messages),
    built on ``backend`` in ``dtype``."""

    def __init__(self, param: caffe_pb2.SolverParameter, source: str, backend: str, dtype):
        self.param = param
        self.source = source
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self.weights_files: List[str] = []   # -weights files copied in, named if loss diverges

    def read_net_file(self, path: str) -> caffe_pb2.NetParameter:
        if not os.path.exists(path):
            hint = ""
            beside = os.path.join(os.path.dirname(self.source), path)
            if not os.path.isabs(path) and os.path.exists(beside):
                hint = (f" It exists beside the solver file ({beside}): net paths in a solver "
                        f"are relative to the current directory, as in Caffe; run from "
                        f"'{os.path.dirname(self.source) or '.'}' or fix the path.")
            raise ProtoError(f"{self.source}: net file '{path}' does not exist (current "
                             f"directory: {os.getcwd()}).{hint}")
        return read_net_text(path)

    def make_net(self, net_param: caffe_pb2.NetParameter, source: str) -> Net:
        return Net(net_param, backend=self.backend, dtype=self.dtype, source=source)

    def train_net(self) -> Net:
        """Caffe's InitTrainNet: exactly one of the train net fields, phase TRAIN merged with
        the net's own state and the solver's train_state, then the ``weights`` files."""
        p = self.param
        given = [f for f in TRAIN_NET_FIELDS if p.HasField(f)]
        if not given:
            raise CCTError(f"{self.source}: the solver names no net to train; give it one of "
                           f"{', '.join(TRAIN_NET_FIELDS)} (e.g. net: \"train_val.prototxt\").")
        if len(given) > 1:
            raise CCTError(f"{self.source}: the solver names more than one train net "
                           f"({', '.join(given)}); keep exactly one of "
                           f"{', '.join(TRAIN_NET_FIELDS)}.")
        if p.HasField("train_net_param"):
            info("solver.cpp:88", "Creating training net specified in train_net_param.")
            net_param, src = copy_net(p.train_net_param), f"{self.source} (train_net_param)"
        elif p.HasField("train_net"):
            info("solver.cpp:92", f"Creating training net from train_net file: {p.train_net}")
            net_param, src = self.read_net_file(p.train_net), p.train_net
        elif p.HasField("net_param"):
            info("solver.cpp:96", "Creating training net specified in net_param.")
            net_param, src = copy_net(p.net_param), f"{self.source} (net_param)"
        else:
            info("solver.cpp:102", f"Creating training net from net file: {p.net}")
            net_param, src = self.read_net_file(p.net), p.net
        state = caffe_pb2.NetState(phase=TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        net = self.make_net(net_param, src)
        for model_list in p.weights:
            self.load_weights(net, model_list)
        return net

    def test_nets(self) -> List[Net]:
        """Caffe's InitTestNets: test_net_param, then test_net files, then the generic net for
        the remaining test_iter entries; phase TEST merged with each test_state."""
        p = self.param
        nets = []
        for i, (net_param, what) in enumerate(self._test_net_params()):
            state = caffe_pb2.NetState(phase=TEST)
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net_param.state.CopyFrom(state)
            info("solver.cpp:190", f"Creating test net (#{i}) specified by {what}")
            net = self.make_net(net_param, what.split(": ", 1)[-1])
            for model_list in p.weights:
                self.load_weights(net, model_list)
            nets.append(net)
        return nets

    def _test_net_params(self) -> List[Tuple[caffe_pb2.NetParameter, str]]:
        """(NetParameter, where it comes from) of each test net, in Caffe's order."""
        p = self.param
        instances = self._check_test_counts()
        out: List[Tuple[caffe_pb2.NetParameter, str]] = []
        for tp in p.test_net_param:
            out.append((copy_net(tp), "test_net_param"))
        for path in p.test_net:
            out.append((self.read_net_file(path), f"test_net file: {path}"))
        remaining = instances - len(out)
        if remaining and p.HasField("net_param"):
            out += [(copy_net(p.net_param), "net_param") for _ in range(remaining)]
        elif remaining and p.HasField("net"):
            generic = self.read_net_file(p.net)
            out += [(copy_net(generic), f"net file: {p.net}") for _ in range(remaining)]
        return out

    def _check_test_counts(self) -> int:
        """Caffe's checks of test_iter and test_state against the test nets; the number of
        test net instances (one per test_iter)."""
        p, src = self.param, self.source
        num_test_nets = len(p.test_net_param) + len(p.test_net)
        if p.HasField("net_param") or p.HasField("net"):
            if len(p.test_iter) < num_test_nets:
                raise CCTError(f"{src}: test_iter must be specified for each test network: "
                               f"{num_test_nets} test nets but {len(p.test_iter)} test_iter.")
        elif len(p.test_iter) != num_test_nets:
            raise CCTError(f"{src}: test_iter must be specified for each test network: "
                           f"{num_test_nets} test nets (test_net/test_net_param) but "
                           f"{len(p.test_iter)} test_iter.")
        instances = len(p.test_iter)
        if len(p.test_state) and len(p.test_state) != instances:
            raise CCTError(f"{src}: test_state must be unspecified or specified once per test "
                           f"net: {instances} test nets but {len(p.test_state)} test_state.")
        if instances and p.test_interval <= 0:
            raise CCTError(f"{src}: {instances} test net(s) (test_iter given) need a positive "
                           f"test_interval; set test_interval or remove test_iter.")
        return instances

    def load_weights(self, net: Net, model_list: str) -> None:
        """Caffe's LoadNetWeights: a comma-separated list of weights files, copied by name."""
        for name in model_list.split(","):
            name = name.strip()
            info("solver.cpp:72", f"Finetuning from {name}")
            net.copy_trained_layers_from(name)
            if name not in self.weights_files:
                self.weights_files.append(name)

    def non_finite_weights_file(self, net: Net) -> str:
        """Advice naming the weights file that put NaN/inf values into a param of ``net`` that
        still holds them, or '' (then the training itself diverged). Read again only here, when
        the loss has already failed."""
        for name, layer in zip(net.layer_names, net.layers):
            for i, blob in enumerate(layer.blobs):
                if _finite(blob.data):
                    continue
                for path in self.weights_files:
                    arrays = weights.load_weights(path).get(name, [])
                    if i < len(arrays) and not _finite(arrays[i]):
                        return (f"The weights file '{path}' holds NaN/inf values (layer "
                                f"'{name}' param {i}); fix or replace it.")
        return ""


def copy_net(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A copy of a net embedded in the solver, upgraded like a net read from a file."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    return upgrade_net(out, "<net in solver>")


def _finite(a) -> bool:
    """Whether every value of a (host or device) array is finite: its min and max are (they
    are NaN or infinite exactly when some value is), which needs no temporary array."""
    return a.size == 0 or (math.isfinite(float(a.min())) and math.isfinite(float(a.max())))

"""Blob diffs that share memory during training (``cct train``).

Caffe keeps a diff for every blob the backward pass reaches, all alive at once: on CaffeNet at
batch 256 that is 874 MB. Yet a blob's diff lives only from its consumer's backward, which
writes it, to its producer's, which reads it last; blobs whose lifetimes do not overlap can use
the same memory, as PyTorch frees a gradient once it has been used. :func:`share_blob_diffs`
lays the diffs of a net out that way (a greedy interval assignment over the backward order),
so peak memory holds the few diffs alive together instead of all of them.

Only where no one reads a blob diff between passes: ``cct train`` turns it on for its train
net (no Python layers, no ``debug_info``). Through pycaffe every blob keeps its own diff, as
in Caffe, since a script may read ``net.blobs[name].diff`` after ``backward()``. A blob keeps its
own diff where it is read without being written first in the same pass: net inputs and
outputs, loss blobs (their diff holds the loss weight), and blobs a consumer does not write
back to (a Split top feeding an Accuracy layer, which the Split sums as zeros).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from .blob import Blob, DeviceBlob


def _lifetimes(net) -> Dict[int, Tuple[int, int]]:
    """blob id -> (first, last) step of the backward pass that touches its diff, for the
    blobs whose diff every pass writes before it reads it."""
    n = len(net.layers)
    produced = {b for i in range(n) for b in net.top_ids(i)}
    loss = {b for b, w in enumerate(net.blob_loss_weights) if w}
    inputs = set(net.input_ids())
    bottoms = [net.bottom_ids(i) for i in range(n)]
    spans: Dict[int, List[int]] = {}
    refused = set()
    for i in range(n):
        step = n - 1 - i  # backward runs the layers last to first
        tops = set(net.top_ids(i))
        for b in tops:
            spans.setdefault(b, []).append(step)
            # a stacked sibling's top diff is read at its group's turn, later in the pass
            spans[b].append(n - 1 - net.backward_turn(i))
        for k, b in enumerate(bottoms[i]):
            spans.setdefault(b, []).append(step)
            in_place = b in tops
            if not in_place and not (net.layer_need_backward[i] and
                                     net.bottom_need_backward[i][k]):
                refused.add(b)  # this consumer leaves the diff as it was
    out = {}
    for b, steps in spans.items():
        consumed = any(b in ids for ids in bottoms)
        blob = net.blobs_list[b]
        if (b in refused or b in loss or b in inputs or b not in produced or not consumed
                or not net.blob_need_backward[b] or type(blob) not in (Blob, DeviceBlob)):
            continue
        out[b] = (min(steps), max(steps))
    return out


def plan(net) -> List[Tuple[int, List[int]]]:
    """The buffers: (bytes, blob ids sharing it), no two of whose lifetimes overlap. Blobs are
    placed in the order their lifetimes start, each into the free buffer that fits it most
    tightly (else the largest free one, grown; else a new one)."""
    lives = _lifetimes(net)
    order = sorted(lives, key=lambda b: (lives[b][0], -net.blobs_list[b].count))
    buffers: List[Tuple[int, List[int]]] = []   # (bytes, blob ids)
    busy_until: List[int] = []                  # last step of the buffer's latest blob
    kinds: List[np.dtype] = []
    for b in order:
        start, end = lives[b]
        blob = net.blobs_list[b]
        size = blob.count * blob.dtype.itemsize
        free = [j for j in range(len(buffers))
                if busy_until[j] < start and kinds[j] == blob.dtype]
        fits = [j for j in free if buffers[j][0] >= size]
        if fits:
            j = min(fits, key=lambda j: buffers[j][0])
        elif free:
            j = max(free, key=lambda j: buffers[j][0])
        else:
            buffers.append((0, []))
            busy_until.append(-1)
            kinds.append(blob.dtype)
            j = len(buffers) - 1
        buffers[j] = (max(buffers[j][0], size), buffers[j][1] + [b])
        busy_until[j] = end
    return buffers


def share_blob_diffs(net) -> Tuple[int, int]:
    """Give the net's blobs the diff layout of :func:`plan`; returns (bytes their own diffs
    would take, bytes the shared buffers take)."""
    own = shared = 0
    for size, ids in plan(net):
        first = net.blobs_list[ids[0]]
        # In the blobs' own memory: the host's, or a device's (the GPU's, the stand-in's).
        memory = first.xp.zeros(size // first.dtype.itemsize, first.dtype)
        shared += size
        for b in ids:
            blob = net.blobs_list[b]
            own += blob.count * blob.dtype.itemsize
            blob.diff_in(memory)
    return own, shared

"""gflags-style command-line flags, as Caffe's tools take them.

Every gflags spelling is accepted: ``-model x``, ``-model=x``, ``--model=x``, ``--model x``;
boolean flags also as ``-shuffle`` / ``--noshuffle`` / ``-shuffle=false``. Arguments that are
not flags are positional (Caffe's tools take e.g. ``ROOTFOLDER/ LISTFILE DB_NAME``).

As gflags does for every Caffe tool, ``-help``, ``-helpshort`` and ``-helpfull`` (any spelling)
list the command's flags with their defaults and ``-version`` prints the version line; both
raise :class:`ShowAndExit`, which ``cct``'s main prints to stdout before exiting with status 0.
"""
from __future__ import annotations

import math
import re
import textwrap
from typing import Dict, List, Optional, Sequence, Set, Union

from .errors import CCTError, close_matches
from .usage import USAGE

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}

#: gflags' reporting flags (all list every flag: a cct command's flags are all its own)
_HELP = {"help", "helpshort", "helpfull", "h"}
#: the Caffe release cct follows (Caffe sets gflags' version string to CAFFE_VERSION)
CAFFE_VERSION = "1.0.0"

#: Caffe's descriptions of its flags (tools/caffe.cpp, tools/convert_imageset.cpp, ...), shown
#: by -help for every command that takes a flag of that name.
DESCRIPTIONS: Dict[str, str] = {
    "solver": "The solver definition protocol buffer text file.",
    "model": "The model definition protocol buffer text file.",
    "weights": "Optional; the pretrained weights to initialize finetuning, separated by ','. "
               "Cannot be set simultaneously with snapshot.",
    "snapshot": "Optional; the snapshot solver state to resume training.",
    "gpu": "Optional; run in GPU mode on given device IDs separated by ','. Use '-gpu all' "
           "to run on all available GPUs.",
    "devices": "cct: the devices to split every batch across, e.g. cpu:1,cpu:1 or cpu,gpu0.",
    "level": "Optional; network level.",
    "stage": "Optional; network stages (not to be confused with phase), separated by ','.",
    "phase": "Optional; network phase (TRAIN or TEST; draw_net and summarize also ALL).",
    "iterations": "The number of iterations to run.",
    "sigint_effect": "Optional; action to take when a SIGINT signal is received: "
                     "snapshot, stop or none.",
    "sighup_effect": "Optional; action to take when a SIGHUP signal is received: "
                     "snapshot, stop or none.",
    "deterministic": "cct: fixed kernel plans, none timed, so runs repeat to the bit.",
    "precision": "cct: float32, or bf16 (bf16 GEMM operands, float32 weights and updates) "
                 "where the CPU has bf16 units (AMX, AVX512-BF16); on a GPU also tf32 and "
                 "fp16 (tensor cores; fp16 with a dynamic loss scale); train: overrides the "
                 "solver's precision field.",
    "cuda-graphs": "cct: on (default): on a GPU, each training iteration's layers after the "
                   "data layers replay one CUDA graph, captured after two eager iterations and "
                   "checked against an eager pass (eager, saying why, where a layer or the "
                   "capture refuses); off: eager launches.",
    "strategy": "cct: sync (one group), async (asynchronous compute groups), hogbatch "
                "(async with a batch per group), adaptive-hogbatch (batches follow the groups' "
                "speeds) or sma (Crossbow's synchronous model averaging).",
    "groups": "cct: the number of compute groups of the driver's strategies.",
    "engine": "cct: threads, processes, simulated or ray, how the driver runs its groups.",
    "batch-sizes": "cct: each group's batch, in order (16,256) or by device (cpu:16,gpu0:256).",
    "threshold": "cct: adaptive-hogbatch's tolerated gap between a group's share of the "
                 "updates and 1/groups.",
    "learners": "cct: -strategy=sma's learner count, or auto (add while throughput gains 10%).",
    "sma-alpha": "cct: the share of its gap to the central model a learner closes at each "
                 "synchronisation (default 1/learners).",
    "sma-momentum": "cct: the central model's momentum with -strategy=sma, in [0, 1).",
    "sync-period": "cct: -strategy=sma's local steps between synchronisations.",
    "simulate-speeds": "cct: the simulated engine's device speeds in records per virtual "
                       "second, one per group (1,8).",
    "ray-address": "cct: the Ray cluster of -engine=ray (an address or auto; none: start a "
                   "local Ray).",
    "ps-shards": "cct: the parameter store's shards with -engine=ray, a count or auto (Zou "
                 "et al.'s rule from the model's bytes, the bandwidth and a step's time).",
    "ray-group-restarts": "cct: how often Ray restarts a group actor that died before it is "
                          "dropped (at least 0; Ray's -1, forever, is not taken).",
    "group-timeout": "cct: seconds a group of -engine=processes or ray may take to answer "
                     "before it is dropped as dead (default: the larger of 300 and 10x the "
                     "slowest step seen).",
    "ray-data": "cct: -engine=ray's data: ship (the driver reads and ships batches) or local "
                "(each group reads its part of the LMDB where it runs).",
    "staleness": "cct: round-robin or exponential, the staleness model of a simulated run.",
    "optimize": "cct: let the optimizer choose strategy, groups, lr and momentum from "
                "in-run probes, print its plan, and re-tune while training (cct/optimizer).",
    "target-accuracy": "cct: with -optimize, stop when the first test net's accuracy reaches "
                       "this, in (0, 1].",
    "target-loss": "cct: with -optimize, stop when the smoothed training loss reaches this "
                   "(positive).",
    "budget": "cct: with -optimize, the seconds the run may take (sizes the probes).",
    "probe-share": "cct: with -optimize, the share of the run's time its probes may take, in "
                   "(0, 1).",
    "retune-every": "cct: with -optimize, iterations between re-tunes (0: one epoch when "
                    "known, else max_iter/10).",
    "plot": "cct: with -optimize (and plan), a PNG of the plan's probes: raw and smoothed "
            "losses, fitted power laws, the reference loss (needs matplotlib).",
    "bandwidth": "cct: plan's link bandwidth in bytes/s for the store-shard advice "
                 "(assumed, 10 Gbit/s by default).",
    "cluster": "cct: plan for a cluster: nodes=N,bandwidth=BYTES_PER_S[,shards=S]"
               "[,overhead=SECONDS]; HE from the scale-out model, SE from the simulated engine.",
    "momentum": "cct: the momentum to use instead of the solver's, at least 0; auto (async, "
                "hogbatch): chosen by short probes at the group count, from the grid "
                "0..0.9 pruned by the measured staleness.",
    "seed": "cct: the seed of a simulated run's exponential staleness (at least 0: unlike "
            "Caffe's random_seed, -1 is no random seed).",
    "allow-negative-momentum": "cct: let -momentum go below zero (auto probes negative "
                               "values too, or a negative value).",
    "sync-fc": "cct: run the InnerProduct layers serially on the store's weights, never stale.",
    "backend": "The backend {lmdb, leveldb} for storing the result.",
    "gray": "When this option is on, treat images as grayscale ones.",
    "shuffle": "Randomly shuffle the order of images and their labels.",
    "resize_width": "Width images are resized to.",
    "resize_height": "Height images are resized to.",
    "check_size": "When this option is on, check that all the datum have the same size.",
    "encoded": "When this option is on, the encoded image will be save in datum.",
    "encode_type": "Optional: What type should we encode the image as ('png','jpg',...).",
    "rankdir": "One of TB (top-bottom), LR (left-right), BT (bottom-top), RL (right-left).",
    "display_lrm": "Display the learning rate multipliers of the layers.",
    "delimiter": "Column delimiter in the output files.",
    "verbose": "Print some extra info (e.g. the output file names).",
    "output": "The ONNX file to write.",
    "opset": "The ONNX opset version.",
    "batch": "The batch dimension: dynamic or a number.",
    "check": "Check the exported model with onnx.checker.",
    "progress": "cct: auto (a live progress line when stderr is a terminal), bar or none; the "
                "log's lines are Caffe's either way.",
    "follow": "Redraw the picture as the log grows, until 'Optimization Done.' or Ctrl-C.",
    "follow-timeout": "With --follow: stop after this many seconds without a new log line "
                      "(0: never).",
    "poll": "With --follow: seconds between two reads of the log.",
    "max-width": "Maximum field width.",
    "color": "Color the blob names: auto (on a terminal), always or never.",
}


class ShowAndExit(Exception):
    """-help or -version was given: print :attr:`text` to stdout and exit with status 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def version_line(program: str = "cct") -> str:
    """gflags' ``ShowVersion`` line (``caffe version 1.0.0``), with cct's own version."""
    from .native import __version__
    return f"{program} version {__version__} (Caffe {CAFFE_VERSION} compatible)"


#: gflags' type names, by the Python type of a flag's default
_KINDS = {bool: "bool", int: "int32", float: "double", str: "string"}


class Flags:
    """Parse ``argv`` against ``known`` ({name: default}); ``booleans`` name the flags that take
    no value. A default's Python type is the flag's type in -help (gflags' ``DEFINE_double``
    and ``DEFINE_int32``): ``0.0`` is a double whose default prints as 0; a string default
    that reads as an integer or a number is an int32 or a double. Unknown flags are errors
    naming the command and the closest known flags. :attr:`given` holds the flags the command
    line named (whatever their value), for the rule that a flag the chosen settings do not
    use is an error rather than silently ignored."""

    def __init__(self, command: str, argv: Sequence[str],
                 known: Dict[str, Union[str, int, float, bool]],
                 booleans: Sequence[str] = (), positional: Sequence[str] = ()):
        self.command = command
        self.kinds: Dict[str, str] = {k: _kind(v) for k, v in known.items()}
        self.values: Dict[str, str] = {k: _text(v) for k, v in known.items()}
        self.booleans = set(booleans)
        for b in self.booleans:
            self.values.setdefault(b, "false")
            self.kinds[b] = "bool"
        self.given: Set[str] = set()
        self.positional: List[str] = []
        argv = list(argv)
        # As gflags: a reporting flag wins over every other flag, and over their errors.
        for arg in argv:
            name = arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else ""
            if name in self.values or arg.split("=", 1)[-1].lower() in _FALSE:
                continue
            if name in _HELP:
                raise ShowAndExit(self.help_text(positional))
            if name == "version":
                raise ShowAndExit(version_line())
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("-") or arg in ("-", "--") or _is_number(arg):
                self.positional.append(arg)
                i += 1
                continue
            name = arg.lstrip("-")
            value: Optional[str] = None
            if "=" in name:
                name, value = name.split("=", 1)
            if name not in self.values and name.startswith("no") and name[2:] in self.booleans:
                name, value = name[2:], "false"
            if name not in self.values and name in _HELP | {"version"}:
                i += 1  # -help=false: gflags accepts it and does nothing
                continue
            if name not in self.values:
                # One line: the closest names, not the whole list (-help has that).
                hint = close_matches(f"-{name}", [f"-{k}" for k in self.values])
                raise CCTError(f"{command}: unknown flag -{name}.{hint} (cct {command} --help "
                               f"lists its flags)")
            if value is None:
                if name in self.booleans:
                    value = "true"
                elif i + 1 < len(argv):
                    value = argv[i + 1]
                    i += 1
                else:
                    raise CCTError(f"{command}: flag -{name} needs a value")
            self.values[name] = value
            self.given.add(name)
            i += 1
        if positional and len(self.positional) != len(positional):
            raise CCTError(f"{command}: expected {len(positional)} argument(s) "
                           f"({' '.join(positional)}), got {len(self.positional)}"
                           + (f": {' '.join(self.positional)}" if self.positional else ""))

    def help_text(self, positional: Sequence[str] = ()) -> str:
        """gflags' ``-help`` listing: the command's summary and usage, then each flag with its
        description, type and default."""
        summary, usage = _summary(self.command)
        lines = [f"cct {self.command}: {summary}" if summary else f"cct {self.command}",
                 "usage: cct " + (usage or " ".join([self.command] + (["[FLAGS]"] if self.values
                                                                       else [])
                                                    + list(positional))),
                 "", f"  Flags from cct {self.command}:"]
        for name in sorted(self.values):
            default, kind = self.values[name], self.kinds[name]
            shown = f'"{default}"' if kind == "string" else default
            lines.append(textwrap.fill(f"    --{name} ({DESCRIPTIONS.get(name, '')}) type: "
                                       f"{kind} default: {shown}", width=79,
                                       subsequent_indent=" " * 6, break_on_hyphens=False))
        if not self.values:
            lines.append("    (none)")
        return "\n".join(lines)

    def get(self, name: str) -> str:
        return self.values[name]

    def int(self, name: str, within: Optional[str] = None, why: str = "") -> int:
        """The flag as an integer, in the interval ``within`` (``"[1, inf)"``) when given;
        ``why`` (what the flag means) ends the error's line."""
        try:
            value = int(self.values[name])
        except ValueError:
            raise CCTError(f"{self.command}: -{name} must be an integer, got "
                           f"'{self.values[name]}'") from None
        return self._check(name, value, within, why)

    def float(self, name: str, within: Optional[str] = None, why: str = "") -> float:
        """The flag as a finite number (NaN and inf are refused: no flag means either), in
        the interval ``within`` (``"(0, 1]"``) when given."""
        try:
            value = float(self.values[name])
        except ValueError:
            raise CCTError(f"{self.command}: -{name} must be a number, got "
                           f"'{self.values[name]}'") from None
        if not math.isfinite(value):
            raise CCTError(f"{self.command}: -{name} must be a finite number"
                           + (f" {_phrase(within)}" if within else "")
                           + f", got '{self.values[name]}'" + (f" ({why})" if why else ""))
        return self._check(name, value, within, why)

    def _check(self, name: str, value, within: Optional[str], why: str):
        if within is None or _inside(value, within):
            return value
        raise CCTError(f"{self.command}: -{name} must be {_phrase(within)}, got "
                       f"'{self.values[name]}'" + (f" ({why})" if why else ""))

    def bool(self, name: str) -> bool:
        v = self.values[name].lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise CCTError(f"{self.command}: -{name} must be true or false, got '{v}'")

    def list(self, name: str) -> List[str]:
        """A comma-separated flag (``-stage a,b``, ``-weights x,y``) as a list."""
        return [x for x in self.values[name].split(",") if x]


def _summary(command: str):
    """(summary, usage) of ``command`` from ``cct.usage.USAGE``: a command's description, or a
    tool's argument synopsis; either may be empty."""
    text = USAGE.splitlines()
    for i, line in enumerate(text):
        m = re.match(r"  (\S+)( +)(.*)$", line)
        if not m or m.group(1) != command:
            continue
        body = [m.group(3).strip()]
        indent = len(m.group(1)) + len(m.group(2)) + 2
        for more in text[i + 1:]:
            if len(more) - len(more.lstrip()) < indent or not more.strip():
                break
            body.append(more.strip())
        joined = " ".join(body)
        tools_start = next((j for j, t in enumerate(text) if t.startswith("tools")), len(text))
        if i < tools_start:  # a command: its description, without the flags in parentheses
            return joined.split(" (", 1)[0], ""
        return "", f"{command} {joined}"
    return "", ""


def _kind(default) -> str:
    """gflags' type name of a flag with this default."""
    if isinstance(default, str):
        if re.fullmatch(r"-?\d+", default):
            return "int32"
        return "double" if default and _is_number(default) else "string"
    return _KINDS[type(default)]


def _text(default) -> str:
    """A default as the flag's text: ``0.0`` shows as 0, as gflags prints a double."""
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def _bounds(within: str):
    """``"(0, 1]"`` -> (0.0, 1.0, lower included, upper included); ``inf`` is unbounded."""
    lo, hi = (float(x) for x in within[1:-1].split(","))
    return lo, hi, within[0] == "[", within[-1] == "]"


def _inside(value, within: str) -> bool:
    lo, hi, lo_in, hi_in = _bounds(within)
    return (lo <= value if lo_in else lo < value) and (value <= hi if hi_in else value < hi)


def _phrase(within: str) -> str:
    """The interval in words where they are shorter: at least 0, positive, in (0, 1]."""
    lo, hi, lo_in, _ = _bounds(within)
    if math.isinf(hi):
        if lo == 0 and not lo_in:
            return "positive"
        return f"{'at least' if lo_in else 'above'} {lo:g}"
    return f"in {within}"


def _is_number(arg: str) -> bool:
    try:
        float(arg)
        return True
    except ValueError:
        return False

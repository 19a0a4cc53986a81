"""The benches' worker protocol: each measurement runs in a fresh process (its own threads,
plans and peak memory) that prints one ``RESULT <json>`` line on stdout; and the timing and
machine helpers they share."""
from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Dict, List, Optional


def run_worker(cmd: List[str], what: str, env: Optional[Dict[str, str]] = None) -> dict:
    """Run ``cmd`` and return the JSON of its ``RESULT`` line; stop the bench, naming
    ``what`` and showing the end of the worker's stderr, when it has none."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join(proc.stderr.splitlines()[-15:])
    raise SystemExit(f"bench: {what} failed (exit {proc.returncode}):\n{tail}")


def one_thread_env() -> Dict[str, str]:
    """This environment with OpenMP and OpenBLAS held to one thread (cct sets its own)."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def seconds(call) -> float:
    """The wall-clock seconds of one call of ``call``."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def best_of(call, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls (seconds), after one untimed call that times the
    kernels' plans, compiles the numba kernels and touches the outputs."""
    call()
    return min(seconds(call) for _ in range(repeats))


def cpu_model() -> str:
    """The CPU's model name (what bench/RESULTS.md records with every figure)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"

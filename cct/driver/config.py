"""One run's parallel settings: what ``cct train``'s flags say and what ``cct.driver.Driver``
takes from Python, in one object. The CLI fills it (cct/cli.py ``_driver_config``, each flag
checked where it is parsed); the Driver checks it again with the settings' own names, for
Python callers, before anything is built.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from ..devices import available_cores, parse_devices
from ..errors import CCTError
from ..glog import info

#: The strategies the driver runs; ``sync`` is the solver's own ``solve()`` (no driver).
STRATEGIES = ("sync", "async", "hogbatch", "adaptive-hogbatch", "sma")


@dataclass(frozen=True)
class DriverConfig:
    """The driver's settings, named as ``cct train``'s flags are (``--sync-fc`` is
    ``sync_fc``). ``devices`` is a spelling (``"cpu:0,gpu0"``) or a list of Device objects;
    ``groups=None`` is one group per device. Frozen: a probe or a re-tune makes a changed copy
    (:meth:`replace`), never changes the run's own."""

    strategy: str = "async"
    groups: Optional[int] = 2
    engine: str = "threads"
    devices: object = None
    staleness: str = "round-robin"
    momentum: Optional[str] = None
    allow_negative_momentum: bool = False
    seed: int = 0
    trace: Optional[Sequence[int]] = None
    sync_fc: bool = False
    batch_sizes: object = None
    threshold: float = 0.05
    learners: object = None
    sma_alpha: Optional[float] = None
    sma_momentum: float = 0.0
    sync_period: int = 1
    simulate_speeds: Optional[Sequence[float]] = None
    ray_address: Optional[str] = None
    ps_shards: object = "auto"
    ray_group_restarts: int = 3
    ray_data: str = "ship"
    group_timeout: Optional[float] = None

    def replace(self, **changes) -> "DriverConfig":
        return dataclasses.replace(self, **changes)

    def check(self, engines) -> None:
        """Refuse settings that contradict each other, before a group exists (``engines``:
        the registry's names)."""
        if self.strategy not in STRATEGIES or self.strategy == "sync":
            raise CCTError(f"the driver runs strategies {', '.join(STRATEGIES[1:])}, not "
                           f"'{self.strategy}' (sync is the solver's own solve())")
        if self.engine not in engines:
            raise CCTError(f"unknown engine '{self.engine}'; known: {', '.join(engines)}")
        if self.simulate_speeds is not None and self.engine != "simulated":
            raise CCTError("--simulate-speeds sets the simulated engine's device speeds: add "
                           "--engine=simulated")
        if self.strategy == "sma":
            if self.sync_fc:
                raise CCTError("--sync-fc is for the parameter store's strategies, not sma")
            if self.momentum is not None:
                raise CCTError("--momentum sets the parameter store's momentum; with sma the "
                               "learners use the solver's and the central model "
                               "--sma-momentum")
        if self.sync_fc and self.engine in ("processes", "ray"):
            raise CCTError("--sync-fc runs with the threads and simulated engines (the FC "
                           "layers run on the parameter store, in the driver's process)")
        if self.ray_data == "local" and self.strategy == "adaptive-hogbatch" \
                and self.engine == "ray":
            raise CCTError("--ray-data=local fixes each group's batch in its data layer: "
                           "adaptive-hogbatch needs --ray-data=ship")

    def device_list(self):
        """The devices as a list (parsed from a spelling), or None."""
        if isinstance(self.devices, str):
            return parse_devices(self.devices)
        return None if self.devices is None else list(self.devices)

    def resolved(self) -> "DriverConfig":
        """The settings with the group count decided: one group per device when ``groups``
        is None (the papers' setting: CPU+GPU Hogbatch, Omnivore's CPU and GPU groups; a group
        holding several devices, its batch split between them, is asked for by name), and an
        SMA run's learner count (``learners``: a number, ``"auto"`` or the groups)."""
        config = self
        if self.groups is None:
            devices = self.device_list()
            config = config.replace(devices=devices, groups=len(devices) if devices else 1)
            if devices and len(devices) > 1:
                info("driver.cpp:0", f"One compute group per device: "
                     f"{', '.join(d.name for d in devices)} (--groups=1 makes them one group "
                     f"that splits each batch between them)")
        if self.strategy == "sma":
            config = config.replace(groups=config._learner_count())
        if config.groups < 1:
            raise CCTError(f"--groups must be at least 1, got {config.groups}")
        if (self.simulate_speeds is not None and self.strategy != "sma"
                and len(self.simulate_speeds) != config.groups):
            raise CCTError(f"--simulate-speeds gives {len(self.simulate_speeds)} speed(s) for "
                           f"{config.groups} group(s): give one per group")
        return config

    def _learner_count(self) -> int:
        if self.learners != "auto":
            return int(self.learners if self.learners is not None else self.groups)
        if self.simulate_speeds:
            return len(self.simulate_speeds)
        if self.engine == "ray":      # Ray's CPUs are the cluster's: one per --groups
            return self.groups
        if self.devices is None:
            return len(available_cores())
        return len(self.device_list())

"""What the simulator takes and gives: a step's costs (Costs), a simulated run (SimResult)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Costs:
    """Seconds each part of a step costs (calibrated from a real run, or set by hand)."""

    compute_s: float | dict  # a worker's gradient on one batch; a dict: per worker
    compute_cv: float = 0.0  # per-step noise: lognormal with this coefficient of variation
    pull_s: float = 0.0  # one pull of the parameters, every PS task together (worker's side)
    push_s: float = 0.0  # one push's transfer (worker's side)
    latency_s: float = 0.0  # a call's round trip waiting on neither side's CPU (pull, push)
    checkpoint_s: float = 0.0  # PS task 0 writing one checkpoint (checkpoint_every)
    restart_s: float = 0.0  # from a PS's death to its resumed run's first step
    serve_s: float = 0.0  # the PS's work per worker step: half serving a pull, half a push
    serve_fixed: float = 0.0  # the share of it every PS task pays when sharded (per request)
    apply_s: float = 0.0  # applying one update's gradients, on one PS task
    background_s: float = 0.0  # CPU per worker step off the step's path (shared cores only)
    shard_s: float = 0.0  # per update, with P > 1 PS tasks: coordinating them
    decide_s: float = 0.0  # PS task 0's bookkeeping per push (sync, SSP, backup)
    cores: int | None = None  # cores the run's processes share (None: a core each)

    def __post_init__(self):
        values = self.compute_s.values() if isinstance(self.compute_s, dict) else [self.compute_s]
        for name, value in [("compute_s", v) for v in values] + [
            (n, getattr(self, n))
            for n in (
                "compute_cv",
                "pull_s",
                "push_s",
                "latency_s",
                "serve_s",
                "serve_fixed",
                "apply_s",
                "background_s",
                "shard_s",
                "decide_s",
                "checkpoint_s",
                "restart_s",
            )
        ]:
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"Costs.{name} must be a number of seconds >= 0, got {value!r}")
        if self.serve_fixed > 1:
            raise ValueError(f"Costs.serve_fixed is a share, 0 to 1, got {self.serve_fixed!r}")
        if self.cores is not None and (not isinstance(self.cores, int) or self.cores < 1):
            raise ValueError(f"Costs.cores must be None or an integer >= 1, got {self.cores!r}")

    def compute_of(self, worker: int) -> float:
        """Worker `worker`'s mean compute seconds per step."""
        if not isinstance(self.compute_s, dict):
            return float(self.compute_s)
        for key in (worker, str(worker)):
            if key in self.compute_s:
                return float(self.compute_s[key])
        raise ValueError(
            f"Costs.compute_s has no time for worker {worker} (it has {sorted(self.compute_s)}): "
            f"give every worker of the run one"
        )


@dataclass
class SimResult:
    """What a simulated run did, in the figures a real run's events give."""

    seconds: float  # simulated wall time from the first step to the last update
    updates: int
    update_t: np.ndarray  # simulated time of each update
    staleness: np.ndarray  # of every gradient applied, in order
    drops: int  # late gradients dropped (backup, drop)
    folded: int  # late gradients folded in (backup, fold)
    steps: dict  # worker -> steps taken
    wait_s: dict  # worker -> seconds spent waiting for a token
    # each pull's and push's seconds (a pull from its call, after any token, to its return;
    # an async push with its apply), when the steps are simulated phase by phase (shared cores
    # or the PS's serving set); else empty
    pulls: np.ndarray
    pushes: np.ndarray
    dead: list = field(default_factory=list)  # workers killed by a fault
    error: str | None = None  # why the run could not finish (sync after a lost worker)
    checkpoints: int = 0  # written by PS task 0
    # with PS faults: (simulated s, the update the PS died at, the checkpoint resumed from)
    restarts: list = field(default_factory=list)
    lost: int = 0  # updates made again after restarts (each fault's update less its checkpoint)
    # with numerics: [(simulated s, version, test accuracy)] every eval_every updates, and
    # the final parameters' test accuracy
    accuracy: list = field(default_factory=list)
    test_accuracy: float | None = None

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_staleness(self) -> float:
        return float(self.staleness.mean()) if len(self.staleness) else float("nan")

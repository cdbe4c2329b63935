"""Where one PS becomes the bottleneck: what each PS task carries, and a cost model fitted to runs.

Measured in a run of async training (every worker step is one pull and one push):
- the bytes each PS task sends and receives per worker step, from the sharding plan
  (wire.plan): a task sends its pieces of the parameters and receives their gradients;
- the CPU seconds each process used per worker step while the run trained
  (Run.cpu_seconds, sampled by the launcher);
- the wall time of a step's pull, compute and push, from the workers' step stamps.

The model (`CostModel`) states its assumptions: every process has a core and a full-duplex
network link of its own, as on real machines. A message of b bytes takes alpha + b / beta
seconds; a worker's step takes compute + pull + push of the whole model, whatever the number
of PS tasks (the worker receives and sends every byte); a PS task is busy, per worker step,
for a fixed part (task 0 only: the protocol's loop and its messages) plus gamma seconds per
byte it carries. The workers then make N / step_s steps per second, and the busiest PS task
can serve 1 / its busy time: the throughput is the smaller of the two.

This is our own code: the lesson is the model, and no library fits it for us (NumPy's least
squares does the fitting).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helpers.cluster import wire
from helpers.cluster.events import Kind, StepStamps
from helpers.cluster.wire import Header
from helpers.training import compression


def task_bytes(shapes, tasks: int, compress=None) -> list[dict]:
    """Per PS task: bytes it sends per pull and receives per push (task 0: with the header)."""
    pieces = wire.plan(shapes, tasks)
    comp = compression.from_spec(compress)
    out = []
    for t, idx in enumerate(wire.by_task(pieces, tasks)):
        mine = [pieces[i].shape for i in idx]
        out.append({"pull": 4 * sum(math.prod(s) for s in mine),
                    "push": comp.bytes_for(mine) + (8 * len(Header._fields) if t == 0 else 0)})
    return out


def phases(run) -> dict:
    """Median seconds of a worker step's pull, compute and push (async: the push applies)."""
    st = run.events[run.events.kind == Kind.STEP]
    s = np.array([StepStamps(*x) for x in st.stamps])
    fields = StepStamps._fields
    col = {f: s[:, i] for i, f in enumerate(fields)}
    return {"pull_s": float(np.median(col["arrived"] - col["called"])),
            "compute_s": float(np.median(col["computed"] - col["arrived"])),
            "push_s": float(np.median(col["pushed"] - col["computed"]))}


def run_row(run, shapes) -> dict:
    """One run's measured figures: steps/s, and per process CPU seconds per worker step;
    per PS task the MB it carries per worker step."""
    cfg = run.config
    ev = run.events
    start, end = run.training_window()
    st = ev[(ev.kind == Kind.STEP) & (ev.t > start) & (ev.t <= end)]
    n_steps = len(st)
    cpu = run.cpu_seconds()
    tasks = len([n for n in cpu if str(n).startswith("ps:")])
    carried = task_bytes(shapes, tasks, cfg.compress)
    row = {"workers": cfg.workers, "ps tasks": tasks, "model": cfg.model,
           "steps/s": n_steps / (end - start)}
    for t, b in enumerate(carried):
        row[f"ps:{t} MB/step"] = (b["pull"] + b["push"]) / 1e6
        row[f"ps:{t} CPU ms/step"] = 1e3 * cpu.get(f"ps:{t}", float("nan")) / n_steps
    workers = [f"worker:{w}" for w in cfg.worker_ids]
    row["worker CPU ms/step"] = 1e3 * sum(cpu[w] for w in workers) / n_steps
    row["CPU used (% of a core)"] = 100 * sum(v for v in cpu.values() if v == v) / (end - start)
    row.update({k.replace("_s", " ms"): 1e3 * v for k, v in phases(run).items()})
    return row


@dataclass
class CostModel:
    """alpha + bytes / beta per message; PS task busy time fixed (task 0) + gamma * bytes."""

    alpha_s: float  # seconds per message
    beta: float  # bytes per second
    compute_s: float  # a worker's gradient, seconds
    ps0_fixed_s: float  # PS task 0 per worker step: its loop and messages
    gamma_s: float  # PS task CPU seconds per byte carried

    @classmethod
    def fit(cls, messages, ps0, compute_s) -> "CostModel":
        """Least squares: `messages` [(bytes, seconds)] of pulls and pushes; `ps0` [(bytes
        carried per step, CPU seconds per step)] of one-task runs; compute seconds of a step."""
        (beta_inv, alpha), *_ = np.linalg.lstsq(
            np.c_[[b for b, _ in messages], np.ones(len(messages))],
            [s for _, s in messages], rcond=None)
        (gamma, fixed), *_ = np.linalg.lstsq(
            np.c_[[b for b, _ in ps0], np.ones(len(ps0))], [s for _, s in ps0], rcond=None)
        if beta_inv <= 0 or gamma <= 0:
            raise ValueError(f"the fit found no cost per byte (1/beta={beta_inv:.3g} s/B, "
                             f"gamma={gamma:.3g} s/B): measure models of more different sizes")
        return cls(float(max(alpha, 0.0)), float(1 / beta_inv), float(compute_s),
                   float(max(fixed, 0.0)), float(gamma))

    def message_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.beta

    def step_s(self, model_bytes: float) -> float:
        """A worker's step: pull the whole model, compute, push the whole gradient."""
        return self.compute_s + 2 * self.message_s(model_bytes)

    def ps_busy_s(self, carried: list[float]) -> list[float]:
        """Each PS task's busy seconds per worker step, given the bytes it carries per step."""
        return [self.ps0_fixed_s * (t == 0) + self.gamma_s * b for t, b in enumerate(carried)]

    def throughput(self, workers: int, model_bytes: float, carried: list[float]) -> float:
        """Worker steps per second: the workers' pace or the busiest PS task's, the smaller."""
        return min(workers / self.step_s(model_bytes), 1 / max(self.ps_busy_s(carried)))

    def saturation(self, model_bytes: float, carried: list[float]) -> float:
        """The number of workers at which the busiest PS task is busy all the time."""
        return self.step_s(model_bytes) / max(self.ps_busy_s(carried))

"""Where one PS becomes the bottleneck: what each PS task carries, and a cost model fitted to runs.

Measured in a run of async training (every worker step is one pull and one push):
- the bytes each PS task sends and receives per worker step, from the sharding plan
  (wire.plan): a task sends its pieces of the parameters and receives their gradients;
- the CPU seconds each process used per worker step while the run trained
  (Run.cpu_seconds, sampled by the launcher);
- the wall time of a step's pull, compute and push, from the workers' step stamps.

The model (`CostModel`) states its assumptions: every process has a core and a full-duplex
network link of its own, as on real machines. A message of b bytes costs alpha + b / beta
seconds. A worker's step is compute + pull + push; it talks to every PS task, so with P tasks
it pays alpha P times each way, and b / beta for the whole model whatever P is (the worker
receives and sends every byte). A PS task is busy, per worker step, for phi + gamma * (the
bytes it carries), plus delta when the parameters are split (each task then also takes part
in coordinating every step with the others); none of it depends on the number of workers.
The workers then make N / step_s steps per second, and the busiest PS task can serve 1 / its
busy time: the throughput is the smaller of the two.

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
        out.append(
            {
                "pull": 4 * sum(math.prod(s) for s in mine),
                "push": comp.bytes_for(mine) + (8 * len(Header._fields) if t == 0 else 0),
            }
        )
    return out


def phases(run) -> dict:
    """Median seconds of a worker step's pull, compute and push (async: the push applies), as
    the timeline cuts a step (events.StepStamps.phases: a pull without the wait for a token)."""
    st = run.events[run.events.kind == Kind.STEP]
    per_step = [StepStamps(*stamps).took() for stamps in st.stamps]
    return {
        f"{name}_s": float(np.median([t[name] for t in per_step]))
        for name in ("pull", "compute", "push")
    }


def run_row(run, shapes) -> dict:
    """One run's measured figures: steps/s, and per process CPU seconds per worker step;
    per PS task the MB it carries per worker step."""
    cfg = run.config
    st, seconds = run.in_training(Kind.STEP)
    n_steps = len(st)
    cpu = run.cpu_seconds()
    tasks = run.ps_tasks
    carried = task_bytes(shapes, tasks, cfg.compress)
    row = {
        "workers": cfg.workers,
        "ps tasks": tasks,
        "model": cfg.model,
        "steps/s": n_steps / seconds,
    }
    for t, b in enumerate(carried):
        row[f"ps:{t} MB/step"] = (b["pull"] + b["push"]) / 1e6
        row[f"ps:{t} CPU ms/step"] = 1e3 * cpu.get(f"ps:{t}", float("nan")) / n_steps
    workers = [f"worker:{w}" for w in cfg.worker_ids]
    row["worker CPU ms/step"] = 1e3 * sum(cpu[w] for w in workers) / n_steps
    row["CPU used (% of a core)"] = 100 * sum(v for v in cpu.values() if v == v) / seconds
    row.update({k.replace("_s", " ms"): 1e3 * v for k, v in phases(run).items()})
    return row


def _line(points) -> tuple[float, float]:
    """Least-squares slope and intercept (intercept >= 0) of [(x, y)] points."""
    (slope, icept), *_ = np.linalg.lstsq(
        np.c_[[x for x, _ in points], np.ones(len(points))], [y for _, y in points], rcond=None
    )
    return float(slope), float(max(icept, 0.0))


@dataclass
class CostModel:
    """alpha + bytes / beta per message; a PS task busy phi + gamma * bytes (+ delta when
    sharded) per worker step."""

    alpha_s: float  # seconds per message
    beta: float  # bytes per second
    compute_s: float  # a worker's gradient, seconds
    phi_s: float  # a PS task's busy seconds per worker step, apart from the bytes
    gamma_s: float  # a PS task's busy seconds per byte it carries
    delta_s: float = 0.0  # what a task of a sharded PS adds per worker step

    @classmethod
    def fit(cls, messages, one_task, compute_s, sharded=()) -> "CostModel":
        """Least squares. `messages`: [(bytes, seconds)] of pulls and pushes with one PS task;
        `one_task`: [(bytes the PS carries per worker step, its CPU seconds per step)] of
        one-task runs; `sharded`: the same for the tasks of sharded runs (gives delta)."""
        beta_inv, alpha = _line(messages)
        gamma, phi = _line(one_task)
        if beta_inv <= 0 or gamma <= 0:
            raise ValueError(
                f"the fit found no cost per byte (1/beta={beta_inv:.3g} s/B, "
                f"gamma={gamma:.3g} s/B): measure models of more different sizes"
            )
        delta = float(np.mean([s - phi - gamma * b for b, s in sharded])) if len(sharded) else 0.0
        return cls(alpha, 1 / beta_inv, float(compute_s), phi, gamma, delta)

    def step_s(self, model_bytes: float, tasks: int = 1) -> float:
        """A worker's step: pull the model from every task, compute, push the gradient."""
        return self.compute_s + 2 * (tasks * self.alpha_s + model_bytes / self.beta)

    def ps_busy_s(self, carried: list[float]) -> list[float]:
        """Each PS task's busy seconds per worker step, given the bytes it carries per step."""
        extra = self.delta_s if len(carried) > 1 else 0.0
        return [self.phi_s + self.gamma_s * b + extra for b in carried]

    def throughput(self, workers: int, model_bytes: float, carried: list[float]) -> float:
        """Worker steps per second: the workers' pace or the busiest PS task's, the smaller."""
        return min(
            workers / self.step_s(model_bytes, len(carried)), 1 / max(self.ps_busy_s(carried))
        )

    def saturation(self, model_bytes: float, carried: list[float]) -> float:
        """The number of workers at which the busiest PS task is busy all the time."""
        return self.step_s(model_bytes, len(carried)) / max(self.ps_busy_s(carried))

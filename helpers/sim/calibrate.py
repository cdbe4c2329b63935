"""The simulator's costs, measured on one real run: `calibrate(run)` -> Calibration.

What a run's record gives (its training window only, after the warm-up):
- from the step stamps (events.StepStamps, cut into phases as the timeline cuts them): each
  worker's compute time per step (median) with its own Python between two steps (its loop and
  log, less a straggler's sleep), how much the compute varies (the median of the workers'
  coefficients of variation), and the median pull and push of the steps that fetched and pushed;
- from the launcher's CPU samples of every process: the run's CPU seconds per worker step, the
  PS tasks' among them.

The model those figures are fitted to, and why: on this machine a step's pull and push are mostly
the PS's time, taken one request at a time. Adding workers to async logistic regression (1 PS task,
2 cores) raised the steps per second far less than it raised the workers, while every pull and push
grew. So the pull and the push are the PS's work on the step (Costs.serve_s), in turn, on a core;
the compute is the worker's, on a core; the CPU the run used beyond those is spent off the step's
path (background_s: logging, the runtime's threads).

The stamps of a run whose workers queue at the PS include that queueing. So the phases are
scaled by one factor, fitted so that the simulator, run on the calibration run's own
configuration with the machine's cores shared, gives that run's steps per second.

What one run cannot tell apart is said in the table, not guessed: the apply of an update is in
the PS's work per step (apply_s stays 0). PS task 0's own loop in sync, SSP and backup (taking
each push off the queue, deciding, applying, handing out tokens, in Python: decide_s) is not on
an async run's path at all; a run of a waiting mode, if given, fits it, else it stays 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from helpers.cluster import protocol
from helpers.cluster.events import Kind, StepStamps
from helpers.sim.simulator import Costs, simulate

MIN_STEPS = 200  # worker steps in the training window
MIN_SECONDS = 2.0  # the CPU samples come every 0.5 s
FIXED_SHARES = np.round(np.arange(0.0, 1.01, 0.05), 2)  # serve_fixed, tried in turn
DECISIONS = np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 56)])  # decide_s (s), in turn
SCALES = (0.02, 5.0)  # the phases' factor lies between these: found by bisection


@dataclass
class Calibration:
    """Costs fitted to one run, with the figures they came from."""

    costs: Costs
    run_id: str
    mode: str
    workers: int
    ps: int
    steps: int  # worker steps in the training window
    steps_per_s: float  # measured
    simulated_steps_per_s: float  # the simulator on the same configuration, with `costs`
    scale: float  # the factor the measured phases were scaled by
    per_worker: dict  # worker -> its median compute (with its own Python), before scaling
    cpu_per_step_s: float  # every process of the run, per worker step
    ps_cpu_per_step_s: float  # the PS tasks', per worker step
    call_s: float = math.nan  # measured: median pull + median push
    simulated_call_s: float = math.nan  # the same, simulated with the fitted costs
    sharded_from: str | None = None  # the sharded run serve_fixed was fitted on
    waiting_from: str | None = None  # the sync/SSP/backup run decide_s was fitted on

    def table(self):
        """Each fitted figure, its value, and what it was measured from (a DataFrame)."""
        import pandas as pd

        c = self.costs
        src = _described(self.run_id, self.mode, self.workers, self.ps)
        scaled = f"x {self.scale:.2f} (fitted)"
        rows = [
            (f"compute, worker {w} (ms)", 1e3 * v, f"median of its steps, {src}")
            for w, v in sorted(self.per_worker.items())
        ]
        rows += [
            ("compute, every worker (ms)", 1e3 * c.compute_s, f"median of the above {scaled}"),
            ("compute variation (CV)", c.compute_cv, f"median over the workers, {src}"),
            ("pull + push, measured (ms)", 1e3 * self.call_s, f"medians of its steps, {src}"),
            ("pull + push, simulated (ms)", 1e3 * self.simulated_call_s, "medians, fitted"),
            (
                "PS work per step (ms)",
                1e3 * c.serve_s,
                f"median pull + median push {scaled}, one request at a time",
            ),
            (
                "latency per call (ms)",
                1e3 * c.latency_s,
                "not separable on one machine: 0 (set it for a network)",
            ),
            (
                "PS work every task pays (share)",
                c.serve_fixed,
                f"fitted on {self.sharded_from}"
                if self.sharded_from
                else "no sharded run given: assumed 0 (the work splits over the tasks)",
            ),
            ("PS apply per update (ms)", 1e3 * c.apply_s, "not separable from one run: above"),
            (
                "PS task 0's loop per push (ms)",
                1e3 * c.decide_s,
                f"fitted on {self.waiting_from}"
                if self.waiting_from
                else "no sync, SSP or backup run given: assumed 0",
            ),
            (
                "off the step's path (ms)",
                1e3 * c.background_s,
                "the run's CPU per step, less the PS's work and the compute",
            ),
            ("CPU per step, all (ms)", 1e3 * self.cpu_per_step_s, f"every process's CPU, {src}"),
            ("CPU per step, PS (ms)", 1e3 * self.ps_cpu_per_step_s, f"the PS tasks' CPU, {src}"),
            ("shared cores", c.cores, "this machine's logical cores"),
            ("steps/s, measured", self.steps_per_s, f"{self.steps} worker steps, {src}"),
            ("steps/s, simulated", self.simulated_steps_per_s, "the same configuration, fitted"),
        ]
        return pd.DataFrame(rows, columns=["figure", "value", "measured from"])


def _per_worker(steps, phases) -> tuple[dict, list]:
    """Each worker's median compute with its own Python between two steps, and the
    coefficients of variation of the workers' compute."""
    compute, cvs = {}, []
    for w, rows in steps.groupby("worker"):
        mine = np.flatnonzero(steps.worker.to_numpy() == w)
        took = np.array([phases[i]["compute"] for i in mine])
        st = [StepStamps(*x) for x in rows.stamps]
        # the worker's own Python between two steps (its loop, its log), less a straggler's
        # sleep: on its core like the compute, so counted with it
        gaps = [b.waiting - a.returned - d for a, b, d in zip(st, st[1:], rows.delay_s)]
        between = max(0.0, float(np.median(gaps))) if gaps else 0.0
        compute[int(w)] = float(np.median(took)) + between
        if len(took) > 1 and took.mean() > 0:
            cvs.append(float(took.std() / took.mean()))
    return compute, cvs


def _rate(result) -> float:
    """A simulation's worker steps per simulated second."""
    return sum(result.steps.values()) / result.seconds if result.seconds else float("nan")


def _steps_per_s(cfg, costs, ps: int) -> float:
    return _rate(simulate(cfg, costs, ps=ps))


def _fit_scale(cfg, costs_at, measured: float, ps: int) -> float:
    """The factor at which the simulator gives `measured` steps per second (the rate falls as
    the costs grow), to 2 %."""
    lo, hi = math.log(SCALES[0]), math.log(SCALES[1])
    for _ in range(9):
        mid = (lo + hi) / 2
        if _steps_per_s(cfg, costs_at(math.exp(mid)), ps) > measured:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _trained(run):
    """The run's worker steps in its training window, and their rate; refuses a run too
    short to measure."""
    steps, seconds = run.in_training(Kind.STEP)
    if len(steps) < MIN_STEPS or seconds < MIN_SECONDS:
        raise ValueError(
            f"run {run.config.run_id!r} trained {len(steps)} worker steps in {seconds:.1f} s: "
            f"calibrate on a run of at least {MIN_STEPS} steps and {MIN_SECONDS:.0f} s "
            f"(more steps=...)"
        )
    return steps, len(steps) / seconds


def _sim_config(cfg):
    """The run's configuration, simulated over at most 1,000 updates (enough for a rate)."""
    return protocol.validate(
        protocol.RunConfig(**{**cfg.to_dict(), "steps": max(200, min(cfg.steps, 1000))})
    )


def _fit_one(costs: Costs, run, field: str, values) -> Costs:
    """`costs` with one figure (`field`) set to the value among `values` at which the
    simulator gives `run`'s rate (one of the same model in another configuration)."""
    _, measured = _trained(run)
    cfg = _sim_config(run.config)
    fits = [
        (abs(_steps_per_s(cfg, replace(costs, **{field: v}), run.ps_tasks) / measured - 1), v)
        for v in values
    ]
    return replace(costs, **{field: float(min(fits)[1])})


def _refuse_unfit(sharded, waiting) -> None:
    """A sharded run must have several PS tasks, a waiting run a mode with PS task 0's loop."""
    if sharded is not None and sharded.ps_tasks < 2:
        raise ValueError(
            f"sharded run {sharded.config.run_id!r} had its parameters on 1 PS task: give a "
            f"run of LocalCluster(ps=2) or more, or sharded=None"
        )
    if waiting is not None and waiting.config.mode not in protocol.WAITING_MODES:
        raise ValueError(
            f"waiting run {waiting.config.run_id!r} was {waiting.config.mode}: give a run of "
            f"mode sync, ssp or backup, or waiting=None"
        )


def _described(run_id: str, mode: str, workers: int, ps: int) -> str:
    return f"{run_id} ({mode}, {workers} workers, {ps} PS)"


def _source(run) -> str:
    cfg = run.config
    return _described(cfg.run_id, cfg.mode, cfg.workers, run.ps_tasks)


def calibrate(run, cores: int | None = None, sharded=None, waiting=None) -> Calibration:
    """Fit the simulator's Costs to one run of a LocalCluster (a cluster.run.Run).

    Args:
        run: the real run (its events and the launcher's CPU samples).
        cores: the cores its processes shared; default: this machine's logical cores.
        sharded: optionally, a run of the same model with the parameters on several PS
            tasks, to fit the share of the PS's work each task pays whatever its part of the
            parameters (Costs.serve_fixed; without it, 0: the work splits evenly).
        waiting: optionally, a run of the same model in sync, SSP or backup mode, to fit PS
            task 0's loop per push (Costs.decide_s; without it, 0).
    Raises:
        ValueError: a run is too short to measure (fewer than MIN_STEPS worker steps or
            MIN_SECONDS of training), has no CPU samples (a run on other hosts), the
            sharded run had one PS task, or the waiting run was async.
    """
    import psutil

    cfg = run.config
    steps, measured = _trained(run)
    cpu = run.cpu_seconds()
    ps_names = [f"ps:{j}" for j in range(run.ps_tasks)]
    names = ps_names + [f"worker:{w}" for w in cfg.worker_ids]
    missing = [n for n in names if not math.isfinite(cpu.get(n, math.nan))]
    if missing:
        raise ValueError(
            f"run {cfg.run_id!r} has no CPU samples of {', '.join(missing)} over its training: "
            f"calibrate on a run made on this machine (LocalCluster without a placement)"
        )
    n = len(steps)
    phases = [StepStamps(*s).took() for s in steps.stamps]
    compute, cvs = _per_worker(steps, phases)
    fetched = steps.fetched.to_numpy(dtype=bool)
    pushed = steps.pushed.to_numpy(dtype=bool)
    pull = float(np.median([p["pull"] for p, f in zip(phases, fetched) if f] or [0.0]))
    push = float(np.median([p["push"] for p, f in zip(phases, pushed) if f] or [0.0]))
    ps_cpu = sum(cpu[j] for j in ps_names) / n
    cpu_per_step = sum(cpu[k] for k in names) / n
    sim_cfg = _sim_config(cfg)

    typical = float(np.median(list(compute.values())))

    def costs_at(scale: float) -> Costs:
        return Costs(
            compute_s=scale * typical,
            compute_cv=float(np.median(cvs)) if cvs else 0.0,
            serve_s=scale * (pull + push),
            background_s=max(0.0, cpu_per_step - scale * (pull + push + typical)),
            cores=cores or psutil.cpu_count(logical=True),
        )

    _refuse_unfit(sharded, waiting)
    scale = _fit_scale(sim_cfg, costs_at, measured, run.ps_tasks)
    costs = costs_at(scale)
    if sharded is not None:  # the share every PS task pays
        costs = _fit_one(costs, sharded, "serve_fixed", FIXED_SHARES)
    if waiting is not None:  # PS task 0's loop per push
        costs = _fit_one(costs, waiting, "decide_s", DECISIONS)
    own = simulate(sim_cfg, costs, ps=run.ps_tasks)  # the run's own, with the fitted costs
    return Calibration(
        costs=costs,
        run_id=cfg.run_id,
        mode=cfg.mode,
        workers=cfg.workers,
        ps=run.ps_tasks,
        steps=n,
        steps_per_s=measured,
        simulated_steps_per_s=_rate(own),
        scale=float(scale),
        call_s=pull + push,
        simulated_call_s=float(np.median(own.pulls) + np.median(own.pushes)),
        per_worker=compute,
        cpu_per_step_s=cpu_per_step,
        ps_cpu_per_step_s=ps_cpu,
        sharded_from=_source(sharded) if sharded is not None else None,
        waiting_from=_source(waiting) if waiting is not None else None,
    )


def with_costs(calibration: Calibration, **changes) -> Costs:
    """The calibrated costs with some figures changed (a bigger model, more cores)."""
    return replace(calibration.costs, **changes)

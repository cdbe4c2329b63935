"""A discrete-event simulation of the parameter-server engine: the same run configuration, the
same protocol rules, simulated time instead of processes, so 1,000 workers fit on a laptop.

    from helpers.cluster.protocol import RunConfig, validate
    from helpers.sim.simulator import Costs, simulate
    cfg = validate(RunConfig(workers=100, mode="backup", k=90, steps=1000))
    result = simulate(cfg, Costs(compute_s=0.004, pull_s=0.001, push_s=0.001, apply_s=0.0005))
    result.updates_per_s, result.mean_staleness, result.drops

What is simulated, as the engine does it (helpers/cluster/ps.py and worker.py):
- a worker step: wait for a token (sync, SSP, backup), pull the parameters (every n_fetch-th
  step, Downpour; the version is read on the PS half-way through the pull), compute a gradient
  on a core, push (every n_push-th step), then sleep a straggler's delay (no core), drawn as
  worker.py draws it: a slowdown factor stretches the step's call (pull, compute and push;
  in sync, SSP and backup, whose pull holds the wait for the token, compute and push);
  each call, pull or push, also waits Costs.latency_s on no CPU (a network's round trip);
- async: each push applies under the next ticket, one at a time on the PS; its staleness is the
  updates applied since the worker read the parameters;
- sync and backup: PS task 0's loop takes the pushes in arrival order, decides with
  protocol.BackupAggregator (the first k fresh gradients; late ones dropped or folded with
  protocol.fold_weights), applies an update, and hands a token to every worker whose push it
  has seen once the version has moved past what that worker read;
- SSP: the loop applies every push and hands out the tokens protocol.SSPGate frees;
- the PS's own work per worker step (serving its pull, taking its push: Costs.serve_s) is done
  by each PS task one request at a time, so one PS saturates as workers are added;
- P PS tasks: a step's serving and an update's apply are split over them, each on a core,
  except the share of the serving every task pays per request, one task after another
  (Costs.serve_fixed: a round trip each), plus a fixed cost per update for coordinating them;
  PS task 0 alone decides;
- checkpoints (checkpoint_every): PS task 0 writes after the update, on a core
  (Costs.checkpoint_s); in sync, SSP and backup its loop waits meanwhile, the tokens already
  out; in async the pushes past the checkpoint wait for it, as the engine's ticket blocks do;
- a killed PS task (faults {"ps": {"kind": "kill", "at": v}} or "ps:J"): the attempt ends at
  update v as the real run fails there, and the run is resumed as train(resume=True) resumes
  it: Costs.restart_s later, from the last checkpoint, every worker alive and drawing its
  batches anew (SimResult.restarts, .lost); a worker's faults are its first attempt's;
- shared cores: with Costs.cores set, everything a process does (a worker's pull, compute and
  push, the PS's serving and applying, and Costs.background_s per step off the step's path)
  waits for one of that many cores (first come, first served), as a run's processes contend on
  a small machine.

SimPy runs the events: a well-kept discrete-event library whose processes are Python
generators, so a worker's loop reads as the engine's does; its overhead per event (a few
microseconds) keeps 1,000 workers x 1,000 sync updates within a minute.
"""

from __future__ import annotations

import numpy as np

from helpers.cluster import protocol
from helpers.sim.attempt import Attempt
from helpers.sim.costs import Costs, SimResult

__all__ = ["Costs", "SimResult", "simulate"]


def _ps_faults(cfg) -> list[int]:
    """The versions at which a PS task is killed, in order; a hung PS is refused by name."""
    at = []
    for who, spec in cfg.faults.items():
        if protocol.ps_fault_task(who) is None:
            continue
        if spec["kind"] != "kill":
            raise ValueError(
                f"fault {who!r}: a hung PS is not simulated (the run would wait for the "
                f"launcher's stall_timeout); simulate {{'kind': 'kill', 'at': {spec['at']}}}"
            )
        at.append(int(spec["at"]))
    return sorted({v for v in at if 0 < v < cfg.steps})


def _joined(parts: list[SimResult], offsets: list[float], restarts: list, numerics) -> SimResult:
    """One run's result from its attempts, each starting at its offset (simulated s)."""
    workers = parts[0].steps
    return SimResult(
        seconds=offsets[-1] + parts[-1].seconds,
        updates=parts[-1].updates,
        update_t=np.concatenate([p.update_t + o for p, o in zip(parts, offsets)]),
        staleness=np.concatenate([p.staleness for p in parts]),
        drops=sum(p.drops for p in parts),
        folded=sum(p.folded for p in parts),
        steps={w: sum(p.steps[w] for p in parts) for w in workers},
        wait_s={w: sum(p.wait_s[w] for p in parts) for w in workers},
        pulls=np.concatenate([p.pulls for p in parts]),
        pushes=np.concatenate([p.pushes for p in parts]),
        dead=[w for p in parts for w in p.dead],
        error=parts[-1].error,
        accuracy=numerics.accuracy if numerics is not None else [],
        test_accuracy=parts[-1].test_accuracy,
        checkpoints=sum(p.checkpoints for p in parts),
        restarts=restarts,
        lost=sum(died - back for _, died, back in restarts),
    )


def simulate(
    cfg: protocol.RunConfig, costs: Costs, ps: int = 1, seed: int = 0, numerics=None
) -> SimResult:
    """Simulate one run of `cfg` (a validated protocol.RunConfig) with these costs on `ps` PS
    tasks; the same seed gives the same result. `numerics`: a helpers.sim.numerics.Numerics
    of the same configuration, to compute the gradients for real (accuracy), or None.

    With checkpoint_every, PS task 0 writes a checkpoint every that many updates
    (Costs.checkpoint_s on a core; in async the pushes past it wait, as the engine's tickets
    do). A PS fault ("kill" at update v) ends that attempt as it ends a real run; the run is
    then resumed as `LocalCluster.train(resume=True)` resumes it: after Costs.restart_s, from
    the last checkpoint (update 0 without one), every worker alive again. The result is the
    whole run's: its seconds and updates count the lost work, `restarts` and `lost` say how
    much there was."""
    if ps < 1 or isinstance(ps, bool) or not isinstance(ps, int):
        raise ValueError(f"ps must be an integer >= 1, got {ps!r}")
    protocol.validate(cfg)
    if cfg.resume:
        raise ValueError(
            "resume=True continues a real run from its checkpoint: simulate the whole run "
            "instead (its PS fault and checkpoint_every), with Costs.restart_s for the restart"
        )
    if numerics is not None and numerics.cfg is not cfg:
        raise ValueError("numerics must be made from the same configuration: Numerics(cfg)")
    parts, offsets, restarts, start = [], [0.0], [], 0
    for attempt, died in enumerate([*_ps_faults(cfg), None]):
        if numerics is not None:
            numerics.offset = offsets[-1]
        part = Attempt(
            cfg, costs, ps, seed if not attempt else [seed, attempt], numerics, start, died
        ).run()
        parts.append(part)
        if died is None or part.error is not None:
            break
        every = cfg.checkpoint_every
        back = (died // every) * every if every else 0
        if every and back == died:  # written before the fault, as ps.py's loop does
            part.checkpoints += 1
            if numerics is not None:
                numerics.checkpoint()
        restarts.append((offsets[-1] + part.seconds, died, back))
        offsets.append(offsets[-1] + part.seconds + costs.restart_s)
        if numerics is not None:
            numerics.restore()
        start = back
    return parts[0] if len(parts) == 1 else _joined(parts, offsets, restarts, numerics)

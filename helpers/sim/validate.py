"""The simulator against real runs: the figures compared and the margins they must meet.

`measured(run)` and `simulated(cfg, costs, ps)` give the same four figures (updates per second,
mean staleness, late pushes dropped, test accuracy); `within(real, sim, rel, absolute)` is the
rule a simulated figure is judged by: within `rel` of the real runs' median (or `absolute`), or
within their own spread (max - min) when that is larger. MARGINS holds each figure's.
"""

from __future__ import annotations

import statistics

import numpy as np

# figure -> (relative margin, absolute margin)
MARGINS = {
    "updates_per_s": (0.15, 0.0),
    "staleness": (0.20, 0.3),
    "drops": (0.20, 0.0),
    "accuracy": (0.0, 0.02),
}


def measured(run) -> dict:
    """updates/s, mean staleness and drops of a real run over its training window, and its
    final test accuracy."""
    from helpers.cluster.events import Kind

    updates, seconds = run.in_training(Kind.UPDATE)
    stale = [s for row in updates.staleness for s in row]
    return {
        "updates_per_s": len(updates) / seconds,
        "staleness": float(np.mean(stale)) if stale else 0.0,
        "drops": int((run.events.kind == Kind.DROP).sum()),
        "accuracy": run.test_accuracy,
    }


def simulated(cfg, costs, ps: int = 1) -> dict:
    """The same figures from a simulation of `cfg`, its gradients computed for real."""
    from helpers.sim.numerics import Numerics
    from helpers.sim.simulator import simulate

    r = simulate(cfg, costs, ps=ps, numerics=Numerics(cfg))
    return {
        "updates_per_s": r.updates_per_s,
        "staleness": r.mean_staleness,
        "drops": r.drops,
        "accuracy": r.test_accuracy,
    }


def within(real: list[float], sim: float, rel: float, absolute: float = 0.0) -> bool:
    """Within rel (or `absolute`) of the real median, or of the real runs' own spread."""
    mid = statistics.median(real)
    margin = max(rel * abs(mid), absolute, max(real) - min(real))
    return abs(sim - mid) <= margin


def judged(real: list[dict], sim: dict) -> dict:
    """figure -> whether the simulation is within its margin of the real repeats."""
    return {f: within([m[f] for m in real], sim[f], *MARGINS[f]) for f in MARGINS}


def typical(runs: list):
    """The repeat with the median updates per second: one run's rate moves with the
    machine's load, and calibrating on the middle one keeps an outlier out of every
    prediction."""
    return sorted(runs, key=lambda r: measured(r)["updates_per_s"])[len(runs) // 2]

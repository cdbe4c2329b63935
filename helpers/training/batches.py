"""Batch-size schedules and minibatch index plans (disjoint or overlapping), in pure NumPy."""

from __future__ import annotations

import numpy as np

# The source report's growing schedules: batch size = base + step * epoch (epoch from 0).
GROWING_SCHEDULES = {"30+10e": (30, 10), "50+50e": (50, 50), "500+50e": (500, 50)}


def batch_size_at(schedule, epoch: int) -> int:
    """Batch size for `epoch` (0-based): an int (fixed) or a (base, step) growing schedule."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if isinstance(schedule, str):
        if schedule not in GROWING_SCHEDULES:
            raise ValueError(
                f"unknown schedule {schedule!r}: use an int or one of {sorted(GROWING_SCHEDULES)}"
            )
        schedule = GROWING_SCHEDULES[schedule]
    if isinstance(schedule, (int, np.integer)):
        size = int(schedule)
    else:
        base, step = schedule
        size = int(base + step * epoch)
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size} (schedule {schedule!r})")
    return size


def epoch_batches(n: int, batch_size: int, overlap: float = 0.0, seed: int = 0) -> list:
    """Index arrays for one epoch over a shuffled order of n examples.

    With overlap = 0 the batches partition the data (the last may be smaller). With
    0 < overlap < 1 each batch starts batch_size * (1 - overlap) after the previous one,
    so consecutive batches share that fraction of examples and an epoch has ~1/(1-overlap)
    times as many steps.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    order = np.random.default_rng(seed).permutation(n)
    stride = max(1, int(round(batch_size * (1.0 - overlap))))
    batches = []
    for start in range(0, n, stride):
        batches.append(order[start : start + batch_size])
        if start + batch_size >= n:
            break
    return batches
